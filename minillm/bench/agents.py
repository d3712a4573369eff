"""Agent sessions under KV pressure: keep in the pool, recompute, or offload to a second tier.

Sessions of tool-using calls (minillm/agents) run interleaved, each call's prompt = the previous
call's prompt + output + a tool result. Three variants, measured side by side in one run:

  * keep-in-pool: a pool big enough for every session's prefix at once (the upper bound);
  * recompute:    a small pool, no tier: waiting sessions' blocks are evicted and recomputed;
  * offload:      the same small pool + a host tier: a waiting session's blocks move out and
                  are restored on its next call.

Figures: TTFT of follow-up calls (median, p90), prefix hit rate (cached / prompt tokens of
follow-up calls), the share of follow-ups that got their whole previous call back, bytes moved,
and the capacity the tier adds: sessions whose prefix the small pool holds alone, vs with the tier.
"""
import inspect
import json
import statistics

from minillm import LLM, SamplingParams
from minillm.agents import agent_workload, run_sessions
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line
from minillm.perf.serving import percentile

BLOCK_SIZE = 16
CONTEXT = 256  # tokens a session may grow to: sessions end ("context") sooner, so more of them fit a run


def measure(llm: LLM, workload, max_tokens: int, offload_blocks: int | None, bar) -> dict:
    llm.generate([list(range(1, 9))], SamplingParams(max_tokens=2), use_tqdm=False)  # warm up (no full block)
    if offload_blocks:
        llm.engine.kv_offload.attach("host", offload_blocks)
    run = run_sessions(llm, workload, max_tokens=max_tokens, offload=bool(offload_blocks),
                       on_call=lambda _: bar.update())
    follow = run.followups()
    ttfts = [c.ttft * 1e3 for c in follow]
    footprint = {}  # session -> its longest prompt, in blocks: what it holds while it waits
    for c in run.calls:
        footprint[c.session_id] = max(footprint.get(c.session_id, 0), c.prompt_tokens // BLOCK_SIZE)
    whole = [c.cached_tokens >= (c.previous_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE for c in follow]
    tier = llm.engine.kv_offload.stats() or {"bytes_moved": 0, "seconds_moving": 0.0, "blocks": 0}
    return {"calls": len(run.calls), "ttft_median_ms": statistics.median(ttfts), "ttft_p90_ms": percentile(ttfts, 90),
            "hit_rate": sum(c.cached_tokens for c in follow) / sum(c.prompt_tokens for c in follow),
            "whole_prefix_share": sum(whole) / len(whole), "bytes_moved": tier["bytes_moved"],
            "seconds_moving": tier["seconds_moving"], "tier_blocks": tier["blocks"],
            "pool_used_after": llm.engine.view.kv_stats().used_blocks, "seconds": run.seconds,
            "footprint_blocks": statistics.mean(footprint.values())}


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    # the small pool holds one context-long prompt (16 blocks) and little more, so sessions compete
    big = quick and is_big(model)
    sessions, small, tier_blocks, max_tokens = (6, 20, 256, 4) if quick else (16, 24, 1024, 8)
    probe = LLM(model, num_kv_blocks=1)
    corpus = probe.tokenizer.encode(inspect.getsource(json.decoder))  # real Python, the same everywhere
    workload = agent_workload(corpus, sessions, seed=0, system_tokens=64, task_tokens=16, tool_tokens=24,
                              tool_seconds=0.05 if quick else 0.2, median_calls=3 if big else 4 if quick else 6)
    total_calls = sum(min(s.num_calls, 50) for s in workload.sessions)
    per_session = CONTEXT // BLOCK_SIZE  # a session's prefix is at most the context
    variants = [("keep-in-pool", sessions * per_session + 8, None), ("recompute", small, None),
                ("offload", small, tier_blocks)]
    results = {}
    with progress("agents", total_calls * len(variants), unit="call") as bar:
        for name, blocks, tier in variants:
            bar.set_description(f"agents: {name}")
            llm = LLM(model, block_size=BLOCK_SIZE, num_kv_blocks=blocks, max_model_len=CONTEXT)
            results[name] = {"pool_blocks": blocks, **measure(llm, workload, max_tokens, tier, bar)}
    keep, off = results["keep-in-pool"], results["offload"]
    footprint = keep["footprint_blocks"]
    figures = {
        "model": model, "smaller_quick_workload": big, "sessions": sessions, "calls": keep["calls"],
        "block_size": BLOCK_SIZE,
        "variants": results, "ttft_median_recompute_over_offload":
            results["recompute"]["ttft_median_ms"] / off["ttft_median_ms"],
        "ttft_median_offload_over_keep": off["ttft_median_ms"] / keep["ttft_median_ms"],
        "sessions_held_small_pool": small / footprint, "sessions_held_small_pool_plus_tier":
            (small + off["tier_blocks"]) / footprint, "session_footprint_blocks": footprint,
    }
    print(f"{machine_line(conditions)}\nmodel: {model}; {sessions} agent sessions, {keep['calls']} calls; "
          f"pools of {keep['pool_blocks']} (keep) and {small} blocks (recompute, offload) of {BLOCK_SIZE} tokens"
          + (f" (--quick: {SMALLER_QUICK})" if big else ""))
    print_table([{"variant": k, "pool blocks": v["pool_blocks"], "median TTFT ms": v["ttft_median_ms"],
                  "p90 TTFT ms": v["ttft_p90_ms"], "hit rate": f"{v['hit_rate']:.0%}",
                  "whole prefix back": f"{v['whole_prefix_share']:.0%}", "MB moved": v["bytes_moved"] / 2**20,
                  "s moving": v["seconds_moving"]} for k, v in results.items()],
                "follow-up calls (each begins with the previous call)")
    print(f"\nmedian TTFT: recompute / offload = {figures['ttft_median_recompute_over_offload']:.2f}x, "
          f"offload / keep-in-pool = {figures['ttft_median_offload_over_keep']:.2f}x")
    print(f"capacity: a waiting session holds {footprint:.1f} blocks on average; the {small}-block pool keeps "
          f"{figures['sessions_held_small_pool']:.1f} sessions resident alone, "
          f"{figures['sessions_held_small_pool_plus_tier']:.1f} with the tier's {off['tier_blocks']} blocks "
          f"(keep-in-pool needed {keep['pool_blocks']} pool blocks for all {sessions})")
    write_json(json_path, "agents", figures, conditions)
    return figures
