"""The step's sampling: the tokens each emitting sequence adds, from the rows of the step's logits.

A sequence that verified proposals emits what verification decided (Verdict.tokens); every other
one draws one token from its row: processed by its request's controls (logit_bias, penalties,
min_tokens: logits_processors.py), masked to what its grammar allows next (structured output, so
a penalty can never bring back a token the grammar forbids), then sampled with its own params and
generator. Requests that asked for logprobs get them for every token emitted, under the model's
own distribution at that token's row (raw: before the controls, as vLLM reports them by default).
What raises for one sequence's sake ends that sequence alone (engine/isolation.py).
"""
import itertools

import torch

from minillm.config import EngineConfig
from minillm.engine.isolation import fail_alone, rowwise
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
        seqs = [seq for seq, _ in drawn]
        drawn_logits = logits[[row for _, row in drawn]]  # [drawn, vocab]
        if any(seq.params.processes_logits for seq in seqs):  # else not even a History is built
            drawn_logits = rowwise(lambda x, ss: process_logits(x, [history_of(q) for q in ss]), drawn_logits, seqs,
                                   "applying its logit_bias, penalties and min_tokens")
        masked = self._constrain(drawn_logits, seqs)
        # A row with no finite logit has no token to draw (its grammar and min_tokens disagree, or a control
        # failed on it): sampling it would raise, failing every sequence of the step. It ends alone, drawing nothing.
        alive = [ok and seq.error is None for seq, ok in zip(seqs, torch.isfinite(masked).any(-1).tolist())]
        for seq, ok in zip(seqs, alive):
            if not ok and seq.error is None:
                seq.error = dead_end(seq)
        live = [j for j, ok in enumerate(alive) if ok]
        tokens = sample_requests(masked[live], [seqs[j].params for j in live], [seqs[j].generator for j in live],
                                 self._sample, on_error=lambda k, e: fail_alone(seqs[live[k]], "sampling", e))
        drawn_tokens = dict(zip(live, tokens))
        emitted = [(seq, [] if drawn_tokens.get(j) is None else [drawn_tokens[j]], row)
                   for j, (seq, row) in enumerate(drawn)]
        emitted += [(seq, verified[seq], rows[i]) for seq, i in emitting if seq in verified]
        for seq, new, row in emitted:
            if seq.logprobs is not None:
                try:
                    seq.logprobs += [token_logprobs(logits[row + j], t, seq.params.logprobs) for j, t in enumerate(new)]
                except Exception as e:
                    fail_alone(seq, "computing its logprobs", e)
        return emitted

    def _constrain(self, rows: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Mask the rows of structured samples to the tokens their grammar allows next.
        rows: [len(seqs), vocab] -> [len(seqs), vocab]"""
        constrained = [j for j, seq in enumerate(seqs) if seq.grammar is not None]
        if not constrained:
            return rows
        bitmask = new_bitmask(len(constrained), rows.shape[-1])  # [constrained, ceil(vocab / 32)]
        for r, j in enumerate(constrained):
            try:
                seqs[j].grammar.fill_bitmask(bitmask, r)
            except Exception as e:
                fail_alone(seqs[j], "masking its logits to its grammar", e)
        row_of = {seqs[j]: r for r, j in enumerate(constrained)}

        def mask(x: torch.Tensor, ss: list[Sequence]) -> torch.Tensor:
            return self._grammar_mask(x, bitmask[[row_of[q] for q in ss]].to(x.device))
        rows = rows.clone()
        rows[constrained] = rowwise(mask, rows[constrained], [seqs[j] for j in constrained],
                                    "masking its logits to its grammar")
        return rows
