"""Text <-> token ids through Hugging Face's `tokenizers` (tokenizer.json), and streaming detokenization.

Why incremental detokenization is subtle: a byte-level BPE token can hold part of a UTF-8 character
(an emoji is 4 bytes, often split over 2 tokens), and decoding a token alone can lose the leading
space that decoding it in context gives. So new text is always the difference between decoding a
short window of recent tokens with and without the newest ones, and text ending in the
replacement character U+FFFD is held back until the character is complete.
"""
import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from minillm.models.model_config import eos_token_ids

REPLACEMENT = "\ufffd"
LONG_TEXT = 10_000  # characters; shorter texts take encode, whose call costs less


class Tokenizer:
    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir} has no tokenizer.json (minillm reads tokenizers in "
                                    f"the Hugging Face `tokenizers` format)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises a plain Exception
            raise ValueError(f"cannot read {path}: {e}") from None
        self.eos_token_ids = _eos_ids(model_dir)
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > LONG_TEXT:
            # encode_batch lets go of the GIL while it works and encode does not: a long prompt tokenized in a
            # server's worker thread would otherwise hold the event loop for the whole of it (0.6 s a MB here)
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def vocab(self) -> dict[str, int]:
        """Every token and its id (special tokens included)."""
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


def _eos_ids(model_dir: Path) -> tuple[int, ...]:
    """End-of-sequence ids: generation_config.json wins over config.json, as in transformers."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            eos = eos_token_ids(json.loads(path.read_text()).get("eos_token_id"))
            if eos:
                return eos
    return ()


class IncrementalDetokenizer:
    """Turns a growing list of output tokens into text deltas that are always valid UTF-8."""

    CONTEXT = 5  # prompt tokens decoded with the first outputs, so spacing comes out as in context

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.prefix_offset = max(len(self.ids) - self.CONTEXT, 0)  # window start
        self.read_offset = len(self.ids)  # tokens before this are already emitted as text

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text ('' while a character is unfinished)."""
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of a sequence: emit whatever is held, even an unfinished character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        seen = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset:])
        if len(full) <= len(seen) or (full.endswith(REPLACEMENT) and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(seen):]
