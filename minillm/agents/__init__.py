"""Agent workloads on the engine: multi-turn sessions with tool pauses, the harness that runs them
against the KV pool (with KV offload while a session waits), and the loop breaker."""
from minillm.agents.breaker import LoopBreaker
from minillm.agents.harness import AgentRun, CallRecord, run_sessions
from minillm.agents.sessions import AgentSession, AgentWorkload, agent_workload

__all__ = ["LoopBreaker", "AgentRun", "CallRecord", "run_sessions", "AgentSession", "AgentWorkload",
           "agent_workload"]
