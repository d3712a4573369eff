"""Real replicas in processes of their own, to check the simulator beyond one replica.

    calibration, run, knobs, real = replay_fleet("tiny", requests, replicas=2)
    profile = fit_profile(*calibration)
    sim = simulate(copies(requests), profile, replicas=2, router="round_robin", **knobs)

Each replica is an LLMEngine with one torch thread in a process of its own (`python -m
minillm.sim.fleet_replay`, its job as JSON on stdin). The replicas calibrate at the same time (so each
step's cost is measured while the others run, as they will in the real run), say "ready", and when all
are, replay their share of the requests, dealt round robin in arrival order as the simulator's
round-robin router deals them, from one start on one clock: time.perf_counter is the system's monotonic
clock, the same in every process. Each answers with one JSON line. A replica that fails, dies or goes
silent is named in the error; none is left running.
"""
import json
import select
import subprocess
import sys
import tempfile
import time

import torch

from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.sim.calibrate import Step, calibration_steps, recorded_steps, replay, replica_knobs
from minillm.sim.replica import SimRequest

READY = "ready"


def replay_fleet(model: str, requests: list[SimRequest], replicas: int = 2, calibration_requests: int = 24,
                 timeout: float = 600.0) -> tuple[tuple[list[Step], list[bool]], tuple[list[Step], list[bool]],
                                                  dict, list[SimRequest]]:
    """-> ((calibration steps, woke) of every replica, (the run's steps, woke) of every replica, one
    replica's knobs, the requests with their real timings)."""
    ordered = sorted(requests, key=lambda r: r.arrival)
    deadline = time.monotonic() + timeout
    procs, logs = [], []
    try:
        for rank in range(replicas):
            logs.append(tempfile.TemporaryFile(mode="w+"))
            procs.append(subprocess.Popen([sys.executable, "-m", "minillm.sim.fleet_replay"], text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[-1]))
            job = {"rank": rank, "model": model, "calibration_requests": calibration_requests,
                   "requests": [[r.arrival, r.prompt_tokens, r.output_tokens, r.request_id]
                                for r in ordered[rank::replicas]]}
            procs[-1].stdin.write(json.dumps(job) + "\n")
            procs[-1].stdin.flush()
        for rank, proc in enumerate(procs):
            if _line(proc, rank, logs[rank], deadline) != READY:
                raise RuntimeError(f"replica-{rank} said something other than {READY!r}")
        start = time.perf_counter() + 0.05  # a moment ahead, so every replica is listening at 0
        for proc in procs:
            proc.stdin.write(f"{start!r}\n")
            proc.stdin.close()
        answers = [json.loads(_line(proc, rank, logs[rank], deadline)) for rank, proc in enumerate(procs)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for log in logs:
            log.close()
    calibration = ([tuple(s) for a in answers for s in a["calibration"]], [w for a in answers for w in a["woke"]])
    run = ([tuple(s) for a in answers for s in a["run"]], [w for a in answers for w in a["run_woke"]])
    real = [SimRequest(arrival, prompt, output, request_id=rid, first_scheduled=first, token_times=times)
            for a in answers for arrival, prompt, output, rid, first, times in a["real"]]
    return calibration, run, answers[0]["knobs"], real


def _line(proc: subprocess.Popen, rank: int, log, deadline: float) -> str:
    """The replica's next line on stdout; its error output in the exception if it died or went silent."""
    while not select.select([proc.stdout], [], [], 1.0)[0]:
        if proc.poll() is not None or time.monotonic() > deadline:
            break
    else:
        line = proc.stdout.readline()
        if line:
            return line.strip()
        try:  # end of its output: it is exiting, and may not have finished yet
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    log.seek(0)
    tail = log.read()[-3000:]
    if proc.poll() is None:
        raise TimeoutError(f"replica-{rank} gave no answer in time:\n{tail}")
    raise RuntimeError(f"replica-{rank} failed (exit code {proc.returncode}):\n{tail}")


def main() -> None:
    """One replica: read its job, calibrate, say ready, wait for the start, replay, answer."""
    answer, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers alone: any other print goes to stderr
    job = json.loads(sys.stdin.readline())
    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig.from_knobs(job["model"], max_num_seqs=16, enable_prefix_caching=False))
    steps, woke = calibration_steps(engine, seed=1 + job["rank"], requests=job["calibration_requests"])
    print(READY, file=answer, flush=True)
    start = float(sys.stdin.readline())
    requests = [SimRequest(arrival, prompt, output, request_id=rid) for arrival, prompt, output, rid in job["requests"]]
    real, run, run_woke = recorded_steps(engine, lambda: replay(engine, requests, seed=job["rank"], start=start))
    print(json.dumps({"calibration": steps, "woke": woke, "run": run, "run_woke": run_woke,
                      "knobs": replica_knobs(engine),
                      "real": [[r.arrival, r.prompt_tokens, r.output_tokens, r.request_id, r.first_scheduled,
                                r.token_times] for r in real]}), file=answer, flush=True)


if __name__ == "__main__":
    main()
