"""The engine's settings: EngineConfig composes one group per concern (cache, scheduler, kernels,
parallelism, speculation, quantization); knobs.py maps the flat knobs of `LLM(model, **knobs)` to them.

`Components` swaps parts of the engine for other implementations of the same interface (the labs'
parts run inside the real engine through it).
"""
from minillm.config.cache_config import OFFLOAD_KINDS, CacheConfig, CacheKind
from minillm.config.components import Components
from minillm.config.engine_config import DTYPES, EngineConfig
from minillm.config.kernel_config import ATTENTION_BACKENDS, KernelConfig
from minillm.config.knobs import KNOBS
from minillm.config.parallel_config import ParallelConfig
from minillm.config.scheduler_config import SchedulerConfig, SchedulerPolicy
from minillm.config.speculative_config import SELF_DRAFT, SPEC_METHODS, SpeculativeConfig
from minillm.quant.quant_config import QuantConfig

__all__ = ["ATTENTION_BACKENDS", "DTYPES", "KNOBS", "OFFLOAD_KINDS", "SELF_DRAFT", "SPEC_METHODS", "CacheConfig",
           "CacheKind", "Components", "EngineConfig", "KernelConfig", "ParallelConfig", "QuantConfig",
           "SchedulerConfig", "SchedulerPolicy", "SpeculativeConfig"]
