"""The grid has n // block programs: the elements of the last, partial block are never written."""
EXERCISE = "7.1"


def vector_add(x: Tensor, y: Tensor, block: int = 1024) -> Tensor:
    """Elementwise x + y on the vector_add_kernel.

    x, y: [n], same dtype -> out [n] in x's dtype; out[i] = x[i] + y[i], added in float32.
    block: elements per program (a power of two); the grid is ceil(n / block) programs.

    Hints: kernel 5 lines: offsets from tl.program_id(0), a mask, two tl.load, one tl.store.
    Launcher 2 lines: torch.empty_like, then vector_add_kernel[(triton.cdiv(n, block),)](...).
    """
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"vector_add takes two vectors of the same length, got {tuple(x.shape)} and {tuple(y.shape)}")
    check_device(x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    vector_add_kernel[(max(x.numel() // block, 1),)](x, y, out, x.numel(), BLOCK=block)
    return out
