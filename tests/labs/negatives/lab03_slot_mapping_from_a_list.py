"""Builds the slots as torch.tensor of a Python list: int64 while there are slots, but float32 for an
empty range (torch.tensor([]) is a float tensor)."""
EXERCISE = "3.2"


def slot_mapping(block_table, start, end, block_size):
    return torch.tensor([block_table[t // block_size] * block_size + t % block_size for t in range(start, end)])
