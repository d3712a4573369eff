"""Write a bundled model's card (README.md) from its training log and its own greedy completions."""
import json
import sys
from pathlib import Path

# No trailing newline: in training, a newline and the next line's indentation are usually one
# token, so a prompt that ends in a bare newline starts the model off an unusual token boundary.
SAMPLE_PROMPTS = ["def fibonacci(n):", "import os\n\n\ndef list_files(path):", "class Stack:\n    def __init__(self):"]
SAMPLE_TOKENS = 48


def greedy_samples(model_dir: Path) -> list[tuple[str, str]]:
    from minillm import LLM, SamplingParams
    llm = LLM(str(model_dir), device="cpu", dtype="float32")
    outs = llm.generate(SAMPLE_PROMPTS, SamplingParams(max_tokens=SAMPLE_TOKENS, temperature=0), use_tqdm=False)
    return [(p, o.text) for p, o in zip(SAMPLE_PROMPTS, outs)]


def write_card(model_dir: Path) -> None:
    log = json.loads((model_dir / "training_log.json").read_text())
    cfg = json.loads((model_dir / "config.json").read_text())
    p = log["preset"]
    name = model_dir.name
    role = ("the default model: the subject of most labs, and the target for speculative decoding"
            if name == "tiny" else "the draft model for speculative decoding: small, fast, and worse")
    curve = log["loss_curve"]
    picks = curve[:: max(1, len(curve) // 8)]
    if picks[-1] is not curve[-1]:
        picks.append(curve[-1])
    rows = "\n".join(f"| {c['step']} | {c['train_loss']:.3f} | {c['heldout_loss']:.3f} | {c['seconds']:.0f} |"
                     for c in picks)
    samples = "\n\n".join(f"```python\n{prompt}{text}\n```" for prompt, text in greedy_samples(model_dir))
    card = f"""# minillm `{name}`

A {log['parameters'] / 1e6:.2f}M-parameter Llama-architecture language model of Python code, trained by
this project with `python -m minillm train --models {name}` so that everything runs offline. It is
{role}.

## Architecture
| field | value |
| --- | --- |
| architecture | `LlamaForCausalLM` (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) |
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| attention heads / key-value heads | {cfg['num_attention_heads']} / {cfg['num_key_value_heads']} \
(head dim {cfg['head_dim']}) |
| MLP intermediate size | {cfg['intermediate_size']} |
| vocabulary | {cfg['vocab_size']} (byte-level BPE, shared by `tiny` and `pico`) |
| context | trained on {p['seq_len']}-token windows; `max_position_embeddings` {cfg['max_position_embeddings']} |
| embeddings | tied input/output |
| parameters | {log['parameters']:,} |

## Data
The Python standard library's own source (`.py` files outside `test/`, `tests/`, `idlelib/`,
`site-packages/`) of the Python that trained it ({sys.version.split()[0]} here), split by file: a file is
held out when the first byte of the SHA-256 of its relative path is below 13 (about 5% of files).
{log['train_tokens']:,} training tokens, {log['heldout_tokens']:,} held-out tokens (held-out set digest
`{log['heldout_digest']}`; a different Python version has a different stdlib and so a different digest).
The tokenizer averages {log['bytes_per_token']} bytes per token on the training text.

## Training
{p['steps']} steps of {p['batch']} windows x {p['seq_len']} tokens ({log['train_tokens_seen']:,} tokens, about
{log['train_tokens_seen'] / log['train_tokens']:.1f} epochs); AdamW (betas 0.9, 0.95, weight decay 0.1 on \
matrices), peak
learning rate {p['lr']}, 100 warm-up steps then cosine decay to 10%, gradient clipping at 1.0, seed {log['seed']},
{log['precision']}. Took {log['train_seconds'] / 60:.1f} minutes on {log['machine']}.

| step | train loss | held-out loss (32 windows) | seconds |
| --- | --- | --- | --- |
{rows}

## Quality
Held-out per-token perplexity over non-overlapping {p['seq_len']}-token windows of the whole held-out set:
**{log['heldout_perplexity']:.2f}**. A unigram model (token frequencies of the training split) scores
{log['unigram_perplexity']:.1f} on the same tokens. `tests/models/test_bundled_models.py` recomputes both from the
committed weights.

## Greedy samples
Each block is a prompt (its first lines, up to the colon) and the model's greedy continuation of
{SAMPLE_TOKENS} tokens, reproduced by `python -m minillm generate --model {name} --prompt ... \
--max-tokens {SAMPLE_TOKENS}`.

{samples}

## What it can and cannot do
It has learned the surface of Python: indentation, keywords, docstrings, common names and idioms of
the standard library. It writes code that looks like Python and often parses, but it does not
reason: functions rarely do what their names promise, and it repeats itself on long greedy runs.
Use it to watch an inference engine work (and, once labs 05 and 06 exist, to measure speculative
decoding's acceptance rate and quantization's perplexity cost), not to write code. Its knowledge
stops at the standard library's source; it has seen no natural-language chat.
"""
    (model_dir / "README.md").write_text(card)
