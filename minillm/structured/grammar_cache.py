"""An LRU cache of compiled grammars bounded by their bytes.

A compiled grammar holds, for each state, the token masks xgrammar precomputed: from kilobytes (a
regex) to hundreds of megabytes (a json_schema with thousands of properties). A count of entries
would not bound memory, so each entry is weighed by xgrammar's own `memory_size_bytes` (its mask
caches and rule tables: what it allocated for the grammar, not counting Python's small wrapper).
"""
from collections import OrderedDict


class GrammarCache:
    """{spec key: compiled grammar}, at most budget_bytes in all; not thread-safe (GrammarCompiler locks)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple, tuple[object, int]] = OrderedDict()  # oldest use first

    def get(self, key: tuple):
        """-> the grammar (now the most recently used), or None."""
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key][0]

    def put(self, key: tuple, grammar, size: int) -> None:
        """Keep grammar, evicting the least recently used until it fits; one over the whole budget is not kept."""
        if key in self._entries or size > self.budget_bytes:
            return
        while self.bytes + size > self.budget_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted
        self._entries[key] = (grammar, size)
        self.bytes += size

    def __len__(self) -> int:
        return len(self._entries)
