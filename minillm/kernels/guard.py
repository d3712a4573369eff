"""Catch out-of-bounds accesses: put each buffer inside a larger one whose guard regions (before and
after) hold a sentinel, hand the kernel the inner view, and check afterwards that no guard changed.

A kernel with a missing mask reads the guard (NaN for floats: it leaks into the outputs, where
`no_nan` finds it) or writes over it (`untouched` finds that). Integer buffers (block tables, slot
mappings) get -1: a stray read of one names block or slot -1, just before the pool, in the pool's
own guard (so give a pool a pad of at least one block).
"""
import torch

FLOAT_SENTINEL = float("nan")
INT_SENTINEL = -1
UINT8_SENTINEL = 0xFF


class Guarded:
    """`inner`: a view of `like`'s shape, dtype and values in the middle of a larger buffer."""

    def __init__(self, like: torch.Tensor, pad: int = 256) -> None:
        if like.dtype.is_floating_point:
            fill = FLOAT_SENTINEL
        else:
            fill = UINT8_SENTINEL if like.dtype == torch.uint8 else INT_SENTINEL
        n = like.numel()
        self.buffer = torch.full((pad + n + pad,), fill, dtype=like.dtype, device=like.device)
        self.guard_before, self.guard_after = self.buffer[:pad].clone(), self.buffer[pad + n:].clone()
        self.pad, self.n = pad, n
        self.inner = self.buffer[pad:pad + n].view(like.shape)
        self.inner.copy_(like)

    def untouched(self) -> bool:
        """True when the kernel wrote nothing outside the inner view."""
        return same(self.buffer[:self.pad], self.guard_before) and same(self.buffer[self.pad + self.n:],
                                                                         self.guard_after)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN for NaN."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def guarded(*tensors: torch.Tensor, pad: int = 256) -> list[Guarded]:
    """One Guarded per tensor."""
    return [Guarded(t, pad) for t in tensors]


def no_nan(*outputs: torch.Tensor) -> bool:
    """True when no output holds a NaN (a guard's NaN read through a missing mask would)."""
    return not any(bool(o.isnan().any()) for o in outputs if o.dtype.is_floating_point)
