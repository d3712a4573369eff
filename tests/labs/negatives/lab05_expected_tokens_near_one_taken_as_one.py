"""Avoids the closed form's cancellation by answering k + 1 for any alpha within 1e-6 of 1."""
EXERCISE = "5.5"


def expected_tokens_per_forward(alpha, k):
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha > 1 - 1e-6:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)
