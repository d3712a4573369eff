"""The conditions a benchmark ran under: torch threads, CPUs, and how busy the machine was.

A benchmark reads them before it measures, warns when other processes keep the CPUs busy, and
records them beside its figures, so a reader can tell a slow machine from a busy one.
"""
import os
import sys

import torch

from minillm.perf import machine

# An idle machine's background (daemons, a shell) keeps the load average well under 0.5; one
# process that holds a core half of the time adds 0.5 by itself.
LOAD_TOLERANCE = 0.5


def busy_warning(load: float | None, cpus: int, threads: int) -> str | None:
    """The warning to print when other processes compete for this run's cores, else None.

    load: the 1-minute load average (None where the platform has none), read as the run starts:
    this process has run for only a few seconds, so nearly all of it is other processes' work.
    Those processes fit beside this run on the cores its `threads` leave free; beyond that, plus
    the tolerance, they take turns on this run's own cores and every timing stretches.
    """
    if load is None:
        return None
    spare = max(cpus - threads, 0)
    if load <= spare + LOAD_TOLERANCE:
        return None
    return (f"warning: the machine is busy (1-minute load average {load:.2f} on {cpus} CPUs, and this run uses "
            f"{threads} torch thread{'s' if threads != 1 else ''}): absolute figures will be noisy and slow. "
            f"Ratios between variants measured side by side in this run are still comparable.")


def check_conditions() -> dict:
    """Read the threads, CPUs and load now, print the busy warning to stderr if it applies,
    -> the record that write_json stores and machine_line prints."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpus = os.cpu_count() or 1  # every CPU of the system, as the load average counts the whole system
    threads = torch.get_num_threads()
    warning = busy_warning(load, cpus, threads)
    if warning:
        print(warning, file=sys.stderr)
    return {"torch_threads": threads, "cpus": cpus,
            "load_avg_1min": None if load is None else round(load, 2), "busy": warning is not None}


def machine_line(conditions: dict) -> str:
    """One printed line: the hardware, the torch threads, and the load the run started under."""
    load = conditions["load_avg_1min"]
    state = "load average unknown" if load is None else f"load average {load:.2f} on {conditions['cpus']} CPUs"
    busy = " (busy: compare the ratios, not absolute speeds)" if conditions["busy"] else ""
    return f"machine: {machine()}; {state}{busy}"
