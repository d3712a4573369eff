"""The request limits whose cost a client could otherwise choose: what each bounds, and the 400 past it.

    --max-stop-strings  16      stop strings per request: each is searched after every token
    --max-stop-chars    4096    their total length: the search window and the text held back grow with it
    MAX_JSON_DEPTH      100     a constant: how deeply the body's arrays and objects may nest

A stop string costs the engine thread a search on every token of every sample (output_processor.py
searches only the new text, so the cost is the number of strings times their length), and its longest
one is held back from the stream until it is ruled out; 16 strings of a line or two each are more than
clients send (OpenAI accepts 4), and 4,096 characters leave room for long ones.

Deep JSON is refused before anything walks it: the validators that check every string (protocol.py) and
the schema compiler recurse once per level, and ~600 levels exhaust Python's recursion limit (a 500). The
deepest body a client needs is a json_schema of nested objects, two levels each: 100 allows ~45 of them.
"""
from dataclasses import dataclass

MAX_JSON_DEPTH = 100


@dataclass(frozen=True)
class RequestLimits:
    max_stop_strings: int = 16
    """Stop strings per request (--max-stop-strings)."""
    max_stop_chars: int = 4096
    """Their total length, in characters (--max-stop-chars)."""

    def __post_init__(self) -> None:
        for name in ("max_stop_strings", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def check_stop(self, stop: str | list[str] | None) -> None:
        """ValueError naming the limit and its flag when the stop strings pass one."""
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > self.max_stop_strings:
            raise ValueError(f"stop has {len(strings)} strings; this server accepts at most {self.max_stop_strings} "
                             f"(its --max-stop-strings)")
        chars = sum(len(s) for s in strings)
        if chars > self.max_stop_chars:
            raise ValueError(f"the stop strings total {chars} characters; this server accepts at most "
                             f"{self.max_stop_chars} (its --max-stop-chars)")


DEFAULT_LIMITS = RequestLimits()


def json_depth_over(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether arrays and objects nest in value deeper than limit (`[]` is depth 1). Iterative: no
    recursion, so no depth can make it raise."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
