"""The event loop never waits for a model step: while steps of 100+ ms run, a burst of requests,
aborts and stats reads leaves a 2 ms sleeper on the loop at most a few milliseconds late
(p99 <= 5 ms, max <= 20 ms). The lock-based AsyncLLM this replaced failed it by 100+ ms.

The steps are slowed on purpose, and how they are slowed decides whether the test is honest. A real
step is neither a sleep nor pure Python: its torch ops release the GIL while they compute (and so
at every op call), and between them it runs Python (scheduling, building inputs, sampling,
detokenizing: bytecode, which CPython interrupts once a switch interval has passed to let a waiting
thread in) and short C calls that keep the GIL until they return (tensors from lists, `.tolist()`,
the tokenizer). The slowed step does all three, and holds the GIL half of its time in stretches of
milliseconds: more than a real step on this CPU does, whose every op call lets the loop in.

The machine running the tests is shared (2 cores, other test runs beside this one), so each nap's
lateness is reduced by the time this process's Python threads waited for a CPU they were ready to
use (Linux's per-thread schedstat): the loop's thread after its timer fired, and the engine thread
while the loop waited for the GIL it held. It is a virtual machine, too: its hypervisor now and then
runs something else on every one of its CPUs at once, for 10-40 ms, and no thread of it runs then.
Linux counts that per CPU as steal time (/proc/stat, in 10 ms ticks), and each nap's lateness is
reduced by the steal of the CPU that had the least during it (the time the whole machine stood
still, to a tick). What is left is the lateness the engine and the loop cause, the thing under
test; the wall-clock lateness is printed beside it. (Every such pause of 10+ ms I traced on the
2-core Intel Xeon CI machine, with the other test process running beside it, came with 1-4 ticks
of steal on both CPUs, and no thread of this process was waiting for a CPU.)
"""
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest

from minillm import AsyncLLM, SamplingParams
from minillm.perf.serving import percentile

SLEEP = 0.002  # the sleeper's nap
LONG_STREAMS, BURST, ABORTED = 8, 48, 6


def runqueue_seconds() -> dict[int, float]:
    """Per Python thread of this process: seconds it has waited for a CPU while it could run
    (Linux's schedstat; empty where the kernel does not say)."""
    waits = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
                waits[thread.native_id] = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):  # not Linux, or the thread just ended
            pass
    return waits


def waited_for_cpu(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[t] - before[t] for t in before.keys() & after.keys())


TICK = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def steal_ticks() -> list[int]:
    """Per CPU: the ticks its hypervisor has run something else while it had work (/proc/stat's steal column);
    empty where the kernel does not say."""
    try:
        with open("/proc/stat") as f:
            return [int(line.split()[8]) for line in f if line.startswith("cpu") and line[3] != " "]
    except (OSError, IndexError, ValueError):
        return []


def machine_stopped(before: list[int], after: list[int]) -> float:
    """Seconds every CPU was taken by the hypervisor between the two readings, to a tick: the least steal of any."""
    return min((b - a for a, b in zip(before, after)), default=0) * TICK


def slow_steps(engine, python_s: float = 0.05, released_s: float = 0.05, rounds: int = 10) -> list[float]:
    """Make every step of engine cost python_s more holding the GIL and released_s more releasing
    it, in `rounds` layers of: bytecode, a short C call that keeps the GIL, a "kernel" (a sleep)
    that releases it. -> a list that gets each slowed step's seconds."""
    step, durations = engine.step, []

    def slowed():
        start = time.perf_counter()
        chunks = step()
        for _ in range(rounds):
            until = time.perf_counter() + python_s / rounds * 0.8
            while time.perf_counter() < until:  # Python between the kernels: interruptible bytecode
                [i * i for i in range(50)]
            until = time.perf_counter() + python_s / rounds * 0.2
            while time.perf_counter() < until:  # C that holds the GIL until it returns, ~0.1 ms a call
                sum(range(5000))
            time.sleep(released_s / rounds)  # a kernel: torch releases the GIL while it computes
        durations.append(time.perf_counter() - start)
        return chunks

    engine.step = slowed
    return durations


