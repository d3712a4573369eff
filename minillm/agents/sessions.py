"""A seeded multi-turn agent workload: sessions of calls whose prompts grow by a tool result each.

An agent session is a chain of calls. Call 1's prompt is the shared system prompt + the session's
task; call k's prompt is call k-1's prompt + its output + the result of the tool it asked for.
Between calls the agent waits for the tool. So every call after the first starts with the whole
previous call: the prefix cache can skip all of it, if the blocks are still there.

Calls per session: log-normal with median `median_calls` (default 6) and sigma 1.0, rounded and
clipped to 1..50: most tasks take a few calls, a long tail takes dozens (the shape of public agent
traces, where a few trajectories run to the step limit). Tool results: `tool_tokens` tokens cut
from the corpus at a random place. Tool pauses: uniform in [0.5, 1.5] x `tool_seconds`.
"""
from dataclasses import dataclass

import torch

MAX_CALLS = 50


@dataclass(frozen=True)
class AgentSession:
    session_id: int
    task: list[int]                 # the task's tokens, after the shared system prompt
    tool_results: list[list[int]]   # tool_results[k]: appended after call k's output (the last is unused)
    pauses: list[float]             # pauses[k]: seconds the tool runs after call k

    @property
    def num_calls(self) -> int:
        return len(self.tool_results)


@dataclass(frozen=True)
class AgentWorkload:
    system: list[int]               # the system prompt every session starts with
    sessions: list[AgentSession]


def calls_per_session(n: int, gen: torch.Generator, median_calls: float = 6.0, sigma: float = 1.0) -> list[int]:
    """n draws of round(exp(N(log median_calls, sigma^2))), clipped to [1, MAX_CALLS]."""
    x = (torch.randn(n, generator=gen, dtype=torch.float64) * sigma + torch.log(torch.tensor(median_calls))).exp()
    return x.round().clamp(1, MAX_CALLS).long().tolist()


def agent_workload(corpus: list[int], num_sessions: int, seed: int = 0, system_tokens: int = 64,
                   task_tokens: int = 16, tool_tokens: int = 24, tool_seconds: float = 0.1,
                   median_calls: float = 6.0) -> AgentWorkload:
    """num_sessions sessions drawn from a seeded generator (the same seed gives the same sessions).
    corpus: token ids that the system prompt (its first system_tokens), the tasks and the tool
    results are cut from; it must be longer than each of them."""
    longest = max(system_tokens, task_tokens, tool_tokens)
    if len(corpus) <= longest:
        raise ValueError(f"the corpus has {len(corpus)} tokens: it must be longer than the longest piece "
                         f"cut from it ({longest} tokens)")
    if tool_seconds < 0:
        raise ValueError(f"tool_seconds must be >= 0, got {tool_seconds!r}")
    gen = torch.Generator().manual_seed(seed)

    def cut(length: int) -> list[int]:
        start = int(torch.randint(len(corpus) - length + 1, (1,), generator=gen))
        return corpus[start:start + length]

    sessions = []
    for i, calls in enumerate(calls_per_session(num_sessions, gen, median_calls)):
        task = cut(task_tokens)
        results = [cut(tool_tokens) for _ in range(calls)]
        pauses = (tool_seconds * (0.5 + torch.rand(calls, generator=gen, dtype=torch.float64))).tolist()
        sessions.append(AgentSession(i, task, results, pauses))
    return AgentWorkload(corpus[:system_tokens], sessions)
