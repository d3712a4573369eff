"""The step profile of the real engine, for the cluster simulator: what a step costs by its work.

Replays a calibration workload (a burst, a trickle, then lone prompts: minillm/sim/calibrate.py) through
the engine and fits t = fixed + tokens(prefill tokens + decoding sequences) + c * context tokens to its steps, with
tokens(N) a rising curve through step sizes of 2, 3, 4, 8, 16, ... tokens (minillm/sim/step_profile.py),
what the steps after an idle pause cost over warm ones, how far the steps stray from their fitted price (the
spread the simulator draws from), and how alike consecutive steps' strays are (the persistence of its pace).
`--json PATH` writes a file `StepProfile.load(PATH)` reads.
"""
from dataclasses import asdict

from minillm.bench import SMALLER_QUICK, is_big, print_table, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.sim.calibrate import CALIBRATION_REQUESTS, measure_profile
from minillm.sim.step_profile import LONG_STEP, warmup_bins

QUICK_BIG_REQUESTS = 12  # a calibration's burst and trickle with --quick on a big model


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    big = quick and is_big(model)
    requests = QUICK_BIG_REQUESTS if big else CALIBRATION_REQUESTS[quick]
    engine = LLMEngine(EngineConfig.from_knobs(model, max_num_seqs=16, enable_prefix_caching=False))
    profile = measure_profile(engine, requests=requests)
    print(machine_line(conditions))
    if big:
        print(f"--quick: {SMALLER_QUICK}: a calibration of {requests} requests (and {requests // 2} lone prompts)")
    print_table([{"term": "fixed per step (a step of one token)", "ms": profile.fixed * 1e3},
                 *({"term": f"a step of {n} tokens adds", "ms": s * 1e3} for n, s in profile.token_curve),
                 {"term": "each token past the last point", "ms": profile.per_decode_seq * 1e3},
                 {"term": "per context token of a decode", "ms": profile.per_context_token * 1e3}],
                f"step cost of {model} ({profile.source})")
    if profile.warmup:
        print_table([{"steps after an idle pause": steps, "cost over a warm step's": f"{r:.0%}"}
                     for steps, r in zip(warmup_bins(len(profile.warmup)), profile.warmup)],
                    "a cold replica: the steps after an idle pause")
    if profile.spread:
        print(f"how far the steps strayed from that price (the spread the simulator draws from): 5% of steps took "
              f"at most {profile.strays(0.05):.0%} of it, half at most {profile.strays(0.5):.0%}, 95% at most "
              f"{profile.strays(0.95):.0%}; a step keeps {profile.persistence:.2f} of the last one's pace (slow steps "
              f"come in spells: minillm/sim/pace.py)")
    if profile.long_spread:
        print(f"the long steps alone (priced at {LONG_STEP:g} one-token steps or more), which stray less: 5% took at "
              f"most {profile.strays(0.05, long=True):.0%}, 95% at most {profile.strays(0.95, long=True):.0%}")
    figures = {"model": model, "smaller_quick_workload": big, "calibration_requests": requests,
               "profile": asdict(profile)}
    write_json(json_path, "profile", figures, conditions)
    return figures
