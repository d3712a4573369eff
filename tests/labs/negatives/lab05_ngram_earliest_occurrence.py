"""Proposes from the earliest earlier occurrence of the n-gram instead of the latest."""
EXERCISE = "5.4"


def propose_ngram(token_ids, n, k):
    for m in range(min(n, len(token_ids) - 1), 0, -1):
        tail = token_ids[-m:]
        for s in range(0, len(token_ids) - m):
            if token_ids[s:s + m] == tail:
                return token_ids[s + m:s + m + k]
    return []
