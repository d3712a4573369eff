"""Gives the running totals without the leading 0, so sequence i's rows are off by one sequence."""
EXERCISE = "4.5"


def flatten_batch(token_ids, computed, num_tokens, block_tables, block_size):
    ids, positions, slots = [], [], []
    for seq, start, n, table in zip(token_ids, computed, num_tokens, block_tables):
        for t in range(start, start + n):
            ids.append(seq[t])
            positions.append(t)
            slots.append(table[t // block_size] * block_size + t % block_size)
    return torch.tensor(ids), torch.tensor(positions), torch.cumsum(torch.tensor(num_tokens), 0), torch.tensor(slots)
