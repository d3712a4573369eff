"""The model runner: turns the scheduler's decision into tensors, runs the model, returns logits.

A step's sequences are flattened into one batch without padding: the tokens of every sequence
back to back in `input_ids`, each with its absolute `positions`; the cache's AttentionContext
records how many tokens belong to each sequence.
"""
import time

import torch

from minillm.cache.base import CacheManager
from minillm.engine.compiled import CompiledDecode
from minillm.layers.attention import AttentionContext
from minillm.step import ScheduledSeq


class ModelRunner:
    """Runs one step's batch through the model: prepare() flattens it into input_ids and positions,
    execute() runs the forward with the cache's AttentionContext and returns the sampling rows' logits."""
    def __init__(self, model: torch.nn.Module, cache: CacheManager, device: torch.device,
                 time_attention: bool = False, compile_decode: bool = False) -> None:
        self.model, self.cache, self.device = model, cache, device
        # The forward each step runs: the model, or the model compiled for decode steps (engine/compiled.py).
        self.forward = CompiledDecode(model, cache.pool) if compile_decode else model
        self.time_attention = time_attention
        self.last_timings: dict[str, float] = {}  # seconds of the latest execute(): prepare, model, attention
        self.last_hidden: torch.Tensor | None = None  # [rows, hidden] of the latest execute()

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """-> input_ids [num_tokens], positions [num_tokens], the rows whose logits the step needs
        (each sampling sequence's last token, or every verified position of a speculating one)."""
        ids, positions, rows = [], [], []
        for item in batch:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_tokens
            tokens = seq.token_ids[start:start + n]
            ids.extend(tokens + seq.spec_tokens[:n - len(tokens)])  # proposals come after the verified tokens
            positions.extend(range(start, start + n))
            rows.extend(range(len(ids) - item.num_logits, len(ids)))
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        return as_tensor(ids), as_tensor(positions), rows

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Run one forward over the batch; -> logits [sum of num_logits, vocab], the rows of each
        sequence in batch order. The hidden states of those rows stay in `last_hidden` (the
        speculative heads propose from them)."""
        start = time.perf_counter()
        input_ids, positions, rows = self.prepare(batch)
        ctx = self.cache.context(batch)
        if self.time_attention:
            ctx = TimedAttention(ctx, self._sync)
        prepared = time.perf_counter()
        hidden = self.forward(input_ids, positions, ctx)  # [num_tokens, hidden]
        self.last_hidden = hidden[rows] if len(rows) < len(input_ids) else hidden  # [rows, hidden]
        logits = self.model.compute_logits(self.last_hidden).float()
        if self.time_attention:
            self._sync()
        self.last_timings = {"prepare": prepared - start, "model": time.perf_counter() - prepared,
                             "attention": ctx.seconds if self.time_attention else float("nan")}
        return logits  # [num_seqs, vocab]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class TimedAttention(AttentionContext):
    """Wraps a step's context and adds up the time its attention calls take (a clock read per
    layer; on a GPU also a synchronisation per layer, so profile runs are a little slower)."""

    def __init__(self, inner: AttentionContext, sync) -> None:
        self.inner, self.sync, self.seconds = inner, sync, 0.0

    def attend(self, layer_idx, q, k, v):
        self.sync()
        start = time.perf_counter()
        out = self.inner.attend(layer_idx, q, k, v)
        self.sync()
        self.seconds += time.perf_counter() - start
        return out


@torch.inference_mode()
def full_forward_logits(model: torch.nn.Module, token_ids: list[int] | torch.Tensor, max_model_len: int,
                        device: torch.device) -> torch.Tensor:
    """One forward over a single sequence, no cache (a reference, and prompt scoring): -> float32
    logits [len, vocab]. It writes no state, so it may run beside the engine's own steps."""
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device).reshape(-1)  # [len]
    if ids.numel() == 0 or ids.numel() > max_model_len:
        raise ValueError(f"logits() needs 1 to {max_model_len} tokens, got {ids.numel()}")
    positions = torch.arange(ids.numel(), device=ids.device)
    return model.compute_logits(model(ids, positions)).float()
