"""Speculative decoding: exact (greedy identical, sampling distributed as the target's), measured
against its theory, and leaving nothing behind when proposals are rolled back."""
import math
from pathlib import Path

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.arith import cdiv
from minillm.config import Components, EngineConfig, SpeculativeConfig
from minillm.quant.quant_config import PROJECTIONS, QuantConfig
from minillm.quant.quantized_linear import QuantizedLinear
from minillm.speculative.heads import SpecHeads, propose_heads, save_heads
from minillm.speculative.mlp_speculator import MLPSpeculator, save_speculator
from minillm.speculative.ngram import propose_ngram
from minillm.speculative.theory import acceptance_rate, expected_tokens_per_forward
from minillm.speculative.verify import target_probs, verify

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return LLM("tiny")


@pytest.fixture(scope="module")
def heads_file(tmp_path_factory, tiny) -> Path:
    """Heads for tiny, untrained but not the identity (their guesses are wrong, never unsafe)."""
    heads = SpecHeads(tiny.model.config.hidden_size, 8)
    for block in heads.blocks:
        torch.nn.init.normal_(block.weight, std=0.02, generator=torch.Generator().manual_seed(0))
    path = tmp_path_factory.mktemp("heads") / "heads.safetensors"
    save_heads(heads, tiny.model, path)
    return path


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory, tiny) -> Path:
    """An MLP speculator for tiny, untrained but not the identity, proposing from tiny's first 1,024 ids."""
    spec = MLPSpeculator(tiny.model.config.hidden_size, 128, vocab=1024)
    torch.nn.init.normal_(spec.down.weight, std=0.02, generator=torch.Generator().manual_seed(0))
    path = tmp_path_factory.mktemp("mlp") / "mlp.safetensors"
    save_speculator(spec, tiny.model, path)
    return path


def workload(tiny, n: int = 6) -> list[list[int]]:
    """Code prompts, some repeating themselves (so prompt lookup finds something), of mixed lengths."""
    texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
             "import os\nimport sys\n", "class Stack:\n    def __init__(self):\n        self.items = []\n",
             "for i in range(10):\n    print(i)\nfor j in range(10):\n", "x = 1\n", "def f(x):\n    return x\n" * 3]
    return [tiny.tokenizer.encode(t) for t in texts[:n]]


def spec_config(method: str, k: int, heads_file: Path, mlp_file: Path | None = None) -> SpeculativeConfig:
    return SpeculativeConfig(method, k=k, heads=str(heads_file) if method == "heads" else None,
                             speculator=str(mlp_file) if method == "mlp" else None)


@pytest.mark.parametrize("method", ["ngram", "draft", "heads", "mlp"])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_greedy_speculation_is_token_identical_inside_a_preempting_batch(method, k, tiny, heads_file, mlp_file):
    prompts = workload(tiny)
    params = [SamplingParams(max_tokens=24 + 4 * i, **GREEDY) for i in range(len(prompts))]
    reference = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny", speculative=spec_config(method, k, heads_file, mlp_file), block_size=4, num_kv_blocks=48)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference
    assert llm.engine.view.num_preemptions > 0, "the small pool was meant to force preemption"
    stats = llm.engine.speculator.stats
    assert stats.proposed > 0 and 0 <= stats.accepted <= stats.proposed
    assert llm.engine.view.kv_stats().used_blocks == 0
    if method == "draft":
        proposer = llm.engine.speculator.proposer
        assert not proposer.shadows and proposer.cache.stats([]).used_blocks == 0, "the draft's cache leaked"


SELF_INT4 = SpeculativeConfig("draft", k=4, draft_model="self", draft_quantization=QuantConfig("int4", group_size=32),
                              draft_head_quantization=QuantConfig("int8"))


