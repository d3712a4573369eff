"""KV-cache layouts: paged blocks (the default) and contiguous per sequence (the baseline)."""
import torch

from minillm.cache.contiguous import ContiguousCacheManager
from minillm.cache.paged import PagedCacheManager, block_bytes
from minillm.config import EngineConfig
from minillm.models.config import ModelConfig

DEFAULT_CPU_KV_MEMORY = 256 * 2**20


def make_cache_manager(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype, device: torch.device):
    if config.kv_cache == "contiguous":
        return ContiguousCacheManager(cfg, dtype, device)
    per_block = block_bytes(cfg, config.block_size, dtype)
    num_blocks = config.num_kv_blocks
    if num_blocks is None:
        memory = config.kv_cache_memory
        if memory is None:
            memory = torch.cuda.mem_get_info(device)[0] // 2 if device.type == "cuda" else DEFAULT_CPU_KV_MEMORY
        num_blocks = memory // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory of {memory:,} bytes holds no block: one block of "
                             f"{config.block_size} tokens takes {per_block:,} bytes for this model")
    return PagedCacheManager(cfg, num_blocks, config.block_size, dtype, device, config.enable_prefix_caching)
