"""Maps positions 0 .. end - start - 1, as if every chunk started the sequence."""
EXERCISE = "3.2"


def slot_mapping(block_table, start, end, block_size):
    t = torch.arange(0, end - start)
    return torch.tensor(block_table)[t // block_size] * block_size + t % block_size
