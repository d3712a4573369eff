"""The decoding strategy (engine/decoding.py): plain decoding and the Speculator answer the engine core
the same three calls, and either way greedy outputs are the target's own."""
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import Components, SpeculativeConfig
from minillm.engine.decoding import PlainDecoding
from minillm.sequence import Phase, Sequence
from minillm.speculative.speculator import Speculator
from minillm.step import ScheduledSeq, Verdict

VOCAB = 11


class RecordingProposer:
    def __init__(self) -> None:
        self.verified_calls = []

    def propose(self, seqs, limits) -> None:
        for seq, k in zip(seqs, limits):
            seq.spec_tokens, seq.spec_probs = [3, 4, 5][:k], None

    def verified(self, seq, accepted, hidden) -> None:
        self.verified_calls.append((seq, accepted, hidden.tolist()))

    def release(self, seq) -> None:
        pass


def decoding_seq(request_id: str, tokens: list[int]) -> Sequence:
    seq = Sequence(request_id, None, tokens, SamplingParams(max_tokens=20, temperature=0), torch.Generator(), None, ())
    seq.num_computed_tokens = len(tokens) - 1
    return seq


def one_hot_rows(tokens: list[int]) -> torch.Tensor:
    """[len(tokens), VOCAB] logits whose argmax is each token."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), VOCAB).float()


def test_plain_decoding_proposes_verifies_and_observes_nothing():
    plain, seq = PlainDecoding(), decoding_seq("a", [1, 2])
    plain.propose([seq])
    assert seq.spec_tokens == []
    batch = [ScheduledSeq(seq, 1, Phase.DECODE, samples=True)]
    assert plain.verify(batch, one_hot_rows([6]), [0, 1]) == Verdict()


def test_the_speculator_verifies_and_observes_each_sequence_from_its_own_rows():
    proposer = RecordingProposer()
    speculator = Speculator(SpeculativeConfig("ngram", k=3), proposer, 100, Components())
    plain, spec = decoding_seq("plain", [1, 2]), decoding_seq("spec", [1, 2])
    speculator.propose([spec])
    assert spec.spec_tokens == [3, 4, 5]
    plain.spec_tokens = []  # a sequence may be scheduled without proposals (its first decode, say)
    batch = [ScheduledSeq(plain, 1, Phase.DECODE, samples=True),
             ScheduledSeq(spec, 4, Phase.DECODE, samples=True, num_proposals=3)]
    rows = [0, 1, 5]
    logits = torch.cat([one_hot_rows([9]), one_hot_rows([3, 4, 7, 8])])  # spec: keeps 3, 4; then the target's 7
    verdict = speculator.verify(batch, logits, rows)
    assert verdict.accepted == [0, 2] and verdict.tokens == {spec: [3, 4, 7]}
    assert [(r.request_id, r.proposed, r.accepted, r.token) for r in verdict.records] == [("spec", (3, 4, 5), 2, 7)]
    assert (speculator.stats.proposed, speculator.stats.accepted, speculator.stats.reached) == (3, 2, 3)
    hidden = torch.arange(5.0)[:, None]  # [rows, 1]: each row's hidden state is its index
    speculator.observe([(plain, [9], 0), (spec, [3, 4, 7], 1)], hidden)
    # the state after the last kept token: plain's only row; spec's row of its second accepted proposal
    assert proposer.verified_calls == [(plain, 0, [0.0]), (spec, 2, [3.0])]


@pytest.fixture(scope="module")
def plain_tiny():
    return LLM("tiny")


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_the_engine_holds_one_strategy_and_greedy_tokens_do_not_depend_on_it(method, plain_tiny):
    prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):", "for i in range(3):\n    print(i)\n"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    assert isinstance(plain_tiny.engine.decoding, PlainDecoding) and plain_tiny.engine.speculator is None
    spec = LLM("tiny", speculative=SpeculativeConfig(method, k=3))
    assert spec.engine.decoding is spec.engine.speculator
    want = [o.token_ids for o in plain_tiny.generate(prompts, params, use_tqdm=False)]
    outs = spec.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == want
    stats = spec.engine.speculator.stats
    assert stats.verifications > 0 and sum(o.metrics["spec_proposed"] for o in outs) == stats.proposed
