"""QuantConfig: which scheme, and which layers and projections it applies to.

    QuantConfig("int8")                                     every projection of every decoder layer
    QuantConfig("int4", group_size=32, layers=(0, 5))       only decoder layers 0 and 5
    QuantConfig("int4", projections=("gate_proj", "up_proj", "down_proj"))   only the MLPs
    QuantConfig("int4", group_size=32, int4_range="min-max")   a float zero point per group (Q4_1's shape)
    QuantConfig("int8", kernel="reference")                 dequantize-then-matmul, the plain-PyTorch reference

The projections are named as in a Hugging Face checkpoint. The LM head is left in full precision
unless "lm_head" is named: most weight-only schemes do the same, since every logit passes through it.
The embedding is never quantized (it is a lookup table, not a matmul).
"""
from dataclasses import asdict, dataclass

from minillm.quant import codecs

SCHEMES = ("int8", "int4", "fp8")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
LAYER_PROJECTIONS = PROJECTIONS[:-1]  # the seven inside each decoder layer
CALIBRATIONS = (None, "awq")
INT4_RANGES = ("holds-zero", "min-max")  # codecs.quantize_int4, codecs.quantize_int4_minmax
KERNELS = ("fused", "reference")          # fused.py where it applies, else linear.py's; always linear.py's


@dataclass(frozen=True)
class QuantConfig:
    """Weight-only quantization: which scheme (int8, int4 group-wise, fp8), which decoder layers and which
    projections (Hugging Face names); checked when built, with the accepted values in each error."""

    scheme: str
    """int8: one scale per output row; int4: group-wise, a scale and zero point per group; fp8: float8 e4m3."""

    group_size: int = 64
    """int4: inputs that share one scale and zero point."""

    layers: tuple[int, ...] | None = None
    """Decoder layers to quantize. None: all of them."""

    projections: tuple[str, ...] = LAYER_PROJECTIONS
    """Which matrices, by Hugging Face name; "lm_head" quantizes the LM head too."""

    calibration: str | None = None
    """The "awq" calibration: activation-aware scaling on calibration text (int4). None: no calibration."""

    int4_range: str = "holds-zero"
    """int4 levels: a range that holds 0 (a whole zero point), or min-max (a float zero point per group)."""

    kernel: str = "fused"
    """fused: the fused CPU kernels where they apply, else the reference; reference: dequantize-then-matmul always."""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"quantization scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.scheme == "fp8":
            codecs.require_fp8()
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {self.group_size!r}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be None or 'awq', got {self.calibration!r}")
        if self.calibration is not None and self.scheme != "int4":
            raise ValueError(f"calibration {self.calibration!r} applies to int4 only, not {self.scheme!r}")
        if self.int4_range not in INT4_RANGES:
            raise ValueError(f"int4_range must be one of {', '.join(INT4_RANGES)}, got {self.int4_range!r}")
        if self.int4_range != "holds-zero" and self.scheme != "int4":
            raise ValueError(f"int4_range {self.int4_range!r} applies to int4 only, not {self.scheme!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if isinstance(self.projections, str):
            raise TypeError(f"projections must be a list of names, got the string {self.projections!r}")
        projections = tuple(self.projections)
        unknown = [p for p in projections if p not in PROJECTIONS]
        if unknown or not projections:
            raise ValueError(f"projections must be a non-empty list drawn from {', '.join(PROJECTIONS)}, "
                             f"got {list(projections)}")
        object.__setattr__(self, "projections", projections)
        if self.layers is not None:
            layers = tuple(self.layers)
            bad = [i for i in layers if not isinstance(i, int) or isinstance(i, bool) or i < 0]
            if bad:
                raise ValueError(f"layers must be decoder layer indices (integers >= 0), got {bad}")
            object.__setattr__(self, "layers", tuple(sorted(set(layers))))

    def layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The decoder layers to quantize in a model with num_layers of them; a clear error for one
        that does not exist."""
        if self.layers is None:
            return tuple(range(num_layers))
        out_of_range = [i for i in self.layers if i >= num_layers]
        if out_of_range:
            raise ValueError(f"layers {out_of_range} out of range: this model has {num_layers} decoder layers "
                             f"(0..{num_layers - 1})")
        return self.layers

    def to_dict(self) -> dict:
        """The form a checkpoint's config.json records (quantization_config)."""
        d = asdict(self)
        d["layers"] = None if self.layers is None else list(self.layers)
        d["projections"] = list(self.projections)
        return {"quant_method": "minillm", **d}

    @classmethod
    def from_dict(cls, raw: dict) -> "QuantConfig":
        method = raw.get("quant_method")
        if method != "minillm":
            raise ValueError(f"quantization_config.quant_method is {method!r}: minillm loads only the checkpoints "
                             f"it quantized itself ('minillm'); quantize the full-precision model with "
                             f"EngineConfig(quantization=...) instead")
        return cls(scheme=raw["scheme"], group_size=raw.get("group_size", 64), layers=raw.get("layers"),
                   projections=tuple(raw.get("projections", LAYER_PROJECTIONS)), calibration=raw.get("calibration"),
                   int4_range=raw.get("int4_range", "holds-zero"), kernel=raw.get("kernel", "fused"))

    def label(self) -> str:
        """A short name: int8, int4-g64, int4-g32-minmax, fp8, with the layers when not all."""
        name = f"int4-g{self.group_size}" if self.scheme == "int4" else self.scheme
        if self.int4_range == "min-max":
            name += "-minmax"
        if self.calibration:
            name += f"-{self.calibration}"
        if self.layers is not None:
            name += f" layers {','.join(map(str, self.layers))}"
        if self.projections == PROJECTIONS:
            name += "+head"  # every projection, the LM head too
        elif self.projections != LAYER_PROJECTIONS:
            name += f" ({','.join(p.removesuffix('_proj') for p in self.projections)})"
        if self.kernel == "reference":
            name += " reference"
        return name
