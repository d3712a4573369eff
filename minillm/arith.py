"""Small helpers with no better home, each defined once."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers, in exact integer arithmetic: cdiv(17, 16) == 2."""
    return -(-a // b)
