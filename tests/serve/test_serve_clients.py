"""The server under the tools people point at it: guidellm's streaming benchmark (completions and chat:
every request succeeds, TTFT and ITL are reported) and lm-eval's local-completions model on a
multiple-choice task of a few local JSONL rows (each choice's loglikelihood, and so the accuracy,
equal scoring the same tokens with LLM.logits directly). Both run offline: the tiny model's folder
is the tokenizer they load, and the task's rows are written here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minillm import LLM
from minillm.models.registry import resolve_model_path

TINY = str(resolve_model_path("tiny"))
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_streaming_benchmark_succeeds_on_every_request(server, endpoint, tmp_path):
    pytest.importorskip("guidellm", reason="guidellm is not installed (the dev extra installs it)")
    report = tmp_path / "guidellm.json"
    command = [str(Path(sys.executable).with_name("guidellm")), "run",
               "--backend", f"kind=openai_http,target={server.base_url},model=tiny,request_format={endpoint}",
               "--profile", "kind=concurrent,streams=4", "--constraint", "kind=max_requests,count=24",
               "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
               "--tokenizer", f"kind=hf_auto,model={TINY}", "--output", f"kind=json,path={report}",
               "--disable-console-interactive"]
    done = subprocess.run(command, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": 24, "errored": 0, "incomplete": 0, "total": 24}
    assert metrics["time_to_first_token_ms"]["successful"]["count"] == 24
    assert metrics["time_to_first_token_ms"]["successful"]["median"] > 0
    assert metrics["inter_token_latency_ms"]["successful"]["count"] >= 24 * 14  # 15 gaps a request, roughly
    assert metrics["inter_token_latency_ms"]["successful"]["median"] > 0


ROWS = [{"question": "def add(a, b):\n    return a", "choices": [" + b", " * b", " - b"], "answer": 0},
        {"question": "import", "choices": [" os", " banana", " ))"], "answer": 0},
        {"question": "for i in", "choices": [" range(10):", " the house", " ]]]"], "answer": 2},
        {"question": "x = [1, 2,", "choices": [" 3]", " 'a'", " None"], "answer": 1}]
TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lm_eval_local_completions_scores_as_the_model_does(server, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (the dev extra installs it)")
    pytest.importorskip("tenacity", reason="lm-eval's API models need lm-eval[api] (tenacity)")
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "tiny_mc.yaml").write_text(TASK.format(rows=rows))
    lm = get_model("local-completions").create_from_arg_obj(
        {"base_url": server.base_url + "/v1/completions", "model": "tiny", "tokenizer": TINY,
         "tokenizer_backend": "huggingface", "num_concurrent": 1, "max_retries": 1})
    out = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path)),
                                  log_samples=True)

    offline = LLM("tiny")
    correct = []
    for sample in sorted(out["samples"]["tiny_mc"], key=lambda s: s["doc_id"]):
        scores = []
        for (context, continuation), [(served, _)] in zip(sample["arguments"], sample["resps"]):
            ctx, cont = lm._encode_pair(context, continuation)  # lm-eval's own split of the tokens
            logprobs = offline.logits(ctx + cont).log_softmax(-1)  # [len, vocab]
            direct = sum(float(logprobs[len(ctx) - 1 + j, t]) for j, t in enumerate(cont))
            assert served == pytest.approx(direct, abs=1e-3), (context, continuation)
            scores.append(direct)
        correct.append(max(range(len(scores)), key=scores.__getitem__) == ROWS[sample["doc_id"]]["answer"])
    assert out["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(correct) / len(correct))
