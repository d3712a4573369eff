"""The real model in the labs' optional sections: SmolLM2-135M-Instruct, when its package is installed.

In a notebook:  from minillm.labkit import REAL_MODEL, real_model_installed
                if real_model_installed(): ...   (otherwise it says how to install it, and the section is skipped)
"""
from minillm.models.registry import PACKAGED_MODELS, packaged_gguf

REAL_MODEL = "smollm2-135m-instruct"


def real_model_installed(name: str = REAL_MODEL) -> bool:
    """True when the model's package is installed; otherwise print how to install it and return False."""
    if packaged_gguf(name) is not None:
        return True
    print(f"{name} is not installed, so this section is skipped. To run it: {PACKAGED_MODELS[name].install_command()}, "
          "then restart the kernel and run the notebook again.")
    return False
