"""Logits processors: a request's own controls on its next-token scores, applied before sampling.

Each row of logits belongs to one sequence at one position; its History is what the controls read:
the tokens before that position (prompt + output so far, plus, when verifying proposals, the
proposals before it) and the request's params. The order, the one vLLM V1 and transformers agree on:

    1. logit_bias           logit[t] += bias[t]                                  (OpenAI)
    2. repetition_penalty   for t in prompt + output: logit[t] / r if logit[t] > 0 else logit[t] * r   (CTRL, HF)
    3. presence, frequency  logit[t] -= presence * (count[t] > 0) + frequency * count[t],
                            count over the OUTPUT tokens only                     (OpenAI, vLLM)
    4. min_tokens           EOS and stop_token_ids -> -inf while output < min_tokens         (vLLM)
then the grammar mask (structured output) and temperature, top-k, top-p (sampling.py).

Bias comes before the repetition penalty as in transformers (SequenceBias, then RepetitionPenalty)
and vLLM (its logit-bias processor runs before its penalties); the two do not commute, since the
penalty scales a logit. The additive steps commute with each other, and a -inf mask survives
every step, so the rest of the order changes nothing.

Every control is vectorized over the rows that asked for it; a batch where no row asked for any
does no work at all (process_logits returns its input). Logprobs are not affected: the engine
reports them under the model's own distribution (engine/sampler.py).
"""
import itertools
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from minillm.sampling import SamplingParams


class History(NamedTuple):
    """What one row's controls read: the row scores the token after token_ids."""
    params: "SamplingParams"
    token_ids: Sequence[int]         # prompt + output before this row's position
    num_prompt_tokens: int
    stop_token_ids: Collection[int]  # what min_tokens holds back: EOS (unless ignore_eos) and stop_token_ids

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def history_of(seq, after: Sequence[int] = ()) -> History:
    """The History of a state.Sequence's next row, or (after: proposals) of the row after them."""
    token_ids = seq.token_ids if not after else [*seq.token_ids, *after]
    return History(seq.params, token_ids, seq.num_prompt_tokens, seq.stop_token_ids)


def token_counts(histories: list[Sequence[int]], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """How often each token occurs in each row's history: -> [rows, vocab] float32, by one
    scatter_add over the flattened (row, token) pairs."""
    flat = torch.tensor(list(itertools.chain.from_iterable(histories)), dtype=torch.long, device=device)
    lengths = torch.tensor([len(h) for h in histories], device=device)
    row = torch.repeat_interleave(torch.arange(len(histories), device=device), lengths)  # [total]
    counts = torch.zeros(len(histories) * vocab, device=device)
    return counts.scatter_add_(0, row * vocab + flat, torch.ones_like(flat, dtype=counts.dtype)).view(-1, vocab)


def apply_logit_bias(logits: torch.Tensor, biases: list[dict[int, float]]) -> torch.Tensor:
    """logits: [rows, vocab]; biases: one {token id: bias} per row -> logits + each row's bias."""
    row = torch.tensor([r for r, bias in enumerate(biases) for _ in bias], dtype=torch.long, device=logits.device)
    token = torch.tensor([t for bias in biases for t in bias], dtype=torch.long, device=logits.device)
    value = torch.tensor([v for bias in biases for v in bias.values()], dtype=logits.dtype, device=logits.device)
    return logits.index_put((row, token), value, accumulate=True)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """The CTRL rule (Keskar et al. 2019, as transformers applies it): a token already seen has its
    logit divided by the penalty when positive, multiplied when negative, so penalty > 1 always
    makes it less likely. logits: [rows, vocab]; seen: [rows, vocab] bool; penalty: [rows]."""
    r = penalty.to(logits).unsqueeze(-1)  # [rows, 1]
    return torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)


def apply_presence_frequency(logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor,
                             frequency: torch.Tensor) -> torch.Tensor:
    """OpenAI's formula: logit[t] -= presence * (count[t] > 0) + frequency * count[t].
    logits, counts: [rows, vocab] (counts over the output tokens); presence, frequency: [rows]."""
    presence, frequency = presence.to(logits).unsqueeze(-1), frequency.to(logits).unsqueeze(-1)  # [rows, 1]
    return logits - presence * (counts > 0).to(logits) - frequency * counts.to(logits)


def mask_tokens(logits: torch.Tensor, tokens: list[Collection[int]]) -> torch.Tensor:
    """logits: [rows, vocab]; tokens: the ids to forbid in each row -> those logits set to -inf."""
    row = torch.tensor([r for r, ids in enumerate(tokens) for _ in ids], dtype=torch.long, device=logits.device)
    token = torch.tensor([t for ids in tokens for t in ids], dtype=torch.long, device=logits.device)
    return logits.index_put((row, token), torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))


def process_logits(logits: torch.Tensor, histories: list[History]) -> torch.Tensor:
    """logits: [rows, vocab], row i scored after histories[i] -> the processed logits (a float32
    copy), or the input itself when no row asks for any control. Each control touches only its rows."""
    if not any(h.params.processes_logits for h in histories):
        return logits
    out = logits.to(torch.float32, copy=True)  # [rows, vocab]: the caller's logits stay the model's own
    vocab, device = out.shape[-1], out.device

    def rows_where(wants) -> list[int]:
        return [i for i, h in enumerate(histories) if wants(h.params)]

    def param(rows: list[int], name: str) -> torch.Tensor:  # [len(rows)]
        return torch.tensor([getattr(histories[i].params, name) for i in rows])

    if rows := rows_where(lambda p: p.logit_bias):
        out[rows] = apply_logit_bias(out[rows], [histories[i].params.logit_bias for i in rows])
    if rows := rows_where(lambda p: p.repetition_penalty != 1.0):
        seen = token_counts([histories[i].token_ids for i in rows], vocab, device) > 0  # prompt + output
        out[rows] = apply_repetition_penalty(out[rows], seen, param(rows, "repetition_penalty"))
    if rows := rows_where(lambda p: p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
        counts = token_counts([histories[i].token_ids[histories[i].num_prompt_tokens:] for i in rows], vocab, device)
        out[rows] = apply_presence_frequency(out[rows], counts, param(rows, "presence_penalty"),
                                             param(rows, "frequency_penalty"))
    held = [i for i, h in enumerate(histories) if h.num_output_tokens < h.params.min_tokens]
    if held:  # a stop id outside the vocabulary can never be drawn anyway
        out[held] = mask_tokens(out[held], [[t for t in histories[i].stop_token_ids if 0 <= t < vocab] for i in held])
    return out