def test_an_int4_copy_of_the_target_drafts_for_it_exactly_and_leaves_it_untouched(tiny):
    """Self-speculation: draft_model 'self' drafts with a quantized copy of the target. Greedy output is the
    target's own, inside a preempting batch; the int4 copy with an int8 head agrees with the target most of the
    time (most proposals on tiny, a few rejected); and the target keeps its float weights: the copy shares the ones it
    did not quantize (the embedding) and holds its own quantized matrices. The draft takes the K/V of the
    tokens the target has computed from the target's pool: no forward of the draft computes more than the
    two tokens a verification can add (the last proposal and the bonus token)."""
    prompts = workload(tiny)
    params = [SamplingParams(max_tokens=24 + 4 * i, **GREEDY) for i in range(len(prompts))]
    reference = [o.token_ids for o in tiny.generate(prompts, params, use_tqdm=False)]
    llm = LLM("tiny", speculative=SELF_INT4, block_size=4, num_kv_blocks=48)
    runner, draft_tokens = llm.engine.speculator.proposer.runner, []
    execute = runner.execute
    runner.execute = lambda batch: draft_tokens.extend(item.num_tokens for item in batch) or execute(batch)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == reference
    assert llm.engine.view.num_preemptions > 0, "the small pool was meant to force preemption"
    stats, proposer = llm.engine.speculator.stats, llm.engine.speculator.proposer
    assert stats.proposed > stats.accepted > 0.8 * stats.proposed, (stats.accepted, stats.proposed)
    assert max(draft_tokens) <= 2, "the self draft computed a prompt again instead of taking the target's K/V"
    assert not proposer.shadows and proposer.cache.stats([]).used_blocks == 0, "the draft's cache leaked"
    target, draft = llm.engine.model, proposer.model
    assert getattr(target, "quant_config", None) is None and draft.quant_config == SELF_INT4.draft_quantization
    assert not isinstance(target.model.layers[0].mlp.down_proj, QuantizedLinear)
    assert isinstance(draft.model.layers[0].mlp.down_proj, QuantizedLinear)
    assert draft.lm_head.scheme == "int8" and not isinstance(target.lm_head, QuantizedLinear)
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()


def test_a_self_draft_is_refused_without_a_quantization_or_over_a_quantized_target():
    with pytest.raises(ValueError, match="draft_model 'self' needs a draft_quantization"):
        SpeculativeConfig("draft", draft_model="self")
    with pytest.raises(TypeError, match="draft_quantization must be a minillm.QuantConfig"):
        SpeculativeConfig("draft", draft_model="self", draft_quantization="int8")
    with pytest.raises(ValueError, match="draft_quantization quantizes a draft model: it needs method 'draft'"):
        SpeculativeConfig("ngram", draft_quantization=QuantConfig("int8"))
    with pytest.raises(ValueError, match="draft_head_quantization quantizes a draft model: it needs method 'draft'"):
        SpeculativeConfig("heads", draft_head_quantization=QuantConfig("int8"))
    with pytest.raises(ValueError, match=r"draft_quantization int8\+head quantizes the LM head already"):
        SpeculativeConfig("draft", draft_model="self", draft_quantization=QuantConfig("int8", projections=PROJECTIONS),
                          draft_head_quantization=QuantConfig("int8"))
    with pytest.raises(ValueError, match=r"the target is quantized \(int4"):
        LLM("tiny", speculative=SELF_INT4, quantization=QuantConfig("int4"))
    with pytest.raises(ValueError, match="it runs with tensor_parallel_size=1 only, got 2"):
        EngineConfig.from_knobs("tiny", speculative=SELF_INT4, tensor_parallel_size=2)


def test_mlp_proposals_are_drawn_from_its_vocabulary_with_the_distributions_it_reports(tiny, mlp_file):
    """At temperature 1 each proposal comes with the distribution it was drawn from: zero above
    the speculator's vocabulary, summing to one, and giving the proposal itself positive mass."""
    llm = LLM("tiny", speculative=SpeculativeConfig("mlp", k=3, speculator=str(mlp_file)))
    proposer, seen = llm.engine.speculator.proposer, []
    propose = proposer.propose

    def record(seqs, limits):
        propose(seqs, limits)
        seen.extend((list(s.spec_tokens), s.spec_probs) for s in seqs if s.spec_tokens)

    proposer.propose = record
    llm.generate(workload(tiny, 2), SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True),
                 use_tqdm=False)
    assert seen
    for tokens, q in seen:
        assert q.shape == (len(tokens), tiny.model.config.vocab_size)
        assert torch.allclose(q.sum(-1), torch.ones(len(tokens))) and q[:, 1024:].sum() == 0
        assert all(t < 1024 and q[i, t] > 0 for i, t in enumerate(tokens))


