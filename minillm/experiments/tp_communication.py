"""measure_tp_communication: what tensor parallelism costs and buys on this machine, side by side.

    python -c "from minillm.experiments.tp_communication import measure_tp_communication as m; print(m(tokens=64))"

On a CPU the ranks are processes sharing the same cores and memory bandwidth, so TP=2 is not
faster than TP=1: each rank does half the matmul work but the two compete for the cores, and
every layer adds two all-reduces through loopback TCP. Tensor parallelism pays on GPUs, where
each rank brings its own compute and memory bandwidth and NVLink makes the all-reduces cheap.
On a machine shared with other work, two processes also get a larger share of the cores than one,
which can make TP=2 look faster: compare the two rates on an idle machine before reading a speedup.
"""
import time

from minillm.llm import LLM
from minillm.sampling import SamplingParams

PROMPTS = ["def fib(n):", "import os\n", "class Stack:\n    def push(self, item):\n", "for i in range(10):"]


def _tokens_per_second(llm: LLM, tokens: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start), [o.token_ids for o in outs]


def _warmed(llm: LLM) -> LLM:
    llm.generate(PROMPTS, SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)  # first calls are slower
    return llm


def measure_tp_communication(model: str = "tiny", tp: int = 2, tokens: int = 32) -> dict:
    """Generate `tokens` tokens for each of 4 prompts at TP=1 and TP=tp (greedy, prefix cache off so
    both compute the same tokens) -> bytes all-reduced per token (measured and by formula), the ring
    all-reduce's bytes per rank, all-reduce seconds per step, output tokens/s at both sizes, and
    whether the greedy tokens agree."""
    config = dict(enable_prefix_caching=False)
    one_rate, one_tokens = _tokens_per_second(_warmed(LLM(model, **config)), tokens)
    llm = _warmed(LLM(model, tensor_parallel_size=tp, **config))
    try:
        llm.model.all_reduce.reset()
        tp_rate, tp_tokens = _tokens_per_second(llm, tokens)
        report = llm.model.communication()
    finally:
        llm.model.shutdown()
    return {**report, "model": model, "tp": tp, "tokens_per_s_tp1": one_rate, f"tokens_per_s_tp{tp}": tp_rate,
            "speedup": tp_rate / one_rate, "greedy_tokens_equal": one_tokens == tp_tokens}
