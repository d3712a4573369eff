"""A model's weights in huge pages: one allocation the operating system is asked to back with 2 MiB pages.

Decode streams every weight from memory once a token. Memory is mapped page by page, and the CPU keeps the
recent translations from virtual to physical addresses in a small cache, the TLB. With the usual 4 KiB pages,
streaming SmolLM2-135M's 540 MB of float32 weights crosses 132,000 pages a token, and nearly every one costs a walk
of the page tables; with 2 MiB pages, 258. Measured over SmolLM2's matrices on one core of the 2-core AMD EPYC, ms
for a pass over all of them at one row: torch's F.linear 31.6 -> 26.5, the C++ few-row product of
layers/cpu_ops.py 24.9 -> 16.8 (32 GB/s). (llama.cpp gets the same from its file mapping, which Linux backs
with huge pages where it can.)

Linux gives anonymous memory huge pages where a program asks for them with madvise(MADV_HUGEPAGE) (the setting
/sys/kernel/mm/transparent_hugepage/enabled is `madvise` or `always`). `to_huge_pages` makes one allocation,
asks, and copies every parameter and buffer of the model into it, tensor by tensor (each keeps its shape, strides
and values; a weight tied to another stays tied). Elsewhere, or where the system refuses, the model is left as it
is: the pages are a speed-up, never a requirement.
"""
import ctypes
import ctypes.util

import torch

from minillm.layers import cpu_ops
from minillm.layers.linear import Linear

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h
ALIGN = 64          # bytes: each tensor starts on a cache line

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if ctypes.util.find_library("c") else None
_MADVISE = getattr(_LIBC, "madvise", None)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only
if _MADVISE is not None:
    _MADVISE.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def huge_buffer(nbytes: int) -> tuple[torch.Tensor, int] | None:
    """(a uint8 tensor holding nbytes from a 2 MiB boundary, that boundary's offset in it), the range advised for
    huge pages; None where madvise is missing or refuses. The pages are not touched yet: the kernel gives them
    on first write, huge where it can."""
    if _MADVISE is None:
        return None
    length = (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    buffer = torch.empty(length + HUGE_PAGE, dtype=torch.uint8)
    offset = -buffer.data_ptr() % HUGE_PAGE
    if _MADVISE(buffer.data_ptr() + offset, length, MADV_HUGEPAGE) != 0:
        return None
    return buffer, offset


def dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill a block of numel() elements, each once, in some order of its dimensions
    (contiguous, or a transpose of contiguous like the loader's column-major weights)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def to_huge_pages(model: torch.nn.Module) -> bool:
    """Move every CPU parameter and buffer of `model` (dense ones; each once, however many modules share it) into
    one allocation advised for huge pages, and make the C++ product's panel copies of its Linears' weights in
    another (`pack_few_rows_weights`). -> whether it moved them."""
    tensors: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type == "cpu" and t.numel() and dense(t):
            tensors.setdefault(id(t), t)
    sizes = {key: -(-t.numel() * t.element_size() // ALIGN) * ALIGN for key, t in tensors.items()}
    advised = huge_buffer(sum(sizes.values()))
    if advised is None:
        return False
    buffer, start = advised
    moved = {}
    with torch.no_grad():
        for key, t in tensors.items():
            flat = buffer[start:start + t.numel() * t.element_size()].view(t.dtype)
            start += sizes[key]
            moved[key] = flat.as_strided(t.shape, t.stride())  # t's strides: a column-major weight stays one
            moved[key].copy_(t)
            if isinstance(t, torch.nn.Parameter):
                t.data = moved[key]  # one Parameter object: every module tied to it sees the move
    for module in model.modules():
        for name, b in module._buffers.items():
            if b is not None and id(b) in moved:
                module._buffers[name] = moved[id(b)]
    del tensors, moved
    pack_few_rows_weights(model)
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)  # the old copies' pages back to the system (glibc keeps freed heap pages otherwise)
    return True


def pack_few_rows_weights(model: torch.nn.Module) -> bool:
    """Where the C++ product reads weights in panels (a copy of each, layers/cpu_ops.py `pack`), make those copies
    now, in one more allocation advised for huge pages: decode streams them instead of the weights. Each weight
    once (a tied one serves both its modules). -> whether it did."""
    width = cpu_ops.panel() if cpu_ops.library() is not None else 0
    if not width:
        return False
    weights: dict[int, tuple[torch.Tensor, list[Linear]]] = {}
    for m in model.modules():
        w = m._parameters.get("weight") if type(m) is Linear else None
        if w is not None and m.few_rows and w.device.type == "cpu" and w.dtype == torch.float32 and w.is_contiguous():
            weights.setdefault(id(w), (w, []))[1].append(m)
    sizes = {key: -(-w.shape[0] // width) * width * w.shape[1] * 4 for key, (w, _) in weights.items()}  # bytes
    advised = huge_buffer(sum(-(-size // ALIGN) * ALIGN for size in sizes.values())) if weights else None
    if advised is None:
        return False
    buffer, start = advised
    with torch.no_grad():
        for key, (_, modules) in weights.items():
            out = buffer[start:start + sizes[key]].view(torch.float32)
            start += -(-sizes[key] // ALIGN) * ALIGN
            modules[0].few_rows_weight(out)
            for m in modules[1:]:
                m._few_rows_weight = modules[0]._few_rows_weight
    return True
