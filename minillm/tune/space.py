"""The space a search explores: a small declarative table of the engine's knobs and the values they may take.

    space = parse_space(["max_num_seqs=4,8,16", "enable_prefix_caching=true,false"])
    for knobs in configurations(space): LLM("tiny", **engine_knobs(knobs))

A configuration is a dict of knob -> value; a knob the space leaves out keeps the engine's default
(DEFAULTS). `quantization` is a scheme's name ("none", "int8", "int4", "fp8"): each one needs a step
profile of its own, measured on this machine (the simulator prices its steps with it).
"""
import itertools

from minillm.quant import QuantConfig


class SpaceError(ValueError):
    """A space that names an unknown knob or a value a knob does not take."""


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


QUANT_SCHEMES = ("none", "int8", "int4", "fp8")


def _scheme(text: str) -> str:
    if text not in QUANT_SCHEMES:
        raise ValueError(text)
    return text


# knob -> (how a value is read, what is accepted, the engine's default)
KNOBS = {
    "max_num_seqs": (_positive, "a positive integer", 64),
    "max_num_batched_tokens": (_positive, "a positive integer", 1024),
    "enable_chunked_prefill": (_bool, "true or false", True),
    "block_size": (_positive, "a positive integer", 16),
    "enable_prefix_caching": (_bool, "true or false", True),
    "num_kv_blocks": (_positive, "a positive integer (blocks in the KV pool)", 1024),
    "quantization": (_scheme, f"one of {', '.join(QUANT_SCHEMES)}", "none"),
}
DEFAULTS = {name: default for name, (_, _, default) in KNOBS.items()}

# The space `python -m minillm tune` searches when given none: 3 x 3 x 2 x 2 = 36 configurations.
DEFAULT_SPACE = {"max_num_seqs": [4, 8, 16], "max_num_batched_tokens": [128, 256, 512],
                 "enable_prefix_caching": [True, False], "quantization": ["none", "int8"]}


def parse_space(items: list[str]) -> dict[str, list]:
    """["knob=v1,v2", ...] -> {knob: [values]}, each value read and checked; a SpaceError names the knob or
    value that is wrong and what is accepted."""
    space: dict[str, list] = {}
    for item in items:
        name, eq, values = item.partition("=")
        if name not in KNOBS:
            raise SpaceError(f"unknown knob {name!r}: the knobs are {', '.join(KNOBS)}")
        if not eq or not values:
            raise SpaceError(f"knob {name!r} needs values: write {name}=V1,V2 ({KNOBS[name][1]})")
        read, accepted, _ = KNOBS[name]
        try:
            space[name] = [read(v.strip()) for v in values.split(",")]
        except ValueError:
            raise SpaceError(f"{name}={values!r}: each value must be {accepted}") from None
    return space


def configurations(space: dict[str, list]) -> list[dict]:
    """Every combination of the space's values, each a full configuration (DEFAULTS for the rest), in a
    fixed order: the order ties are broken in."""
    names = list(space)
    return [{**DEFAULTS, **dict(zip(names, values))} for values in itertools.product(*(space[n] for n in names))]


def key(knobs: dict) -> str:
    """A configuration's name in the results file and the tables: its knobs that differ from DEFAULTS."""
    changed = [f"{k}={_show(v)}" for k, v in knobs.items() if DEFAULTS.get(k) != v]
    return " ".join(changed) or "defaults"


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def engine_knobs(knobs: dict) -> dict:
    """The configuration as the exact keywords of LLM(...) / EngineConfig.from_knobs."""
    out = {k: v for k, v in knobs.items() if k != "quantization"}
    if knobs.get("quantization", "none") != "none":
        out["quantization"] = QuantConfig(knobs["quantization"])
    return out


def llm_call(model: str, knobs: dict) -> str:
    """LLM(...) as Python source, with the configuration's exact keywords."""
    args = [repr(model)] + [f"{k}={v!r}" for k, v in knobs.items() if k != "quantization"]
    if knobs.get("quantization", "none") != "none":
        args.append(f"quantization=QuantConfig({knobs['quantization']!r})")
    return f"LLM({', '.join(args)})"
