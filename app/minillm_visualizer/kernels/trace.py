"""Record what a Triton kernel touches: which elements of which buffer each program loads and stores.

The kernel runs for real, in Triton's interpreter, with two of the interpreter's memory operations
wrapped: every masked load and store hands over its addresses (the lanes its mask lets through) and the
program that issued it. Each launch also hands over its arguments, so the buffers are the kernel's own,
named after its parameters (`x_ptr`, `k_ptr`, ...), and an address that lies in none of them is kept as
a stray access: a missing mask would show up there. Nothing here re-derives an access pattern by hand.
"""
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from minillm.kernels.runtime import INTERPRETED

_LOCK = threading.Lock()  # the interpreter's grid position is one global: one recording at a time


@dataclass(frozen=True)
class Buffer:
    """One tensor argument of a launch: `span` elements from address `base` (its storage extent)."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    base: int
    itemsize: int
    span: int


@dataclass
class Access:
    program: int        # the program's number, in the order the interpreter runs the grid
    kind: str           # "load" | "store"
    buffer: str | None  # None: an address outside every buffer of the launch
    index: np.ndarray   # flat element indices into the buffer (raw addresses when buffer is None)


@dataclass
class Launch:
    kernel: str
    buffers: dict[str, Buffer]
    grid: tuple[int, int, int] = (1, 1, 1)
    accesses: list[Access] = field(default_factory=list)

    @property
    def programs(self) -> int:
        return int(np.prod(self.grid))

    def program_id(self, number: int) -> tuple[int, ...]:
        """The (x, y, z) of program `number`, without the axes the grid does not use."""
        _, gy, gz = self.grid
        xyz = (number // (gy * gz), number // gz % gy, number % gz)
        used = max([1] + [axis + 1 for axis in range(3) if self.grid[axis] > 1])
        return xyz[:used]

    def of(self, buffer: str, kind: str | None = None, program: int | None = None) -> list[Access]:
        return [a for a in self.accesses if a.buffer == buffer and (kind is None or a.kind == kind)
                and (program is None or a.program == program)]

    def counts(self, buffer: str, kind: str) -> np.ndarray:
        """How many times each element was loaded (or stored), over every program: [span]."""
        out = np.zeros(self.buffers[buffer].span, dtype=np.int64)
        for a in self.of(buffer, kind):
            np.add.at(out, a.index, 1)
        return out

    def owners(self, buffer: str) -> list[set[int]]:
        """For each element, the programs that loaded or stored it."""
        out = [set() for _ in range(self.buffers[buffer].span)]
        for a in self.of(buffer):
            for i in np.unique(a.index):
                out[i].add(a.program)
        return out

    def footprint(self, buffer: str, program: int, kind: str | None = None) -> np.ndarray:
        """The elements one program touched, sorted, each once."""
        hits = [a.index for a in self.of(buffer, kind, program)]
        return np.unique(np.concatenate(hits)) if hits else np.zeros(0, dtype=np.int64)

    def strays(self) -> list[Access]:
        return [a for a in self.accesses if a.buffer is None]


def _buffers(arg_names: list[str], args: tuple, kwargs: dict) -> dict[str, Buffer]:
    """The launch's tensor arguments by parameter name; one passed twice (a placeholder) keeps its first name."""
    out, seen = {}, set()
    for name, arg in [*zip(arg_names, args), *kwargs.items()]:
        if not isinstance(arg, torch.Tensor) or arg.data_ptr() in seen:
            continue
        seen.add(arg.data_ptr())
        span = 1 + sum((size - 1) * stride for size, stride in zip(arg.shape, arg.stride())) if arg.numel() else 0
        out[name] = Buffer(name, tuple(arg.shape), str(arg.dtype).removeprefix("torch."), arg.data_ptr(),
                           arg.element_size(), span)
    return out


def _locate(launch: Launch, addresses: np.ndarray) -> list[tuple[str | None, np.ndarray]]:
    """Split addresses by the buffer they fall in: [(name, element indices)], then (None, the rest)."""
    addresses = addresses.astype(np.int64).ravel()
    left = np.ones(addresses.shape, dtype=bool)
    out = []
    for b in launch.buffers.values():
        offset = addresses - b.base
        inside = left & (offset >= 0) & (offset < b.span * b.itemsize) & (offset % b.itemsize == 0)
        if inside.any():
            out.append((b.name, offset[inside] // b.itemsize))
            left &= ~inside
    if left.any():
        out.append((None, addresses[left]))
    return out


def record(run: Callable[[], object]) -> tuple[object, list[Launch]]:
    """Call run() (which launches one or more kernels) and record every launch. -> (run's result, launches)"""
    if not INTERPRETED:
        raise RuntimeError("accesses are recorded in Triton's interpreter, and here the kernels are compiled for the "
                           "GPU: start the app with TRITON_INTERPRET=1 to record them")
    from triton.runtime import interpreter  # after minillm.kernels.runtime has chosen the interpreter
    builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
    launches: list[Launch] = []
    real_load, real_store, real_call = builder.create_masked_load, builder.create_masked_store, executor.__call__

    def note(kind: str, ptrs, mask) -> None:
        launch = launches[-1]
        launch.grid = tuple(builder.grid_dim)
        x, y, z = builder.grid_idx
        program = (x * launch.grid[1] + y) * launch.grid[2] + z
        through = np.broadcast_to(mask.data, ptrs.data.shape)
        for name, index in _locate(launch, ptrs.data[through]):
            launch.accesses.append(Access(program, kind, name, index))

    def load(ptrs, mask, other, cache_policy, is_volatile):
        note("load", ptrs, mask)
        return real_load(ptrs, mask, other, cache_policy, is_volatile)

    def store(ptrs, value, mask, cache_policy):
        note("store", ptrs, mask)
        return real_store(ptrs, value, mask, cache_policy)

    def call(self, *args, **kwargs):
        launches.append(Launch(self.fn.__name__, _buffers(self.arg_names, args, kwargs)))
        return real_call(self, *args, **kwargs)

    with _LOCK:
        builder.create_masked_load, builder.create_masked_store, executor.__call__ = load, store, call
        try:
            result = run()
        finally:
            del builder.create_masked_load, builder.create_masked_store
            executor.__call__ = real_call
    return result, launches
