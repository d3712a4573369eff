"""The buffer is allocated with torch.empty of the default dtype and filled token by token: a bfloat16 or
float16 pool travels as float32 (twice the bytes), its values unchanged."""
EXERCISE = "9.3"


def pack_kv(k_blocks, v_blocks, block_table, num_tokens):
    layers, _, block_size, heads, dim = k_blocks.shape
    if len(block_table) != -(-num_tokens // block_size):
        raise ValueError("the block table does not fit the tokens")
    buffer = torch.empty(2, layers, num_tokens, heads, dim)
    for t in range(num_tokens):
        block, slot = block_table[t // block_size], t % block_size
        buffer[0, :, t] = k_blocks[:, block, slot]
        buffer[1, :, t] = v_blocks[:, block, slot]
    return buffer
