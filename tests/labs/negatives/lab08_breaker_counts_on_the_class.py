"""Counts calls and tokens on the class (LoopBreaker.calls += 1): every breaker shares one count, so a second
session, or a second breaker beside the first, starts where the others left off."""
EXERCISE = "8.8"


class LoopBreaker:
    calls = 0
    tokens = 0

    def __init__(self, max_calls, max_tokens, repeat_window, max_repeats):
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("repeat_window", repeat_window), ("max_repeats", max_repeats)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_repeats > repeat_window:
            raise ValueError("max_repeats must be <= repeat_window")
        self.max_calls, self.max_tokens, self.max_repeats = max_calls, max_tokens, max_repeats
        self.recent = deque(maxlen=repeat_window)

    def check(self, output, tokens):
        LoopBreaker.calls += 1
        LoopBreaker.tokens += tokens
        self.recent.append(normalise(output))
        repeats = Counter(self.recent)[self.recent[-1]]
        if repeats >= self.max_repeats:
            return f"repeat: {repeats} times"
        if LoopBreaker.tokens >= self.max_tokens:
            return f"tokens: {LoopBreaker.tokens}"
        if LoopBreaker.calls >= self.max_calls:
            return f"calls: {LoopBreaker.calls}"
        return None
