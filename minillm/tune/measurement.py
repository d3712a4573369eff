"""Real runs of the engine: a configuration's step profile, and the seeded workload served at its arrivals.

Every engine of a search shares the weights of one loaded LLM (a quantized one copies them first), so a
run's peak RSS growth is what the configuration adds: its KV pool, its activations, a quantized copy.
"""
import threading
import time

import psutil

from minillm.llm import LLM
from minillm.sim.calibrate import CALIBRATION_REQUESTS, measure_profile, replay
from minillm.sim.replica import SimRequest
from minillm.sim.step_profile import StepProfile
from minillm.tune.space import engine_knobs

WARM_UP = [SimRequest(0.0, 32, 4, request_id="warm-up")]  # an engine's first step pays its set-up


def build(base: LLM, knobs: dict) -> LLM:
    """An LLM of the configuration on the base LLM's weights."""
    return LLM(base.config.model, weights=base.model, device=base.config.device, dtype=base.config.dtype,
               **engine_knobs(knobs))


def profile_of(base: LLM, scheme: str, quick: bool = True) -> StepProfile:
    """The step profile of the model under a quantization scheme, measured on this machine (bench profile's)."""
    llm = build(base, {"quantization": scheme, "max_num_seqs": 16, "enable_prefix_caching": False})
    return measure_profile(llm.engine, requests=CALIBRATION_REQUESTS[quick])


class PeakRSS:
    """The process's peak resident memory over a block, sampled every few milliseconds, above its start."""

    def __init__(self, every: float = 0.005) -> None:
        self.every, self.process = every, psutil.Process()

    def __enter__(self) -> "PeakRSS":
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


def real_run(base: LLM, knobs: dict, requests: list[SimRequest], seed: int = 0) -> tuple[list[SimRequest], int]:
    """The requests through an engine of the configuration at their arrival times; -> the requests with their
    token times, and the peak RSS growth in bytes from before the engine was built."""
    with PeakRSS() as rss:
        llm = build(base, knobs)
        replay(llm.engine, WARM_UP, seed)
        time.sleep(0.01)  # the warm-up's last step ends before the run's clock starts
        served = replay(llm.engine, requests, seed)
    return served, rss.growth
