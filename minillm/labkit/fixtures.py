"""Inputs and reference models shared by the graded tests (and so by check() in notebooks)."""
import atexit
import contextlib
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch


@contextlib.contextmanager
def one_thread():
    """tiny's small matrix products run fastest on one torch thread (on a busy machine more threads only wait)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def randn(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Float32 normal values of both signs, from their own seed (not the notebook's)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@cache
def checkpoint(kind: str = "llama", seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """A random Hugging Face checkpoint built by transformers (the independent reference), saved
    once per process: -> (its directory, the transformers model)."""
    from transformers.utils import logging

    from minillm.testing import make_hf_model
    logging.disable_progress_bar()
    folder = Path(tempfile.mkdtemp(prefix=f"minillm-lab-{kind}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # a notebook's kernel or pytest leaves none behind
    return folder, make_hf_model(folder, kind, seed=seed, **overrides)


def assert_close(actual, expected: torch.Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Fail with the property in words: `what` has the wrong type, shape, or values."""
    assert isinstance(actual, torch.Tensor), f"{what}: returns {type(actual).__name__}, not a torch.Tensor"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    actual, expected = actual.detach().double(), expected.detach().double()
    assert not actual.isnan().any(), f"{what}: the output contains NaN"
    inf = expected.isinf()
    mismatched = int((actual.isinf() != inf).sum() + (actual[inf] != expected[inf]).sum())
    assert not mismatched, \
        f"{what}: {mismatched} entries are infinite where the reference is not, or the other way round"
    err = (actual - expected)[~inf].abs().max().item() if (~inf).any() else 0.0
    assert torch.allclose(actual, expected, atol=atol, rtol=rtol), \
        f"{what}: differs from the reference by up to {err:.3g} (allowed {atol:g} + {rtol:g}*|reference|)"
