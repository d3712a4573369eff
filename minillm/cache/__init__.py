"""KV-cache layouts: paged blocks (the default) and contiguous per sequence (the baseline)."""
import torch

from minillm.cache.base import CacheManager
from minillm.cache.contiguous import ContiguousCacheManager
from minillm.cache.paged import PagedCacheManager
from minillm.cache.pool import block_bytes
from minillm.config import CacheKind, EngineConfig
from minillm.models.model_config import ModelConfig

DEFAULT_CPU_KV_MEMORY = 256 * 2**20

__all__ = ["CacheManager", "make_cache_manager", "block_bytes"]


def make_cache_manager(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype,
                       device: torch.device) -> CacheManager:
    """The cache config.cache describes, with the attention paths config.kernels picks."""
    cache, kernels = config.cache, config.kernels
    if cache.kind == CacheKind.CONTIGUOUS:
        return ContiguousCacheManager(cfg, dtype, device)
    per_block = block_bytes(cfg, cache.block_size, dtype)
    num_blocks = cache.num_kv_blocks
    if num_blocks is None:
        memory = cache.kv_cache_memory
        if memory is None:
            memory = torch.cuda.mem_get_info(device)[0] // 2 if device.type == "cuda" else DEFAULT_CPU_KV_MEMORY
        num_blocks = memory // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory of {memory:,} bytes holds no block: one block of "
                             f"{cache.block_size} tokens takes {per_block:,} bytes for this model")
    manager = PagedCacheManager(cfg, num_blocks, cache.block_size, dtype, device, cache.enable_prefix_caching,
                                config.components, kernels.attention_backend,
                                None if kernels.compile_decode else PagedCacheManager.DECODE_GROUP,
                                # tensor-parallel ranks rebuild the gather path's context from what rank 0 sends
                                cpu_decode=kernels.cpu_decode_kernel and config.parallel.tensor_parallel_size == 1,
                                cpu_layers=kernels.cpu_decode_layers)
    if cache.kv_offload is not None:
        manager.offload.attach(cache.kv_offload, cache.kv_offload_blocks, cache.kv_offload_dir)
    return manager
