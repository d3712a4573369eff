"""Checks the parent by its name, which a collision can share, instead of by identity."""
EXERCISE = "3.5"


def match_prefix(token_ids, block_size, cache, hash_fn=chain_hash):
    matched, parent_hash = [], None
    for i, h in enumerate(block_hashes(token_ids[:-1], block_size, hash_fn)):
        entry = cache.get(h)
        tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
        if entry is None or entry.tokens != tokens or (entry.parent.hash if entry.parent else None) != parent_hash:
            break
        matched.append(entry)
        parent_hash = h
    return matched
