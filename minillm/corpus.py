"""The bundled models' corpus: the Python standard library's own source (present wherever Python
is), split by file into train and held-out sets, in a model's tokens, and windows of its stream.

Training (the bundled models, the speculative heads, the distilled draft), the quantization
measurements and the benchmarks read the same split, so a held-out figure means the same everywhere.
"""
import functools
import hashlib
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer

EOT = "<|endoftext|>"
EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages"}


def stdlib_files() -> list[tuple[str, Path]]:
    """(path relative to the stdlib, path) of every stdlib .py file outside tests and IDLE, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if not EXCLUDED_DIRS & set(rel.parts[:-1]):
            files.append((rel.as_posix(), p))
    return files


def is_heldout(rel: str) -> bool:
    """About 5% of files, chosen by a hash of the path: the same split on every machine."""
    return hashlib.sha256(rel.encode()).digest()[0] < 13


def corpus_split() -> tuple[list[str], list[str], str]:
    """Train texts, held-out texts, and a digest of the held-out set (to tell whether it matches)."""
    train, heldout, digest = [], [], hashlib.sha256()
    for rel, path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        (heldout if is_heldout(rel) else train).append(text)
        if is_heldout(rel):
            digest.update(rel.encode() + b"\0" + text.encode())
    return train, heldout, digest.hexdigest()[:16]


def encode_corpus(tok, texts: list[str]) -> torch.Tensor:
    """All files as one token stream, each followed by the end-of-text token."""
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def random_rows(ids: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length] windows of ids at random offsets."""
    starts = torch.randint(0, len(ids) - length, (batch,), generator=gen)
    return torch.stack([ids[s:s + length] for s in starts.tolist()])


def spread_rows(ids: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """[count, length] windows evenly spread over ids (the same ones every run)."""
    starts = torch.linspace(0, len(ids) - length, count).long()
    return torch.stack([ids[s:s + length] for s in starts.tolist()])


@functools.lru_cache(maxsize=4)
def corpus_tokens(model_dir: str, split: str, texts: int | None = None) -> torch.Tensor:
    """The bundled corpus's `split` ("train" or "heldout") in the model's tokens; texts: only that many
    of its files, evenly spaced (calibration needs a few hundred tokens, not the whole train split)."""
    train, heldout, _ = corpus_split()
    chosen = train if split == "train" else heldout
    if texts is not None:
        chosen = chosen[::max(1, len(chosen) // texts)][:texts]
    return encode_corpus(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")), chosen)
