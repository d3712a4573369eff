"""The first kernel: out = x + y, one block of BLOCK elements per program.

Each program handles elements [pid * BLOCK, pid * BLOCK + BLOCK); the last block sticks out past
the end of the tensor, so every load and store is masked (`offsets < n`). Drop the mask and the
last program reads and writes memory that is not the tensor's (tests/kernels/test_kernels.py shows it).
The sum is taken in float32: the interpreter has no bfloat16 arithmetic, and a GPU adds in fp32 too.
"""
import torch

from minillm.kernels.runtime import check_device, tl, triton


def vector_add_spec(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y: [n] -> [n]"""
    return (x.float() + y.float()).to(x.dtype)


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x, y: [n] contiguous, same dtype -> [n]"""
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"vector_add takes two vectors of the same length, got {tuple(x.shape)} and {tuple(y.shape)}")
    check_device(x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    vector_add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out
