"""The loads and the store without the mask: the last program runs past the end."""
EXERCISE = "7.1"


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """One program: out[i] = x[i] + y[i] for its BLOCK elements i (those < n)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    x = tl.load(x_ptr + offsets).to(tl.float32)
    y = tl.load(y_ptr + offsets).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty))
