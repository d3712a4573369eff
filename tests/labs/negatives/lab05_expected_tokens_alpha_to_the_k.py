"""Off by one: (1 - alpha^k) / (1 - alpha), forgetting the token every step adds."""
EXERCISE = "5.5"


def expected_tokens_per_forward(alpha, k):
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return float(k) if alpha == 1 else (1 - alpha ** k) / (1 - alpha)
