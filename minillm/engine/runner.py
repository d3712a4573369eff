"""The model runner: turns the scheduler's decision into tensors, runs the model, returns logits.

A step's sequences are flattened into one batch without padding: the tokens of every sequence
back to back in `input_ids`, each with its absolute `positions`; the cache's AttentionContext
records how many tokens belong to each sequence.
"""
import torch

from minillm.cache.base import CacheManager
from minillm.state import ScheduledSeq


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cache: CacheManager, device: torch.device) -> None:
        self.model, self.cache, self.device = model, cache, device

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """-> input_ids [num_tokens], positions [num_tokens], index of each sequence's last token."""
        ids, positions, last = [], [], []
        for item in batch:
            start = item.seq.num_computed_tokens
            ids.extend(item.seq.token_ids[start:start + item.num_tokens])
            positions.extend(range(start, start + item.num_tokens))
            last.append(len(ids) - 1)
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        return as_tensor(ids), as_tensor(positions), last

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Run one forward over the batch; -> logits of each sequence's last token [num_seqs, vocab]."""
        input_ids, positions, last = self.prepare(batch)
        ctx = self.cache.context(batch)
        hidden = self.model(input_ids, positions, ctx)  # [num_tokens, hidden]
        return self.model.compute_logits(hidden[last]).float()  # [num_seqs, vocab]
