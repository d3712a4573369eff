"""Successive halving: many candidates get a short real run, the best of them longer ones.

    rungs(8, 64)  -> [(8, 16), (4, 32), (2, 64)]   (candidates, requests each) per round
    halving_round(scores, keep=4)                 the 4 best names of a round

A round spends sum of its candidates' requests in real runs; halving the candidates while doubling the
requests keeps every round's cost about the same, so the whole search costs about log2(candidates) rounds
of the longest run, where the exhaustive search costs `candidates` of them.
"""


def halving_round(scores: list[tuple[str, float]], keep: int) -> tuple[list[str], int]:
    """scores: (candidate, score) of one round, higher is better. -> (the `keep` best candidates, best
    first; a tie goes to the one listed first), and how many candidates the round ran (its real runs)."""
    if keep < 1:
        raise ValueError(f"a round keeps at least 1 candidate, got keep={keep}")
    order = sorted(range(len(scores)), key=lambda i: (-scores[i][1], i))
    return [scores[i][0] for i in order[:keep]], len(scores)


def rungs(candidates: int, max_requests: int, eta: int = 2, min_requests: int = 8) -> list[tuple[int, int]]:
    """The rounds of a search that starts with `candidates` and ends with one run of max_requests:
    (candidates, requests each) per round, each round keeping 1/eta of the last one's (at least 1)."""
    if candidates < 1 or eta < 2:
        raise ValueError(f"need candidates >= 1 and eta >= 2, got {candidates}, {eta}")
    counts = [candidates]
    while counts[-1] > 1:
        counts.append(max(1, counts[-1] // eta))
    requests = [max(min_requests, max_requests // eta ** (len(counts) - 1 - i)) for i in range(len(counts))]
    return list(zip(counts, [min(r, max_requests) for r in requests]))
