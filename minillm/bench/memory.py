"""KV memory wasted by contiguous max-length allocation vs paged blocks, on a chat-like workload.

No model runs: the workload is replayed through the allocators themselves, token by token.
  * waste = (slots reserved - tokens stored) / slots reserved, averaged over every step of every
    request's life (time-weighted, as the memory is held);
  * concurrency = how many requests run at once while the queue is full and the same pool limits admission.
Contiguous caches reserve either max_model_len per request (what early serving systems did) or
prompt + max_tokens (minillm's `contiguous` baseline); paged reserves whole blocks as tokens come.
"""
from minillm.bench import print_table, progress, write_json
from minillm.bench.catalog import BENCHMARKS
from minillm.bench.conditions import check_conditions, machine_line
from minillm.bench.synthetic_traffic import Request, chat_workload
from minillm.cache.allocator import BlockAllocator


def paged_waste(workload: list[Request], block_size: int) -> float:
    """Replay each request through a BlockAllocator: prompt allocation, then one append per token."""
    bm = BlockAllocator(4096, block_size)
    reserved = stored = 0
    for r in workload:
        table = bm.allocate(r.prompt_len)
        for length in range(r.prompt_len, r.prompt_len + r.output_len):
            assert bm.append(table, length + 1)
            reserved += len(table) * block_size
            stored += length + 1
        bm.free(table)
    return 1 - stored / reserved


def contiguous_waste(workload: list[Request], reserve) -> float:
    reserved = stored = 0
    for r in workload:
        for length in range(r.prompt_len, r.prompt_len + r.output_len):
            reserved += reserve(r)
            stored += length + 1
    return 1 - stored / reserved


def concurrency(workload: list[Request], pool_tokens: int, block_size: int, reserve=None) -> float:
    """Mean requests running per step while requests are still queued (the pool is the limit),
    when the pool admits first come, first served.
    Contiguous (reserve given) admits while the request's whole reservation fits. Paged admits
    while the prompt's blocks fit with one block of headroom per running request; when a growing
    request still finds the pool full, the newest running request gives its blocks back and
    waits to be recomputed (preemption)."""
    bm = BlockAllocator(pool_tokens // block_size, block_size)
    waiting, running, steps, total, free_tokens = list(workload), [], 0, 0, pool_tokens
    while waiting or running:
        while waiting:
            r = waiting[0]
            if reserve is not None:
                if reserve(r) > free_tokens:
                    break
                free_tokens -= reserve(r)
                running.append([r, None, r.prompt_len])
            else:
                if bm.blocks_for(r.prompt_len) + len(running) > bm.num_free:
                    break
                running.append([r, bm.allocate(r.prompt_len), r.prompt_len])
            waiting.pop(0)
        if waiting:  # saturated: memory, not demand, decides how many run
            steps, total = steps + 1, total + len(running)
        for item in list(running):
            if item not in running:
                continue  # preempted earlier in this step
            r, table, length = item
            while table is not None and not bm.append(table, length + 1):
                victim = running.pop()  # the newest request gives its blocks back and waits
                bm.free(victim[1])
                waiting.insert(0, victim[0])
                if victim is item:
                    break
            if item not in running:
                continue
            item[2] = length + 1
            if item[2] >= r.prompt_len + r.output_len:
                running.remove(item)
                if table is not None:
                    bm.free(table)
                else:
                    free_tokens += reserve(r)
    return total / max(steps, 1)


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    if model is not None:
        raise ValueError(BENCHMARKS["memory"].model_refusal())
    conditions = check_conditions()
    n, max_model_len, pool_tokens = (100, 2048, 16384) if quick else (400, 2048, 65536)
    workload = chat_workload(n, seed=0, max_output=512)
    full = lambda r: max_model_len  # noqa: E731
    capped = lambda r: r.prompt_len + r.max_tokens  # noqa: E731
    # allocation -> (what a contiguous cache reserves per request, or None for paged; block size)
    variants = {"contiguous, max_model_len": (full, 16), "contiguous, prompt + max_tokens": (capped, 16),
                "paged, block 16": (None, 16), "paged, block 32": (None, 32), "paged, block 1": (None, 1)}
    rows, figures = [], {"requests": n, "max_model_len": max_model_len, "pool_tokens": pool_tokens,
                         "mean_prompt": sum(r.prompt_len for r in workload) / n,
                         "mean_output": sum(r.output_len for r in workload) / n}
    with progress("memory", len(variants), unit="variant") as bar:
        for name, (reserve, block_size) in variants.items():
            bar.set_description(f"memory: {name}")
            waste = contiguous_waste(workload, reserve) if reserve else paged_waste(workload, block_size)
            conc = concurrency(workload, pool_tokens, block_size, reserve)
            rows.append({"allocation": name, "KV waste": f"{waste:.1%}", "requests at once (saturated)": conc})
            figures[name] = {"waste": waste, "concurrency": conc}
            bar.update()
    print(machine_line(conditions))
    print(f"allocator replay, no model runs; workload: {n} chat-like requests, mean prompt "
          f"{figures['mean_prompt']:.0f}, mean output {figures['mean_output']:.0f}, max_tokens 512; "
          f"pool of {pool_tokens:,} token slots")
    print_table(rows, "KV memory reserved but unused (time-weighted) and requests that fit at once")
    at_once = {name: f["concurrency"] for name, f in figures.items() if name in variants}
    paged = at_once["paged, block 16"]
    print(f"\npaged (block 16) runs {paged / at_once['contiguous, max_model_len']:.1f}x the requests at once of "
          f"max-length contiguous allocation, {paged / at_once['contiguous, prompt + max_tokens']:.1f}x of "
          f"prompt + max_tokens reservation")
    write_json(json_path, "memory", figures, conditions)
    return figures
