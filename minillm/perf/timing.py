"""Timing a piece of work, the one way every measurement here does it: warm up, then take the
median of repeated runs (the typical run, robust to a noisy neighbour on a shared machine)."""
import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1,
                sync: Callable[[], None] | None = None) -> float:
    """Median wall time of fn() in seconds, over `repeats` runs after `warmup` unmeasured ones.
    sync: called after each run before the clock stops (torch.cuda.synchronize on a GPU, whose
    work runs asynchronously)."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
