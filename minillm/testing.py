"""Random Hugging Face checkpoints built by `transformers` itself, for tests and benchmarks.

`transformers` is the reference no one here wrote: a model it builds and saves must load in
minillm and give its logits and its greedy tokens. Needs the `dev` extra (transformers).
"""
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import time
from pathlib import Path

import torch

from minillm.perf.shapes import MODEL_SHAPES, hf_config_fields

# The shape of SmolLM2-135M (perf/shapes.py): the benchmarks' stand-in for a real small model.
SMOLLM2_135M_SHAPE = hf_config_fields(MODEL_SHAPES["SmolLM2-135M"])


_LIBC_PATH = ctypes.util.find_library("c")
_MALLOC_TRIM = getattr(ctypes.CDLL(_LIBC_PATH), "malloc_trim", None) if _LIBC_PATH else None  # glibc only
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where there is none). Costs microseconds."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


_after_last_give_back = 0  # this process's resident bytes just after give_memory_back last worked


def give_memory_back(above: int = 0, grown: int = 0) -> bool:
    """Free what only reference cycles still hold and hand freed heap pages back to the system, when this
    process holds more than `above` bytes and `grown` bytes more than just after the last time: -> whether it did.

    Engines, servers and executed notebooks hold reference cycles, so they wait for the cyclic collector,
    which counts objects, not bytes: a few big tensors never trigger it. And glibc keeps freed heap pages
    for reuse instead of returning them. gc.collect() frees the cycles; malloc_trim(0) hands the pages back.
    A full collection walks every object a test worker holds (0.4-0.7 s once transformers and the notebooks are
    loaded), so `grown` skips it where the last one left the process at about this size: a test worker that
    settled at 2.3 GB, above a fixed bound, paid 103 s of collections in one suite that freed little."""
    global _after_last_give_back
    resident = resident_bytes()
    if (above and resident <= above) or (grown and resident <= _after_last_give_back + grown):
        return False
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    _after_last_give_back = resident_bytes()
    return True


def make_tokenizer_json(path: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of at most `vocab_size` entries, its merges learned from a fixed text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = " ".join(f"def f{i}(x, y):\n    return x * {i} + y  # the {i}th line of a small corpus" for i in range(400))
    tok.train_from_iterator([text], trainer)
    tok.save(str(path))


def make_hf_model(out: Path, kind: str = "llama", seed: int = 0, vocab_size: int = 320, **overrides):
    """Save a random transformers model of `kind` ('llama': GQA, untied; 'qwen2': biases, tied;
    'mistral') under `out`, with a tokenizer.json of at most vocab_size entries; overrides replace
    config fields. -> the transformers model (float32, eval mode)."""
    import transformers
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    kinds = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(tie_word_embeddings=False, rope_theta=500.0)),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=None)),
    }
    if kind not in kinds:
        raise ValueError(f"kind must be one of {', '.join(kinds)}, got {kind!r}")
    config_cls, cls, defaults = kinds[kind]
    cfg = config_cls(**{**common, **defaults, **overrides})  # derived fields (head_dim) follow
    vocab_size = cfg.vocab_size
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # random init leaves biases at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    make_tokenizer_json(out / "tokenizer.json", vocab_size)
    return model


# -- a real browser and local servers, for end-to-end tests of the app and the notebooks ----------
# Debian's chromium, never a test tool's own download; no background networking: the machine may be offline.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@contextlib.contextmanager
def gguf_parsed_once():
    """Inside it, transformers reads each GGUF file once: its loader parses a file twice per model or tokenizer
    (SmolLM2's: ~3 s each, the 49,152-token vocabulary's arrays field by field) and builds gguf's tensor-name map
    again for every tensor (397 times). Both are pure functions of their arguments, kept for the context's
    length; the weights transformers converts and the reference they give are unchanged."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    read = functools.cache(reader)

    def read_once(path, mode="r"):  # by absolute path, whichever way the caller spells it
        return read(str(Path(path).resolve()), mode)

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def chromium() -> str:
    """The Chromium executable, or skip the calling test with the reason."""
    import shutil

    import pytest
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on this machine: install Debian's `chromium` (.ci/run does) to run the browser test")
    return path


def run_folder(tmp_path_factory) -> Path:
    """The temporary folder every pytest-xdist worker of this test run shares (a worker's own is <run>/popen-gwN),
    or the run's own without xdist: for what the workers make once a run and share (a lock, a converted model)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd: list[str], url: str, ready_path: str, log: Path, env: dict | None = None, start_within: float = 90,
          stop_within: float = 300, ready=lambda body: True):
    """A context manager: run a local server (`cmd`, its output to `log`) until it answers
    url + ready_path with a body `ready` accepts, yield url, and stop it at the end. The server
    also stops itself after stop_within seconds (GNU timeout), should the test be killed."""
    import contextlib
    import shutil
    import subprocess
    import time
    import urllib.request

    import pytest

    @contextlib.contextmanager
    def running():
        full = ["timeout", str(int(stop_within)), *cmd] if shutil.which("timeout") else cmd
        with log.open("w") as out:
            proc = subprocess.Popen(full, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_within
            while True:
                try:
                    if ready(urllib.request.urlopen(url + ready_path, timeout=2).read()):
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server ({' '.join(cmd[:3])} ...) did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return running()


def wait_until(condition, timeout: float = 5.0, poll: float = 0.02) -> bool:
    """Poll condition() until it holds or `timeout` seconds pass; -> whether it held (checked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()
