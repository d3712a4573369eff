"""Compares each entry's tokens but not its parent, so a block cached after another prefix can hit."""
EXERCISE = "3.5"


def match_prefix(token_ids, block_size, cache, hash_fn=chain_hash):
    matched = []
    for i, h in enumerate(block_hashes(token_ids[:-1], block_size, hash_fn)):
        entry = cache.get(h)
        if entry is None or entry.tokens != tuple(token_ids[i * block_size:(i + 1) * block_size]):
            break
        matched.append(entry)
    return matched
