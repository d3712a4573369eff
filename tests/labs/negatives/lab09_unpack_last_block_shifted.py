"""Right-aligns the last partial block's tokens in their block (slots shifted to its end)."""
EXERCISE = "9.3"


def unpack_kv(buffer, k_blocks, v_blocks, block_table):
    num_tokens, block_size = buffer.shape[2], k_blocks.shape[2]
    if len(block_table) != -(-num_tokens // block_size):
        raise ValueError("the block table does not fit the tokens")
    for i, block in enumerate(block_table):
        start = i * block_size
        n = min(block_size, num_tokens - start)
        k_blocks[:, block, block_size - n:] = buffer[0, :, start:start + n]
        v_blocks[:, block, block_size - n:] = buffer[1, :, start:start + n]
