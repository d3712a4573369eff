"""The logits controls (logit_bias, repetition / presence / frequency penalties, min_tokens): each
against transformers' own logits processor, or the OpenAI formula, on random logits of both signs
and histories with repeats, in batches whose rows ask for different controls; then in the engine,
batched and alone, with speculation and with a grammar."""
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from minillm import LLM, SamplingParams
from minillm.config import SpeculativeConfig
from minillm.logits_processors import History, process_logits, token_counts

VOCAB = 37


def random_case(seed: int, params: list[SamplingParams], prompt_len: int = 6, output_len: int = 9):
    """-> (logits [rows, VOCAB] of both signs, histories): token ids drawn from a small range so
    that the prompts and outputs repeat tokens, and a few tokens occur only in the prompt."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(params), VOCAB, generator=gen) * 4
    histories = []
    for p in params:
        prompt = torch.randint(0, 12, (prompt_len,), generator=gen).tolist() + [30]  # 30: in the prompt only
        output = torch.randint(0, 12, (output_len,), generator=gen).tolist()
        histories.append(History(p, prompt + output, len(prompt), {0, 5}))
    return logits, histories


def test_token_counts_equal_a_bincount_per_row():
    rows = [[3, 3, 1, 0, 3], [], [36, 36], [2]]
    counts = token_counts(rows, VOCAB)
    for row, got in zip(rows, counts):
        torch.testing.assert_close(got, torch.bincount(torch.tensor(row, dtype=torch.long), minlength=VOCAB).float())


def test_repetition_penalty_matches_transformers_row_by_row():
    penalties = [1.0, 1.3, 0.7, 2.0]  # neutral, the usual, one that rewards repeats, a strong one
    logits, histories = random_case(0, [SamplingParams(repetition_penalty=r) for r in penalties])
    got = process_logits(logits, histories)
    for i, (r, h) in enumerate(zip(penalties, histories)):
        want = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([h.token_ids]), logits[i:i + 1].clone())[0]
        torch.testing.assert_close(got[i], want, msg=f"row {i}, penalty {r}")
    assert torch.equal(got[0], logits[0])
    assert got[1, 30] != logits[1, 30], "a token of the prompt only must be penalised too"


def openai_penalties(logits: torch.Tensor, output: list[int], presence: float, frequency: float) -> torch.Tensor:
    """The OpenAI docs' formula, token by token:
    mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence, c over the output."""
    out = logits.clone()
    for j in range(len(out)):
        c = output.count(j)
        out[j] = out[j] - c * frequency - float(c > 0) * presence
    return out


def test_presence_and_frequency_follow_the_openai_formula_over_the_output_only():
    pairs = [(0.0, 0.0), (0.8, 0.0), (0.0, 1.5), (-1.0, 2.0), (2.0, -0.5)]
    logits, histories = random_case(1, [SamplingParams(presence_penalty=a, frequency_penalty=b) for a, b in pairs])
    got = process_logits(logits, histories)
    for i, ((presence, frequency), h) in enumerate(zip(pairs, histories)):
        want = openai_penalties(logits[i], list(h.token_ids[h.num_prompt_tokens:]), presence, frequency)
        torch.testing.assert_close(got[i], want, msg=f"row {i}, presence {presence}, frequency {frequency}")
    assert torch.equal(got[:, 30], logits[:, 30]), "a token only in the prompt is not penalised"


def test_logit_bias_matches_transformers_sequence_bias_of_single_tokens():
    biases = [None, {3: 5.0, 30: -100.0}, {0: 2.5}, {7: -1.0, 8: 1.0, 36: 100.0}]
    logits, histories = random_case(2, [SamplingParams(logit_bias=b) for b in biases])
    got = process_logits(logits, histories)
    for i, (b, h) in enumerate(zip(biases, histories)):
        want = logits[i:i + 1].clone()
        if b:
            bias = SequenceBiasLogitsProcessor(sequence_bias=[[[t], v] for t, v in b.items()])
            want = bias(torch.tensor([h.token_ids]), want)
        torch.testing.assert_close(got[i], want[0], msg=f"row {i}, bias {b}")


def test_min_tokens_matches_transformers_min_new_tokens():
    # 9 output tokens each: held back below 10 and 12, free at 9 and 3 (and at 0, the neutral row)
    mins = [0, 10, 9, 3, 12]
    logits, histories = random_case(3, [SamplingParams(min_tokens=m, max_tokens=20) for m in mins])
    got = process_logits(logits, histories)
    for i, (m, h) in enumerate(zip(mins, histories)):
        stops = sorted(h.stop_token_ids)
        masker = MinNewTokensLengthLogitsProcessor(h.num_prompt_tokens, m, stops) if m else None
        want = masker(torch.tensor([h.token_ids]), logits[i:i + 1].clone())[0] if masker else logits[i]
        assert torch.equal(got[i], want), f"row {i}, min_tokens {m}"
    assert got[1, [0, 5]].isinf().all() and not got[2].isinf().any()


def test_all_controls_together_apply_in_transformers_order():
    """Bias then repetition penalty, as transformers' generate builds its list (they do not commute),
    then presence / frequency and min_tokens: one row with everything, beside a neutral one."""
    full = SamplingParams(logit_bias={1: 3.0, 2: -4.0, 9: 1.5}, repetition_penalty=1.4, presence_penalty=0.5,
                          frequency_penalty=0.3, min_tokens=15, max_tokens=20)
    logits, histories = random_case(4, [SamplingParams(), full])
    got = process_logits(logits, histories)
    h = histories[1]
    ids = torch.tensor([h.token_ids])
    hf = LogitsProcessorList([SequenceBiasLogitsProcessor([[[t], v] for t, v in full.logit_bias.items()]),
                              RepetitionPenaltyLogitsProcessor(1.4)])(ids, logits[1:2].clone())[0]
    hf = openai_penalties(hf, list(h.token_ids[h.num_prompt_tokens:]), 0.5, 0.3)
    hf = MinNewTokensLengthLogitsProcessor(h.num_prompt_tokens, 15, sorted(h.stop_token_ids))(ids, hf[None])[0]
    torch.testing.assert_close(got[1], hf)
    assert torch.equal(got[0], logits[0])


def test_a_batch_without_controls_is_returned_untouched():
    logits, histories = random_case(5, [SamplingParams(), SamplingParams(temperature=0, top_k=3)])
    assert process_logits(logits, histories) is logits


def test_processing_never_writes_into_the_models_logits():
    logits, histories = random_case(6, [SamplingParams(repetition_penalty=1.5, logit_bias={4: 9.0}, min_tokens=20,
                                                       max_tokens=20)])
    before = logits.clone()
    process_logits(logits, histories)
    assert torch.equal(logits, before)


# -- in the engine --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return LLM("tiny")


PROMPTS = ["def add(a, b):\n    return a + b\n", "x = 1\n", "import os\nimport sys\n", "class Stack:\n"]


def greedy(max_tokens: int = 24, **controls) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **controls)


def test_a_batch_of_different_controls_gives_each_request_its_tokens_alone(tiny):
    params = [greedy(), greedy(frequency_penalty=1.0), greedy(repetition_penalty=1.3, presence_penalty=0.5),
              greedy(logit_bias={63: -100.0, 23: 4.0}, min_tokens=10, stop_token_ids=[199])]
    batched = tiny.generate(PROMPTS, params, use_tqdm=False)
    alone = [tiny.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(PROMPTS, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    plain = tiny.generate(PROMPTS, [greedy()] * 4, use_tqdm=False)
    assert all(b.token_ids != p.token_ids for b, p in zip(batched[1:], plain[1:])), "every control changed its output"


def test_a_large_logit_bias_forces_its_token_and_a_negative_one_bans_it(tiny):
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    forced = tiny.generate([prompt], greedy(8, logit_bias={1234: 100.0}), use_tqdm=False)[0]
    assert forced.token_ids == [1234] * 8
    raw = tiny.logits(prompt)[-1]  # [vocab]: the model's own next-token logits
    first, second = raw.topk(2).indices.tolist()
    banned = tiny.generate([prompt], greedy(1, logit_bias={first: -100.0}), use_tqdm=False)[0]
    assert banned.token_ids == [second]


def test_min_tokens_holds_back_a_stop_token_and_eos(tiny):
    stop = 63  # tiny's 5th greedy token after "x = 1\n", and again later
    free = tiny.generate(["x = 1\n"], greedy(stop_token_ids=[stop]), use_tqdm=False)[0]
    assert free.token_ids[-1] == stop and len(free.token_ids) == 5 and free.finish_reason == "stop"
    held = tiny.generate(["x = 1\n"], greedy(stop_token_ids=[stop], min_tokens=8), use_tqdm=False)[0]
    assert len(held.token_ids) > 8 and stop not in held.token_ids[:8]
    eos = tiny.engine.eos_token_ids[0]  # biased so that it is the greedy choice at once, held back until 6 tokens
    out = tiny.generate(["x = 1\n"], greedy(logit_bias={eos: 100.0}, min_tokens=6), use_tqdm=False)[0]
    assert len(out.token_ids) == 7 and out.token_ids[-1] == eos and out.finish_reason == "stop"


def test_min_tokens_holds_back_a_stop_string_inside_its_text(tiny):
    """vLLM's rule: a stop string counts only once the output is past min_tokens, and only where it
    ends in text that came after them. tiny writes "\ndef _get_req_req_...": "_re" first ends at
    token 6, then at token 9."""
    free = tiny.generate(["x = 1\n"], greedy(stop="_re"), use_tqdm=False)[0]
    assert free.text == "\ndef _get" and len(free.token_ids) == 6
    held = tiny.generate(["x = 1\n"], greedy(stop="_re", min_tokens=7), use_tqdm=False)[0]
    assert held.text == "\ndef _get_req" and len(held.token_ids) == 9 and held.finish_reason == "stop"


def repeats(tokens: list[int]) -> int:
    return len(tokens) - len(set(tokens))


def test_frequency_penalty_reduces_repeats(tiny):
    plain = tiny.generate(PROMPTS, greedy(48), use_tqdm=False)
    penalised = tiny.generate(PROMPTS, greedy(48, frequency_penalty=1.0), use_tqdm=False)
    before, after = sum(repeats(o.token_ids) for o in plain), sum(repeats(o.token_ids) for o in penalised)
    assert after < 0.8 * before, f"repeated tokens: {before} without the penalty, {after} with it"


def test_logprobs_stay_the_models_own_under_a_bias(tiny):
    prompt = tiny.tokenizer.encode(PROMPTS[1])
    out = tiny.generate([prompt], greedy(3, logit_bias={1234: 100.0}, logprobs=0), use_tqdm=False)[0]
    for i, (token, lp) in enumerate(zip(out.token_ids, out.outputs[0].logprobs)):
        raw = tiny.logits(prompt + out.token_ids[:i])[-1].float().log_softmax(-1)
        assert lp[token] == pytest.approx(float(raw[token]), abs=1e-4)


@pytest.fixture(scope="module", params=["ngram", "draft"])
def spec(request):
    return LLM("tiny", speculative=SpeculativeConfig(request.param, k=4))


def test_greedy_speculation_with_controls_emits_plain_greedy_tokens(tiny, spec):
    params = [greedy(40, frequency_penalty=0.4), greedy(40, repetition_penalty=1.2),
              greedy(40, presence_penalty=0.6, logit_bias={63: 2.0}), greedy(40, min_tokens=12, stop_token_ids=[63])]
    want = tiny.generate(PROMPTS, params, use_tqdm=False)
    got = spec.generate(PROMPTS, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics["spec_accepted"] for o in got) > 0, "no proposal was kept: the test checked nothing"


def test_sampled_speculation_verifies_against_the_processed_distribution(tiny, spec):
    """EOS biased to near-certainty but held back for 6 tokens: each verified position must see both
    (the proposals before it count as output), so the 7th token, and only it, is EOS."""
    eos = tiny.engine.eos_token_ids[0]
    params = SamplingParams(max_tokens=30, temperature=0.1, seed=3, logit_bias={eos: 100.0}, min_tokens=6)
    out = spec.generate(["#\n" * 6], params, use_tqdm=False)[0]  # tiny goes on with "#\n": proposals are kept
    assert len(out.token_ids) == 7 and out.token_ids[-1] == eos and eos not in out.token_ids[:6]
    assert out.metrics["spec_accepted"] > 0, "no proposal was kept: the test checked nothing"


def test_the_grammar_mask_applies_after_the_bias(tiny):
    pytest.importorskip("xgrammar")
    from minillm.structured import StructuredOutput
    seven, x = tiny.tokenizer.encode("7"), tiny.tokenizer.encode("x")  # one token each
    params = greedy(12, structured=StructuredOutput(regex="[0-9]{6}"), logit_bias={seven[0]: 30.0, x[0]: 100.0})
    out = tiny.generate(["n = "], params, use_tqdm=False)[0]
    assert out.text == "777777", "the biased digit wins, the biased letter stays forbidden by the grammar"


@pytest.mark.parametrize("kwargs, message", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-2.01), "frequency_penalty"),
    (dict(presence_penalty=float("nan")), "presence_penalty"), (dict(frequency_penalty=True), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(logit_bias={3: 101.0}), "logit_bias values"), (dict(logit_bias={-1: 1.0}), "logit_bias keys"),
    (dict(logit_bias={"50256": 1.0}), "logit_bias keys"), (dict(logit_bias=[(3, 1.0)]), "logit_bias must be a dict"),
    (dict(min_tokens=-1), "min_tokens"), (dict(min_tokens=65, max_tokens=64), "min_tokens"),
])
def test_out_of_range_controls_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_a_biased_token_outside_the_vocabulary_is_refused_naming_it(tiny):
    with pytest.raises(ValueError, match="token id 4096.*0 to 4095"):
        tiny.generate(["x = 1\n"], greedy(logit_bias={4096: 1.0}), use_tqdm=False)
