"""EngineConfig: the engine's settings, grouped by concern, each group checked when it is built and the
checks that span groups run here once.

    EngineConfig.from_knobs("tiny", block_size=32, scheduler="static")        the flat knobs LLM(...) takes
    EngineConfig("tiny", cache=CacheConfig(block_size=32), scheduler=SchedulerConfig("static"))   the same
"""
from dataclasses import dataclass, field

import torch

from minillm.config.cache_config import CacheConfig, CacheKind
from minillm.config.components import Components
from minillm.config.kernel_config import KernelConfig
from minillm.config.knobs import GROUPS, KNOBS, OWN_KNOBS
from minillm.config.parallel_config import ParallelConfig
from minillm.config.scheduler_config import SchedulerConfig
from minillm.config.speculative_config import SELF_DRAFT, SpeculativeConfig
from minillm.models.registry import DEFAULT_MODEL
from minillm.quant.quant_config import QuantConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    """Every setting of the engine, each a plain constructor argument (so two configurations can run side by
    side). A bad value or a combination the engine cannot run raises ValueError (TypeError for a wrong
    config type) naming it and what is accepted. `LLM(model, **knobs)` builds one with `from_knobs`;
    docs/engine.md says why each setting is there."""

    model: str = DEFAULT_MODEL
    """A bundled model name or a Hugging Face model directory."""

    dtype: str = "auto"
    """float32, bfloat16 or float16. auto: float32 on a CPU, bfloat16 on CUDA."""

    device: str = "auto"
    """cpu, cuda or cuda:N. auto: cuda when torch sees a GPU, else cpu."""

    max_model_len: int | None = None
    """The longest prompt + output a request may reach. None: the model's max_position_embeddings."""

    seed: int = 0
    """Seeds the requests that give no seed of their own."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    """The KV cache: its layout, pool size, prefix caching and offload tier."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """The scheduling policy and the step's limits."""

    kernels: KernelConfig = field(default_factory=KernelConfig)
    """The attention backend, the CPU decode paths, compilation and attention timing."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Tensor parallelism."""

    speculative: SpeculativeConfig | None = None
    """Speculative decoding. None: one token per sequence per step."""

    quantization: QuantConfig | None = None
    """Weight-only quantization. None: the checkpoint's own weights."""

    components: Components = field(default_factory=Components)
    """Replacements for the engine's parts; the default replaces none."""

    @classmethod
    def from_knobs(cls, model: str | None = None, **knobs) -> "EngineConfig":
        """The config the flat knobs describe (knobs.py's table says which group each one sets):
        `from_knobs("tiny", block_size=32)` sets cache.block_size. model None: the default model."""
        unknown = [name for name in knobs if name not in KNOBS and name not in OWN_KNOBS]
        if unknown:
            raise TypeError(f"unknown engine knob{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}: the "
                            f"knobs are {', '.join(['model', *OWN_KNOBS, *KNOBS])}")
        grouped: dict[str, dict] = {group: {} for group in GROUPS}
        for name, value in knobs.items():
            if name in KNOBS:
                group, setting = KNOBS[name]
                grouped[group][setting] = value
        own = {name: value for name, value in knobs.items() if name in OWN_KNOBS}
        return cls(model=model or DEFAULT_MODEL, **own,
                   **{group: GROUPS[group](**settings) for group, settings in grouped.items()})

    def __post_init__(self) -> None:
        self.model = str(self.model)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}") from None
            if self.torch_device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device {self.device!r} was asked for, but torch sees no CUDA GPU")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}")
        for name, kind in (*((group, GROUPS[group]) for group in GROUPS), ("components", Components)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name} must be a minillm.config.{kind.__name__}, "
                                f"got {type(getattr(self, name)).__name__}")
        for name, kind in (("speculative", SpeculativeConfig), ("quantization", QuantConfig)):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name} must be a minillm.{kind.__name__} or None, "
                                f"got {type(getattr(self, name)).__name__}")
        self._check_triton()
        self._check_tensor_parallel()
        self._check_compile()
        self._check_self_draft()
        if self.components.paged_decode is not None and self.kernels.attention_backend != "triton":
            raise ValueError("components.paged_decode is a Triton kernel's launcher: it runs only with "
                             f"attention_backend='triton', got {self.kernels.attention_backend!r}")

    def _check_triton(self) -> None:
        if self.kernels.attention_backend != "triton":
            return
        if self.cache.kind != CacheKind.PAGED:
            raise ValueError(f"attention_backend 'triton' reads K/V in place in the paged pool: it needs "
                             f"kv_cache='paged', got {self.cache.kind.value!r}")
        if self.torch_device.type == "cpu" and self.torch_dtype == torch.bfloat16:
            raise ValueError("attention_backend 'triton' on the CPU runs in Triton's interpreter, which has no "
                             "bfloat16 arithmetic: use dtype 'float32' or 'float16' there")

    def _check_tensor_parallel(self) -> None:
        tp = self.parallel.tensor_parallel_size
        if tp == 1:
            return
        # Each rank's shard must see the same attention inputs: only the paged torch context is broadcast,
        # and a tier or a quantized layer would hold (or cut) rank 0's weights and K/V alone.
        unsupported = {"device": (self.torch_device.type, "cpu"), "kv_cache": (self.cache.kind.value, "paged"),
                       "attention_backend": (self.kernels.attention_backend, "torch"),
                       "kv_offload": (self.cache.kv_offload, None), "quantization": (self.quantization, None)}
        for name, (value, accepted) in unsupported.items():
            if value != accepted:
                raise ValueError(f"tensor_parallel_size {tp} runs with {name}={accepted!r} only (gloo on CPU, the "
                                 f"paged torch attention, full-precision weights), got {name}={value!r}")

    def _check_compile(self) -> None:
        if not self.kernels.compile_decode:
            return
        # The compiled step is the paged torch attention over the model's own layers, in one process.
        needs = {"kv_cache": (self.cache.kind.value, "paged"),
                 "attention_backend": (self.kernels.attention_backend, "torch"),
                 "tensor_parallel_size": (self.parallel.tensor_parallel_size, 1),
                 "quantization": (self.quantization, None)}
        for name, (value, accepted) in needs.items():
            if value != accepted:
                raise ValueError(f"compile_decode runs with {name}={accepted!r} only (the paged torch attention "
                                 f"over full-precision weights, in one process), got {name}={value!r}")

    def _check_self_draft(self) -> None:
        spec = self.speculative
        if spec is None or spec.method != "draft" or spec.draft_model != SELF_DRAFT:
            return
        if self.quantization is not None:
            raise ValueError(f"draft_model 'self' quantizes the target's full-precision weights, but the target "
                             f"is quantized ({self.quantization.label()}): leave quantization None, or draft "
                             f"with another model")
        if self.parallel.tensor_parallel_size != 1:
            raise ValueError(f"draft_model 'self' copies the target's layers in this process: it runs with "
                             f"tensor_parallel_size=1 only, got {self.parallel.tensor_parallel_size}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]
