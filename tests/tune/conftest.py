import json

import pytest
import torch

from minillm.sim.step_profile import StepProfile


@pytest.fixture
def profiles():
    """Hand-made step profiles: the tests check the search's plumbing, not a calibration (bench profile's)."""
    speeds = {"none": 1.0, "int8": 0.8, "int4": 0.9}
    return {scheme: StepProfile(fixed=0.004 * speed, per_prefill_token=2e-5 * speed, per_decode_seq=5e-4 * speed,
                                per_context_token=1e-8 * speed) for scheme, speed in speeds.items()}


@pytest.fixture
def one_thread():
    """One torch thread: two on a shared 2-core machine run tiny many times slower; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def trace(tmp_path):
    """Six short requests, 20 ms apart: a real run of tiny takes well under a second."""
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival": 0.02 * i, "prompt_tokens": 16 + 4 * i, "output_tokens": 4}) + "\n"
                            for i in range(6)))
    return str(path)
