"""A discrete-event cluster simulator (on SimPy), calibrated on the real engine.

    profile = StepProfile.load("profiles/tiny-cpu.json")     # python -m minillm.bench profile writes it
    result = simulate(workload, profile, replicas=64, router="prefix_aware")

Each engine step costs what the profile, measured on the real engine, says a step with that many
prefill tokens, decoding sequences and context tokens costs (times a ratio drawn from how far the
measured steps strayed from that price); the replicas batch continuously as the engine does. So
fleets no laptop runs can be planned, and checked against a real run of one or two.
"""
from minillm.sim.replica import Replica, SimRequest
from minillm.sim.simulate import SimResult, SimSession, simulate
from minillm.sim.step_profile import StepProfile

__all__ = ["Replica", "SimRequest", "SimResult", "SimSession", "StepProfile", "simulate"]
