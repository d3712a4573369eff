"""Streaming, detokenization, stop conditions and request metrics."""
import json
import shutil

import pytest

from minillm import LLM, SamplingParams
from minillm.tokenizer import IncrementalDetokenizer

GREEDY = dict(temperature=0, ignore_eos=True)


def test_incremental_detokenizer_never_emits_broken_utf8(llama_llm):
    tok = llama_llm.tokenizer
    text = "naïve café → 日本語 🙂🚀 done"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several byte-level tokens
    detok = IncrementalDetokenizer(tok, tok.encode("x = "))
    pieces = [detok.push(t) for t in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_stream_concatenates_to_the_final_text(llama_llm):
    chunks = list(llama_llm.stream([7, 8, 9], SamplingParams(max_tokens=30, **GREEDY)))
    final = chunks[-1]
    assert final.finished and not any(c.finished for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == final.output.text
    assert final.output.text == llama_llm.tokenizer.decode(final.output.token_ids)
    assert sum(len(c.token_ids) for c in chunks) == 30


def test_stop_string_cuts_the_text_and_is_never_streamed(llama_llm):
    prompt = [11, 12, 13]
    base = llama_llm.generate([prompt], SamplingParams(max_tokens=40, **GREEDY))[0].text
    stop = base[len(base) // 2: len(base) // 2 + 3]
    assert len(stop) == 3
    chunks = list(llama_llm.stream(prompt, SamplingParams(max_tokens=40, stop=[stop], **GREEDY)))
    out = chunks[-1].output
    assert out.finish_reason == "stop"
    assert out.text == base[: base.index(stop)]
    assert "".join(c.text for c in chunks) == out.text


def test_stop_token_id_ends_the_request(llama_llm):
    prompt = [21, 22, 23]
    base = llama_llm.generate([prompt], SamplingParams(max_tokens=30, **GREEDY))[0].token_ids
    stop_tok = base[6]
    out = llama_llm.generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=[stop_tok], **GREEDY))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == base[: base.index(stop_tok) + 1]


def test_eos_stops_unless_ignored(tmp_path, hf_llama):
    probe = LLM(str(hf_llama[0]))
    base = probe.generate([[31, 32]], SamplingParams(max_tokens=20, **GREEDY))[0].token_ids
    d = tmp_path / "m"
    shutil.copytree(hf_llama[0], d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": base[4]}))
    llm = LLM(str(d))
    stopped = llm.generate([[31, 32]], SamplingParams(max_tokens=20, temperature=0))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == base[: base.index(base[4]) + 1]
    assert llm.generate([[31, 32]], SamplingParams(max_tokens=20, **GREEDY))[0].token_ids == base


def test_request_metrics_follow_the_serving_definitions(llama_llm):
    m = llama_llm.generate([[41, 42, 43]], SamplingParams(max_tokens=12, **GREEDY))[0].metrics
    assert m["output_tokens"] == 12 and len(m["itl"]) == 11
    assert 0 <= m["queue_time"] <= m["ttft"] <= m["e2e"]
    assert m["tpot"] == pytest.approx(sum(m["itl"]) / 11)
    assert m["tpot"] == pytest.approx((m["e2e"] - m["ttft"]) / 11)


def test_breaking_out_of_a_stream_aborts_and_frees_the_cache(llama_llm):
    stream = llama_llm.stream([1, 2, 3], SamplingParams(max_tokens=50, **GREEDY))
    next(stream), next(stream)
    stream.close()
    assert not llama_llm.engine.has_unfinished()
    assert llama_llm.engine.view.kv_stats().used_blocks == 0


def test_generate_keeps_prompt_order_and_per_prompt_params(llama_llm):
    prompts = [[1, 2], [3, 4, 5], [6]]
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (3, 7, 5)]
    outs = llama_llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [len(o.token_ids) for o in outs] == [3, 7, 5]


def test_generate_returns_its_own_requests_while_another_is_in_flight(llama_llm):
    """Another request on the same engine, finishing while generate runs, is not taken for one of generate's."""
    other = llama_llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (3, 6)]
    outs = llama_llm.generate([[4, 5], [6, 7, 8]], params)
    assert [len(o.token_ids) for o in outs] == [3, 6] and other not in {o.request_id for o in outs}
    assert not llama_llm.engine.has_unfinished() and llama_llm.engine.view.kv_stats().used_blocks == 0
