"""The model of a configuration: the simulator (sim/), its steps priced by a profile measured on this machine.

One profile per quantization scheme: a scheme changes what a step costs (int8 weights stream in a quarter
of the bytes, and dequantize on the way), which the other knobs do not. The knobs that shape the schedule
(max_num_seqs, max_num_batched_tokens, block_size, the KV pool, prefix caching) are the simulated replica's
own. Chunked prefill off is not simulated (the replica always chunks): the real runs measure it.
"""
import statistics

from minillm.sim.replica import SimRequest, copies
from minillm.sim.simulate import simulate
from minillm.sim.step_profile import StepProfile
from minillm.tune.figures import GoodputFn, run_figures

SEEDS = 3  # simulations per prediction, each drawing its own step times from the profile's spread


def replica_options(knobs: dict) -> dict:
    """The simulated replica's knobs equal to a configuration's."""
    return {"max_num_seqs": knobs["max_num_seqs"], "max_num_batched_tokens": knobs["max_num_batched_tokens"],
            "kv_blocks": knobs["num_kv_blocks"], "block_size": knobs["block_size"],
            **({} if knobs["enable_prefix_caching"] else {"prefix_cache_tokens": 0})}


def predict(requests: list[SimRequest], profile: StepProfile, knobs: dict, slo: dict[str, float],
            goodput_fn: GoodputFn, seeds: int = SEEDS) -> dict:
    """run_figures of the requests simulated under the configuration, each figure the median of `seeds` runs."""
    runs = [run_figures(simulate(copies(requests), profile, seed=seed, **replica_options(knobs)).requests, slo,
                        goodput_fn) for seed in range(seeds if profile.spread else 1)]
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}
