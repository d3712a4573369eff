"""Looks up only the last n tokens, never falling back to shorter n-grams."""
EXERCISE = "5.4"


def propose_ngram(token_ids, n, k):
    m = min(n, len(token_ids) - 1)
    if m < 1:
        return []
    tail = token_ids[-m:]
    for s in range(len(token_ids) - m - 1, -1, -1):
        if token_ids[s:s + m] == tail:
            return token_ids[s + m:s + m + k]
    return []
