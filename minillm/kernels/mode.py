"""Compiled or interpreted: chosen once, before triton is imported.

Triton builds its own library of device functions (`tl.sum`, `tl.max`, ...) when `triton` is first
imported, for the GPU compiler or for its CPU interpreter, after the TRITON_INTERPRET environment
variable. A kernel run by the interpreter cannot call functions built for the compiler. So the
choice must be made before anything imports triton: `import minillm` makes it (where torch sees no
CUDA GPU it sets TRITON_INTERPRET=1), and the kernels' runtime refuses, with how to recover, a triton
imported earlier without it. This module imports no triton.
"""
import os
import sys

import torch


def choose_triton_mode() -> None:
    """Where there is no CUDA GPU and triton is not imported yet, have it run in its interpreter."""
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_imported_for_a_missing_gpu() -> bool:
    """True when there is no GPU but triton was imported (before minillm) without TRITON_INTERPRET=1."""
    return not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" and "triton" in sys.modules
