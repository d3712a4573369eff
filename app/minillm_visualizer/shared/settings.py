"""From the page's knobs to what the engine runs: an EngineConfig and a list of requests.

Plain functions over a dict of values, so they are tested without a page. Every mistake a learner
can make becomes a ValueError whose message the page shows as it is.
"""
from pathlib import Path

import torch

import minillm
from minillm import EngineConfig, SamplingParams
from minillm.bench.synthetic_traffic import chat_workload
from minillm.cache.pool import block_bytes
from minillm.config import Components
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.tokenizer import Tokenizer
from minillm_visualizer.shared.engine_run import RequestSpec
from minillm_visualizer.shared.learner_parts import KERNELS_LAB, LAB_PARTS, default_folder

DEFAULTS = {
    "source": "Seeded workload", "prompts": "def fibonacci(n):\nimport os\nclass Stack:\nfor i in range(10):",
    "n_requests": 24, "workload_seed": 0, "rate": 12.0, "shared_prefix": 32,
    "max_tokens": 48, "temperature": 0.8, "top_p": 0.95, "n_samples": 1, "seed": 0,
    "kv_cache": "paged", "attention_backend": "torch", "block_size": 16, "kv_mib": 6.0, "prefix_caching": True,
    "scheduler": "continuous", "max_num_seqs": 16, "max_batched_tokens": 256, "chunked_prefill": True,
    "pace_ms": 0, "mine": False, "mine_labs": [lab for lab in LAB_PARTS if lab != KERNELS_LAB],
    "mine_folder": default_folder(),
}

DEFAULT_KV_BLOCKS = 64  # the KV budget's default, in blocks of 16 tokens: 6 MiB of tiny's, 45 MiB of SmolLM2-135M's


def default_kv_mib(model: str) -> float:
    """The KV budget (MiB) that holds DEFAULT_KV_BLOCKS of this model's blocks, so that every model starts with
    the same pool in tokens: the same memory pressure on the same workload."""
    cfg = ModelConfig.from_file(resolve_model_path(model) / "config.json")
    per_block = block_bytes(cfg, DEFAULTS["block_size"], EngineConfig().torch_dtype)
    return round(DEFAULT_KV_BLOCKS * per_block / 2**20, 2)


def engine_config(values: dict, components: Components | None = None) -> EngineConfig:
    """The EngineConfig the knobs describe (EngineConfig itself validates and explains), with the
    engine's own parts unless `components` replaces some."""
    kv_bytes = values["kv_mib"] * 2**20
    if values["kv_cache"] == "paged" and kv_bytes < 1:
        raise ValueError(f"the KV budget must be more than 0 MiB, got {values['kv_mib']}")
    # The learner's paged decode kernel (lab 07) is a Triton kernel: it runs on the Triton backend.
    mine_kernel = components is not None and components.paged_decode is not None
    backend = "triton" if mine_kernel else values["attention_backend"]
    return EngineConfig.from_knobs(values["model"], seed=int(values["seed"]), kv_cache=values["kv_cache"],
                             attention_backend=backend,
                             block_size=int(values["block_size"]), kv_cache_memory=int(kv_bytes),
                             enable_prefix_caching=bool(values["prefix_caching"]), scheduler=values["scheduler"],
                             max_num_seqs=int(values["max_num_seqs"]),
                             max_num_batched_tokens=int(values["max_batched_tokens"]),
                             enable_chunked_prefill=bool(values["chunked_prefill"]),
                             components=components or Components())


def request_specs(values: dict, tokenizer: Tokenizer, max_model_len: int) -> list[RequestSpec]:
    """The requests to run: the learner's prompts (all arriving at once) or a seeded workload."""
    if values["source"] == "My prompts":
        prompts = [p for p in values["prompts"].splitlines() if p.strip()]
        if not prompts:
            raise ValueError("the prompt list is empty: write one prompt per line")
        params = SamplingParams(max_tokens=int(values["max_tokens"]), temperature=float(values["temperature"]),
                                top_p=float(values["top_p"]), n=int(values["n_samples"]))
        return [RequestSpec(f"r{i}", p.replace("\\n", "\n"), params) for i, p in enumerate(prompts)]
    return workload_specs(values, tokenizer, max_model_len)


def workload_specs(values: dict, tokenizer: Tokenizer, max_model_len: int) -> list[RequestSpec]:
    """chat_workload's seeded prompt/output lengths; prompts are windows of minillm's own source
    (Python, which the bundled models were trained on), all opening with the same shared prefix
    (like a system prompt); arrivals are a Poisson process of the given rate."""
    n, seed, rate, prefix_len = (int(values["n_requests"]), int(values["workload_seed"]),
                                 float(values["rate"]), int(values["shared_prefix"]))
    if n < 1:
        raise ValueError(f"the workload needs at least 1 request, got {n}")
    if rate < 0 or prefix_len < 0:
        raise ValueError(f"arrival rate and shared prefix cannot be negative, got {rate} and {prefix_len}")
    max_output = min(128, max_model_len // 4)
    max_prompt = max_model_len - max_output - prefix_len
    if max_prompt < 8:
        raise ValueError(f"a shared prefix of {prefix_len} tokens leaves no room for prompts in the "
                         f"model's {max_model_len}-token context")
    workload = chat_workload(n, seed, max_prompt=min(256, max_prompt), max_output=max_output,
                             median_prompt=48, median_output=40)
    corpus = _corpus_ids(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n).exponential_(generator=gen) / rate if rate > 0 else torch.zeros(n)
    arrivals = gaps.cumsum(0).tolist()
    specs = []
    for i, (r, arrival) in enumerate(zip(workload, arrivals)):
        start = int(torch.randint(prefix_len, len(corpus) - r.prompt_len, (1,), generator=gen))
        prompt = corpus[:prefix_len] + corpus[start:start + r.prompt_len]
        params = SamplingParams(max_tokens=r.output_len, temperature=float(values["temperature"]),
                                top_p=float(values["top_p"]), ignore_eos=True, n=int(values["n_samples"]))
        specs.append(RequestSpec(f"r{i}", prompt, params, arrival))
    return specs


def _corpus_ids(tokenizer: Tokenizer) -> list[int]:
    """minillm's engine and cache source, tokenized (some 30 kB: milliseconds)."""
    root = Path(minillm.__file__).parent
    files = sorted(root.glob("engine/*.py")) + sorted(root.glob("cache/*.py"))
    return tokenizer.encode("\n\n".join(p.read_text() for p in files))
