"""Numbers each sequence's tokens from 0, as if every chunk and decode started a new sequence."""
EXERCISE = "4.5"


def flatten_batch(token_ids, computed, num_tokens, block_tables, block_size):
    ids, positions, slots = [], [], []
    for seq, start, n, table in zip(token_ids, computed, num_tokens, block_tables):
        for t in range(start, start + n):
            ids.append(seq[t])
            positions.append(t - start)
            slots.append(table[t // block_size] * block_size + t % block_size)
    cu = torch.cumsum(torch.tensor([0] + list(num_tokens)), 0)
    return torch.tensor(ids), torch.tensor(positions), cu, torch.tensor(slots)
