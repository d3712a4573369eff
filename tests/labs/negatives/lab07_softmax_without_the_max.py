"""No max subtracted: exp(x) / sum(exp(x)) overflows for logits past 88."""
EXERCISE = "7.3"


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride_x, stride_out, BLOCK: tl.constexpr):
    """One program per row: an online pass for (max, sum), a second pass writing exp(x - max) / sum."""
    row = tl.program_id(0)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    offsets = tl.arange(0, BLOCK)
    s = 0.0
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        s = s + tl.sum(tl.exp(x), axis=0)
    for start in range(0, cols, BLOCK):
        mask = start + offsets < cols
        x = tl.load(x_row + start + offsets, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(out_row + start + offsets, (tl.exp(x) / s).to(out_ptr.dtype.element_ty), mask=mask)
