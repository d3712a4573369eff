"""Prefix caching, with and without the cache, on two workloads:

* many requests that share a long system prompt, one after another (no queueing), each = the shared
  system prompt + its own short question: prompt tokens actually computed, time to first token
  (median), and the prefix-cache hit rate;
* a multi-turn chat: each turn sends the whole conversation again (the chat template renders every
  earlier question and answer, as a chat client does), until it holds `history` tokens. Without the
  cache every turn prefills all of it; with the cache only the new question. Turn N's TTFT, at the
  full history, is the figure.
Outputs must be identical with the cache and without it.
"""
import inspect
import itertools
import json
import json.encoder
import statistics

from minillm import LLM, SamplingParams
from minillm.bench import SMALLER_QUICK, is_big, print_table, progress, write_json
from minillm.bench.conditions import check_conditions, machine_line


def shared_prompt_workload(llm: LLM, system_tokens: int, n: int) -> list[list[int]]:
    source = inspect.getsource(json.decoder)  # real Python text, the same on every machine
    system = llm.tokenizer.encode(source)[:system_tokens]
    return [system + llm.tokenizer.encode(f"\n\ndef handle_request_{i}(payload):\n    ") for i in range(n)]


def measure(llm: LLM, prompts: list[list[int]], new_tokens: int, bar) -> dict:
    """bar: the benchmark's progress bar, advanced once a request."""
    computed = []
    llm.engine.subscribe(lambda e: computed.extend(w.num_tokens for w in e.scheduled if w.phase == "prefill"))
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    outs = []
    for p in prompts:
        outs.append(llm.generate([p], params, use_tqdm=False)[0])
        bar.update()
    ttfts = [o.metrics["ttft"] for o in outs[1:]]  # the first request only fills the cache
    return {"prompt_tokens": sum(map(len, prompts)), "computed_prompt_tokens": sum(computed),
            "ttft_median_ms": statistics.median(ttfts) * 1e3, "hit_rate": llm.engine.view.kv_stats().prefix_hit_rate,
            "outputs": [o.token_ids for o in outs]}


def multi_turn_chat(llm: LLM, history: int, answer_tokens: int, bar) -> dict:
    """A conversation whose questions are paragraphs of real Python source, each answered greedily, until
    a turn's rendered prompt holds `history` tokens -> that last turn's prompt length and TTFT, all answers."""
    paragraphs = [p for p in inspect.getsource(json.encoder).split("\n\n") if len(p) > 80]
    params = SamplingParams(max_tokens=answer_tokens, temperature=0)
    messages, answers = [], []
    for paragraph in itertools.cycle(paragraphs):
        messages.append({"role": "user", "content": f"What does this code do?\n{paragraph}"})
        out = llm.chat(messages, params, use_tqdm=False)[0]
        answers.append(out.token_ids)
        messages.append({"role": "assistant", "content": out.text})
        bar.update()
        if len(out.prompt_token_ids) >= history or len(answers) > 64:
            return {"turns": len(answers), "prompt_tokens": len(out.prompt_token_ids),
                    "ttft_ms": out.metrics["ttft"] * 1e3, "answers": answers}


def run(quick: bool = False, json_path: str | None = None, model: str | None = None) -> dict:
    model = model or "tiny"
    conditions = check_conditions()
    big = quick and is_big(model)
    n, system_tokens, new = (4, 192, 4) if big else (6, 256, 4) if quick else (24, 448, 8)
    variants = [("prefix caching off", False), ("prefix caching on", True)]
    results = {}
    with progress("prefix", n * len(variants), unit="req") as bar:
        for name, enabled in variants:
            bar.set_description(f"prefix: {name}")
            llm = LLM(model, enable_prefix_caching=enabled)
            results[name] = measure(llm, shared_prompt_workload(llm, system_tokens, n), new, bar)
    off, on = results["prefix caching off"], results["prefix caching on"]
    history, answer = (512, 8) if big else (384, 8) if quick else (1024, 24)
    chat = {}
    with progress("prefix", 2, unit="conversation") as bar:
        for name, enabled in variants:
            bar.set_description(f"prefix: multi-turn chat, {name}")
            chat[name] = multi_turn_chat(LLM(model, enable_prefix_caching=enabled), history, answer, bar)
    chat_off, chat_on = chat["prefix caching off"], chat["prefix caching on"]
    figures = {
        "model": model, "smaller_quick_workload": big, "requests": n, "system_prompt_tokens": system_tokens,
        "computed_tokens_off": off["computed_prompt_tokens"], "computed_tokens_on": on["computed_prompt_tokens"],
        "ttft_ms_off": off["ttft_median_ms"], "ttft_ms_on": on["ttft_median_ms"],
        "ttft_speedup": off["ttft_median_ms"] / on["ttft_median_ms"], "hit_rate": on["hit_rate"],
        "outputs_identical": off["outputs"] == on["outputs"],
        "chat_history_tokens": chat_on["prompt_tokens"], "chat_turns": chat_on["turns"],
        "chat_last_turn_ttft_ms_off": chat_off["ttft_ms"], "chat_last_turn_ttft_ms_on": chat_on["ttft_ms"],
        "chat_ttft_speedup": chat_off["ttft_ms"] / chat_on["ttft_ms"],
        "chat_outputs_identical": chat_off["answers"] == chat_on["answers"],
    }
    print(f"{machine_line(conditions)}\nmodel: {model}; {n} requests sharing a {system_tokens}-token system prompt"
          + (f" (--quick: {SMALLER_QUICK})" if big else ""))
    print_table([{"variant": k, "prompt tokens": v["prompt_tokens"], "computed": v["computed_prompt_tokens"],
                  "median TTFT ms": v["ttft_median_ms"], "hit rate": f"{v['hit_rate']:.0%}"}
                 for k, v in results.items()], "prefill work and time to first token")
    print(f"\nTTFT {figures['ttft_speedup']:.1f}x faster with prefix caching; prompt tokens computed "
          f"{off['computed_prompt_tokens']:,} -> {on['computed_prompt_tokens']:,}; outputs identical: "
          f"{figures['outputs_identical']}")
    print_table([{"variant": k, "turns": v["turns"], "last turn's prompt tokens": v["prompt_tokens"],
                  "last turn's TTFT ms": v["ttft_ms"]} for k, v in chat.items()],
                f"multi-turn chat, {answer}-token answers, until a turn holds {history} tokens")
    print(f"\nmulti-turn chat: turn {chat_on['turns']}'s TTFT {figures['chat_ttft_speedup']:.1f}x lower with prefix "
          f"caching, at {chat_on['prompt_tokens']:,} tokens of history; answers identical: "
          f"{figures['chat_outputs_identical']}")
    write_json(json_path, "prefix", figures, conditions)
    return figures
