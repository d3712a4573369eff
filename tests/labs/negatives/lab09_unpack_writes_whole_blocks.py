"""Writes the last block whole, zero-padded: the slots past the sequence are overwritten."""
EXERCISE = "9.3"


def unpack_kv(buffer, k_blocks, v_blocks, block_table):
    num_tokens, block_size = buffer.shape[2], k_blocks.shape[2]
    if len(block_table) != -(-num_tokens // block_size):
        raise ValueError("the block table does not fit the tokens")
    pad = len(block_table) * block_size - num_tokens
    padded = F.pad(buffer, (0, 0, 0, 0, 0, pad))
    for i, block in enumerate(block_table):
        k_blocks[:, block] = padded[0, :, i * block_size:(i + 1) * block_size]
        v_blocks[:, block] = padded[1, :, i * block_size:(i + 1) * block_size]
