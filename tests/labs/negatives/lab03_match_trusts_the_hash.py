"""Takes any entry found under the right name as a hit, without comparing its tokens."""
EXERCISE = "3.5"


def match_prefix(token_ids, block_size, cache, hash_fn=chain_hash):
    matched, parent = [], None
    for h in block_hashes(token_ids[:-1], block_size, hash_fn):
        entry = cache.get(h)
        if entry is None or entry.parent is not parent:
            break
        matched.append(entry)
        parent = entry
    return matched
