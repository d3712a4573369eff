"""Run agent sessions against an engine, interleaved so they compete for the KV pool.

Every session runs one call at a time; while it waits for its tool, the others' calls run and
fill the pool. The loop, on the wall clock:

    sessions whose tool finished submit their next call -> engine.step() -> each finished call:
    record TTFT and prefix hits, ask the breaker, then (offload=True) move the session's cached
    blocks to the second tier with engine.kv_offload.offload_prefix, and wait for the tool

A session ends after its planned calls, when the breaker says stop, or when its next prompt
would no longer fit the model's context ("context"). Nothing is held after a run: a finished
call's blocks stay only as cached (evictable) blocks.
"""
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from minillm.agents.breaker import LoopBreaker
from minillm.agents.sessions import AgentWorkload
from minillm.sampling import SamplingParams

DEFAULT_BREAKER = partial(LoopBreaker, max_calls=50, max_tokens=100_000, repeat_window=4, max_repeats=3)


@dataclass(frozen=True)
class CallRecord:
    session_id: int
    call: int                 # 0-based index within its session
    prompt_tokens: int
    previous_tokens: int      # the previous call's prompt + output tokens, which this prompt begins with (0: first)
    cached_tokens: int        # prompt tokens whose K/V were reused (pool hits and tier restores)
    ttft: float               # seconds from submission to the first token
    output_ids: list[int]


@dataclass
class AgentRun:
    calls: list[CallRecord] = field(default_factory=list)
    stop_reasons: dict[int, str] = field(default_factory=dict)  # session id -> why it ended
    blocks_offloaded: int = 0  # blocks engine.kv_offload.offload_prefix freed in the pool
    seconds: float = 0.0

    def followups(self) -> list[CallRecord]:
        """The calls after a session's first: those whose prompt begins with a previous call."""
        return [c for c in self.calls if c.call > 0]


@dataclass
class _Live:
    """A session in progress: its next prompt, when it may be sent, and its breaker."""
    prompt: list[int]
    previous: int             # tokens of the previous call's prompt + output
    call: int
    ready_at: float
    breaker: object
    request_id: str | None = None


def run_sessions(llm, workload: AgentWorkload, max_tokens: int = 8, breaker: Callable = DEFAULT_BREAKER,
                 offload: bool = False, on_call: Callable[[CallRecord], None] | None = None) -> AgentRun:
    """Run every session of the workload to its end, all at once. llm: an LLM or an LLMEngine.
    breaker: a zero-argument factory of one session's breaker (anything with check(output, tokens));
    a call's tokens are its prompt + output tokens, what a provider bills.
    offload: move a waiting session's cached blocks to the engine's offload tier (attach one first).
    Greedy calls of max_tokens tokens (ignore_eos, so every call costs the same decode work)."""
    engine = getattr(llm, "engine", llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    live = {s.session_id: _Live(workload.system + s.task, 0, 0, start, breaker()) for s in workload.sessions}
    by_id = {s.session_id: s for s in workload.sessions}
    owner: dict[str, int] = {}  # request id -> session id
    run = AgentRun()
    while live:
        now = time.perf_counter()
        for sid, state in live.items():
            if state.request_id is None and state.ready_at <= now:
                state.request_id = engine.add_request(state.prompt, params, request_id=f"s{sid}c{state.call}")
                owner[state.request_id] = sid
        if not engine.has_unfinished():  # every live session waits for its tool
            time.sleep(max(0.0, min(s.ready_at for s in live.values()) - time.perf_counter()))
            continue
        for chunk in engine.step():
            if chunk.request is None:
                continue
            sid = owner.pop(chunk.request_id)
            state, out = live[sid], chunk.request.outputs[0]
            record = CallRecord(sid, state.call, len(state.prompt), state.previous,
                                out.metrics["cached_prompt_tokens"], out.metrics["ttft"], out.token_ids)
            run.calls.append(record)
            if on_call is not None:
                on_call(record)
            reason = _next_call(engine, state, by_id[sid], out, params, offload, run)
            if reason is not None:
                run.stop_reasons[sid] = reason
                del live[sid]
    run.seconds = time.perf_counter() - start
    return run


def _next_call(engine, state: _Live, session, out, params: SamplingParams, offload: bool, run: AgentRun) -> str | None:
    """After a call finished: -> why the session ends, or None with state set for its next call."""
    full = state.prompt + out.token_ids
    reason = state.breaker.check(out.text, len(full))
    if reason is None and state.call + 1 == session.num_calls:
        reason = "done"
    prompt = full + session.tool_results[state.call]
    if reason is None and len(prompt) + params.max_tokens > engine.max_model_len:
        reason = "context"
    if reason is not None:
        return reason
    if offload:
        run.blocks_offloaded += engine.kv_offload.offload_prefix(full)
    state.ready_at = time.perf_counter() + session.pauses[state.call]
    state.prompt, state.previous, state.call, state.request_id = prompt, len(full), state.call + 1, None
    return None
