"""The step's sampling: the tokens each emitting sequence adds, from the rows of the step's logits.

A sequence that verified proposals emits what verification decided (Verdict.tokens); every other
one draws one token from its row: processed by its request's controls (logit_bias, penalties,
min_tokens: logits_processors.py), masked to what its grammar allows next (structured output, so
a penalty can never bring back a token the grammar forbids), then sampled with its own params and
generator. Requests that asked for logprobs get them for every token emitted, under the model's
own distribution at that token's row (raw: before the controls, as vLLM reports them by default).
"""
import itertools

import torch

from minillm.config import EngineConfig
from minillm.logits_processors import history_of, process_logits
from minillm.sampling import sample_requests, token_logprobs
from minillm.sequence import Sequence
from minillm.step import ScheduledSeq
from minillm.structured import apply_grammar_mask
from minillm.structured.grammar import new_bitmask

Emitted = tuple[Sequence, list[int], int]  # a sequence, the tokens it emits this step, its first row of logits


def first_rows(batch: list[ScheduledSeq]) -> list[int]:
    """Each batch item's first row in the step's logits (the runner returns num_logits rows per item)."""
    return list(itertools.accumulate((b.num_logits for b in batch), initial=0))


def dead_end(seq: Sequence) -> str:
    """Why no token is left for seq: its grammar allows only its end, which min_tokens holds back (or,
    without min_tokens pending, nothing its other controls leave)."""
    kind = seq.params.structured.key()[0].replace("_", " ") if seq.params.structured else "no constraint"
    made, least = len(seq.output_token_ids), seq.params.min_tokens
    if made < least:
        return (f"no token can come next: the {kind} allows only its end after these {made} tokens, and "
                f"min_tokens ({least}) holds the end back until there are {least}; ask for fewer min_tokens "
                f"or a {kind} whose outputs are that long")
    return (f"no token can come next after {made} tokens: the {kind} allows none that logit_bias and the "
            f"penalties leave")


class Sampler:
    """Draws the step's new tokens: each emitting row masked by its grammar, then sampled with its own
    params and generator (or the verified tokens of a speculating sequence); logprobs when asked for."""
    def __init__(self, config: EngineConfig) -> None:
        components = config.components
        self._sample = components.sample
        self._grammar_mask = components.grammar_mask or apply_grammar_mask

    def emit(self, emitting: list[tuple[Sequence, int]], logits: torch.Tensor, rows: list[int],
             verified: dict[Sequence, list[int]]) -> list[Emitted]:
        """emitting: (sequence, batch index) of each sequence the step reached the end of (a prompt's
        other samples join at its index); logits: [rows, vocab]. -> what each emits, drawn ones first."""
        drawn = [(seq, rows[i]) for seq, i in emitting if seq not in verified]
        drawn_logits = logits[[row for _, row in drawn]]  # [drawn, vocab]
        if any(seq.params.processes_logits for seq, _ in drawn):  # else not even a History is built
            drawn_logits = process_logits(drawn_logits, [history_of(seq) for seq, _ in drawn])
        masked = self._constrain(drawn_logits, [seq for seq, _ in drawn])
        # A row with no finite logit has no token to draw (its grammar and min_tokens disagree): sampling it
        # would raise, failing every sequence of the step. It ends alone, with the reason, and draws nothing.
        alive = torch.isfinite(masked).any(-1).tolist()
        for (seq, _), ok in zip(drawn, alive):
            if not ok:
                seq.error = dead_end(seq)
        live = [j for j, ok in enumerate(alive) if ok]
        tokens = iter(sample_requests(masked[live], [drawn[j][0].params for j in live],
                                      [drawn[j][0].generator for j in live], self._sample))
        emitted = [(seq, [next(tokens)] if ok else [], row) for (seq, row), ok in zip(drawn, alive)]
        emitted += [(seq, verified[seq], rows[i]) for seq, i in emitting if seq in verified]
        for seq, new, row in emitted:
            if seq.logprobs is not None:
                seq.logprobs += [token_logprobs(logits[row + j], t, seq.params.logprobs) for j, t in enumerate(new)]
        return emitted

    def _constrain(self, rows: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Mask the rows of structured samples to the tokens their grammar allows next.
        rows: [len(seqs), vocab] -> [len(seqs), vocab]"""
        constrained = [j for j, seq in enumerate(seqs) if seq.grammar is not None]
        if not constrained:
            return rows
        bitmask = new_bitmask(len(constrained), rows.shape[-1])  # [constrained, ceil(vocab / 32)]
        for r, j in enumerate(constrained):
            seqs[j].grammar.fill_bitmask(bitmask, r)
        rows = rows.clone()
        rows[constrained] = self._grammar_mask(rows[constrained], bitmask.to(rows.device))
        return rows
