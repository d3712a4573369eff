"""Compiling a StructuredOutput for one tokenizer, and the per-sample matchers (on xgrammar).

xgrammar precomputes, for each grammar state, which of the vocabulary's tokens may come next; the
engine asks a sample's matcher for that set as a bitmask before each draw and tells it the token
that was drawn. The vocabulary is read from tokenizer.json as it is stored (byte-level BPE tokens
keep their byte-to-character encoding), so no `transformers` tokenizer is needed.

A compile can take seconds to minutes (a json_schema with thousands of properties) and xgrammar
cannot be interrupted, so compiles run one at a time on a worker thread (xgrammar releases the GIL)
and the caller waits at most `GrammarLimits.compile_timeout_s`: past it the request is refused while
the compile finishes in the background and is cached for the next one. Requests for the same spec
share one compile. Compiled grammars live in an LRU cache bounded in bytes (grammar_cache.py).
"""
import json
import re
import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm.structured.grammar_cache import GrammarCache
from minillm.structured.output_spec import StructuredOutput
from minillm.structured.worker import CompileWorker


@dataclass(frozen=True)
class GrammarLimits:
    """What one structured request may cost the server (`minillm serve --grammar-*`, docs/serving.md)."""
    compile_timeout_s: float = 10.0
    """The longest a request waits for its grammar's compile; past it, a ValueError naming the limit."""
    cache_bytes: int = 256 * 2**20
    """The compiled grammars kept for reuse, in xgrammar's memory_size_bytes; the least recently used go first."""

    def __post_init__(self) -> None:
        if not self.compile_timeout_s > 0:
            raise ValueError(f"grammar compile_timeout_s must be > 0 seconds, got {self.compile_timeout_s!r}")
        if not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise ValueError(f"grammar cache_bytes must be an integer >= 0, got {self.cache_bytes!r}")


def _vocab_type(tokenizer_json: dict):
    import xgrammar as xgr
    decoders = tokenizer_json.get("decoder") or {}
    kinds = {d.get("type") for d in decoders.get("decoders", [decoders])}
    if "ByteLevel" in kinds:
        return xgr.VocabType.BYTE_LEVEL
    if "ByteFallback" in kinds:
        return xgr.VocabType.BYTE_FALLBACK
    return xgr.VocabType.RAW


class GrammarCompiler:
    """Compiles structured-output specs for a model's vocabulary, once per distinct spec; any thread may call it."""

    def __init__(self, model_dir: Path, vocab_size: int, stop_token_ids: tuple[int, ...],
                 limits: GrammarLimits = GrammarLimits()) -> None:
        try:
            import xgrammar as xgr
        except ImportError:
            raise ValueError("structured output needs the xgrammar package, a dependency of minillm: "
                             "pip install 'xgrammar>=0.1.21'") from None
        spec = json.loads((model_dir / "tokenizer.json").read_text())
        by_id = {i: t for t, i in spec["model"]["vocab"].items()}
        by_id.update({t["id"]: t["content"] for t in spec.get("added_tokens", [])})
        encoded = [by_id.get(i, "") for i in range(vocab_size)]  # ids beyond the tokenizer: never allowed
        info = xgr.TokenizerInfo(encoded, _vocab_type(spec), vocab_size=vocab_size,
                                 stop_token_ids=list(stop_token_ids))
        self.vocab_size, self.limits = vocab_size, limits
        # xgrammar's own cache has no LRU order we can see; ours is the one bound. Two threads: a compile
        # may not take the whole machine from the engine.
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.cache = GrammarCache(limits.cache_bytes)
        self._pending: dict[tuple, Future] = {}  # spec key -> its compile, queued or running
        self._lock = threading.Lock()  # the cache and _pending; never held while compiling
        self._worker = CompileWorker()

    def compile(self, spec: StructuredOutput):
        """-> xgrammar's CompiledGrammar for spec; an invalid schema, regex or grammar, or a compile
        longer than limits.compile_timeout_s, raises ValueError."""
        key = spec.key()
        with self._lock:
            grammar = self.cache.get(key)
            if grammar is not None:
                return grammar
            future = self._pending.get(key)
            if future is None:
                future = self._pending[key] = self._worker.submit(lambda: self._compile_and_keep(key, spec))
        try:
            return future.result(timeout=self.limits.compile_timeout_s)
        except (FutureTimeout, CancelledError):
            with self._lock:
                if future.cancel():  # still queued: nobody runs it now (a running one cannot be stopped)
                    self._pending.pop(key, None)
            raise ValueError(f"the {key[0].replace('_', ' ')} took longer than the server's grammar compile "
                             f"limit of {self.limits.compile_timeout_s:g} s (--grammar-compile-timeout) to "
                             f"compile: simplify it (fewer properties, alternatives or nested rules)") from None

    def _compile_and_keep(self, key: tuple, spec: StructuredOutput):
        """On the worker: compile, check, cache; the spec leaves _pending either way."""
        try:
            grammar = self._compile(key, spec)
            with self._lock:
                self.cache.put(key, grammar, grammar.memory_size_bytes)
            return grammar
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _compile(self, key: tuple, spec: StructuredOutput):
        try:
            if spec.json_schema is not None or spec.json_object:
                # json_object is OpenAI's "any JSON object" (xgrammar's built-in JSON grammar takes any value).
                # No free whitespace: a small model could otherwise pad the JSON with it forever.
                schema = spec.json_schema if spec.json_schema is not None else {"type": "object"}
                grammar = self._compiler.compile_json_schema(schema, any_whitespace=False)
            elif spec.regex is not None:
                grammar = self._compiler.compile_regex(spec.regex)
            else:
                grammar = self._compiler.compile_grammar(spec.grammar)
        except Exception as e:  # xgrammar raises RuntimeError (and its own types) for bad input
            kind = key[0].replace("_", " ")
            reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip().splitlines()[0])  # xgrammar's log prefix
            raise ValueError(f"the {kind} cannot be compiled: {reason}") from None
        if not GrammarState(grammar, self.vocab_size).can_start():
            raise ValueError(f"the {key[0].replace('_', ' ')} admits no first token: no text made of this "
                             f"model's tokens can match it (a character the vocabulary cannot spell?)")
        return grammar

    def matcher(self, spec: StructuredOutput) -> "GrammarState":
        return GrammarState(self.compile(spec), self.vocab_size)


class GrammarState:
    """One sample's position in its grammar: which tokens may come next, and the tokens so far."""

    def __init__(self, compiled, vocab_size: int) -> None:
        import xgrammar as xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of an int32 [rows, ceil(vocab / 32)] bitmask."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def can_start(self) -> bool:
        """Some token is allowed now (else every logit would be masked, and nothing could be sampled)."""
        bitmask = new_bitmask(1, self.vocab_size)
        self.fill_bitmask(bitmask, 0)
        return bool(bitmask.any())

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"token {token} was sampled although the grammar forbids it (a mask bug)")

    @property
    def finished(self) -> bool:
        """The output is complete: the grammar accepted its end (the stop token)."""
        return self._matcher.is_terminated()


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """An int32 [rows, ceil(vocab / 32)] bitmask with every token allowed."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)