def chi_square_critical(df: int, z: float = 3.719) -> float:
    """The chi-square value a true null exceeds with probability ~1e-4 (z: the normal quantile),
    by the Wilson-Hilferty approximation (accurate to a few percent for df >= 3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def emitted_distribution(logits, proposals, q, draws: int, **params) -> torch.Tensor:
    """How often each token is the first one verification emits (an accepted proposal, or the
    token drawn after a rejection), over `draws` seeded runs."""
    vocab = logits.shape[-1]
    counts = torch.zeros(vocab)
    gen = torch.Generator().manual_seed(7)
    for _ in range(draws):
        m, token = verify(logits, proposals, q, params["temperature"], params["top_k"], params["top_p"], gen)
        counts[proposals[0] if m >= 1 else token] += 1
    return counts


PARAMS = [dict(temperature=1.0, top_k=0, top_p=1.0), dict(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.parametrize("case", ["random p and q", "q disjoint from p"])
@pytest.mark.parametrize("params", PARAMS)
def test_the_first_emitted_token_is_distributed_as_the_target(case, params):
    """Chi-square test of the emitted token against the target's (filtered) distribution over 6 tokens,
    20,000 seeded draws: a correct verifier fails it with probability about 1e-4."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 6, generator=g) * 0.5  # spread out: top-k and top-p leave several tokens
    p = target_probs(logits, **params)  # [2, 6]: at the proposal, and after it
    if case == "random p and q":
        q = torch.randn(6, generator=g).softmax(-1)
    else:  # all of q's mass on the token p likes least (filtered out, or nearly): the rejected case
        q = torch.zeros(6)
        q[int(p[0].argmin())] = 1.0
    x = int((q - p[0]).argmax())  # the token the proposer over-proposes most: rejected some of the time
    draws = 20_000
    counts = emitted_distribution(logits, [x], q[None], draws, **params)
    # With the proposal x fixed: P(emit y | x) = accept(x) [y = x] + (1 - accept(x)) residual(y).
    accept_x = min(1.0, float(p[0, x] / q[x]))
    residual = (p[0] - q).clamp(min=0)
    residual = residual / residual.sum() if residual.sum() > 0 else p[0]
    expected = (1 - accept_x) * residual
    expected[x] += accept_x
    support = expected > 0
    assert counts[~support].sum() == 0, "emitted a token the verifier can never emit"
    chi2 = float((((counts - draws * expected) ** 2) / (draws * expected))[support].sum())
    assert chi2 < chi_square_critical(int(support.sum()) - 1), f"chi-square {chi2:.1f}"


@pytest.mark.slow
@pytest.mark.parametrize("params", PARAMS)
def test_when_every_proposal_is_accepted_the_bonus_token_is_distributed_as_the_last_position(params):
    """q = p: nothing is ever rejected, and the token after the proposal is drawn from p at the
    position after it (chi-square over 20,000 seeded draws, false alarms about 1e-4)."""
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(2, 6, generator=g) * 1.5
    p = target_probs(logits, **params)
    x = int(p[0].argmax())
    gen, draws, counts = torch.Generator().manual_seed(17), 20_000, torch.zeros(6)
    for _ in range(draws):
        m, token = verify(logits, [x], p[:1], params["temperature"], params["top_k"], params["top_p"], gen)
        assert m == 1, "a proposal drawn from the target's own distribution was rejected"
        counts[token] += 1
    support = p[1] > 0
    assert counts[~support].sum() == 0, "a bonus token the target's filters exclude"
    chi2 = float((((counts - draws * p[1]) ** 2) / (draws * p[1]))[support].sum())
    assert chi2 < chi_square_critical(int(support.sum()) - 1), f"chi-square {chi2:.1f}"


