"""The step profile of the real engine, for the cluster simulator: what a step costs by its work.

Replays a calibration workload (a burst, then Poisson arrivals) through the engine and fits
t = fixed + a * prefill tokens + b * decoding sequences + c * context tokens to every step
(minillm/sim/profile.py). `--json PATH` writes a file `StepProfile.load(PATH)` reads.
"""
from minillm.bench import print_table, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.sim.calibrate import measure_profile


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    engine = LLMEngine(EngineConfig(model=model, max_num_seqs=16, enable_prefix_caching=False))
    profile = measure_profile(engine, requests=12 if quick else 48)
    print(machine_line(conditions))
    print_table([{"term": "fixed per step", "ms": profile.fixed * 1e3},
                 {"term": "per prefill token", "ms": profile.per_prefill_token * 1e3},
                 {"term": "per decoding sequence", "ms": profile.per_decode_seq * 1e3},
                 {"term": "per context token of a decode", "ms": profile.per_context_token * 1e3}],
                f"step cost of {model} ({profile.source})")
    figures = {"model": model, "profile": {k: getattr(profile, k) for k in
                                           ("fixed", "per_prefill_token", "per_decode_seq", "per_context_token",
                                            "source")}}
    write_json(json_path, "profile", figures, conditions)
    return figures
