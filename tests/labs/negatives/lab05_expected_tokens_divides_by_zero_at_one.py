"""The closed form without its limit: alpha = 1 divides by zero."""
EXERCISE = "5.5"


def expected_tokens_per_forward(alpha, k):
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return (1 - alpha ** (k + 1)) / (1 - alpha)
