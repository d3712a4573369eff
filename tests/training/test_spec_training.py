"""The trained parts of speculative decoding: tiny's multi-token-prediction heads and the draft
distilled from tiny (`python -m minillm train heads | distill`)."""
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer

from minillm import LLM, SamplingParams
from minillm.config import SpeculativeConfig
from minillm.corpus import encode_corpus, spread_rows
from minillm.models.prepare import load_model
from minillm.models.registry import BUNDLED_DIR
from minillm.speculative.distill import distill_loss
from minillm.speculative.heads import HEADS_FILE, SpecHeads, load_heads
from minillm.training.train_heads import (
    HeadsSchedule,
    fit_heads,
    greedy_continuations,
    heads_accuracy,
    heads_losses,
    training_rows,
)

TINY, PICO, DISTILLED = BUNDLED_DIR / "tiny", BUNDLED_DIR / "pico", BUNDLED_DIR / "pico-distilled"


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return load_model(TINY, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def code_ids() -> torch.Tensor:
    """A little Python in tiny's tokens: two standard-library modules."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in ("textwrap.py", "bisect.py")]
    return encode_corpus(HFTokenizer.from_file(str(TINY / "tokenizer.json")), texts)


def test_shipped_heads_load_for_tiny_and_are_refused_for_pico(tiny):
    heads = load_heads(TINY / HEADS_FILE, tiny)
    assert len(heads.blocks) == 8, "the shipped heads should cover speculative k up to 8"
    pico = load_model(PICO, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="trained for another model"):
        load_heads(TINY / HEADS_FILE, pico)
    llm = LLM("tiny", speculative=SpeculativeConfig("heads", k=8))  # found beside tiny's weights by default
    assert len(llm.engine.speculator.proposer.heads.blocks) == 8


def test_shipped_heads_guess_further_tokens_better_than_untrained_ones(tiny, code_ids):
    trained = heads_accuracy(load_heads(TINY / HEADS_FILE, tiny), tiny, code_ids, windows=4, seq_len=128)
    untrained = heads_accuracy(SpecHeads(tiny.config.hidden_size, 8), tiny, code_ids, windows=4, seq_len=128)
    assert trained["heads"][0] > untrained["heads"][0], (trained, untrained)
    assert sum(trained["heads"]) > sum(untrained["heads"]), (trained, untrained)


def test_a_few_seeded_steps_of_heads_training_lower_their_loss(tiny, code_ids):
    schedule = HeadsSchedule(num_heads=3, steps=12, batch=4, seq_len=48, lr=3e-3, warmup=1, seed=0)
    probe = spread_rows(code_ids, 4, 48 + 3 + 1)
    with torch.no_grad():
        before = heads_losses(SpecHeads(tiny.config.hidden_size, 3), tiny, probe)
    heads, curve = fit_heads(tiny, code_ids, schedule, progress=False)
    with torch.no_grad():
        after = heads_losses(heads, tiny, probe)
    assert after.mean() < before.mean(), f"loss before {before.tolist()}, after {after.tolist()}"
    again, _ = fit_heads(tiny, code_ids, schedule, progress=False)
    for a, b in zip(heads.parameters(), again.parameters()):
        assert torch.equal(a, b), "the same seed gave different heads"
    assert not any(p.requires_grad for p in tiny.parameters()), "the target should stay frozen"


def test_heads_train_on_the_targets_own_greedy_continuations(code_ids):
    rows = greedy_continuations("pico", code_ids, 3, prompt_tokens=7, new_tokens=9, seed=1)
    assert rows.shape == (3, 16)
    for row in rows.tolist():
        alone = LLM("pico").generate([row[:7]], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True),
                                     use_tqdm=False)[0]
        assert row[7:] == alone.token_ids, "a training row continues its prompt as the target itself would"
    gen = torch.Generator().manual_seed(0)
    picked = training_rows(rows, 5, 12, gen)
    assert picked.shape == (5, 12) and all(any(torch.equal(p, r[:12]) for r in rows) for p in picked)
    window = training_rows(code_ids, 2, 12, gen)  # a token stream: windows at random offsets
    assert window.shape == (2, 12)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_loss_is_kl_of_the_target_from_the_draft(temperature):
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(3, 5, 7, generator=gen) * 3  # [batch, positions, vocab], both signs
    teacher = torch.randn(3, 5, 7, generator=gen) * 3
    assert distill_loss(teacher, teacher, temperature).item() == pytest.approx(0.0, abs=1e-6)
    assert distill_loss(teacher + 5.0, teacher, temperature).item() == pytest.approx(0.0, abs=1e-5)
    got = distill_loss(student, teacher, temperature)
    assert got.item() > 0
    t = temperature
    ref = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                   reduction="sum") / (3 * 5) * t * t
    torch.testing.assert_close(got, ref)


def test_shipped_distilled_draft_shares_tinys_tokenizer_and_drafts_for_it():
    assert (DISTILLED / "tokenizer.json").read_bytes() == (TINY / "tokenizer.json").read_bytes()
    for name in ("config.json", "model.safetensors", "training_log.json", "README.md"):
        assert (DISTILLED / name).is_file(), f"pico-distilled lacks {name}"
    prompt, params = "def fibonacci(n):", SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    llm = LLM("tiny", speculative=SpeculativeConfig("draft", k=4, draft_model="pico-distilled"))
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert out.token_ids == LLM("tiny").generate(prompt, params, use_tqdm=False)[0].token_ids
    assert llm.engine.speculator.stats.accepted > 0, "the distilled draft had no proposal accepted"


@pytest.mark.subprocess
def test_train_help_lists_heads_and_distill():
    res = subprocess.run([sys.executable, "-m", "minillm", "train", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "heads" in res.stdout and "distill" in res.stdout
