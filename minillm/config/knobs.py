"""The flat knobs of `LLM(model, **knobs)` and the CLI, and the group field each one sets: the one table
from the front door's names to EngineConfig's groups."""
from minillm.config.cache_config import CacheConfig
from minillm.config.kernel_config import KernelConfig
from minillm.config.parallel_config import ParallelConfig
from minillm.config.scheduler_config import SchedulerConfig

GROUPS = {"cache": CacheConfig, "scheduler": SchedulerConfig, "kernels": KernelConfig, "parallel": ParallelConfig}

KNOBS: dict[str, tuple[str, str]] = {  # knob -> (EngineConfig's group field, the group's field)
    "kv_cache": ("cache", "kind"),
    "block_size": ("cache", "block_size"),
    "num_kv_blocks": ("cache", "num_kv_blocks"),
    "kv_cache_memory": ("cache", "kv_cache_memory"),
    "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "kv_offload": ("cache", "kv_offload"),
    "kv_offload_blocks": ("cache", "kv_offload_blocks"),
    "kv_offload_dir": ("cache", "kv_offload_dir"),
    "scheduler": ("scheduler", "policy"),
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler", "enable_chunked_prefill"),
    "attention_backend": ("kernels", "attention_backend"),
    "cpu_decode_kernel": ("kernels", "cpu_decode_kernel"),
    "cpu_decode_layers": ("kernels", "cpu_decode_layers"),
    "compile_decode": ("kernels", "compile_decode"),
    "profile_attention": ("kernels", "profile_attention"),
    "tensor_parallel_size": ("parallel", "tensor_parallel_size"),
}

# EngineConfig's own fields that are knobs as they are (speculative and quantization take their config).
OWN_KNOBS = ("dtype", "device", "max_model_len", "seed", "speculative", "quantization", "components")
