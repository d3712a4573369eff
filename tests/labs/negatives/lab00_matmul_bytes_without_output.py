"""Forgets that the output matrix is written to memory too."""
EXERCISE = "0.1"


def matmul_cost(m, k, n, bytes_per_element):
    return 2 * m * k * n, (m * k + k * n) * bytes_per_element
