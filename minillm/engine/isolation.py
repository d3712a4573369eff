"""One request's failure is its own: a per-request operation of the step that raises ends that request alone.

The step works on a batch, but most of what it does there is one request's: its logits processors
(logit_bias, penalties, min_tokens), its grammar's mask and advance, its draw, its logprobs, its
detokenizing and stop strings. If one of those raises, for one request's sake, the step must not raise:
the engine thread would then fail every running request (engine_thread.py keeps that for true engine
faults, such as the model's forward). Instead the sequence records the failure (Sequence.error, with
`fault` set: the engine's own error, a 500, unlike a constraint's dead end, a 400) and the output
processor ends it with finish_reason "error"; the others go on, each with the tokens it would have had.
"""
import logging
from collections.abc import Callable

import torch

from minillm.sequence import Sequence

log = logging.getLogger(__name__)


def fail_alone(seq: Sequence, stage: str, error: Exception) -> None:
    """Record that the engine failed on seq while at `stage` (its own fault, not the batch's)."""
    log.error("request %s failed while %s", seq.request_id, stage, exc_info=error)
    if seq.error is None:
        seq.error, seq.fault = f"the engine failed on this request while {stage}: {type(error).__name__}: {error}", True


def rowwise(fn: Callable[[torch.Tensor, list[Sequence]], torch.Tensor], rows: torch.Tensor, seqs: list[Sequence],
            stage: str) -> torch.Tensor:
    """fn(rows, seqs) on the whole batch; if it raises, on each row alone, so that only the sequences it
    raises for fail (their rows become -inf: nothing left to draw) and the others get their own rows.
    fn must be pure (the same row gives the same result alone or in a batch). rows: [len(seqs), vocab]."""
    try:
        return fn(rows, seqs)
    except Exception:
        pass
    out = []
    for j, seq in enumerate(seqs):
        try:
            out.append(fn(rows[j:j + 1], [seq]))
        except Exception as e:
            fail_alone(seq, stage, e)
            out.append(torch.full_like(rows[j:j + 1], float("-inf")))
    return torch.cat(out) if out else rows
