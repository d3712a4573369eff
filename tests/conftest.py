"""Shared fixtures: small random checkpoints saved by Hugging Face transformers (the reference)."""
import contextlib
import fcntl
import os

import pytest
import torch

from minillm.testing import give_memory_back, make_hf_model, run_folder

os.environ["TQDM_DISABLE"] = "1"  # no progress bars in test logs (LLM.generate shows one by default)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one torch thread each (and in the processes they start), so
    # they do not fight over the cores. Small tensors are faster on one thread anyway.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

def _holds_the_real_model(node) -> bool:
    return node.get_closest_marker("real_model") is not None


def pytest_collection_modifyitems(config, items):
    """The tests that hold the real model (the modules marked `real_model`, and the lab notebooks that measure on
    it, marked one by one) go first, in their usual order (a stable sort: the same order in every xdist worker).
    `--dist worksteal` hands each worker a contiguous half of the list and steals from the back, so they all land
    on one worker, one after another, early in the run, while the other worker runs the light tests: two copies of
    the real model (and their servers) never meet, which kept the suite's peak memory above 8 GB, and none waits
    for the lock below while the other worker holds it."""
    items.sort(key=lambda item: not _holds_the_real_model(item))


@contextlib.contextmanager
def _real_model_held(tmp_path_factory):
    """One holder of the real model at a time among this run's xdist workers (a lock file they share)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with open(run_folder(tmp_path_factory) / "real-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits only while the other worker holds it
        try:
            yield
            give_memory_back()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="module")
def _one_real_model_at_a_time(request, tmp_path_factory):
    """The guarantee behind the ordering above: a module marked `real_model` holds the lock from its first
    test until its module fixtures are gone. It is set up before any other fixture of the module, so it is
    torn down after them (and after the memory is given back)."""
    if not _holds_the_real_model(request.node):
        yield
        return
    with _real_model_held(tmp_path_factory):
        yield


@pytest.fixture
def real_model_held(tmp_path_factory):
    """The same lock for one test, for a test that loads the real model in a module that mostly does not
    (a lab notebook that measures on it): request it with request.getfixturevalue("real_model_held")."""
    with _real_model_held(tmp_path_factory):
        yield


@pytest.fixture(autouse=True, scope="module")
def _memory_back_after_each_module():
    """After each test module: free its engines, servers and models now, and give the pages back
    (minillm.testing.give_memory_back): else a worker's memory only grows, module after module. Skipped where the
    worker grew less than GROWN since the last give-back: a full collection costs it about half a second."""
    yield
    give_memory_back(grown=GROWN)


HIGH_WATER = 2 << 30  # bytes of a test worker above which each test's end gives memory back
GROWN = 256 << 20  # bytes a worker must have grown by since its last give-back for the next one to run


@pytest.fixture(autouse=True)
def _memory_back_after_a_heavy_test(request):
    """The same after a slow test (a real model, a benchmark, a notebook: a module of them holds GBs), and
    after any test that left the worker above HIGH_WATER (checked in microseconds); in both cases only where it grew
    by GROWN since the last give-back (else the collection would find what the last one left)."""
    yield
    give_memory_back(above=0 if request.node.get_closest_marker("slow") else HIGH_WATER, grown=GROWN)


@pytest.fixture(scope="session")
def real_model_cache(tmp_path_factory):
    """A MINILLM_CACHE that every module and xdist worker of this run shares: the real model's GGUF file is converted
    once a run (about 5 s), not once a module (a conversion is written under a temporary name and renamed, so two
    at once are safe); the processes a test starts find it through the environment. (test_gguf_smollm2 converts
    into a cache of its own: the conversion is what it tests.)"""
    folder = run_folder(tmp_path_factory) / "real-model-cache"
    folder.mkdir(exist_ok=True)
    return folder


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
