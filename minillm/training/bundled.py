"""Reproducible training of the bundled models: `python -m minillm train`.

Corpus: the Python standard library's own source (present wherever Python is), split by file
into train and held-out sets. Tokenizer: a byte-level BPE trained on the train split. Models: two
Llama-architecture decoders built from minillm's own model code, sharing that tokenizer:
`tiny` (the target) and `pico` (its draft for speculative decoding). Everything is seeded and the
schedule is a fixed number of steps, so the same machine reproduces the same weights.
"""
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minillm.corpus import EOT, corpus_split, encode_corpus
from minillm.layers.attention import PackedRows
from minillm.models.export import save_checkpoint
from minillm.models.llama import LlamaForCausalLM
from minillm.models.model_config import ModelConfig
from minillm.perf import machine
from minillm.training.modelcard import write_card

# 4096 tokens: large enough that common identifiers and indentation runs are single tokens
# (about 3.4 bytes a token on this corpus), small enough that the embedding stays a modest share of
# a few-million-parameter model and the output softmax is not what decode time is spent on.
VOCAB_SIZE = 4096


@dataclass(frozen=True)
class Preset:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    steps: int
    batch: int
    lr: float
    seq_len: int = 256
    max_positions: int = 512


PRESETS = {
    "pico": Preset(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, steps=1500, batch=16, lr=3e-3),
    "tiny": Preset(hidden=256, layers=6, heads=8, kv_heads=4, intermediate=768, steps=1600, batch=16, lr=2e-3),
}


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def batch_loss(model: LlamaForCausalLM, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over rows: [batch, seq_len + 1] token ids."""
    b, t = rows.shape[0], rows.shape[1] - 1
    positions = torch.arange(t).repeat(b)
    hidden = model(rows[:, :-1].reshape(-1), positions, PackedRows(b, t))
    return F.cross_entropy(model.compute_logits(hidden).float(), rows[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_perplexity(model: LlamaForCausalLM, ids: torch.Tensor, seq_len: int = 256) -> float:
    """exp(mean NLL) over non-overlapping windows of seq_len + 1 tokens (the tail that does not fill
    a window is dropped); every window starts without context, as a fresh prompt would."""
    n = (len(ids) - 1) // seq_len
    windows = torch.stack([ids[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)])
    total = 0.0
    for chunk in windows.split(32):
        total += batch_loss(model, chunk).item() * chunk.shape[0]
    return math.exp(total / n)


def unigram_perplexity(train_ids: torch.Tensor, heldout_ids: torch.Tensor, vocab: int) -> float:
    """The baseline that knows only token frequencies (add-one smoothed, from the train split)."""
    counts = torch.bincount(train_ids, minlength=vocab).double() + 1
    logp = (counts / counts.sum()).log()
    return math.exp(-logp[heldout_ids[1:]].mean().item())


def hf_config(p: Preset, eot: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB_SIZE,
        "hidden_size": p.hidden, "intermediate_size": p.intermediate, "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads, "num_key_value_heads": p.kv_heads, "head_dim": p.hidden // p.heads,
        "max_position_embeddings": p.max_positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
        "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32", "initializer_range": 0.02,
    }


def init_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def train_model(name: str, train_ids: torch.Tensor, heldout_ids: torch.Tensor, eot: int,
                seed: int, bf16: bool) -> tuple[LlamaForCausalLM, dict]:
    """bf16: run the forward and backward in bfloat16 autocast (the weights and optimizer stay
    float32); about twice the tokens per second on CPUs with bf16 instructions.
    Progress: a bar on stderr with the loss, the last held-out loss and the time left."""
    p = PRESETS[name]
    cfg_dict = hf_config(p, eot)
    cfg = ModelConfig.from_dict(cfg_dict)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    init_weights(model, seed)
    decay = [q for q in model.parameters() if q.dim() == 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=p.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    curve, start = [], time.perf_counter()
    probe = heldout_ids[: 32 * p.seq_len + 1]  # a small fixed held-out slice for the loss curve
    bar = tqdm(range(1, p.steps + 1), desc=f"train {name}", unit="step", file=sys.stderr, dynamic_ncols=True)
    heldout = "n/a"  # until the first evaluation
    for step in bar:
        lr = p.lr * min(1.0, step / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / p.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - p.seq_len - 1, (p.batch,), generator=gen)
        rows = torch.stack([train_ids[s:s + p.seq_len + 1] for s in starts.tolist()])
        with torch.autocast(train_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = batch_loss(model, rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == p.steps:
            model.eval()
            val = math.log(heldout_perplexity(model, probe, p.seq_len))
            model.train()
            elapsed = time.perf_counter() - start
            curve.append({"step": step, "train_loss": round(loss.item(), 4), "heldout_loss": round(val, 4),
                          "seconds": round(elapsed, 1)})
            heldout = f"{val:.3f}"
        bar.set_postfix({"loss": f"{loss.item():.3f}", "held-out": heldout}, refresh=False)
    model.eval()
    info = {"preset": p.__dict__, "parameters": sum(q.numel() for q in model.parameters()),
            "train_seconds": round(time.perf_counter() - start, 1), "loss_curve": curve,
            "train_tokens_seen": p.steps * p.batch * p.seq_len, "precision": "bf16 autocast" if bf16 else "fp32"}
    return model, info


def train_all(out_root: Path, names: list[str], seed: int = 0, bf16: bool = True, log=print) -> None:
    train_texts, heldout_texts, digest = corpus_split()
    log(f"corpus: {len(train_texts)} train files, {len(heldout_texts)} held-out files ({digest})")
    tok = train_tokenizer(train_texts)
    eot = tok.token_to_id(EOT)
    train_ids, heldout_ids = encode_corpus(tok, train_texts), encode_corpus(tok, heldout_texts)
    unigram = unigram_perplexity(train_ids, heldout_ids, VOCAB_SIZE)
    log(f"tokens: {len(train_ids):,} train, {len(heldout_ids):,} held-out; unigram perplexity {unigram:.1f}")
    for name in names:
        model, info = train_model(name, train_ids, heldout_ids, eot, seed, bf16)
        ppl = heldout_perplexity(model, heldout_ids)
        log(f"[{name}] held-out perplexity {ppl:.2f} (unigram {unigram:.1f})")
        out = out_root / name
        p = PRESETS[name]
        save_checkpoint(model, model.config, hf_config(p, eot), out)
        tok.save(str(out / "tokenizer.json"))
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eot, "bos_token_id": eot}) + "\n")
        info.update({
            "heldout_perplexity": round(ppl, 3), "unigram_perplexity": round(unigram, 3),
            "heldout_digest": digest, "heldout_tokens": len(heldout_ids), "train_tokens": len(train_ids),
            "bytes_per_token": round(sum(len(t.encode()) for t in train_texts) / len(train_ids), 3),
            "seed": seed, "machine": machine(),
        })
        (out / "training_log.json").write_text(json.dumps(info, indent=1) + "\n")
        write_card(out)
