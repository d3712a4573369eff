"""Scoring requests (max_tokens 0, echo) never freeze the server: their answers are built off the event
loop, a piece at a time, and a client that leaves stops its scoring (issue 50)."""
import json
import threading
import time

import httpx
import pytest

from minillm import AsyncLLM
from minillm.serve import serve_in_thread


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(AsyncLLM("tiny")) as handle:
        yield handle


def flood(prompts: int = 32, ids: int = 500) -> dict:
    return {"model": "tiny", "prompt": [[(7 * p + i) % 500 + 1 for i in range(ids)] for p in range(prompts)],
            "max_tokens": 0, "echo": True, "logprobs": 20, "n": 16}


def test_health_answers_within_a_second_while_a_scoring_flood_is_answered(server):
    pieces: list[bytes] = []

    def score() -> None:  # read as it comes: this process is the server's too, and a client's one big read
        with httpx.stream("POST", server.base_url + "/v1/completions", json=flood(), timeout=600) as r:
            assert r.status_code == 200
            pieces.extend(r.iter_bytes())
    big = threading.Thread(target=score)
    big.start()
    worst = 0.0
    while big.is_alive():
        start = time.monotonic()
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.05)
    assert worst < 1.0, f"/health took {worst:.2f} s while the scoring answer was built"
    assert len(json.loads(b"".join(pieces))["choices"]) == 32 * 16


def test_a_departed_client_stops_its_scoring(server, monkeypatch):
    scored = []
    from minillm.serve import completions
    real = completions.echo_prompt

    async def counting(*args):
        scored.append(1)
        return await real(*args)
    monkeypatch.setattr(completions, "echo_prompt", counting)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=flood(prompts=32), timeout=0.5)
    time.sleep(2.0)
    count = len(scored)
    time.sleep(1.0)
    assert count == len(scored) < 32, "scoring went on after the client left"
