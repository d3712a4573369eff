"""Masked lanes load 0 instead of -inf: each adds exp(0 - max) to the sum."""
EXERCISE = "7.3"


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride_x, stride_out, BLOCK: tl.constexpr):
    """One program per row: an online pass for (max, sum), a second pass writing exp(x - max) / sum."""
    row = tl.program_id(0)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    offsets = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(out_row + start + offsets, (tl.exp(x - m) / s).to(out_ptr.dtype.element_ty), mask=mask)
