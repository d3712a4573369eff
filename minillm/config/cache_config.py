"""CacheConfig: where the K/V of every sequence lives, how big the pool is, and what it keeps for reuse."""
from dataclasses import dataclass

from minillm.sequence import Label


class CacheKind(Label):
    PAGED = "paged"
    CONTIGUOUS = "contiguous"


OFFLOAD_KINDS = ("host", "disk")  # cache/offload.py's tiers


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache (minillm/cache/): its layout, its pool's size, prefix caching and a second tier. The flat
    knobs are the field names, but for `kv_cache`, which sets `kind`."""

    kind: CacheKind = CacheKind.PAGED
    """paged: one pool of fixed-size blocks shared by all sequences; contiguous: each sequence reserves its
    longest length up front (the baseline). Knob: `kv_cache`."""

    block_size: int = 16
    """Token slots per KV block (paged)."""

    num_kv_blocks: int | None = None
    """The pool's size in blocks; wins over kv_cache_memory. None: from kv_cache_memory."""

    kv_cache_memory: int | None = None
    """The pool's size in bytes. None: 256 MiB on a CPU, half the free memory on a GPU."""

    enable_prefix_caching: bool = True
    """Reuse the K/V of prompt prefixes computed before, found by a hash chain of full blocks (paged)."""

    kv_offload: str | None = None
    """A second tier that cached blocks move to instead of being evicted: "host" (CPU memory) or "disk" (a
    file). None: no tier. Needs the paged cache with prefix caching."""

    kv_offload_blocks: int = 1024
    """The tier's capacity in blocks; the least recently used ones leave first."""

    kv_offload_dir: str | None = None
    """The disk tier's folder. None: a temporary one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CacheKind.parse("kv_cache", self.kind))
        for name in ("block_size", "num_kv_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.kv_offload is None:
            return
        if self.kv_offload not in OFFLOAD_KINDS:
            raise ValueError(f"kv_offload must be None or one of {', '.join(OFFLOAD_KINDS)}, got {self.kv_offload!r}")
        if self.kind != CacheKind.PAGED or not self.enable_prefix_caching:
            raise ValueError("kv_offload keeps prefix-cache blocks in a second tier: it needs kv_cache='paged' and "
                             "enable_prefix_caching=True")
        if not isinstance(self.kv_offload_blocks, int) or self.kv_offload_blocks < 1:
            raise ValueError(f"kv_offload_blocks must be a positive integer, got {self.kv_offload_blocks!r}")
