"""y is allocated in float32 (torch.empty(rows, hidden)), whatever x's dtype: a float16 model gets float32 back."""
EXERCISE = "7.2"


def rmsnorm_residual(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if x.shape != residual.shape or x.dim() != 2 or weight.shape != x.shape[1:]:
        raise ValueError("rmsnorm_residual takes x and residual [rows, hidden] and weight [hidden]")
    check_device(x, residual, weight)
    if x.stride(1) != 1 or residual.stride(1) != 1:
        x, residual = x.contiguous(), residual.contiguous()
    rows, hidden = x.shape
    y, h = torch.empty(rows, hidden, device=x.device), torch.empty_like(x)
    rmsnorm_residual_kernel[(rows,)](x, residual, weight.contiguous(), y, h, hidden, eps, x.stride(0),
                                     residual.stride(0), y.stride(0), h.stride(0), BLOCK=next_pow2(hidden))
    return y, h
