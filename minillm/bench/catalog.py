"""The benchmarks, in one place: what each compares and which model it runs.

The command line's help, `python -m minillm.bench --list` and the Makefile's `bench` target all
read this table, so a new benchmark is one entry here plus its module `minillm/bench/NAME.py`,
whose `run(quick=False, json_path=None, model=None) -> dict` measures and prints.
"""
import importlib
from dataclasses import dataclass
from types import ModuleType

SMOLLM_SHAPE = "SmolLM2-135M shape, random weights"


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    default_model: str        # what runs when --model is not given
    no_model_reason: str = ""  # why --model does not apply; empty when it does

    @property
    def takes_model(self) -> bool:
        return not self.no_model_reason

    def module(self) -> ModuleType:
        return importlib.import_module(f"minillm.bench.{self.name}")

    def model_refusal(self) -> str:
        others = ", ".join(b.name for b in BENCHMARKS.values() if b.takes_model)
        return (f"the {self.name} benchmark does not take --model: {self.no_model_reason}. "
                f"The benchmarks that run a model: {others}")


BENCHMARKS = {b.name: b for b in [
    Benchmark("decode", "single-stream decode: minillm vs transformers vs no KV cache", SMOLLM_SHAPE),
    Benchmark("memory", "KV memory waste and concurrency: contiguous max-length allocation vs paged blocks",
              "none", no_model_reason="it replays a chat-like workload through the KV cache allocators, "
                                      "and no model runs"),
    Benchmark("prefix", "requests sharing a long system prompt: prefill work and TTFT with and without "
                        "prefix caching", "tiny"),
    Benchmark("chunked", "inter-token latency of running decodes while long prompts arrive, with and without "
                         "chunked prefill", "tiny"),
    Benchmark("spec", "speculative decoding: tokens/s with and without it for each proposer and k, acceptance "
                      "against theory, and where it loses (low acceptance, large batches)", "tiny"),
    Benchmark("throughput", "offline throughput: continuous vs static vs sequential batching vs transformers "
                            "padded batches", SMOLLM_SHAPE),
    Benchmark("quant", "weight-only quantization: perplexity, KL, top-1, weight bytes and decode tokens/s of int8, "
                       "int4 (group 32, 64, 128) and fp8 against full precision; per-layer and per-projection "
                       "sensitivity, growing sets, and a search for error cancellation beyond the noise", "tiny"),
    Benchmark("agents", "agent sessions competing for a small KV pool: TTFT and prefix hits of each next call when "
                        "blocks are kept in a big pool, recomputed, or offloaded to a host tier while the agent waits "
                        "for its tool; capacity gained and bytes moved", "tiny"),
    Benchmark("kernels", "Triton kernels vs their torch references against the GPU's measured peaks (paged decode "
                         "attention, int4 matmul, ...) and end-to-end decode on each attention backend; on a CPU a "
                         "correctness smoke pass", "tiny"),
    Benchmark("serve", "online serving under load (TTFT, TPOT, ITL, E2E, goodput): continuous vs static vs "
                       "sequential batching on the same arrivals, the latency-throughput curve, and $/1M tokens "
                       "online at an SLO vs offline batch", "tiny"),
    Benchmark("profile", "the engine's step cost by its work (prefill tokens, decoding sequences, context), fitted "
                         "on a calibration replay: the cluster simulator's input", "tiny"),
    Benchmark("cluster", "the cluster simulator against real runs (throughput, TTFT and TPOT errors), routing "
                         "policies on agent sessions at fleet scale, and a capacity plan for a real model and GPU",
              "tiny"),
]}
