"""The installed environment is what the Makefile promised: the dev tools that depend on torch (guidellm,
lm-eval) were installed under a constraint built from TORCH_SPEC, so torch is still the build it pins
(CI pins the CPU wheel it has on disk: a CUDA build pulled in by a dependency is GBs and wrong)."""
import os
import re

import pytest
import torch


def test_torch_is_still_the_build_torch_spec_pins():
    spec = os.environ.get("TORCH_SPEC", "")
    pinned = re.fullmatch(r"torch==([\w.]+)", spec.replace(" ", ""))
    if pinned is None:
        pytest.skip(f"TORCH_SPEC={spec!r} pins no version: a user's install takes the platform's default torch")
    assert torch.__version__.split("+")[0] == pinned.group(1), f"torch {torch.__version__}, TORCH_SPEC {spec}"
    assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build: a dependency replaced the CPU one"
