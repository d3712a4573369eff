"""Distilling a draft toward its target: `python -m minillm train distill`.

The draft (pico) starts from its own weights and learns, on the corpus's train split, the target's
(tiny's) whole next-token distribution at every position instead of the corpus's next token:
distill_loss = KL(target || draft). Acceptance is sum_x min(p(x), q(x)) = 1 - TV(p, q), so a draft
nearer the target's distributions has more of its proposals survive. The result is written as a
bundled model of its own (pico-distilled), with the target's tokenizer, a training log and a card.
"""
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minillm.config import SpeculativeConfig
from minillm.corpus import random_rows, spread_rows
from minillm.layers.attention import PackedRows
from minillm.models.export import save_checkpoint
from minillm.models.prepare import load_model
from minillm.models.registry import BUNDLED_DIR, resolve_model_path
from minillm.perf import machine
from minillm.speculative.distill import distill_loss
from minillm.speculative.draft import check_same_vocabulary
from minillm.tokenizer import Tokenizer
from minillm.training.bundled import heldout_perplexity
from minillm.training.train_heads import (
    MAX_TOKENS,
    PROMPT_TOKENS,
    corpus_ids,
    heldout_prompts,
    learning_rate,
    measure_speculation,
)


@dataclass(frozen=True)
class DistillSchedule:
    steps: int = 600
    batch: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int = 50
    temperature: float = 1.0
    seed: int = 0