def test_over_the_proposal_too_the_emitted_token_is_distributed_as_p():
    """Drawing the proposal from q each time, the first emitted token is distributed exactly as p
    (the point of the rejection rule), with 1e-4 false alarms."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 8, generator=g) * 2
    q = torch.randn(8, generator=g).softmax(-1)
    p = target_probs(logits, 1.0, 0, 1.0)[0]
    draws, counts = 20_000, torch.zeros(8)
    gen = torch.Generator().manual_seed(9)
    for _ in range(draws):
        x = int(torch.multinomial(q, 1, generator=gen))
        m, token = verify(logits, [x], q[None], 1.0, 0, 1.0, gen)
        counts[x if m else token] += 1
    chi2 = float(((counts - draws * p) ** 2 / (draws * p)).sum())
    assert chi2 < chi_square_critical(7), f"chi-square {chi2:.1f}: the emitted tokens are not distributed as p"


def test_all_accepted_draws_the_bonus_token_from_the_last_position():
    inf = float("-inf")
    logits = torch.tensor([[0, inf, inf, inf], [inf, 0, inf, inf], [inf, inf, inf, 0]])  # the target: 0, then 1, then 3
    for temperature, q in ((0.0, None), (1.0, torch.eye(4)[[0, 1]]), (1.0, None)):
        m, token = verify(logits, [0, 1], q, temperature, 0, 1.0, torch.Generator().manual_seed(0))
        assert (m, token) == (2, 3), f"temperature {temperature}: accepted {m}, then {token}"
    m, token = verify(logits, [0, 2], None, 0.0, 0, 1.0, torch.Generator())
    assert (m, token) == (1, 1), "greedy: the longest matching prefix, then the target's own token"


@pytest.mark.slow
def test_on_the_real_models_the_first_verified_token_is_distributed_as_the_targets():
    """tiny verifying pico's proposal at temperature 1 with top-k 12, 3,000 seeded samples of one prompt: the
    first token a verification emits (the second output token; the first comes from the prefill), among
    the samples whose first token was the likeliest one, follows tiny's own filtered distribution after
    it. Chi-square over the tokens expected at least 5 times (the rest pooled): false alarms ~1e-4."""
    # a request's 1,000 samples run at once: max_num_seqs must seat them all
    llm = LLM("tiny", speculative=SpeculativeConfig("draft", k=2), max_num_seqs=1000)
    prompt = llm.tokenizer.encode("def fibonacci(n):\n")
    params = [SamplingParams(n=1000, max_tokens=3, temperature=1.0, top_k=12, seed=s, ignore_eos=True)
              for s in (5, 6, 7)]
    outs = llm.generate([prompt] * 3, params, use_tqdm=False)
    # A sample preempted after its first token recomputes it with the prompt and samples token 2 in that
    # prefill, unverified: only the samples that verified count.
    pairs = [c.token_ids[:2] for out in outs for c in out.outputs if c.metrics["spec_proposed"]]
    assert len(pairs) == llm.engine.speculator.stats.verifications > 2900
    first = max(set(t for t, _ in pairs), key=[t for t, _ in pairs].count)
    seconds = torch.tensor([t for t1, t in pairs if t1 == first])
    p = target_probs(llm.logits(prompt + [first])[-1:], 1.0, 12, 1.0)[0]  # [vocab]: tiny's own, filtered
    counts = torch.bincount(seconds, minlength=len(p)).double()
    assert counts[p == 0].sum() == 0, "emitted a token outside tiny's top 12"
    expected = p.double() * len(seconds)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    chi2 = float((((obs - exp) ** 2) / exp)[keep].sum())
    assert len(seconds) > 500 and int(keep.sum()) >= 4, (len(seconds), int(keep.sum()))
    assert chi2 < chi_square_critical(int(keep.sum()) - 1), f"chi-square {chi2:.1f} over {len(seconds)} samples"


def test_prompt_lookup_proposes_what_followed_the_latest_occurrence():
    ids = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
    assert propose_ngram(ids, 3, 2) == [9, 2]  # the latest earlier [5, 6, 7] was followed by 9, 2
    assert propose_ngram(ids, 3, 10) == [9, 2, 5, 6, 7]  # never past the end of the history
    assert propose_ngram([1, 2, 3], 2, 4) == []  # nothing repeats
    assert propose_ngram([4, 1, 9, 4], 3, 2) == [1, 9]  # a shorter n-gram when the longest never recurred


def test_measured_acceptance_matches_the_distributions_and_the_theory(tiny):
    """With pico drafting for tiny at temperature 1: the acceptance rate equals the mean of
    sum_x min(p, q) over the proposals the target reached (within 4 binomial standard deviations),
    and with k = 4 the tokens per target forward are (1 - a^5) / (1 - a) within 15% (the formula
    assumes a constant acceptance rate; the real one varies with the context)."""
    expected = []

    def recording_verify(logits, proposals, q, temperature, top_k, top_p, generator):
        p = target_probs(logits[:len(proposals)], temperature, top_k, top_p)
        m, token = verify(logits, proposals, q, temperature, top_k, top_p, generator)
        expected.extend(acceptance_rate(p, q)[:m + 1].tolist())  # the positions the target reached
        return m, token

    llm = LLM("tiny", speculative=SpeculativeConfig("draft", k=4), components=Components(verify=recording_verify))
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=3, ignore_eos=True)
    llm.generate(workload(tiny), params, use_tqdm=False)
    stats = llm.engine.speculator.stats
    # Each proposal the target reaches is one Bernoulli draw with success probability sum min(p, q).
    alpha_expected = sum(expected) / len(expected)
    sigma = math.sqrt(alpha_expected * (1 - alpha_expected) / len(expected))
    assert len(expected) == stats.reached
    assert abs(stats.acceptance_rate - alpha_expected) < 4 * sigma, (stats.acceptance_rate, alpha_expected, sigma)
    theory = expected_tokens_per_forward(stats.acceptance_rate, 4)
    assert abs(stats.tokens_per_forward - theory) / theory < 0.15, (stats.tokens_per_forward, theory)


def test_expected_tokens_per_forward_formula():
    assert expected_tokens_per_forward(0.0, 4) == 1.0
    assert expected_tokens_per_forward(1.0, 4) == 5.0
    assert expected_tokens_per_forward(0.5, 2) == pytest.approx(1.75)


def test_bad_speculative_configurations_are_refused_by_name(tiny, tmp_path):
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        SpeculativeConfig("ngram", k=0)
    with pytest.raises(ValueError, match="method must be one of"):
        SpeculativeConfig("medusa")
    from minillm.testing import make_hf_model
    make_hf_model(tmp_path / "other", "llama", vocab_size=300)
    with pytest.raises(ValueError, match="draft model .* vocabulary of"):
        LLM("tiny", speculative=SpeculativeConfig("draft", draft_model=str(tmp_path / "other")))
    pico = LLM("pico")
    heads = tmp_path / "pico_heads.safetensors"
    save_heads(SpecHeads(pico.model.config.hidden_size, 4), pico.model, heads)
    with pytest.raises(ValueError, match="trained for another model"):
        LLM("tiny", speculative=SpeculativeConfig("heads", heads=str(heads)))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_after_every_rollback_no_block_outlives_the_tokens_it_holds(method, tiny):
    """Rejected proposals' blocks go back at once: after every step each decoding sequence holds
    only the blocks its computed tokens (and the next one) need, and the pool's counts add up."""
    llm = LLM("tiny", speculative=SpeculativeConfig(method, k=8), block_size=4, num_kv_blocks=64)
    seen = []

    def check(event):
        held = set()
        for s in event.sequences:
            if s.status == "running" and s.num_computed_tokens >= s.num_prompt_tokens:
                assert len(s.block_table) <= cdiv(s.num_computed_tokens + 1, 4), (
                    f"step {event.step}: {s.request_id} holds {len(s.block_table)} blocks for "
                    f"{s.num_computed_tokens} computed tokens")
            held |= set(s.block_table)
        assert event.kv.used_blocks == len(held), f"step {event.step}: the pool counts blocks no sequence holds"
        seen.append(sum(v.accepted < len(v.proposed) for v in event.verifications))

    llm.engine.subscribe(check)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=2, ignore_eos=True)
    llm.generate(workload(tiny), params, use_tqdm=False)
    assert sum(seen) > 0, "no proposal was ever rejected: nothing was rolled back"
    assert llm.engine.view.kv_stats().used_blocks == 0


