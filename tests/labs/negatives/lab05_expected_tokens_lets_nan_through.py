"""Refuses alpha < 0 and alpha > 1, but NaN fails both comparisons and comes back as NaN."""
EXERCISE = "5.5"


def expected_tokens_per_forward(alpha, k):
    if alpha < 0 or alpha > 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
