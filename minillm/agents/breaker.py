"""A loop breaker: the circuit breaker an agent harness checks after every model call.

Agents fail by looping: the model asks for the same tool call again and again, or a task never
converges and burns tokens. The breaker stops a session on the first of three rules:

  * repeat: the same output (normalised) max_repeats times within the last repeat_window calls;
  * tokens: the session's tokens (the caller's count per call, summed) reach max_tokens;
  * calls:  the session has made max_calls calls.

Each rule fires at its boundary exactly: the max_calls-th call, the call whose tokens bring the
sum to max_tokens or beyond, the max_repeats-th copy. Lab 08's learners write their own class with
this interface and hand it to the harness as `breaker=`.
"""
import re
from collections import Counter, deque


def normalise(output: str) -> str:
    """The text two calls must share to count as a repeat: case, whitespace and numbers (counters,
    timestamps, ids that change on every turn of a loop) do not tell them apart."""
    return re.sub(r"\s+", " ", re.sub(r"\d+", "0", output.lower())).strip()


class LoopBreaker:
    def __init__(self, max_calls: int, max_tokens: int, repeat_window: int, max_repeats: int) -> None:
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("repeat_window", repeat_window), ("max_repeats", max_repeats)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_repeats > repeat_window:
            raise ValueError(f"max_repeats ({max_repeats}) must be <= repeat_window ({repeat_window}): "
                             f"more repeats than the window holds could never be seen")
        self.max_calls, self.max_tokens = max_calls, max_tokens
        self.repeat_window, self.max_repeats = repeat_window, max_repeats
        self.calls = self.tokens = 0
        self.recent: deque[str] = deque(maxlen=repeat_window)  # the last repeat_window outputs, normalised

    def check(self, output: str, tokens: int) -> str | None:
        """Record one call's output and tokens. -> why the session must stop now, or None to go on."""
        self.calls += 1
        self.tokens += tokens
        self.recent.append(normalise(output))
        repeats = Counter(self.recent)[self.recent[-1]]
        if repeats >= self.max_repeats:
            return f"repeat: the same output {repeats} times in the last {len(self.recent)} calls"
        if self.tokens >= self.max_tokens:
            return f"tokens: {self.tokens} tokens used, the cap is {self.max_tokens}"
        if self.calls >= self.max_calls:
            return f"calls: {self.calls} calls made, the cap is {self.max_calls}"
        return None
