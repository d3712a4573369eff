"""Paged decode attention on the CPU (paged_decode_cpu.cpp): the Triton kernel's interface and job, in C++.

The paged cache's torch path gathers each decode row's blocks into a contiguous copy, pads the rows of a
group to the longest context and hands them to scaled_dot_product_attention: a copy of every key and value
of the batch in every layer, and eight operator calls around it. This kernel reads every key and value where
it lies, through the block table, once for all the query heads that share it, each row to its own length.
The engine uses it for decode rows on a CPU in float32 (cache/paged.py); paged_decode.paged_decode_spec is
its reference in the tests. Where no C++ compiler is, `available()` is False and the gather path runs.
"""
import ctypes
import functools
from pathlib import Path

import torch

from minillm import cpp

SOURCE = Path(__file__).with_name("paged_decode_cpu.cpp")


@functools.cache
def library(flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    ptr, i64 = cpp.PTR, cpp.I64
    decode = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr] + [i64] * 5 + [cpp.F32, cpp.INT]
    return cpp.load(SOURCE, "the CPU paged decode attention kernel (decode rows gather their blocks instead)",
                    {"paged_decode_f32": decode, "paged_store_decode_f32": [ptr, i64, ptr, i64, ptr, i64] + decode},
                    flags)


def available() -> bool:
    """Whether the kernel exists on this machine (compiled, or compilable now)."""
    return library() is not None


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel serves a pool on `device` in `dtype`: float32 on a CPU, where it builds."""
    return device.type == "cpu" and dtype == torch.float32 and available()


def paged_decode_attention_cpu(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                               max_context: int | None = None, rows: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> torch.Tensor:
    """paged_decode.paged_decode_attention's interface. q: [tokens, heads, d] float32; k_slots, v_slots:
    [slots, kv_heads, d]; block_tables: int [B, max_blocks]; context_lens, rows: int [B] (rows None: 0..B-1);
    out: contiguous [tokens, heads, d] whose rows `rows` are written (None: a new one). max_context is unused
    (each row reads its own length). Everything is checked (a block or row out of range would read or write
    outside the tensors): -> out."""
    batch, (tokens, heads, d), kv_heads = block_tables.shape[0], q.shape, k_slots.shape[1]
    if (heads % kv_heads or k_slots.shape[2] != d or v_slots.shape != k_slots.shape
            or context_lens.shape != (batch,) or (rows is not None and rows.shape != (batch,))):
        raise ValueError(f"paged_decode_attention_cpu: q [tokens, heads, d], pools [slots, kv_heads, d] with kv_heads "
                         f"dividing heads, context_lens and rows [B]; got q {tuple(q.shape)}, pools "
                         f"{tuple(k_slots.shape)} and {tuple(v_slots.shape)}, block_tables "
                         f"{tuple(block_tables.shape)}, context_lens {tuple(context_lens.shape)}")
    if {q.dtype, k_slots.dtype, v_slots.dtype} != {torch.float32} or {q.device.type, k_slots.device.type} != {"cpu"}:
        raise ValueError(f"paged_decode_attention_cpu: float32 CPU tensors only; got q {q.dtype} on {q.device}, "
                         f"pools {k_slots.dtype} on {k_slots.device}")
    rows = torch.arange(batch) if rows is None else rows
    blocks = k_slots.shape[0] // block_size
    checks = [("a context length is negative or longer than its block table holds",
               bool(((context_lens < 0) | (context_lens > block_tables.shape[1] * block_size)).any())),
              (f"a block table names a block outside the pool's {blocks}",
               bool(((block_tables < 0) | (block_tables >= blocks)).any())),
              (f"a row is outside q's {tokens}", bool(((rows < 0) | (rows >= tokens)).any()))]
    if k_slots.shape[0] % block_size:
        checks.append((f"the pools' {k_slots.shape[0]} slots are not whole blocks of {block_size}", True))
    for problem, found in checks:
        if found:
            raise ValueError(f"paged_decode_attention_cpu: {problem}")
    out = torch.empty(tokens, heads, d, dtype=torch.float32) if out is None else out
    if not out.is_contiguous() or out.shape != q.shape:
        raise ValueError(f"paged_decode_attention_cpu: out must be contiguous and shaped like q {tuple(q.shape)}, "
                         f"got {tuple(out.shape)}")
    return launch(q, k_slots.contiguous(), v_slots.contiguous(), int32(block_tables), int32(context_lens),
                  int32(rows), block_size, out)


def int32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32).contiguous()


def rows_apart(t: torch.Tensor) -> torch.Tensor:
    """t [rows, heads, d] with each head's d contiguous and the heads d apart (rows may be further apart, as in a
    split of the q/k heads or of the qkv product): as it is, else a contiguous copy."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def launch(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, tables: torch.Tensor,
           lens: torch.Tensor, rows: torch.Tensor, block_size: int, out: torch.Tensor) -> torch.Tensor:
    """The kernel, unchecked: for the engine's own tables (cache/paged.py builds them), every layer of a step.
    tables, lens, rows: contiguous int32; the pools and out contiguous float32. -> out."""
    q = rows_apart(q)
    if tables.shape[0]:
        library().paged_decode_f32(q.data_ptr(), q.stride(0), k_slots.data_ptr(), v_slots.data_ptr(),
                                   tables.data_ptr(), tables.shape[1], lens.data_ptr(), rows.data_ptr(),
                                   out.data_ptr(), tables.shape[0], q.shape[1], k_slots.shape[1], q.shape[2],
                                   block_size, q.shape[2] ** -0.5, torch.get_num_threads())
    return out


def store_and_launch(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, q: torch.Tensor,
                     k_slots: torch.Tensor, v_slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
                     rows: torch.Tensor, block_size: int, out: torch.Tensor) -> torch.Tensor:
    """The step's new K/V (k, v [tokens, kv_heads, d]) written to their slots (slot_mapping: contiguous int64
    [tokens], within the pools), then `launch`, in one call, unchecked as it is. -> out."""
    q, k, v = rows_apart(q), rows_apart(k), rows_apart(v)
    library().paged_store_decode_f32(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), slot_mapping.data_ptr(),
                                     k.shape[0], q.data_ptr(), q.stride(0), k_slots.data_ptr(), v_slots.data_ptr(),
                                     tables.data_ptr(), tables.shape[1], lens.data_ptr(), rows.data_ptr(),
                                     out.data_ptr(), tables.shape[0], q.shape[1], k_slots.shape[1], q.shape[2],
                                     block_size, q.shape[2] ** -0.5, torch.get_num_threads())
    return out
