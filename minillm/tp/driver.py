"""TensorParallelDriver: rank 0's model. The engine calls it like any model; each forward first
hands the step to the workers, then runs rank 0's own shard, in lockstep with theirs.

The engine is unchanged around it: the scheduler, the runner and the sampler run in this process
only, as with one rank. What the workers need of a step is its tokens and what attention reads:

    input_ids, positions          [num_tokens]
    slot mapping                  [num_tokens]: where each new token's K/V go in the pool
    block tables, lengths         per sequence (the paged context's decode groups and prefills)

Block ids are the same on every rank (one BlockManager, on rank 0, decides them); only the
contents differ: rank r's pool holds its kv heads of every block. All ranks end the forward with
the same hidden states (each layer ends in an all-reduce), and only rank 0 computes logits.
"""
import weakref

import torch
from torch import nn

from minillm.cache.paged import PagedContext
from minillm.cache.pool import PagedKVPool
from minillm.config import EngineConfig
from minillm.tp.comm import AllReduceMeter
from minillm.tp.tp_model import shard_model, tp_config
from minillm.tp.workers import WorkerGroup

MIRRORED_POOL_OPS = ("zero_blocks", "copy_block")  # what the scheduler does to a pool between forwards


class TensorParallelDriver(nn.Module):
    def __init__(self, model: nn.Module, model_dir, config: EngineConfig) -> None:
        """model: the whole model, loaded (not changed: rank 0 keeps its shard of it)."""
        super().__init__()
        world = config.parallel.tensor_parallel_size
        tp_config(model.config, world)  # a size that does not divide the heads fails before any process starts
        self.all_reduce = AllReduceMeter()
        self.shard = shard_model(model, 0, world, self.all_reduce)
        self.config = self.shard.config  # per-rank head counts: the engine's KV pool is rank 0's shard
        self.world, self.dtype = world, config.torch_dtype
        self.workers = WorkerGroup(world, str(model_dir), self.dtype)
        self.all_reduce.group = self.workers.step_group
        self._pool_ops: list[tuple[str, tuple]] = []
        weakref.finalize(self, self.workers.stop)  # workers exit with the engine, or at interpreter exit

    @property
    def lm_head(self) -> nn.Module:
        return self.shard.lm_head  # replicated: the speculative heads share it as with one rank

    def attach_pool(self, pool: PagedKVPool) -> None:
        """Give every worker a pool of the same geometry (its own kv heads), and have it repeat the
        changes the scheduler makes to rank 0's pool outside the forward: zeroing blocks handed out,
        copy-on-write of a shared block. Each is replayed, in order, before the next step's forward,
        so block b holds the same tokens' K/V on every rank."""
        self.workers.send({"kind": "pool", "num_blocks": pool.pad_block, "block_size": pool.block_size})
        for name in MIRRORED_POOL_OPS:
            setattr(pool, name, self._recorded(name, getattr(pool, name)))

    def _recorded(self, name: str, method):
        def record(*args):
            self._pool_ops.append((name, args))
            return method(*args)
        return record

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx=None) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden [num_tokens, hidden], the same on every rank."""
        paged = getattr(ctx, "inner", ctx)  # the runner wraps the context in a timer when profiling
        if paged is not None and not isinstance(paged, PagedContext):
            raise ValueError(f"tensor parallelism needs the paged KV cache's context, got {type(paged).__name__}")
        context = None if paged is None else (paged.slot_mapping, paged.decode_groups, paged.prefills)
        message = {"kind": "step", "input_ids": input_ids, "positions": positions,
                   "pool_ops": self._pool_ops, "context": context}
        self._pool_ops = []
        try:
            self.workers.send(message)
            hidden = self.shard(input_ids, positions, ctx)  # [num_tokens, hidden]
        except RuntimeError as e:  # a dead worker shows up as a gloo error: "Connection closed by peer"
            self.workers.raise_if_dead("during a step", grace=2.0)
            self.workers.stop(f"a step failed on rank 0: {e}")  # the ranks are out of step now
            raise
        self.all_reduce.tokens += input_ids.numel()
        self.all_reduce.steps += 1
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [n, hidden] -> logits [n, vocab], on rank 0 only (the LM head is replicated)."""
        return self.shard.compute_logits(hidden)

    def communication(self) -> dict:
        """The all-reduces so far, measured and by formula (comm.py)."""
        return self.all_reduce.summary(self.shard.config, self.dtype.itemsize, self.world)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.workers.procs]

    def shutdown(self) -> None:
        """Stop the workers now (also done when the driver is garbage collected or the interpreter exits)."""
        self.workers.stop()
