"""Where the kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

The choice is made before triton is imported (kernels/mode.py: `import minillm` makes it). Every
kernel module imports triton through here, which says once which it is, and refuses a triton that
was imported before minillm without a GPU to compile for. The interpreter runs each program of the
grid one after another in numpy: results are the same, speed is not (use it for correctness, a GPU
for figures).
"""
import importlib.util
import os
import sys

import torch

from minillm.kernels.mode import choose_triton_mode, triton_imported_for_a_missing_gpu

if importlib.util.find_spec("triton") is None:
    raise ImportError("the Triton kernels need the triton package (Linux only): pip install -e '.[triton]'")

choose_triton_mode()
if triton_imported_for_a_missing_gpu():
    raise RuntimeError(
        "triton was imported before minillm, and there is no GPU: triton built its own functions (tl.sum, tl.max, "
        "...) for a GPU compiler, so minillm's kernels cannot run in the CPU interpreter in this Python process. "
        "In a notebook: restart the kernel (Kernel > Restart Kernel) and run the setup cell, which imports minillm, "
        "before any cell that imports triton or transformers. In a script: import minillm first, or set "
        "TRITON_INTERPRET=1 in the environment before Python starts")
if os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available():
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
