"""Sampling: seeds, temperature, top-k and top-p on distributions built so the answer is known."""
import pytest
import torch

from minillm import SamplingParams
from minillm.sampling import sample, sample_requests, top_k_filter, top_p_filter


def draws(logits: torch.Tensor, params: SamplingParams, n: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [sample_requests(logits[None], [params], [gen])[0] for _ in range(n)]


def test_top_k_never_emits_outside_the_k_largest():
    logits = torch.tensor([2.0, -1.0, 3.0, 0.5, -3.0, 2.5, 1.0])  # top-3: indices 2, 5, 0
    seen = set(draws(logits, SamplingParams(temperature=1.5, top_k=3), 600))
    assert seen == {0, 2, 5}


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])  # sorted: 0.5, 0.3 (cum 0.8), 0.15 (cum 0.95), 0.05
    logits = probs.log()
    assert set(draws(logits, SamplingParams(temperature=1.0, top_p=0.85), 800)) == {1, 2, 3}
    assert set(draws(logits, SamplingParams(temperature=1.0, top_p=0.8), 800)) == {1, 2}
    assert set(draws(logits, SamplingParams(temperature=1.0, top_p=0.4), 200)) == {1}


def test_filtered_distribution_is_softmax_of_tempered_logits_renormalised():
    logits = torch.tensor([1.0, -2.0, 0.5, 3.0, -0.5])
    got = top_p_filter(top_k_filter(logits[None] / 0.7, 3), 1.0)[0].softmax(-1)
    keep = torch.tensor([True, False, True, True, False])
    want = torch.where(keep, (logits / 0.7).exp(), torch.zeros(5))
    torch.testing.assert_close(got, want / want.sum())


@pytest.mark.parametrize("k, p", [(1, 1.0), (5, 1.0), (0, 0.3), (0, 0.9), (7, 0.75), (40, 0.5)])
def test_filters_match_the_transformers_logits_warpers(k, p):
    """Random rows of both signs, batch > 1, against Hugging Face's TopK/TopP warpers (the
    reference no one here wrote): the same tokens survive."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
    logits = torch.randn(6, 97, generator=torch.Generator().manual_seed(k * 100 + int(p * 10))) * 3
    ours = top_p_filter(top_k_filter(logits, k), p)
    theirs = logits
    if k:
        theirs = TopKLogitsWarper(top_k=k)(None, theirs)
    if p < 1:
        theirs = TopPLogitsWarper(top_p=p)(None, theirs)
    assert torch.equal(ours.isinf(), theirs.isinf())
    torch.testing.assert_close(ours[~ours.isinf()], logits[~ours.isinf()])


def test_sampling_frequencies_follow_the_temperature():
    logits = torch.tensor([0.0, 1.0, -1.0])
    counts = torch.bincount(torch.tensor(draws(logits, SamplingParams(temperature=2.0), 6000)), minlength=3)
    expected = (logits / 2.0).softmax(-1)
    assert torch.allclose(counts / 6000, expected, atol=0.03)


def test_same_seed_same_tokens_different_seed_different_tokens(llama_llm):
    prompt = [5, 17, 99, 42]
    run = lambda seed: llama_llm.generate([prompt], SamplingParams(max_tokens=24, temperature=1.0, seed=seed,
                                                                   ignore_eos=True))[0].token_ids  # noqa: E731
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_temperature_near_zero_equals_greedy(llama_llm):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    greedy = llama_llm.generate([prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    cold = llama_llm.generate([prompt], SamplingParams(max_tokens=20, temperature=1e-4, seed=1, ignore_eos=True))[0]
    assert cold.token_ids == greedy.token_ids


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.1), "temperature"), (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(stop=[""]), "stop"), (dict(seed=1.5), "seed"),
])
def test_invalid_sampling_params_are_rejected_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_logprobs_are_the_models_own_log_softmax_with_the_sampled_token(llama_llm):
    prompt = [3, 1, 4, 1, 5]
    out = llama_llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.9, top_k=5, seed=3, logprobs=4,
                                                      ignore_eos=True))[0].outputs[0]
    ids = list(prompt)
    for token, reported in zip(out.token_ids, out.logprobs):
        expected = llama_llm.logits(ids)[-1].log_softmax(-1)  # before temperature and top-k
        best = expected.topk(4).indices.tolist()
        assert set(reported) == set(best) | {token}
        for t, value in reported.items():
            assert abs(value - float(expected[t])) < 1e-4
        ids.append(token)


def test_extreme_but_valid_values_sample_without_overflow():
    """A temperature near 0 is greedy and a top_p under float32's range keeps the top token (vLLM's rules): dividing
    the logits by 1e-191 or comparing against a top_p that rounds to 0 would leave no token to draw."""
    from minillm.sampling import GREEDY_BELOW, MIN_TOP_P
    assert SamplingParams(temperature=1e-191).greedy and not SamplingParams(temperature=GREEDY_BELOW).greedy
    assert SamplingParams(top_p=1e-300).top_p == MIN_TOP_P
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.7, top_p=1e-300)
    token = sample(logits, params.temperature, params.top_k, params.top_p, torch.Generator().manual_seed(1))
    assert torch.equal(token, logits.argmax(-1))
    with pytest.raises(ValueError, match="repetition_penalty must be a number from 0.01 to 100"):
        SamplingParams(repetition_penalty=5e-324)
