"""What tensor parallelism costs in communication: measured by wrapping the all-reduce, and by formula.

Every decoder layer all-reduces twice (after o_proj, after down_proj), each time a [num_tokens,
hidden] tensor. So a token costs

    payload = 2 * num_layers * hidden_size * dtype_bytes        bytes all-reduced per token

whatever the number of ranks. A ring all-reduce (reduce-scatter, then all-gather, each N-1 steps
of payload/N) makes every rank send, and receive, 2 * (N-1)/N * payload bytes: the traffic per
rank barely grows with N, but every step waits for 2 * num_layers rounds of it, which is why tensor
parallelism wants fast links (NVLink) and stays inside one machine.
"""
import time

import torch
import torch.distributed as dist

from minillm.models.model_config import ModelConfig


def allreduce_bytes_per_token(cfg: ModelConfig, dtype_bytes: int) -> int:
    """2 all-reduces per layer of hidden_size values per token: 2 * layers * hidden * dtype_bytes."""
    return 2 * cfg.num_hidden_layers * cfg.hidden_size * dtype_bytes


def ring_bytes_per_rank(payload_bytes: float, world: int) -> float:
    """Bytes one rank sends (and receives) in a ring all-reduce of payload_bytes: 2 * (N-1)/N * payload."""
    return 2 * (world - 1) / world * payload_bytes


class AllReduceMeter:
    """The all-reduce the row-parallel layers call: dist.all_reduce (a sum, in place), counted.

    bytes: payload all-reduced (numel * element size, summed over calls); calls; seconds spent
    inside the all-reduce (on a CPU the call returns when the sum is done, so this is its time).
    The driver adds tokens and steps, so the totals read per token and per step.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.reset()

    def reset(self) -> None:
        self.bytes, self.calls, self.seconds, self.tokens, self.steps = 0, 0, 0.0, 0, 0

    def __call__(self, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        dist.all_reduce(tensor, group=self.group)
        self.seconds += time.perf_counter() - start
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1

    def summary(self, cfg: ModelConfig, dtype_bytes: int, world: int) -> dict:
        """Measured against the formula: bytes per token both ways, ring bytes per rank, time per step."""
        per_token = allreduce_bytes_per_token(cfg, dtype_bytes)
        return {"tokens": self.tokens, "steps": self.steps, "allreduce_calls": self.calls,
                "bytes_per_token_measured": self.bytes / self.tokens if self.tokens else float("nan"),
                "bytes_per_token_formula": per_token,
                "ring_bytes_per_rank_per_token": ring_bytes_per_rank(per_token, world),
                "allreduce_seconds_per_step": self.seconds / self.steps if self.steps else float("nan")}
