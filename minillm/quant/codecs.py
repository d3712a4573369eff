"""Weight codecs: how a float matrix becomes a few bits per weight, and back.

Every scheme keeps a float *scale* beside small integer (or 8-bit float) codes, and the weight is
recovered as `(code - zero) * scale`. The schemes differ in how many weights share one scale:

    int8  symmetric, one scale per output channel (row):  w ~ q * s,        q in [-127, 127]
    int4  asymmetric, one scale and zero point per group of `group_size` inputs of a row:
                                                           w ~ (q - z) * s,  q, z in [0, 15]
          two ways to place the 16 levels: the range holds 0, so z is a whole code (the default,
          lab 06's); or min-max, the group's own min..max, so z is a float (a free minimum,
          the shape of llama.cpp's Q4_1 and of ATen's int4pack scales-and-zeros)
    fp8   e4m3 floats, one scale per row, so the row's largest |w| lands on e4m3's largest, 448

All work on a weight `w: [out_features, in_features]` (nn.Linear's layout): a row is one output
channel, and int4's groups run along it, so each output is a sum over whole groups.

Error bounds (round to nearest, which every codec here uses):
    int8, int4: |w - dequant(w)| <= s / 2 for the scale s of w's row or group (up to float rounding
                for min-max, whose zero point is not a whole code);
    fp8:        |w - dequant(w)| <= max(|w| * 2**-4, s * 2**-10): e4m3 carries 3 mantissa bits, so
                a normal value is off by at most half a step, 2**-4 of it; below e4m3's smallest
                normal (2**-6) the steps are a fixed 2**-9, half of it 2**-10 (times the scale).
"""
import torch

# int4's packed layout is shared with the fused kernel that reads it, so it lives beside the kernel
from minillm.kernels.int4_format import INT4_MAX, dequantize_int4, pack_int4, unpack_int4

__all__ = ["FP8_DTYPE", "FP8_MAX", "INT4_MAX", "INT8_MAX", "TINY", "check_group_size", "dequantize_fp8",
           "dequantize_int4", "dequantize_int8", "pack_int4", "quantize_fp8", "quantize_int4", "quantize_int4_minmax",
           "quantize_int8",
           "require_fp8", "unpack_int4"]

INT8_MAX = 127          # symmetric: -128 is left out so that q and -q are both codes
FP8_MAX = 448.0         # the largest finite float8_e4m3fn
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)  # None on a torch built without 8-bit floats
TINY = torch.finfo(torch.float32).tiny  # keeps a scale of an all-zero row or group from being 0


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax per output channel. w: [out, in] -> q: int8 [out, in], scale: float32 [out].

    scale = max|w[row]| / 127;  q = round(w / scale), so the row's largest weight maps to +-127."""
    scale = (w.abs().amax(dim=1).float() / INT8_MAX).clamp_min(TINY)        # [out]
    q = torch.round(w.float() / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)  # [out, in]
    return q.to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q: int8 [out, in], scale: [out] -> float32 [out, in]."""
    return q.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max per group of `group_size` consecutive inputs of each row.

    w: [out, in] -> codes: uint8 [out, in] in 0..15, scale: float32 [out, in // g], zero: uint8 [out, in // g].
    lo = min(min(group), 0), hi = max(max(group), 0);  scale = (hi - lo) / 15;  zero = round(-lo / scale);
    q = clamp(round(w / scale) + zero, 0, 15).
    The range always holds 0, so the zero point is one of the 16 codes and a weight of exactly 0 is
    stored exactly; a group of only positive weights has zero point 0, only negative ones 15."""
    out_features, in_features = w.shape
    check_group_size(in_features, group_size)
    groups = w.float().reshape(out_features, in_features // group_size, group_size)  # [out, groups, g]
    lo, hi = groups.amin(dim=2).clamp(max=0), groups.amax(dim=2).clamp(min=0)        # [out, groups]
    scale = ((hi - lo) / INT4_MAX).clamp_min(TINY)
    zero = torch.round(-lo / scale).clamp(0, INT4_MAX)
    q = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, INT4_MAX)
    return q.reshape(out_features, in_features).to(torch.uint8), scale, zero.to(torch.uint8)


def quantize_int4_minmax(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per group, the 16 levels spread over the group's own min..max (a free minimum).

    w: [out, in] -> codes: uint8 [out, in] in 0..15, scale: float32 [out, in // g], zero: float32 [out, in // g].
    lo = min(group), hi = max(group);  scale = (hi - lo) / 15;  zero = -lo / scale;  q = round((w - lo) / scale).
    Every level lands inside the group: none is spent on the side of 0 a one-signed group never
    reaches. A group that came from a Q4_1 block (lo = m, step d, codes 0 and 15 both used, which
    Q4_1's own quantizer guarantees) gets its levels back: q is the block's code and
    (q - zero) * scale = m + d * q up to float rounding."""
    out_features, in_features = w.shape
    check_group_size(in_features, group_size)
    groups = w.float().reshape(out_features, in_features // group_size, group_size)  # [out, groups, g]
    lo, hi = groups.amin(dim=2), groups.amax(dim=2)                                   # [out, groups]
    scale = ((hi - lo) / INT4_MAX).clamp_min(TINY)
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, INT4_MAX)
    return q.reshape(out_features, in_features).to(torch.uint8), scale, -lo / scale


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 with one scale per output channel. w: [out, in] -> q: float8_e4m3fn [out, in], scale: [out]."""
    require_fp8()
    scale = (w.abs().amax(dim=1).float() / FP8_MAX).clamp_min(TINY)  # [out]
    return (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q: float8_e4m3fn [out, in], scale: [out] -> float32 [out, in]."""
    return q.float() * scale[:, None]


def check_group_size(in_features: int, group_size: int) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if in_features % group_size:
        raise ValueError(f"group_size {group_size} does not divide the input dimension {in_features}: "
                         f"every group must be whole")


def require_fp8() -> None:
    if FP8_DTYPE is None:
        raise ValueError(f"the fp8 scheme needs torch.float8_e4m3fn, which this torch ({torch.__version__}) "
                         f"does not have: use int8 or int4, or a torch >= 2.1")
