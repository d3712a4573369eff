"""Counts repeats over every call of the session, not only the last repeat_window."""
EXERCISE = "8.8"


class LoopBreaker:
    def __init__(self, max_calls, max_tokens, repeat_window, max_repeats):
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("repeat_window", repeat_window), ("max_repeats", max_repeats)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_repeats > repeat_window:
            raise ValueError("max_repeats must be <= repeat_window")
        self.max_calls, self.max_tokens, self.max_repeats = max_calls, max_tokens, max_repeats
        self.calls = self.tokens = 0
        self.seen = Counter()

    def check(self, output, tokens):
        self.calls += 1
        self.tokens += tokens
        key = normalise(output)
        self.seen[key] += 1
        if self.seen[key] >= self.max_repeats:
            return "repeat: the same output again"
        if self.tokens >= self.max_tokens:
            return "tokens: over the cap"
        if self.calls >= self.max_calls:
            return "calls: at the cap"
        return None
