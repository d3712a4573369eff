"""`python -m minillm tune`: the engine's best configuration for a workload, an objective and a budget.

The search (search.py), in three steps a learner can follow:
1. the model: every configuration of the space (space.py) simulated (sim/), with a step profile measured on
   this machine for each quantization scheme the space holds (prediction.py);
2. real runs of the engine, on the same seeded arrivals, for the few the model ranks best, by successive
   halving (halving.py): many candidates get a short run, the best get longer ones (measurement.py);
3. the model checked against what the runs measured: its error on each run is printed (report.py).

The pieces lab 10 has the learner write are small pure functions, each a keyword argument of `tune`:
objective.py (goodput under SLOs, the Pareto front, the cost per million tokens), halving.py (one round),
memory_fit.py (the fit under a memory budget). edge.py answers the edge question: what fits in a memory
budget at a TPOT, with what quality.
"""
__all__ = ["TuneError", "tune"]


def __getattr__(name: str):
    """tune and TuneError, imported on first use: the command line builds tune's parser (command.py) for every
    command, and `python -m minillm serve` must run without the simulator's extra (SimPy)."""
    if name in __all__:
        from minillm.tune import search
        return getattr(search, name)
    raise AttributeError(f"module 'minillm.tune' has no attribute {name!r}")
