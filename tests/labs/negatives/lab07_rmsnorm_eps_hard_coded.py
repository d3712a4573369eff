"""The kernel adds its own eps, 1e-5, to the mean square instead of the eps it is given."""
EXERCISE = "7.2"


@triton.jit
def rmsnorm_residual_kernel(x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, hidden, eps,
                            stride_x, stride_r, stride_y, stride_h, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / hidden + 1e-5)
    normed = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)
