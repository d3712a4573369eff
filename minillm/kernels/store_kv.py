"""Write a step's new K and V into the paged pool: token t goes to slot slot_mapping[t]
(slot = block * block_size + offset, see minillm/cache/pool.py). A negative slot means "no slot"
(a padded row) and is skipped. One program copies BLOCK_T tokens, all their kv heads.
"""
import torch

from minillm.kernels.runtime import check_device, next_pow2, tl, triton


def store_kv_spec(k: torch.Tensor, v: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, d]; k_slots, v_slots: [slots, kv_heads, d], written in place; slot_mapping: [tokens]"""
    keep = slot_mapping >= 0
    k_slots.index_copy_(0, slot_mapping[keep], k[keep])
    v_slots.index_copy_(0, slot_mapping[keep], v[keep])


@triton.jit
def store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, tokens, kv_heads, d,
                    stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                    BLOCK_T: tl.constexpr, HEADS: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] tokens
    slot = tl.load(slot_ptr + t, mask=t < tokens, other=-1).to(tl.int64)  # int64: slot * stride can pass 2**31
    t, slot = t[:, None, None], slot[:, None, None]
    h, c = tl.arange(0, HEADS)[None, :, None], tl.arange(0, D)[None, None, :]
    mask = (slot >= 0) & (h < kv_heads) & (c < d)  # [BLOCK_T, HEADS, D]
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + c, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + c, mask=mask)
    tl.store(kc_ptr + slot * stride_cs + h * stride_ch + c, k, mask=mask)
    tl.store(vc_ptr + slot * stride_cs + h * stride_ch + c, v, mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, d] (last dim contiguous); k_slots, v_slots: [slots, kv_heads, d] with
    the same strides (one pool layer each, written in place); slot_mapping: [tokens] integer."""
    tokens, kv_heads, d = k.shape
    if (v.shape != k.shape or k_slots.shape[1:] != k.shape[1:] or v_slots.shape != k_slots.shape
            or v_slots.stride() != k_slots.stride() or k_slots.stride(2) != 1):
        raise ValueError(f"store_kv: k and v [tokens, kv_heads, d] and two pools [slots, kv_heads, d] alike (d "
                         f"contiguous), got k {tuple(k.shape)}, v {tuple(v.shape)}, pools {tuple(k_slots.shape)}, "
                         f"{tuple(v_slots.shape)}")
    if slot_mapping.shape != (tokens,):
        raise ValueError(f"store_kv: slot_mapping must be [{tokens}], got {tuple(slot_mapping.shape)}")
    check_device(k, v, k_slots, v_slots, slot_mapping)
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    if tokens:
        block_t = 16
        store_kv_kernel[(triton.cdiv(tokens, block_t),)](
            k, v, k_slots, v_slots, slot_mapping, tokens, kv_heads, d, k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), k_slots.stride(0), k_slots.stride(1), BLOCK_T=block_t, HEADS=next_pow2(kv_heads),
            D=next_pow2(d))
