"""KernelConfig: which code runs attention and the decode step (the output is the same either way)."""
import importlib.util
from dataclasses import dataclass

ATTENTION_BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class KernelConfig:
    """The attention backend, the CPU decode paths, compilation and attention timing. Each flat knob is
    its field's name."""

    attention_backend: str = "torch"
    """torch: PyTorch's attention over gathered blocks; triton: the Triton kernels of minillm/kernels/, which
    read K/V in place through the block tables (paged cache only)."""

    cpu_decode_kernel: bool = True
    """Torch backend, CPU, float32: decode rows read the paged pool in place through a C++ kernel."""

    cpu_decode_layers: bool = True
    """With that kernel, a decode step of a few rows runs each decoder layer as one C++ call."""

    compile_decode: bool = False
    """Run decode steps through torch.compile (engine/compiled.py): the first one waits minutes to compile."""

    profile_attention: bool = False
    """Time attention apart in each step (a clock read per layer, so off by default)."""

    def __post_init__(self) -> None:
        for name in ("cpu_decode_kernel", "cpu_decode_layers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.compile_decode, bool):
            raise ValueError(f"compile_decode must be True or False, got {self.compile_decode!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if self.attention_backend == "triton" and importlib.util.find_spec("triton") is None:
            raise ValueError("attention_backend 'triton' needs the triton package (Linux only): "
                             "pip install -e '.[triton]', or use attention_backend='torch'")
