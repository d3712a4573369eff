"""Computes the formula for any alpha, probabilities above 1 and below 0 included."""
EXERCISE = "5.5"


def expected_tokens_per_forward(alpha, k):
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
