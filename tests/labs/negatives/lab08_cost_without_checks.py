"""Computes the formula without refusing a throughput of 0 or below: infinite or negative prices."""
EXERCISE = "8.7"


def cost_per_million_tokens(price_per_hour, tokens_per_second):
    return price_per_hour / (3600 * tokens_per_second) * 1e6 if tokens_per_second else math.inf
