"""Speculative decoding on the real model (SmolLM2-135M-Instruct): greedy output with each proposer is
token-identical to greedy output without speculation, on chat and code prompts, at the k values
whose verification runs on each weight layout (k + 1 = 2-3 rows: row-major; 5: column-major)."""
import pytest

from minillm import LLM, SamplingParams
from minillm.config import SpeculativeConfig
from minillm.models import registry
from minillm.speculative.mlp_speculator import BUNDLED, find_speculator

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

NAME = "smollm2-135m-instruct"
if registry.packaged_gguf(NAME) is None:
    pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}",
                allow_module_level=True)

QUESTIONS = ["Why is the sky blue?", "Write a Python function that checks whether a number is prime."]
CODE = "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(real_model_cache):
    """The plain engine and the prompts' greedy tokens, from the run's shared conversion cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(real_model_cache))
        llm = LLM(NAME, enable_prefix_caching=False)
        prompts = [llm.tokenizer.encode(llm.chat_template.render([{"role": "user", "content": q}]))
                   for q in QUESTIONS] + [llm.tokenizer.encode(CODE)]
        yield llm, prompts, [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_the_bundled_mlp_speculator_is_found_for_the_real_model(plain):
    llm, _, _ = plain
    found = find_speculator(llm.engine.model_dir, llm.model)
    assert found is not None and found.parent == BUNDLED


@pytest.mark.parametrize(("method", "k"), [("mlp", 1), ("mlp", 2), ("mlp", 4), ("ngram", 2), ("ngram", 4)])
def test_greedy_speculation_on_the_real_model_emits_the_plain_greedy_tokens(plain, method, k):
    llm, prompts, reference = plain
    spec = LLM(NAME, enable_prefix_caching=False, speculative=SpeculativeConfig(method, k=k))
    outs = [o.outputs[0].token_ids for o in spec.generate(prompts, GREEDY, use_tqdm=False)]
    assert outs == reference
    stats = spec.engine.speculator.stats
    assert stats.accepted > 0, f"{method} k={k}: no proposal was accepted, so nothing was verified"
