"""Draws its uniform number from torch's global generator instead of the request's."""
EXERCISE = "5.1"


def accept(p, q, generator):
    return q <= p or float(torch.rand(())) * q < p