def logits_of(model: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """rows: [b, t] token ids -> next-token logits [b * t, vocab]."""
    b, t = rows.shape
    return model.compute_logits(model(rows.reshape(-1), torch.arange(t).repeat(b), PackedRows(b, t)))


def rows_distill_loss(draft: torch.nn.Module, target: torch.nn.Module, rows: torch.Tensor,
                      temperature: float = 1.0) -> torch.Tensor:
    """KL(target || draft) averaged over every position of rows [b, t]; the target gets no gradient."""
    with torch.no_grad():
        teacher = logits_of(target, rows)  # [b * t, vocab]
    return distill_loss(logits_of(draft, rows), teacher, temperature)


def fit_draft(draft: torch.nn.Module, target: torch.nn.Module, train_ids: torch.Tensor, probe: torch.Tensor,
              s: DistillSchedule, progress: bool = True) -> list[dict]:
    """Train the draft in place toward the frozen target; -> the loss curve (train, and on probe: [n, t])."""
    target.requires_grad_(False).eval()
    draft.train()
    torch.manual_seed(s.seed)
    decay = [p for p in draft.parameters() if p.dim() == 2]
    no_decay = [p for p in draft.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(s.seed)
    curve, start, heldout = [], time.perf_counter(), "n/a"
    bar = tqdm(range(1, s.steps + 1), desc="distill", unit="step", file=sys.stderr, dynamic_ncols=True,
               disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, s.steps, s.lr, s.warmup)
        loss = rows_distill_loss(draft, target, random_rows(train_ids, s.batch, s.seq_len, gen), s.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == s.steps:
            val = draft_agreement(draft, target, probe)["kl"]
            curve.append({"step": step, "train_kl": round(loss.item(), 4), "heldout_kl": round(val, 4),
                          "seconds": round(time.perf_counter() - start, 1)})
            heldout = f"{val:.3f}"
        bar.set_postfix({"kl": f"{loss.item():.3f}", "held-out": heldout}, refresh=False)
    draft.eval()
    return curve


@torch.no_grad()
def draft_agreement(draft: torch.nn.Module, target: torch.nn.Module, rows: torch.Tensor) -> dict:
    """Over every position of rows [n, t]: mean KL(target || draft), mean sum_x min(p, q) (the
    acceptance rate theory predicts at temperature 1 on this text) and how often the two argmaxes
    agree (its counterpart at temperature 0)."""
    was_training = draft.training
    draft.eval()
    kl = overlap = agree = 0.0
    for chunk in rows.split(8):
        p, q = logits_of(target, chunk).float(), logits_of(draft, chunk).float()  # [b * t, vocab]
        kl += distill_loss(q, p).item() * len(p)
        overlap += torch.minimum(p.softmax(-1), q.softmax(-1)).sum(-1).sum().item()
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
    draft.train(was_training)
    n = rows.numel()
    return {"positions": n, "kl": kl / n, "overlap": overlap / n, "greedy_agreement": agree / n}


def acceptance_table(target: str, draft: str, prompts: list[list[int]]) -> list[dict]:
    """The engine's acceptance rate with `draft` proposing, at temperatures 0 and 1, k = 1 and 4."""
    return [measure_speculation(target, SpeculativeConfig("draft", k=k, draft_model=draft), prompts, temp)
            for temp in (0.0, 1.0) for k in (1, 4)]


def train_distill(draft: str = "pico", target: str = "tiny", steps: int = 600, seed: int = 0,
                  out: Path | None = None, log=print) -> dict:
    """The `train distill` command: measure, distill, save as a bundled model, measure again."""
    draft_dir, target_dir = resolve_model_path(draft), resolve_model_path(target)
    student = load_model(draft_dir, torch.float32, torch.device("cpu"))
    teacher = load_model(target_dir, torch.float32, torch.device("cpu"))
    check_same_vocabulary(Tokenizer(draft_dir), Tokenizer(target_dir), student.config.vocab_size,
                          teacher.config.vocab_size, draft)
    train_ids, heldout_ids, digest = corpus_ids(target_dir)
    log(f"corpus: {len(train_ids):,} train tokens, {len(heldout_ids):,} held-out tokens ({digest})")
    probe = spread_rows(heldout_ids, 32, 256)  # the held-out slice the curve and agreement are measured on
    prompts = heldout_prompts(heldout_ids)
    before = {"agreement": draft_agreement(student, teacher, probe),
              "acceptance": acceptance_table(target, str(draft_dir), prompts)}
    schedule = DistillSchedule(steps=steps, seed=seed)
    start = time.perf_counter()
    curve = fit_draft(student, teacher, train_ids, probe, schedule)
    seconds = time.perf_counter() - start
    out = out or BUNDLED_DIR / f"{draft_dir.name}-distilled"
    save_checkpoint(student, student.config, json.loads((draft_dir / "config.json").read_text()), out)
    shutil.copyfile(target_dir / "tokenizer.json", out / "tokenizer.json")
    if (draft_dir / "generation_config.json").is_file():
        shutil.copyfile(draft_dir / "generation_config.json", out / "generation_config.json")
    after = {"agreement": draft_agreement(student, teacher, probe),
             "acceptance": acceptance_table(target, str(out), prompts)}
    info = {"draft": draft_dir.name, "target": target_dir.name, "schedule": asdict(schedule),
            "parameters": sum(p.numel() for p in student.parameters()), "train_seconds": round(seconds, 1),
            "train_tokens_seen": steps * schedule.batch * schedule.seq_len, "train_tokens": len(train_ids),
            "loss_curve": curve, "heldout_digest": digest, "heldout_tokens": len(heldout_ids),
            "heldout_perplexity": round(heldout_perplexity(student, heldout_ids), 3),
            "draft_heldout_perplexity": json.loads((draft_dir / "training_log.json").read_text())["heldout_perplexity"]
            if (draft_dir / "training_log.json").is_file() else None,
            "prompts": {"count": len(prompts), "tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS},
            "before": before, "after": after, "seed": seed, "machine": machine()}
    (out / "training_log.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / "README.md").write_text(card(out.name, info))
    log(f"distilled in {seconds / 60:.1f} min; held-out KL {before['agreement']['kl']:.3f} -> "
        f"{after['agreement']['kl']:.3f}; wrote {out}")
    log(acceptance_markdown(info))
    return info


def acceptance_markdown(info: dict) -> str:
    rows = [f"| {b['temperature']:g} | {b['k']} | {b['acceptance_rate']:.3f} ({b['samples']}) | "
            f"{a['acceptance_rate']:.3f} ({a['samples']}) | {b['tokens_per_forward']:.2f} | "
            f"{a['tokens_per_forward']:.2f} |"
            for b, a in zip(info["before"]["acceptance"], info["after"]["acceptance"])]
    return (f"| temperature | k | acceptance, {info['draft']} (samples) | acceptance, distilled (samples) | "
            f"tokens per forward, {info['draft']} | tokens per forward, distilled |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows))


def card(name: str, info: dict) -> str:
    s, b, a = info["schedule"], info["before"]["agreement"], info["after"]["agreement"]
    picks = info["loss_curve"][:: max(1, len(info["loss_curve"]) // 8)]
    if picks[-1] is not info["loss_curve"][-1]:
        picks.append(info["loss_curve"][-1])
    curve = "\n".join(f"| {c['step']} | {c['train_kl']:.3f} | {c['heldout_kl']:.3f} | {c['seconds']:.0f} |"
                      for c in picks)
    p = info["prompts"]
    return f"""# minillm `{name}`

`{info['draft']}` ({info['parameters']:,} parameters, the same architecture and file layout), distilled
toward `{info['target']}` for speculative decoding with `python -m minillm train distill --draft {info['draft']} \
--target {info['target']} --steps {s['steps']}`. Its tokenizer is `{info['target']}`'s, byte for byte. Use it as
`LLM("{info['target']}", speculative=SpeculativeConfig("draft", k=4, draft_model="{name}"))`.

## Data and run
The bundled corpus's train split (the Python standard library's source, held-out set digest
`{info['heldout_digest']}`): {s['steps']} steps of {s['batch']} windows x {s['seq_len']} tokens
({info['train_tokens_seen']:,} tokens, about {info['train_tokens_seen'] / info['train_tokens']:.1f} epochs),
starting from `{info['draft']}`'s weights. Loss: KL(`{info['target']}` || draft) over every position, at temperature
{s['temperature']:g} (`minillm.speculative.distill.distill_loss`); the target is frozen. AdamW (betas 0.9, 0.95,
weight decay 0.1 on matrices), peak learning rate {s['lr']}, {s['warmup']} warm-up steps then cosine decay to
10%, gradient clipping at 1.0, seed {info['seed']}, fp32. Took {info['train_seconds'] / 60:.1f} minutes on
{info['machine']}.

| step | train KL | held-out KL (32 windows) | seconds |
| --- | --- | --- | --- |
{curve}

## Closeness to the target
On 32 held-out windows of 256 tokens ({a['positions']:,} positions), before and after distillation:

| | `{info['draft']}` | `{name}` |
| --- | --- | --- |
| KL(target \\|\\| draft), nats per token | {b['kl']:.3f} | {a['kl']:.3f} |
| sum min(p, q): the acceptance rate theory predicts at temperature 1 | {b['overlap']:.3f} | {a['overlap']:.3f} |
| argmax agreement: its counterpart at temperature 0 | {b['greedy_agreement']:.3f} | {a['greedy_agreement']:.3f} |
| held-out perplexity (whole held-out set) | {info['draft_heldout_perplexity']} | {info['heldout_perplexity']:.2f} |

## Acceptance measured through the engine
`LLM("{info['target']}", speculative=SpeculativeConfig("draft", k=k, draft_model=...))` on {p['count']} prompts of
{p['tokens']} held-out tokens, {p['max_tokens']} new tokens each (end-of-text ignored), engine seed 0. The
acceptance rate is accepted / reached (the theory's alpha); in brackets, the proposals the target reached.

{acceptance_markdown(info)}

## What it is for
Proposing tokens for `{info['target']}`: it was trained to agree with `{info['target']}`, not with the
corpus. Learning from a larger model's whole distributions also changed its own held-out perplexity
(compare above): a teacher's soft targets carry more than the corpus's one next token. Speculative
decoding's output is the target's either way; only the speed changes.
"""
