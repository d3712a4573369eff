"""On a GPU: one kernel timed at a size that fills the GPU, its achieved bandwidth and FLOP/s against the peaks
measured on the same GPU, with the measuring functions of `python -m minillm.bench kernels`."""
from functools import partial

import torch

from minillm.perf import HardwareProfile

SIZES = {"vector add": "2^26 elements", "RMSNorm": "8192 x 4096", "softmax": "8192 x 4096",
         "matmul": "4096^3", "int4 matmul": "batch 4, 4096 x 4096, groups of 64",
         "paged decode attention": "batch 16, context 2048, 32 heads, 8 KV heads, d 128"}


def _case(kernel: str, device: torch.device):
    """-> (the kernel as a call, its torch reference as a call, bytes it must move at least, FLOPs)"""
    from minillm.bench.kernels import paged_case
    from minillm.kernels import fused_add_rmsnorm, int4_matmul, matmul, paged_decode, softmax, vector_add
    from minillm.quant import codecs
    bf = torch.bfloat16
    r = lambda *shape: torch.randn(*shape, device=device, dtype=bf)  # noqa: E731
    if kernel == "vector add":
        x, y = r(2**26), r(2**26)
        return partial(vector_add.vector_add, x, y), lambda: x + y, 3 * x.numel() * 2, x.numel()
    if kernel == "RMSNorm":
        a, res, w = r(8192, 4096), r(8192, 4096), r(4096)
        args = (a, res, w, 1e-5)
        return (partial(fused_add_rmsnorm.rmsnorm_residual, *args),
                partial(fused_add_rmsnorm.rmsnorm_residual_spec, *args),
                4 * a.numel() * 2, 0)
    if kernel == "softmax":
        s = r(8192, 4096)
        return partial(softmax.softmax, s), partial(torch.softmax, s, -1), 2 * s.numel() * 2, 0
    if kernel == "matmul":
        m1, m2 = r(4096, 4096), r(4096, 4096)
        return partial(matmul.matmul, m1, m2), lambda: m1 @ m2, 3 * m1.numel() * 2, 2 * 4096**3
    if kernel == "int4 matmul":
        codes, scale, zero = codecs.quantize_int4(torch.randn(4096, 4096, device=device), 64)
        packed, x = codecs.pack_int4(codes), r(4, 4096)
        args = (x, packed, scale, zero, None)
        return (partial(int4_matmul.int4_linear, *args), partial(int4_matmul.int4_linear_spec, *args),
                packed.numel() + scale.numel() * 5 + 2 * x.numel() * 2, 2 * 4 * 4096**2)
    q, k, v, tables, lens = paged_case([2048] * 16, 16, 32, 8, 128, bf, device)
    args = (q, k, v, tables, lens, 16)
    return (partial(paged_decode.paged_decode_attention, *args, max_context=2048),
            partial(paged_decode.paged_decode_spec, *args), 2 * k.numel() * 2, 4 * 16 * 32 * 2048 * 128)


def measure(kernel: str) -> tuple[dict, HardwareProfile]:
    """-> (bench's row for the kernel: times, GB/s, fractions of the peaks; this GPU's measured profile)"""
    from minillm.bench.kernels import peaks, row, timed
    device = torch.device("cuda")
    peak = peaks(device)
    fn, ref, moved, flop = _case(kernel, device)
    result = row(kernel, SIZES[kernel], timed(fn, 20), timed(ref, 20), moved, flop, peak)
    hw = HardwareProfile(f"{torch.cuda.get_device_name(device)} (measured)", {"bfloat16": peak["flops"]},
                         peak["bandwidth"], torch.cuda.get_device_properties(device).total_memory,
                         "measured now: a 1 GiB copy, an 8192^3 bf16 matmul")
    return result, hw
