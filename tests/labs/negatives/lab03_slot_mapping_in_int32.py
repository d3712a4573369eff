"""Returns the slots as int32, to save memory; index tensors in the engine are int64."""
EXERCISE = "3.2"


def slot_mapping(block_table, start, end, block_size):
    t = torch.arange(start, end, dtype=torch.int32)
    table = torch.tensor(block_table, dtype=torch.int32)
    return table[t // block_size] * block_size + t % block_size
