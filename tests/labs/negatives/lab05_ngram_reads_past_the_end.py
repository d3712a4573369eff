"""Always proposes k tokens, indexing past the end of the history when the match is near it."""
EXERCISE = "5.4"


def propose_ngram(token_ids, n, k):
    for m in range(min(n, len(token_ids) - 1), 0, -1):
        tail = token_ids[-m:]
        for s in range(len(token_ids) - m - 1, -1, -1):
            if token_ids[s:s + m] == tail:
                return [token_ids[s + m + j] for j in range(k)]
    return []