def test_a_heads_proposal_given_as_a_component_is_the_one_the_engine_verifies(tiny, heads_file):
    """Components.propose_heads replaces the heads' proposal step: the engine calls it with the last hidden
    states, its tokens are what is verified (with certainty, q = None, also when sampling), and the engine's own
    proposal (heads.propose_heads) gives the engine's own greedy tokens and counts."""
    calls, seen_q = [], []

    def recording(hidden, blocks, lm_head, k):
        calls.append((tuple(hidden.shape), k))
        return [[7] * k for _ in range(len(hidden))]  # always token 7: a proposal the engine cannot have made

    def recording_verify(logits, proposals, q, *args):
        seen_q.append(q)
        return verify(logits, proposals, q, *args)

    prompts, params = workload(tiny, 3), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    spec = spec_config("heads", 3, heads_file)
    own = LLM("tiny", speculative=spec)
    expected = [o.token_ids for o in own.generate(prompts, params, use_tqdm=False)]
    same = LLM("tiny", speculative=spec, components=Components(propose_heads=propose_heads))
    assert [o.token_ids for o in same.generate(prompts, params, use_tqdm=False)] == expected
    assert same.engine.speculator.stats == own.engine.speculator.stats
    sevens = LLM("tiny", speculative=spec, components=Components(propose_heads=recording, verify=recording_verify))
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=0, ignore_eos=True)
    assert [o.token_ids for o in sevens.generate(prompts, params, use_tqdm=False)] == expected
    sevens.generate(prompts, sampled, use_tqdm=False)
    assert calls and all(shape[1] == tiny.model.config.hidden_size and 1 <= k <= 3 for shape, k in calls)
    assert sevens.engine.speculator.stats.proposed > 0 and all(q is None for q in seen_q)
    with pytest.raises(ValueError, match="0 <= k"):
        propose_heads(torch.zeros(1, 4), SpecHeads(4, 2).blocks, torch.nn.Linear(4, 5), 3)
