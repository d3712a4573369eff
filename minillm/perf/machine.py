"""Measure this machine: what it is, its memory bandwidth (a large copy) and FLOP/s (a large
matmul), and an engine's step times. The median of a few repetitions (perf/timing.py), the same
timing lab 00 and the benchmarks use; on a laptop CPU the two take about a second together.
"""
import platform
from pathlib import Path

import torch

from minillm.perf.hardware import HardwareProfile
from minillm.perf.timing import median_time


def machine() -> str:
    """One line naming the hardware the numbers were measured on."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA), torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def measure_bandwidth(device: torch.device, mbytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a device-to-device copy: each element is read once and written once."""
    n = mbytes * 2**20 // 4
    src, dst = torch.ones(n, device=device), torch.empty(n, device=device)
    seconds = median_time(lambda: dst.copy_(src), repeats, sync=_sync(device))
    return 2 * n * 4 / seconds


def measure_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a square matmul (2 * size^3 FLOPs)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = median_time(lambda: a @ b, repeats, sync=_sync(device))
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
                           f"median of 5 (copy of 256 MiB; {'4096' if dev.type == 'cuda' else '1024'}-square matmul)")


def _ram_bytes() -> float:
    try:
        with open("/proc/meminfo") as f:
            return float(f.readline().split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return float("nan")


def _sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def measure_engine(engine, batch: int, context: int, decode_steps: int = 16) -> dict[str, float]:
    """Time an engine's steps: one prefill of `batch` random prompts of `context` tokens, then
    `decode_steps` decode steps of the whole batch. The engine must admit the batch in one step
    (max_num_seqs >= batch, a token budget >= batch * context, chunked prefill off).
    -> prefill_s (that step), decode_s (median decode step), decode_context (mean tokens attended)."""
    from minillm.sampling import SamplingParams

    gen = torch.Generator().manual_seed(0)
    vocab = engine.model_config.vocab_size
    engine.add_request([1] * 8, SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up, unmeasured
    while engine.has_unfinished():
        engine.step()
    steps = []
    engine.subscribe(lambda event: steps.append(event))
    for _ in range(batch):
        prompt = torch.randint(1, vocab, (context,), generator=gen).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=decode_steps + 1, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    prefill = [e.duration for e in steps if any(w.phase == "prefill" for w in e.scheduled)]
    decode = sorted(e.duration for e in steps if all(w.phase == "decode" for w in e.scheduled)
                    and len(e.scheduled) == batch)
    if len(prefill) != 1 or not decode:
        raise ValueError(f"the batch of {batch} x {context} tokens did not prefill in one step: raise "
                         f"max_num_seqs and max_num_batched_tokens, and turn chunked prefill off")
    return {"prefill_s": prefill[0], "decode_s": decode[len(decode) // 2],
            "decode_context": context + decode_steps / 2}
