"""A lab graded end to end: the real engine with the learner's parts against the engine with its own.

One seeded workload on the bundled `pico` model, sized so that a small KV pool and a small token
budget make the engine do everything at once: chunked prefill, prefix-cache hits on a shared
system prompt, forked samples (n = 2, sharing blocks with copy-on-write), and preemption. The
learner's engine must give exactly the reference engine's tokens, call the learner's parts, and
end with every block back in the pool.
"""
from dataclasses import dataclass, field

import torch

from minillm.config import Components
from minillm.labkit.fixtures import one_thread
from minillm.labkit.plug import calls
from minillm.sampling import SamplingParams

MODEL = "pico"
ENGINE = dict(block_size=4, num_kv_blocks=40, max_num_seqs=6, max_num_batched_tokens=24, enable_chunked_prefill=True)


@dataclass
class Run:
    tokens: list[list[list[int]]]      # per request, per sample
    used_blocks_at_end: int
    preemptions: int
    cached_prompt_tokens: int
    chunked_prefills: int              # prefill steps that computed less than the whole prompt
    forked: int                        # requests with n > 1
    calls: dict[str, int] = field(default_factory=dict)


def workload(sampled: bool) -> list[tuple[list[int], SamplingParams]]:
    """Ten requests: a shared 18-token system prompt + their own 3 to 20 tokens; every third has
    two samples. sampled: mix temperature / top-k / top-p requests (seeded) in with greedy ones."""
    gen = torch.Generator().manual_seed(2024)
    system = torch.randint(1, 4096, (18,), generator=gen).tolist()
    requests = []
    for i in range(10):
        own = torch.randint(1, 4096, (3 + (7 * i) % 18,), generator=gen).tolist()
        params = dict(max_tokens=10 + (5 * i) % 15, temperature=0.0, ignore_eos=True, n=2 if i % 3 == 0 else 1,
                      seed=100 + i)
        if sampled and i % 2:
            params.update(temperature=(0.7, 1.0, 1.3)[i % 3], top_k=(0, 20, 5)[i % 3], top_p=(0.9, 1.0, 0.8)[i % 3])
        requests.append((system + own, SamplingParams(**params)))
    return requests


def run(components: Components | None = None, sampled: bool = False, **config) -> Run:
    """The workload through an engine with these parts (None: the engine's own)."""
    from minillm.llm import LLM
    llm = LLM(MODEL, components=components or Components(), **{**ENGINE, **config})
    prefill_tokens = []
    llm.engine.subscribe(lambda e: prefill_tokens.extend(w.num_tokens for w in e.scheduled if w.phase == "prefill"))
    reqs = workload(sampled)
    outs = llm.generate([p for p, _ in reqs], [sp for _, sp in reqs], use_tqdm=False)
    longest = max(len(p) for p, _ in reqs)
    return Run(tokens=[[c.token_ids for c in o.outputs] for o in outs],
               used_blocks_at_end=llm.engine.view.kv_stats().used_blocks, preemptions=llm.engine.view.num_preemptions,
               cached_prompt_tokens=sum(c.metrics["cached_prompt_tokens"] for o in outs for c in o.outputs),
               chunked_prefills=sum(1 for n in prefill_tokens if n < longest), forked=sum(sp.n > 1 for _, sp in reqs),
               calls=calls(components) if components else {})


def check_against_reference(components: Components, sampled: bool = False, **config) -> None:
    """Assert, in words a learner can act on, that the engine with these parts behaves as the
    reference: under continuous batching, and under static batching too when a static_step is plugged.
    config: the flat knobs of LLM(...) for both engines (speculative=..., say)."""
    policies = ["continuous"] + (["static"] if components.static_step is not None else [])
    with one_thread():
        for policy in policies:
            _check_policy(components, sampled, policy, config)
    unused = [part for part, n in calls(components).items() if n == 0]
    assert not unused, f"the engine never called your {', '.join(unused)}"


def _check_policy(components: Components, sampled: bool, policy: str, config: dict) -> None:
    """One scheduling policy of check_against_reference."""
    reference = run(None, sampled, scheduler=policy, **config)
    assert reference.preemptions and reference.cached_prompt_tokens, \
        f"the end-to-end workload no longer exercises preemption and prefix hits under {policy} batching"
    assert policy == "static" or reference.chunked_prefills, "the end-to-end workload no longer chunks prefills"
    mine = run(components, sampled, scheduler=policy, **config)
    # Parts with the engine's interfaces make the engine's decisions: the same hits, the same preemptions.
    assert mine.cached_prompt_tokens == reference.cached_prompt_tokens, (
        f"{policy} batching: the prefix cache supplied {mine.cached_prompt_tokens} prompt tokens with your "
        f"parts, {reference.cached_prompt_tokens} with the engine's own")
    assert mine.preemptions == reference.preemptions, (
        f"{policy} batching: {mine.preemptions} preemptions with your parts, {reference.preemptions} with "
        f"the engine's own")
    for i, (got, want) in enumerate(zip(mine.tokens, reference.tokens)):
        assert got == want, (f"{policy} batching, request {i}: the engine with your parts generated {got}, "
                             f"the reference engine {want} (same prompts, seeds and settings)")
    assert mine.used_blocks_at_end == 0, (f"{policy} batching: {mine.used_blocks_at_end} KV blocks are still "
                                          f"held after every request finished: a leak")
