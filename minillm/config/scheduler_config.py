"""SchedulerConfig: which sequences run each step, and how much one step may compute."""
from dataclasses import dataclass

from minillm.sequence import Label


class SchedulerPolicy(Label):
    CONTINUOUS = "continuous"
    STATIC = "static"
    SEQUENTIAL = "sequential"


@dataclass(frozen=True)
class SchedulerConfig:
    """The Scheduler's settings (engine/scheduler.py, engine/policy.py). The flat knobs are the field names,
    but for `scheduler`, which sets `policy`."""

    policy: SchedulerPolicy = SchedulerPolicy.CONTINUOUS
    """continuous: waiting sequences join and finished ones leave at every step; static: a batch runs until
    its last member finishes (the baseline); sequential: one request at a time. Knob: `scheduler`."""

    max_num_seqs: int = 64
    """Sequences running at once."""

    max_num_batched_tokens: int = 1024
    """Tokens computed per step, prompt tokens and decodes together: the step's token budget."""

    enable_chunked_prefill: bool = True
    """Split a prompt longer than what is left of the budget across steps (continuous only)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", SchedulerPolicy.parse("scheduler", self.policy))
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
