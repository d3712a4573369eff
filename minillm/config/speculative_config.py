"""SpeculativeConfig: which proposer guesses tokens ahead, and how many per step (minillm/speculative/)."""
from dataclasses import dataclass

from minillm.quant.quant_config import QuantConfig

SPEC_METHODS = ("ngram", "draft", "heads", "mlp")
SELF_DRAFT = "self"  # SpeculativeConfig.draft_model: the target's own weights (quantized) as its draft


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: before each step a proposer guesses up to k tokens per decoding
    sequence, and the target verifies them all in that step's forward (minillm/speculative/).
    The flat knob `speculative` takes one of these, or None."""

    method: str
    """ngram: prompt lookup; draft: a smaller model; heads: multi-token prediction heads; mlp: a recurrent
    MLP speculator on the target's hidden state."""

    k: int = 4
    """Proposals per sequence and step."""

    ngram: int = 3
    """ngram: the longest n-gram looked up (shorter ones are tried too)."""

    draft_model: str = "pico"
    """draft: a bundled name or model directory with the target's tokenizer, or "self": the target's own
    weights, quantized as draft_quantization says."""

    draft_quantization: QuantConfig | None = None
    """draft: weight-only quantization of the draft's copy."""

    draft_head_quantization: QuantConfig | None = None
    """draft: its LM head's own quantization (int8 beside int4 layers, say)."""

    heads: str | None = None
    """heads: a file of trained heads. None: the target's spec_heads.safetensors."""

    speculator: str | None = None
    """mlp: a trained speculator's file. None: the target's spec_mlp.safetensors."""

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPEC_METHODS)}, got {self.method!r}")
        for name, value in (("k", self.k), ("ngram", self.ngram)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative {name} must be an integer >= 1, got {value!r}")
        for name in ("draft_quantization", "draft_head_quantization"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, QuantConfig):
                raise TypeError(f"{name} must be a minillm.QuantConfig or None, got {type(value).__name__}")
            if value is not None and self.method != "draft":
                raise ValueError(f"{name} quantizes a draft model: it needs method 'draft', got {self.method!r}")
        if self.draft_head_quantization is not None and "lm_head" in getattr(self.draft_quantization, "projections",
                                                                             ()):
            raise ValueError(f"draft_quantization {self.draft_quantization.label()} quantizes the LM head already: "
                             f"leave draft_head_quantization None, or take lm_head out of its projections")
        if self.method == "draft" and self.draft_model == SELF_DRAFT and self.draft_quantization is None:
            raise ValueError("draft_model 'self' needs a draft_quantization: the target's own full-precision "
                             "weights as its draft would cost a whole target forward per proposal")
