"""Seeded synthetic workloads shaped like chat traffic: many short requests, a long tail."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Request:
    prompt_len: int
    output_len: int      # tokens the request actually generates before it stops
    max_tokens: int      # the cap the client asked for (what a contiguous cache must reserve)


def chat_workload(n: int, seed: int = 0, max_prompt: int = 1024, max_output: int = 512,
                  median_prompt: float = 160, median_output: float = 120) -> list[Request]:
    """Prompt and output lengths drawn from log-normal distributions (heavy right tail, as in
    public chat traces such as ShareGPT), clipped to [8, max_prompt] and [4, max_output]."""
    gen = torch.Generator().manual_seed(seed)

    def lognormal(median: float, sigma: float, lo: int, hi: int) -> list[int]:
        x = (torch.randn(n, generator=gen) * sigma + torch.log(torch.tensor(median))).exp()
        return x.round().clamp(lo, hi).long().tolist()

    prompts = lognormal(median_prompt, 0.9, 8, max_prompt)
    outputs = lognormal(median_output, 0.9, 4, max_output)
    return [Request(p, o, max_output) for p, o in zip(prompts, outputs)]
