"""Real replicas in processes of their own, to check the simulator beyond one replica.

    calibration, run, knobs, real = replay_fleet("tiny", requests, replicas=2)
    profile = fit_profile(*calibration)
    sim = simulate(copies(requests), profile, replicas=2, router="round_robin", **knobs)

Each replica is an LLMEngine with one torch thread in its own process. The replicas calibrate at the
same time (so each step's cost is measured while the others run, as they will in the real run), wait for
each other, then replay their share of the requests, dealt round robin in arrival order as the
simulator's round-robin router deals them, on one clock: time.perf_counter is the system's monotonic
clock, the same in every process. A replica that fails is named in the error; none is left running.
"""
import multiprocessing as mp
import queue
import time
import traceback

import torch

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.sim.calibrate import Step, calibration_steps, recorded_steps, replay, replica_knobs
from minillm.sim.replica import SimRequest


def replay_fleet(model: str, requests: list[SimRequest], replicas: int = 2, calibration_requests: int = 24,
                 timeout: float = 600.0) -> tuple[tuple[list[Step], list[bool]], tuple[list[Step], list[bool]],
                                                  dict, list[SimRequest]]:
    """-> ((calibration steps, woke) of every replica, (the run's steps, woke) of every replica, one
    replica's knobs, the requests with their real timings)."""
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(replicas), context.Queue()
    ordered = sorted(requests, key=lambda r: r.arrival)
    workers = [context.Process(target=_replica, daemon=True, name=f"replica-{rank}",
                               args=(rank, model, ordered[rank::replicas], calibration_requests, barrier, results))
               for rank in range(replicas)]
    for worker in workers:
        worker.start()
    try:
        answers = [_answer(results, workers, timeout) for _ in workers]
    finally:
        barrier.abort()  # a replica still waiting for a failed one stops waiting
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    answers.sort(key=lambda a: a[0])
    calibration = ([s for a in answers for s in a[1][0]], [w for a in answers for w in a[1][1]])
    run = ([s for a in answers for s in a[2][0]], [w for a in answers for w in a[2][1]])
    return calibration, run, answers[0][3], [r for a in answers for r in a[4]]


def _answer(results, workers: list, timeout: float) -> tuple:
    """The next replica's answer; a replica that failed, died or went silent is named in the error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = results.get(timeout=1.0)
        except queue.Empty:
            dead = [w.name for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} died without an answer") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica answered within {timeout:g} s") from None
            continue
        if isinstance(answer[1], str):
            raise RuntimeError(f"replica-{answer[0]} failed:\n{answer[1]}")
        return answer


def _replica(rank: int, model: str, requests: list[SimRequest], calibration_requests: int, barrier, results) -> None:
    try:
        torch.set_num_threads(1)
        engine = LLMEngine(EngineConfig(model=model, max_num_seqs=16, enable_prefix_caching=False))
        calibration = calibration_steps(engine, seed=1 + rank, requests=calibration_requests)
        barrier.wait()
        start = time.perf_counter()
        real, *run = recorded_steps(engine, lambda: replay(engine, requests, seed=rank, start=start))
        results.put((rank, calibration, run, replica_knobs(engine), real))
    except Exception:  # noqa: BLE001 - whatever went wrong goes to the parent, in words
        results.put((rank, traceback.format_exc()))
