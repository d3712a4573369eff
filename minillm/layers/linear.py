"""The model's linear layers: nn.Linear, with a faster CPU path for products of a few rows.

A decode step of B sequences multiplies a [B, in] activation by every weight matrix. On a CPU, a
general matrix product (sgemm) repacks the weight into cache-sized panels on every call; with one
row it takes a matrix-vector path instead, and with hundreds of rows the repacking is paid back
many times over. With 2 to a few dozen rows it is neither: the repacking streams the weight a
second time, and a step of 8 sequences took more than twice as long as one of a single sequence,
although it reads the same weights.

So, on a CPU in float32, products of 2 to MAX_PACKED_ROWS rows (batched decode, speculative
verification of a few draft tokens, short prefills) use a copy of the weight that oneDNN has packed
once into its own blocked layout (what torch.compile's CPU backend does for frozen weights), and
never repack it. Anything with gradients (training) or under torch.compile keeps the plain weight.

One row (single-stream decode) depends on the CPU. The loader stores the plain weight column by column
(models/loader.py), and on the Intel Xeon below that matrix-vector product beat the packed copy; on a
2-core AMD EPYC the packed copy won by 1.41x over SmolLM2's matrices (20.6 against 28.9 ms a pass, one
thread). So the loader measures it once a process (packed_wins_at_one_row) and lets one row take the
packed copy where it wins. The packed copy is made on the first call that
needs it and made again if the weight changes; a model that only ever decodes one sequence never
holds it. It costs as much memory again as the weight.

Measured on this project's 2-core Intel Xeon, one thread, SmolLM2-135M's matrices (540 MB in all),
milliseconds per pass over every matrix: at 4 rows 56 -> 37, at 8 rows 75 -> 45, at 16 rows 90 -> 58;
at 1 row the plain weight wins (31 against 45); from 64 rows on the two are level.
The results equal F.linear's within float32 rounding (a different summation order).

It pays only where the weights stream from memory. A model whose weights sit in the CPU's caches, like the
bundled tiny (23 MB), repacks them cheaply, and there the packed path was slower (a step of 4 sequences
2.9 -> 3.7 ms); so the loader turns it on (`packed = True`) only for models of PACKED_MIN_MODEL_BYTES or more.
"""
import functools
import time

import torch
import torch.nn.functional as F
from torch import nn

from minillm.layers import cpu_ops

MAX_PACKED_ROWS = 48
PACKED_MIN_MODEL_BYTES = 100 * 2**20  # SmolLM2-135M's float32 weights are 540 MB, tiny's 23 MB


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available()


class Linear(nn.Linear):
    matvec = False  # whether one row takes the C++ matrix-vector product (the loader decides: cpu_paths)
    packed = False  # whether products of 2-MAX_PACKED_ROWS rows may use the packed copy (the loader decides)
    packed_one_row = False  # whether one row may too (where there is no matvec and the packed copy measured faster)
    _packed: tuple[torch.Tensor, int, int] | None = None  # (oneDNN weight, weight's data_ptr, its _version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, in_features] (or [..., in_features]) -> [rows, out_features]"""
        if self.matvec and x.dim() == 2 and x.shape[0] == 1 and cpu_ops.applies(x):
            weight = self.weight
            if weight.dtype == torch.float32 and weight.is_contiguous():
                return cpu_ops.matvec(x, weight, self.bias)
        fewest = 1 if self.packed_one_row else 2
        if self.packed and x.dim() == 2 and fewest <= x.shape[0] <= MAX_PACKED_ROWS and self._packable(x):
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def __getstate__(self) -> dict:
        # copy.deepcopy and pickle go through here: the packed copy is an opaque oneDNN tensor that neither can
        # copy, and a copy repacks from its own weight when it needs to.
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def _packable(self, x: torch.Tensor) -> bool:
        w = self.weight
        return (w.device.type == "cpu" and w.dtype == torch.float32 and x.dtype == torch.float32
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling() and onednn_available())

    def _packed_weight(self) -> torch.Tensor:
        w = self.weight
        version = 0 if w.is_inference() else w._version  # a weight made in inference mode has no version count
        packed = self._packed
        if packed is None or packed[1] != w.data_ptr() or packed[2] != version:
            # Blocked as oneDNN chooses for 16 rows; the packed weight serves any row count.
            self._packed = packed = (torch.ops.mkldnn._reorder_linear_weight(w.detach(), 16), w.data_ptr(), version)
        return packed[0]


@functools.cache
def packed_wins_at_one_row() -> bool:
    """Whether on this CPU, at torch's thread count now, one row times a weight that streams from memory (64 MB)
    is faster through oneDNN's packed copy than through the loader's column-major weight: by 10% or better, the
    best of five tries each, interleaved. Measured once a process (about a fifth of a second)."""
    if not onednn_available():
        return False
    with torch.inference_mode():
        plain = torch.full((2048, 8192), 0.5).t()  # [out, in], stored column by column as the loader does
        packed = torch.ops.mkldnn._reorder_linear_weight(plain, 16)
        x = torch.full((1, 2048), 0.25)
        tries = {"plain": lambda: F.linear(x, plain),
                 "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")}
        best = dict.fromkeys(tries, float("inf"))
        for _ in range(5):
            for name, product in tries.items():
                start = time.perf_counter()
                product()
                best[name] = min(best[name], time.perf_counter() - start)
    return best["packed"] < 0.9 * best["plain"]


def streamed(model: nn.Module) -> bool:
    """Whether the model's weights are too big for the CPU's caches (PACKED_MIN_MODEL_BYTES or more; a quantized
    model's codes are buffers)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) >= PACKED_MIN_MODEL_BYTES


def cpu_paths(model: nn.Module) -> bool:
    """The loader's choices for a CPU model's Linears (see the top of this file): one row through the C++
    matrix-vector product where the library builds, 2-48 rows through the packed copy where the model streams from
    memory, and one row through the packed copy too where there is no matvec and this CPU runs it faster.
    -> whether one row takes the matvec, which wants each weight stored row by row (else the loader stores them
    column by column, for F.linear)."""
    big, matvec = streamed(model), cpu_ops.library() is not None
    one_row = big and not matvec and packed_wins_at_one_row()
    for module in model.modules():
        if isinstance(module, Linear):
            module.matvec, module.packed, module.packed_one_row = matvec, big, one_row
    return matvec
