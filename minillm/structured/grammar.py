"""Compiling a StructuredOutput for one tokenizer, and the per-sample matchers (on xgrammar).

xgrammar precomputes, for each grammar state, which of the vocabulary's tokens may come next; the
engine asks a sample's matcher for that set as a bitmask before each draw and tells it the token
that was drawn. The vocabulary is read from tokenizer.json as it is stored (byte-level BPE tokens
keep their byte-to-character encoding), so no `transformers` tokenizer is needed.
"""
import json
import re
from pathlib import Path

import torch

from minillm.structured.output_spec import StructuredOutput


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
    """Compiles structured-output specs for a model's vocabulary, once per distinct spec."""

    def __init__(self, model_dir: Path, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
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
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info)
        self._compiled: dict = {}

    def compile(self, spec: StructuredOutput):
        """-> xgrammar's CompiledGrammar for spec; an invalid schema, regex or grammar raises ValueError."""
        key = spec.key()
        if key not in self._compiled:
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
            self._compiled[key] = grammar
        return self._compiled[key]

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