def burst_with_aborts_and_scrapes(llm: AsyncLLM, long_tokens: int, burst_tokens: int, seed: int = 0) -> dict:
    """8 long streams decode; then 48 requests arrive about 15 ms apart (6 of them aborted: half
    while their add may still be queued, half after their first chunk) while a scraper reads the
    stats every 10 ms and a sleeper records how late each 2 ms nap ends. -> {"lag": on-CPU seconds
    late per nap, "raw": seconds late, "stopped": seconds the machine stood still per nap, "tokens":
    {request: tokens received}, "aborted": ids}."""
    rng = random.Random(seed)
    loop_lags, raw_lags, stopped, tokens = [], [], [], {}
    first_chunk = defaultdict(asyncio.Event)

    async def consume(prompt, max_tokens: int, rid: str) -> str:
        tokens[rid] = 0
        try:
            async for chunk in llm.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                                   temperature=0.8, seed=rng.randrange(99)), rid):
                tokens[rid] += len(chunk.token_ids)
                first_chunk[rid].set()
            return "finished"
        except asyncio.CancelledError:
            return "aborted"

    async def sleeper(done: asyncio.Event) -> None:
        while not done.is_set():
            queued, stolen, due = runqueue_seconds(), steal_ticks(), time.perf_counter() + SLEEP
            await asyncio.sleep(SLEEP)
            late = time.perf_counter() - due
            raw_lags.append(late)
            stopped.append(machine_stopped(stolen, steal_ticks()))
            loop_lags.append(max(0.0, late - waited_for_cpu(queued, runqueue_seconds()) - stopped[-1]))

    async def scraper(done: asyncio.Event) -> None:
        while not done.is_set():
            llm.kv_stats(), llm.num_waiting, llm.num_running
            await asyncio.sleep(0.01)

    async def main():
        long = [asyncio.create_task(consume([1 + i, 2, 3, 4], long_tokens, f"long-{i}")) for i in range(LONG_STREAMS)]
        await asyncio.gather(*(first_chunk[f"long-{i}"].wait() for i in range(LONG_STREAMS)))
        done = asyncio.Event()
        watchers = [asyncio.create_task(sleeper(done)), asyncio.create_task(scraper(done))]
        picked = rng.sample(range(BURST), ABORTED)
        abort_now, abort_later = set(picked[:ABORTED // 2]), set(picked[ABORTED // 2:])
        burst, aborts = [], []

        async def abort_after_first_chunk(rid: str) -> None:
            await first_chunk[rid].wait()
            await llm.abort(rid)

        for i in range(BURST):
            prompt = [rng.randrange(1, 200) for _ in range(rng.randrange(4, 40))]
            burst.append(asyncio.create_task(consume(prompt, burst_tokens, f"burst-{i}")))
            if i in abort_now:
                await asyncio.sleep(0)  # its consumer queues it; the engine thread is likely mid-step
                aborts.append(asyncio.create_task(llm.abort(f"burst-{i}")))
            elif i in abort_later:
                aborts.append(asyncio.create_task(abort_after_first_chunk(f"burst-{i}")))
            await asyncio.sleep(rng.expovariate(1 / 0.015))
        await asyncio.gather(*aborts)
        outcomes = await asyncio.gather(*burst)
        done.set()
        await asyncio.gather(*watchers)
        for i in range(LONG_STREAMS):
            await llm.abort(f"long-{i}")
        await asyncio.gather(*long)
        await llm.shutdown()
        return outcomes

    outcomes = asyncio.run(main())
    return {"lag": loop_lags, "raw": raw_lags, "stopped": stopped, "tokens": tokens,
            "aborted": {f"burst-{i}" for i, o in enumerate(outcomes) if o == "aborted"}}


def lag_summary(lags: list[float]) -> str:
    return (f"{len(lags)} naps: p50 {percentile(lags, 50) * 1e3:.1f} ms, p99 {percentile(lags, 99) * 1e3:.1f} ms, "
            f"max {max(lags) * 1e3:.1f} ms")


def measure(model_dir: str) -> dict:
    """The burst on a fresh AsyncLLM whose steps are slowed: the lags, the steps and what was left behind."""
    llm = AsyncLLM(model_dir)
    steps = slow_steps(llm.engine)
    got = burst_with_aborts_and_scrapes(llm, long_tokens=200, burst_tokens=24)
    return {**got, "aborted": sorted(got["aborted"]), "steps": steps,
            "used_blocks": llm.engine.view.kv_stats().used_blocks, "unfinished": llm.engine.has_unfinished()}


@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_loop_stays_responsive_while_slow_steps_run(hf_llama):
    # In a Python process of its own, as a server runs: the test process holds the threads and the heap of every
    # test before this one, and any of their threads that still runs would take the GIL from the loop.
    run = subprocess.run([sys.executable, __file__, str(hf_llama[0])], capture_output=True, text=True, timeout=540,
                         env={**os.environ, "TQDM_DISABLE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    steps = got["steps"]
    print(f"\nloop lag on the CPU: {lag_summary(got['lag'])}; wall clock: {lag_summary(got['raw'])}; "
          f"{len(steps)} steps, median {statistics.median(steps) * 1e3:.0f} ms; the hypervisor stopped the machine "
          f"during {sum(s > 0 for s in got['stopped'])} naps, {sum(got['stopped']) * 1e3:.0f} ms in all")
    assert len(got["aborted"]) == ABORTED
    assert all(n == 24 for rid, n in got["tokens"].items() if rid.startswith("burst") and rid not in got["aborted"])
    assert percentile(got["lag"], 99) <= 0.005, lag_summary(got["lag"])
    assert max(got["lag"]) <= 0.020, lag_summary(got["lag"])
    assert len(steps) >= 20 and len(got["lag"]) >= 500  # the naps spanned many slow steps
    assert got["used_blocks"] == 0 and not got["unfinished"]


if __name__ == "__main__":  # the measurement, run by the test above in a process of its own
    print(json.dumps(measure(sys.argv[1])))
