"""Counts a multiply-add as one FLOP."""
EXERCISE = "0.1"


def matmul_cost(m, k, n, bytes_per_element):
    return m * k * n, (m * k + k * n + m * n) * bytes_per_element
