"""The workloads a search serves: the seeded ones the simulator's calibration and benchmarks use, or a trace.

    chat    Poisson arrivals at `rate`/s, prompts of 16-200 tokens, answers of 8-64 (sim/calibrate.workload)
    batch   an offline job: every request there at 0, answers of 32-128 tokens; latency is free

A trace is a JSONL file, one request a line: {"arrival": seconds, "prompt_tokens": n, "output_tokens": m},
arrivals in order. It is read line by line (`read_trace` is a generator), and a run takes only the requests
it needs; the engine receives each one at its arrival time (sim/calibrate.replay), never all at once.
"""
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from minillm.sim.calibrate import workload
from minillm.sim.replica import SimRequest

WORKLOADS = ("chat", "batch")
TRACE_FIELDS = ("arrival", "prompt_tokens", "output_tokens")


class TraceError(ValueError):
    """A trace line that is not a request."""


def named_workload(name: str, n: int, rate: float, seed: int = 0) -> list[SimRequest]:
    """n requests of a named workload (WORKLOADS), seeded: the same arrivals for every configuration."""
    if name == "chat":
        return workload(n, rate, seed)
    if name == "batch":
        return workload(n, float("inf"), seed, output=(32, 128))
    raise ValueError(f"unknown workload {name!r}: the workloads are {', '.join(WORKLOADS)}, or a .jsonl trace")


def read_trace(path: str | Path) -> Iterator[SimRequest]:
    """The trace's requests, one line at a time; a TraceError names the line, what it held and what a line
    must be."""
    last = 0.0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
                values = [record[name] for name in TRACE_FIELDS]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TraceError(f"{where}: {line.strip()[:80]!r} is not a request: each line must be a JSON "
                                 f"object with {', '.join(TRACE_FIELDS)}") from None
            arrival, prompt, output = values
            if not (isinstance(arrival, (int, float)) and arrival >= last and isinstance(prompt, int) and prompt > 0
                    and isinstance(output, int) and output > 0):
                raise TraceError(f"{where}: {line.strip()[:80]!r}: arrival must be seconds >= the line before's "
                                 f"({last}), prompt_tokens and output_tokens positive integers")
            last = float(arrival)
            yield SimRequest(float(arrival), prompt, output, request_id=f"t{number}")


def first_requests(source: str, n: int, rate: float, seed: int = 0) -> list[SimRequest]:
    """The first n requests of a named workload or a trace file (fewer if the trace is shorter)."""
    if source.endswith(".jsonl"):
        return list(itertools.islice(read_trace(source), n))
    return named_workload(source, n, rate, seed)
