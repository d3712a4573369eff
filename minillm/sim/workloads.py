"""Seeded workloads for the simulator: many tenants' agent sessions arriving in bursts.

Each tenant has its own system prompt; a session belongs to a tenant and makes 1 to 50 calls (most
make a few, a long tail makes many: 1 + an exponential of mean `mean_calls - 1`, capped at 50),
each call adding a tool result and producing an answer, with a tool pause between calls. Sessions
start with gamma-distributed gaps (burstiness < 1: bursty; 1: Poisson).
"""
import random

from minillm.sim.simulate import SimSession


def agent_sessions(n: int, rate: float, seed: int = 0, tenants: int = 16, burstiness: float = 0.5,
                   mean_calls: float = 8.0, system_tokens: tuple[int, int] = (500, 2000),
                   new_tokens: tuple[int, int] = (50, 400), output_tokens: tuple[int, int] = (20, 200),
                   tool_seconds: tuple[float, float] = (0.5, 4.0), max_calls: int = 50) -> list[SimSession]:
    rng = random.Random(seed)
    systems = [(f"tenant{i}", rng.randint(*system_tokens)) for i in range(tenants)]
    t, sessions = 0.0, []
    for i in range(n):
        t += rng.gammavariate(burstiness, 1 / (rate * burstiness))  # mean gap 1 / rate
        calls = min(max_calls, 1 + int(rng.expovariate(1 / (mean_calls - 1)))) if mean_calls > 1 else 1
        sessions.append(SimSession(
            start=t, calls=tuple((rng.randint(*new_tokens), rng.randint(*output_tokens)) for _ in range(calls)),
            tool_seconds=rng.uniform(*tool_seconds), system=rng.choice(systems), name=f"s{i}"))
    return sessions
