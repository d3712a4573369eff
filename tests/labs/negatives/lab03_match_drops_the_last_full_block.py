"""Keeps the prompt's last token out by dropping its last full block, even when more tokens follow it."""
EXERCISE = "3.5"


def match_prefix(token_ids, block_size, cache, hash_fn=chain_hash):
    matched, parent = [], None
    for i, h in enumerate(block_hashes(token_ids, block_size, hash_fn)[:-1]):
        entry = cache.get(h)
        tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
        if entry is None or entry.tokens != tokens or entry.parent is not parent:
            break
        matched.append(entry)
        parent = entry
    return matched
