"""Checks `tokens_per_second <= 0`, which is False for NaN: a NaN throughput gives a NaN price."""
EXERCISE = "8.7"


def cost_per_million_tokens(price_per_hour, tokens_per_second):
    if tokens_per_second <= 0:
        raise ValueError(f"tokens_per_second must be > 0, got {tokens_per_second!r}")
    return price_per_hour / (3600 * tokens_per_second) * 1e6
