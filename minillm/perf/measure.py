"""Measure this machine's roofline: memory bandwidth (a large copy) and FLOP/s (a large matmul).

Best of a few repetitions, as a roofline wants the ceiling, not the typical case. On a laptop CPU
the two take about a second together.
"""
import time

import torch

from minillm.bench import machine
from minillm.perf.hardware import HardwareProfile


def _best_time(fn, repeats: int, sync) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(device: torch.device, mbytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a device-to-device copy: each element is read once and written once."""
    n = mbytes * 2**20 // 4
    src, dst = torch.ones(n, device=device), torch.empty(n, device=device)
    seconds = _best_time(lambda: dst.copy_(src), repeats, _sync(device))
    return 2 * n * 4 / seconds


def measure_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square matmul (2 * size^3 FLOPs)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = _best_time(lambda: a @ b, repeats, _sync(device))
    return 2 * size**3 / seconds


def measure_machine(device: str = "auto") -> HardwareProfile:
    """A HardwareProfile for this machine, measured now (float32; bfloat16 too on a GPU)."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    peaks = {"float32": measure_flops(dev, torch.float32)}
    if dev.type == "cuda":
        peaks["bfloat16"] = measure_flops(dev, torch.bfloat16, size=4096)
        memory = torch.cuda.get_device_properties(dev).total_memory
    else:
        memory = _ram_bytes()
    bandwidth = measure_bandwidth(dev)
    return HardwareProfile(f"This machine ({dev.type})", peaks, bandwidth, memory,
                           f"measured now on {machine()}: "
                           f"best of 5 (copy of 256 MiB; {'4096' if dev.type == 'cuda' else '1024'}-square matmul)")


def _ram_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            return float(f.readline().split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return float("nan")


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
