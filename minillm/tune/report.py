"""What a search prints: the real runs beside the model's predictions, the front, the recommendation."""
import math

from minillm.tune.space import DEFAULTS, llm_call

MB = 10**6  # the unit --memory-budget 300MB means (command.size)


def print_table(rows: list[dict], title: str, out=print) -> None:
    if not rows:
        return
    cols = list(rows[0])
    cells = [[_fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out(f"\n{title}")
    out("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        out("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def error(predicted: float, measured: float) -> float:
    """The model's relative error on a measured figure: (predicted - measured) / measured."""
    return (predicted - measured) / measured if measured else math.nan


def run_row(key: str, n: int, score: str, predicted: dict, measured: dict) -> dict:
    return {"configuration": key, "requests": n, f"{score} model": predicted[score], f"{score} real": measured[score],
            "TTFT p99 ms model": 1e3 * predicted["ttft_p99"], "real": 1e3 * measured["ttft_p99"],
            "err": f"{error(predicted['ttft_p99'], measured['ttft_p99']):+.0%}",
            "TPOT p99 ms model": 1e3 * predicted["tpot_p99"], "real ": 1e3 * measured["tpot_p99"],
            "err ": f"{error(predicted['tpot_p99'], measured['tpot_p99']):+.0%}",
            "RSS growth MB": measured["rss_growth"] / MB}


def serve_command(model: str, knobs: dict) -> str:
    """`python -m minillm serve` with the configuration's flags (those that differ from the defaults)."""
    flags = [f"--model {model}"]
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks"):
        flags.append(f"--{name.replace('_', '-')} {knobs[name]}")
    if not knobs["enable_prefix_caching"]:
        flags.append("--no-prefix-caching")
    if not knobs["enable_chunked_prefill"]:
        flags.append("--no-chunked-prefill")
    if knobs["quantization"] != DEFAULTS["quantization"]:
        flags.append(f"--quantization {knobs['quantization']}")
    return "python -m minillm serve " + " ".join(flags)


def recommendation_lines(model: str, knobs: dict, score: str, measured: dict) -> list[str]:
    return [f"recommended ({score} {measured[score]:.3g} measured, TTFT p99 {1e3 * measured['ttft_p99']:.0f} ms, "
            f"TPOT p99 {1e3 * measured['tpot_p99']:.1f} ms):",
            f"  {llm_call(model, knobs)}", f"  {serve_command(model, knobs)}"]
