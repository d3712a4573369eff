"""Where the kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

Triton decides whether a kernel is compiled or interpreted when the kernel is defined (at its
`@triton.jit`), from the TRITON_INTERPRET environment variable. So it must be set before any of
minillm's kernel modules is imported, and only that: `triton` itself may have been imported
earlier (by a notebook cell, or by transformers), it reads the variable afresh at each definition.
Every kernel module imports triton through here, which sets it when torch sees no GPU and says so
once. The interpreter runs each program of the grid one after another in numpy: results are the
same, speed is not (use it for correctness, a GPU for figures).
"""
import importlib.util
import os
import sys

import torch

if importlib.util.find_spec("triton") is None:
    raise ImportError("the Triton kernels need the triton package (Linux only): pip install -e '.[triton]'")

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    os.environ["TRITON_INTERPRET"] = "1"
    print("minillm: no CUDA GPU, so the Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1): "
          "same results, far slower", file=sys.stderr)

import triton  # noqa: E402  (after TRITON_INTERPRET is set)
import triton.language as tl  # noqa: E402

__all__ = ["INTERPRETED", "check_device", "next_pow2", "tl", "triton"]

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def check_device(*tensors: torch.Tensor) -> None:
    """Compiled kernels read GPU memory, interpreted ones CPU memory: refuse the other kind."""
    want = "cpu" if INTERPRETED else "cuda"
    wrong = [t.device for t in tensors if t is not None and t.device.type != want]
    if wrong:
        how = "interpreted (TRITON_INTERPRET=1)" if INTERPRETED else "compiled for the GPU"
        raise ValueError(f"the Triton kernels run {how} here, so they take {want} tensors, got one on {wrong[0]}")


def next_pow2(n: int) -> int:
    """Triton's block shapes are powers of two: the smallest one >= n (and >= 1)."""
    return triton.next_power_of_2(max(int(n), 1))
