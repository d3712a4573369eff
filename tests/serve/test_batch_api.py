"""The Batch API runner (minillm/serve/batch.py): OpenAI's batch file format, errors kept to their
own lines, resuming after a kill, and greedy outputs equal to LLM.generate."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_helpers import post

from minillm import LLM, SamplingParams
from minillm.serve.batch import run_batch

PROMPTS = ["def fib(n):", "import os\n", "class Stack:", "for i in range(", "def add(a, b):", "# parse the",
           "x = [", "with open("]
TOKENS = 8


def line(cid, prompt, max_tokens=TOKENS, url="/v1/completions", **extra):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def read(path: Path) -> list[dict]:
    return [json.loads(t) for t in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """Greedy texts of LLM.generate for PROMPTS, the oracle for the batch runner's outputs."""
    outs = LLM("tiny").generate(PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0), use_tqdm=False)
    return {p: o.text for p, o in zip(PROMPTS, outs)}


def test_good_and_bad_lines_each_get_their_own_answer_and_greedy_equals_generate(tmp_path, reference):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    lines = [
        line("ok-1", PROMPTS[0]),
        "{not json",
        json.dumps({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat}),
        line("bad-type", PROMPTS[1], max_tokens="8"),
        line("too-long", PROMPTS[1], max_tokens=600),
        json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}),
        line("ok-1", PROMPTS[2]),  # a duplicate custom_id
        line("other-model", PROMPTS[2]).replace('"tiny"', '"gpt-4o"'),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),  # no custom_id
        line("ok-2", PROMPTS[3]),
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    stats = run_batch(inp, out)
    rows = read(out)
    assert len(rows) == len(lines) and (stats["succeeded"], stats["failed"]) == (3, 7)
    by_line = {r["error"]["line"]: r for r in rows if r["error"]}
    assert set(by_line) == {2, 6, 7, 9}
    assert by_line[2]["custom_id"] is None and by_line[2]["error"]["code"] == "invalid_json"
    assert by_line[6]["custom_id"] == "bad-url" and by_line[6]["response"] is None
    assert by_line[7]["error"]["code"] == "duplicate_custom_id"
    refused = {r["custom_id"]: r["response"] for r in rows if r["response"] and r["response"]["status_code"] != 200}
    assert refused["bad-type"]["status_code"] == 400 and "max_tokens" in refused["bad-type"]["body"]["error"]["message"]
    assert refused["too-long"]["status_code"] == 400 and "512" in refused["too-long"]["body"]["error"]["message"]
    assert refused["other-model"]["status_code"] == 404
    ok = {r["custom_id"]: r["response"] for r in rows if r["response"] and r["response"]["status_code"] == 200}
    assert set(ok) == {"ok-1", "ok-2", "chat"}
    assert [ok["ok-1"]["body"]["choices"][0]["text"], ok["ok-2"]["body"]["choices"][0]["text"]] == \
        [reference[PROMPTS[0]], reference[PROMPTS[3]]]
    assert ok["chat"]["body"]["object"] == "chat.completion"
    assert ok["chat"]["body"]["choices"][0]["message"]["role"] == "assistant"
    assert ok["ok-1"]["body"]["usage"]["completion_tokens"] == TOKENS
    assert stats["output_tokens"] == sum(r["body"]["usage"]["completion_tokens"] for r in ok.values())
    assert stats["output_throughput"] > 0


def close(a, b) -> bool:
    """Equal JSON, floats within 1e-4 (the batch's forwards and the server's run in two engines)."""
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, abs=1e-4)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(close, a, b))
    return a == b


def test_echo_scoring_and_a_dead_end_answer_as_the_server_does(tmp_path, server):
    asked = {"score": {"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 0, "echo": True, "logprobs": 1, "n": 2},
             "echo": {"prompt": "def fib(n):", "max_tokens": 3, "echo": True, "logprobs": 2},
             "bare": {"prompt": "x = [", "max_tokens": 0},  # scored without echo: empty choices
             "long": {"prompt": [1] * 600, "max_tokens": 0, "echo": True},
             "dead-end": {"prompt": "x = ", "max_tokens": 8, "guided_regex": "a", "min_tokens": 5}}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(line(cid, **body) for cid, body in asked.items()) + "\n")
    run_batch(inp, out)
    answers = {r["custom_id"]: r["response"] for r in read(out)}
    for cid, body in asked.items():
        online = post(server, "/v1/completions", {"model": "tiny", "temperature": 0, **body})
        assert answers[cid]["status_code"] == online.status_code, (cid, answers[cid])
        batch = answers[cid]["body"]
        if online.status_code != 200:
            assert batch["error"]["message"] == online.json()["error"]["message"]
            continue
        assert close(batch["choices"], online.json()["choices"]), (cid, batch, online.json())
        assert batch["usage"] == online.json()["usage"] and batch["object"] == "text_completion"


@pytest.mark.subprocess
@pytest.mark.timeout(150)
def test_a_killed_run_resumes_without_losing_or_repeating_a_request(tmp_path, reference):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(line(f"q{i}", p) for i, p in enumerate(PROMPTS)) + "\n")
    # one sequence at a time, so requests finish one after another while the process runs
    code = f"from minillm.serve.batch import run_batch; run_batch({str(inp)!r}, {str(out)!r}, max_num_seqs=1)"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, "the batch process ended or stalled"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    written = out.read_text().count("\n")
    assert 2 <= written < len(PROMPTS), "the kill came too late to test a resume"
    with out.open("a") as f:
        f.write('{"id": "batch_req_x", "custom_id": "q')  # as if the kill had come mid-write
    stats = run_batch(inp, out)  # the rerun batches all the rest at once: greedy outputs do not change
    rows = read(out)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"q{i}" for i in range(len(PROMPTS)))
    assert stats["skipped"] == written and stats["succeeded"] == len(PROMPTS) - written
    texts = {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in rows}
    assert [texts[f"q{i}"] for i in range(len(PROMPTS))] == [reference[p] for p in PROMPTS]
