"""Searches every earlier start but the very first one (position 0)."""
EXERCISE = "5.4"


def propose_ngram(token_ids, n, k):
    for m in range(min(n, len(token_ids) - 1), 0, -1):
        tail = token_ids[-m:]
        for s in range(len(token_ids) - m - 1, 0, -1):
            if token_ids[s:s + m] == tail:
                return token_ids[s + m:s + m + k]
    return []
