"""What the engine asks of a KV-cache layout: the CacheManager protocol.

The scheduler admits, grows, forks and frees sequences through it; the runner asks it for the
step's AttentionContext; observers get its KVStats. Two layouts implement it: `paged` (one block
pool, block tables, prefix caching) and `contiguous` (one max-length cache per sequence, the
baseline). Each keeps its per-sequence state in `seq.kv`.
"""
from typing import Protocol

from minillm.config import CacheKind
from minillm.layers.attention import AttentionContext
from minillm.sequence import Sequence
from minillm.step import KVStats, ScheduledSeq


class CacheManager(Protocol):
    kind: CacheKind
    num_blocks: int | None  # the pool's capacity in blocks; None: no fixed pool

    def fits(self, prompt_len: int, total_len: int, n: int) -> bool:
        """Could a request of n samples, each up to total_len tokens, ever fit in an empty pool?"""

    def allocate(self, seq: Sequence) -> int | None:
        """Cache for all of seq's tokens. -> how many of them are already computed (prefix-cache
        hits), or None if there is no room now (nothing changed)."""

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Room for seq's next num_new_tokens tokens. -> False if there is none (nothing changed)."""

    def holds(self, seq: Sequence, num_tokens: int) -> bool:
        """Has seq room for its first num_tokens tokens?"""

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give child the parent's cached tokens (shared where the layout can share)."""

    def trim(self, seq: Sequence) -> None:
        """Give back what seq holds past its computed tokens (rejected speculative proposals)."""

    def computed(self, seq: Sequence) -> None:
        """After a step advanced seq.num_computed_tokens (the prefix cache names full blocks)."""

    def free(self, seq: Sequence) -> None:
        """Release everything seq holds."""

    def context(self, batch: list[ScheduledSeq]) -> AttentionContext:
        """The attention metadata of one step over these sequences."""

    def block_table(self, seq: Sequence) -> list[int]:
        """The blocks holding seq's tokens, in order ([] for a layout without blocks)."""

    def stats(self, seqs: list[Sequence]) -> KVStats:
        """The pool now; seqs: the sequences holding cache."""
