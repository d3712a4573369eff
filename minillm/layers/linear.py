"""The model's linear layers: nn.Linear, with faster CPU paths for products of a few rows.

A decode step of B sequences multiplies a [B, in] activation by every weight matrix. On a CPU, a
general matrix product (sgemm) repacks the weight into cache-sized panels on every call; with one
row it takes a matrix-vector path instead, and with hundreds of rows the repacking is paid back
many times over. With 2 to a few dozen rows it is neither: the repacking streams the weight a
second time, and a step of 8 sequences took more than twice as long as one of a single sequence,
although it reads the same weights.

So, on a CPU in float32, without gradients and outside torch.compile:
* 1 to 32 rows (decode at a small batch, speculative verification) take a C++ product (layers/cpu_ops.py) where
  the compiler builds it (`few_rows`, the loader decides). With AVX-512 it reads a copy of the weight in panels of
  16 rows stored column by column (`few_rows_weight`, made once; models/huge_pages.py puts the copies in huge pages),
  each weight once for up to 31 rows of x; elsewhere the weight itself, three rows at a time, each multiplied with
  every row of x. A pass over SmolLM2-135M's 120 layer matrices, one core of the 2-core Intel Xeon, ms, panels against
  the rows (interleaved): 26.7 / 26.2 at 1 row, 28.3 / 29.7 at 4, 31.8 / 31.7 at 8, 37.0 / 45.8 at 16, 50.4 / 76.7 at
  24; at 33 and 48 rows (two passes over a panel) 53.0 and 73.8 against oneDNN's packed copy's 67.3 and 85.7, level
  at 64. The rows, against the packed copy, an earlier evening: 26, 30, 29, 35 and 51 ms at 1, 2, 4, 8 and 16 rows
  against 34, 29-34, 48, 44 and 55-57. On the 2-core AMD EPYC (an earlier version, one weight row at a time, in huge
  pages): 20.9, 25.9 and 30.9 at 1, 2 and 4 rows against the packed copy's 45.5, 49.4 and 34.1, and 26.5 for
  F.linear at one row (31.6 without huge pages).
* 33 to MAX_PACKED_ROWS rows (batched decode, longer verification, short prefills; from 2 rows where there is no
  C++ product) use a copy of the weight that oneDNN has packed once into its own blocked layout (what
  torch.compile's CPU backend does for frozen weights), and never repack it.
  Measured on the project's 2-core Intel Xeon against F.linear: at 4 rows 56 -> 37, at 8 rows 75 -> 45, at 16
  rows 90 -> 58; from 64 rows on the two are level. The packed copy is made on the first call that needs it and
  made again if the weight changes; it costs as much memory again as the weight.
* Where the C++ product does not build, one row takes F.linear on weights the loader stores column by column
  (models/prepare.py), or the packed copy where it measured faster once a process (packed_wins_at_one_row: on
  the AMD EPYC by 1.41x, on the Intel Xeon not).

The results equal F.linear's within float32 rounding (a different summation order). The packed copy pays only
where the weights stream from memory: a model whose weights sit in the CPU's caches, like the bundled tiny
(23 MB), repacks them cheaply, and there it was slower (a step of 4 sequences 2.9 -> 3.7 ms); so the loader
turns it on (`packed = True`) only for models of PACKED_MIN_MODEL_BYTES or more.
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
    few_rows = False  # whether 1-32 rows take the C++ product, cpu_ops.product (load_model decides: cpu_paths)
    packed = False  # whether products of 2-MAX_PACKED_ROWS rows may use the packed copy (the loader decides)
    packed_one_row = False  # whether one row may too (without few_rows, where the packed copy measured faster)
    _packed: tuple[torch.Tensor, int, int] | None = None  # (oneDNN weight, weight's data_ptr, its _version)
    _few_rows_weight: tuple[torch.Tensor, int, int] | None = None  # (cpu_ops.pack's copy, data_ptr, _version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, in_features] (or [..., in_features]) -> [rows, out_features]"""
        # The parameters from their dict: nn.Module's attribute lookup costs half a microsecond each
        params = self._parameters
        if (self.few_rows and x.ndim == 2 and 1 <= x.shape[0] <= cpu_ops.MAX_ROWS and x.is_contiguous()
                and cpu_ops.applies(x)):
            weight = params["weight"]
            if weight.dtype == torch.float32 and weight.is_contiguous() and weight.shape[1] == x.shape[1]:
                # what cpu_ops.linear checks, checked
                return cpu_ops.product(x, self.few_rows_weight(), params["bias"], weight.shape[0])
        fewest = 1 if self.packed_one_row else 2
        if self.packed and x.ndim == 2 and fewest <= x.shape[0] <= MAX_PACKED_ROWS and self._packable(x):
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), params["bias"], "none", [], "")
        return F.linear(x, params["weight"], params["bias"])

    def __getstate__(self) -> dict:
        # copy.deepcopy and pickle go through here: the packed copy is an opaque oneDNN tensor that neither can
        # copy, and a copy repacks from its own weight when it needs to.
        state = self.__dict__.copy()
        state.pop("_packed", None)
        state.pop("_few_rows_weight", None)  # the C++ product's copy, made again where it is needed
        return state

    def few_rows_weight(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight as the C++ product reads it (cpu_ops.pack): the weight itself, or its copy in panels (with
        AVX-512), made on the first call that needs it and made again if the weight changes. out: memory to make it
        in (models/huge_pages.py gives it huge pages)."""
        w = self._parameters["weight"]
        if not cpu_ops.panel():  # the library's layout, fixed for the process
            return w
        version = 0 if w.is_inference() else w._version  # a weight made in inference mode has no version count
        kept = self._few_rows_weight
        if kept is None or out is not None or kept[1] != w.data_ptr() or kept[2] != version:
            self._few_rows_weight = kept = (cpu_ops.pack(w.detach(), out), w.data_ptr(), version)
        return kept[0]

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
    """load_model's choices for a CPU model's Linears (see the top of this file): 1-32 rows through the C++ product
    where the library builds, 2-48 rows through the packed copy where the model streams from memory, and one row
    through the packed copy too where there is no C++ product and this CPU runs it faster.
    -> whether the C++ product is on, which reads each weight stored row by row (else the loader stores them column
    by column, for F.linear)."""
    big, few_rows = streamed(model), cpu_ops.library() is not None
    one_row = big and not few_rows and packed_wins_at_one_row()
    for module in model.modules():
        if isinstance(module, Linear):
            module.few_rows, module.packed, module.packed_one_row = few_rows, big, one_row
    return few_rows
