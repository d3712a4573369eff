"""Which class builds which architecture, and where the bundled models live."""
from pathlib import Path

from minillm.models.config import SUPPORTED_ARCHITECTURES
from minillm.models.llama import LlamaForCausalLM

# Llama, Qwen2 and Mistral (without a sliding window) share one decoder; ModelConfig holds the
# differences (q/k/v biases, tied embeddings, head_dim).
MODEL_CLASSES = {architecture: LlamaForCausalLM for architecture in SUPPORTED_ARCHITECTURES}

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
DEFAULT_MODEL = "tiny"


def bundled_models() -> list[str]:
    """Names of the models shipped inside the package (see minillm/assets/models/)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A bundled model's name ("tiny", "pico") or a directory holding a Hugging Face checkpoint."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if str(name_or_path) in bundled_models():
        return BUNDLED_DIR / str(name_or_path)
    raise FileNotFoundError(
        f"no model directory at {str(name_or_path)!r}, and it is not a bundled model name "
        f"(bundled: {', '.join(bundled_models()) or 'none'}); pass a folder with config.json, "
        f"*.safetensors and tokenizer.json")
