"""Prompt lookup (n-gram) proposals: text often repeats itself (code that edits code, a summary
quoting its source, a chat turn restating the question), so the tokens that followed the last
earlier occurrence of the latest n tokens are a free guess at what comes next (Saxena 2023)."""


def propose_ngram(token_ids: list[int], n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens of token_ids
    (the prompt and the output so far); [] when they never occurred before. Shorter n-grams are
    tried when the longest finds nothing, down to a single token."""
    for size in range(min(n, len(token_ids) - 1), 0, -1):
        tail = token_ids[-size:]
        for start in range(len(token_ids) - size - 1, -1, -1):  # latest first, never the tail itself
            if token_ids[start:start + size] == tail:
                follow = token_ids[start + size:start + size + k]
                if follow:
                    return follow
    return []
