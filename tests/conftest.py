"""Shared fixtures: small random checkpoints saved by Hugging Face transformers (the reference)."""
import ctypes
import ctypes.util
import fcntl
import gc
import os

import pytest
import torch

from minillm.testing import make_hf_model

os.environ["TQDM_DISABLE"] = "1"  # no progress bars in test logs (LLM.generate shows one by default)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one torch thread each (and in the processes they start), so
    # they do not fight over the cores. Small tensors are faster on one thread anyway.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

_LIBC_PATH = ctypes.util.find_library("c")
_MALLOC_TRIM = getattr(ctypes.CDLL(_LIBC_PATH), "malloc_trim", None) if _LIBC_PATH else None  # glibc only


def _give_memory_back() -> None:
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _holds_the_real_model(module) -> bool:
    return module.get_closest_marker("real_model") is not None


def pytest_collection_modifyitems(config, items):
    """The modules that hold the real model go first, in their usual order (a stable sort: the same order in
    every xdist worker). `--dist worksteal` hands each worker a contiguous half of the list and steals from
    the back, so they all land on one worker, one after another, early in the run, while the other worker
    runs the light tests: two copies of the real model (and their servers) never meet, which kept the
    suite's peak memory above 8 GB."""
    items.sort(key=lambda item: not _holds_the_real_model(item))


@pytest.fixture(autouse=True, scope="module")
def _one_real_model_at_a_time(request, tmp_path_factory):
    """The guarantee behind the ordering above: a module marked `real_model` holds a lock, shared by the
    xdist workers of this run, from its first test until its module fixtures are gone. It is set up before
    any other fixture of the module, so it is torn down after them (and after the memory is given back)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not _holds_the_real_model(request.node):
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "real-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits only if a stolen module of the other worker holds it
        try:
            yield
            _give_memory_back()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    """After each test module: free its engines, servers and models now, and give the pages back.

    Engines hold reference cycles, so they wait for the cyclic collector, and glibc keeps freed heap pages
    for reuse instead of returning them: a worker's memory then only grows, module after module, until the
    two workers together pass 8 GB. gc.collect() frees the cycles and malloc_trim(0) hands the pages back."""
    yield
    _give_memory_back()


@pytest.fixture(autouse=True)
def _memory_back_after_each_slow_test(request):
    """The same after each slow test (a real model, a benchmark, a notebook): a module of them holds GBs."""
    yield
    if request.node.get_closest_marker("slow"):
        _give_memory_back()


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory):
    """(directory, transformers model): Llama with GQA (4 heads, 2 kv heads), untied embeddings."""
    path = tmp_path_factory.mktemp("llama")
    return path, make_hf_model(path, "llama")


@pytest.fixture(scope="session")
def hf_qwen2(tmp_path_factory):
    """(directory, transformers model): Qwen2 with q/k/v biases and tied embeddings."""
    path = tmp_path_factory.mktemp("qwen2")
    return path, make_hf_model(path, "qwen2", seed=1)


@pytest.fixture(scope="session")
def llama_llm(hf_llama):
    from minillm import LLM
    return LLM(str(hf_llama[0]))
