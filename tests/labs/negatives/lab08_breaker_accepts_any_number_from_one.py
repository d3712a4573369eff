"""Checks each cap only against 1 (`value < 1`): 2.5 calls and a NaN token cap are accepted."""
EXERCISE = "8.8"


class LoopBreaker:
    def __init__(self, max_calls, max_tokens, repeat_window, max_repeats):
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("repeat_window", repeat_window), ("max_repeats", max_repeats)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        if max_repeats > repeat_window:
            raise ValueError("max_repeats must be <= repeat_window")
        self.max_calls, self.max_tokens, self.max_repeats = max_calls, max_tokens, max_repeats
        self.calls = self.tokens = 0
        self.recent = deque(maxlen=int(repeat_window))

    def check(self, output, tokens):
        self.calls += 1
        self.tokens += tokens
        self.recent.append(normalise(output))
        repeats = Counter(self.recent)[self.recent[-1]]
        if repeats >= self.max_repeats:
            return f"repeat: {repeats} times"
        if self.tokens >= self.max_tokens:
            return f"tokens: {self.tokens}"
        if self.calls >= self.max_calls:
            return f"calls: {self.calls}"
        return None
