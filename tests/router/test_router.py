"""The cache-aware router: the prefix index against the engine's own prefix cache, each routing
policy's choices through the real router (fake replicas that record what they got), failures
(a refused connection retried elsewhere, a stream cut mid-way ending in an error event the `openai`
client raises, 503 in OpenAI's shape with no replica alive, a replica back in rotation after a
health check), and a real fleet of two tiny replicas: greedy outputs equal `LLM.generate`, the
router's hit estimate equals each replica's own hit-rate gauge, and a replica killed mid-run costs
its callers an error or a retry within a timeout, never a hang or a leaked process."""
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from prometheus_client.parser import text_string_to_metric_families

from minillm import LLM, SamplingParams
from minillm.experiments.routing_trial import tenant_sessions
from minillm.router.fleet import Fleet, route_in_thread
from minillm.router.prefix_index import PrefixIndex
from minillm.router.replica_state import RouterState
from minillm.serve.responses import sse
from minillm.serve.server import app_in_thread
from minillm.testing import wait_until

# ~70 tokens of code: prompts built on it share whole 16-token blocks
SHARED = "def handler(value, limit=3):\n    if value > limit:\n        return value - 1\n    return value * 2\n\n" * 3
OTHER = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n" * 3


# -- the prefix index ----------------------------------------------------------------------------
def test_two_prompts_sharing_three_blocks_hit_48_tokens_as_in_the_engine():
    a = list(range(100, 164))                      # 64 tokens: 4 blocks
    b = a[:48] + list(range(2000, 2020))           # shares 3 blocks, then differs
    index = PrefixIndex(block_size=16)
    index.insert(a)
    assert index.match(b) == 48
    assert index.match(a) == 48        # the last token is always computed: 63 tokens -> 3 full blocks
    assert index.match([7] + a) == 0   # a name stands for the whole prefix: shifted blocks never match
    llm = LLM("tiny")                  # the engine's own prefix cache: the same 48 tokens hit
    llm.generate([a], SamplingParams(max_tokens=1))
    llm.generate([b], SamplingParams(max_tokens=1))
    assert llm.engine.view.kv_stats().prefix_hit_rate == pytest.approx(48 / (len(a) + len(b)))


def test_index_forgets_least_recent_leaves_first_within_its_bound():
    index = PrefixIndex(block_size=16, capacity=4)
    a, b = list(range(0, 49)), list(range(500, 549))   # 3 full blocks each
    index.insert(a)
    index.insert(b)
    assert len(index) == 4
    assert index.match(b) == 48   # the newest chain is whole
    assert index.match(a) == 16   # the older one lost its leaves, kept its root
    index.clear()
    assert index.match(b) == 0


def test_index_refuses_a_zero_capacity():
    with pytest.raises(ValueError, match="capacity=0"):
        PrefixIndex(capacity=0)


def test_router_refuses_a_url_without_scheme_and_an_unknown_policy():
    with pytest.raises(ValueError, match="'localhost:8000'"):
        RouterState(["localhost:8000"])
    with pytest.raises(ValueError, match="'fastest'"):
        RouterState(["http://127.0.0.1:8000"], policy="fastest")


# -- fake replicas -------------------------------------------------------------------------------
class FakeReplica:
    """Answers /v1/completions with its own name as the text. A request whose `user` is "hold" waits
    for `release`; mode "break" dies after a stream's first event, "mute" before it."""

    def __init__(self, name: str) -> None:
        self.name, self.prompts, self.release, self.mode = name, [], threading.Event(), None
        self.closed = threading.Event()
        self.app, self.server = FastAPI(), None
        self.app.post("/v1/completions")(self.completions)
        self.app.get("/health")(lambda: {"status": "ok"})

    async def completions(self, request: Request):
        body = await request.json()
        self.prompts.append(body["prompt"])
        if body.get("user") == "hold":
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        if body.get("stream"):
            return StreamingResponse(self.events(), media_type="text/event-stream")
        return self.chunk(self.name, "stop")

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        return {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "tiny",
                "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}]}

    async def events(self):
        if self.mode == "mute":
            raise RuntimeError("the fake replica dies before its first event")
        yield sse(self.chunk(self.name, None))
        try:
            while self.mode == "slow":
                await asyncio.sleep(0.02)
                yield sse(self.chunk(".", None))
        finally:
            self.closed.set()
        if self.mode == "break":
            raise RuntimeError("the fake replica dies mid-stream")
        yield sse(self.chunk("", "stop"))
        yield sse("[DONE]")

    def start(self, port: int = 0) -> "FakeReplica":
        self.server = app_in_thread(self.app, port=port, name=f"fake-{self.name}")
        return self

    @property
    def url(self) -> str:
        return self.server.base_url


@pytest.fixture
def fakes():
    replicas = [FakeReplica("r0").start(), FakeReplica("r1").start()]
    yield replicas
    for r in replicas:
        r.release.set()
        r.server.stop()


def router_over(fakes, policy: str, health_interval: float = 60.0):
    return route_in_thread([f.url for f in fakes], policy=policy, health_interval=health_interval)


def complete(base_url: str, prompt: str, **extra) -> str:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="-", max_retries=0, timeout=20)
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=4, **extra).choices[0].text


def held(pool: ThreadPoolExecutor, router, replica: int, prompt: str):
    """Send a request that the fake holds open; return once the router counts it in flight there."""
    state = router.app.state.router.state
    before = state.replicas[replica].in_flight
    future = pool.submit(complete, router.base_url, prompt, user="hold")
    assert wait_until(lambda: state.replicas[replica].in_flight == before + 1, 10), "the held request went elsewhere"
    return future


# -- policies through the real router --------------------------------------------------------------
def test_round_robin_alternates_replicas(fakes):
    with router_over(fakes, "round_robin") as router:
        assert [complete(router.base_url, f"x = {i}") for i in range(4)] == ["r0", "r1", "r0", "r1"]


def test_least_loaded_avoids_the_replica_holding_a_request(fakes):
    with router_over(fakes, "least_loaded") as router, ThreadPoolExecutor(2) as pool:
        hold = held(pool, router, 0, "x = 1")
        assert complete(router.base_url, "x = 2") == "r1"
        fakes[0].release.set()
        assert hold.result(10) == "r0"
        assert complete(router.base_url, "x = 3") == "r0"   # both idle again: the first wins the tie


def test_prefix_aware_follows_cached_prefixes_until_the_load_gap_passes_its_slack(fakes):
    with router_over(fakes, "prefix_aware") as router, ThreadPoolExecutor(8) as pool:
        state = router.app.state.router.state
        hold = held(pool, router, 0, SHARED)                 # idle fleet, no hits: replica 0
        assert complete(router.base_url, OTHER) == "r1"      # replica 0 is busier, neither holds OTHER
        fakes[0].release.set()
        hold.result(10)
        fakes[0].release.clear()
        assert complete(router.base_url, OTHER + "x = 1") == "r1"    # a hit on r1 beats r0's tie-break
        assert complete(router.base_url, SHARED + "x = 1") == "r0"
        assert state.replicas[1].hit_tokens >= 64
        holds = [held(pool, router, 1, OTHER + f"y = {i}") for i in range(4 + 1)]  # slack 4: up to load 4
        assert complete(router.base_url, OTHER + "z = 0") == "r0"   # r1 is 5 ahead: the load wins
        fakes[1].release.set()
        assert [h.result(10) for h in holds] == ["r1"] * 5


# -- failures ------------------------------------------------------------------------------------
def test_refused_connection_is_retried_elsewhere_and_the_replica_leaves_rotation(fakes):
    with router_over(fakes, "round_robin") as router:
        fakes[0].server.stop()
        assert complete(router.base_url, "x = 1") == "r1"   # r0's turn, refused, sent to r1
        state = router.app.state.router.state
        assert not state.replicas[0].alive and state.replicas[0].failures == 1
        assert [complete(router.base_url, f"x = {i}") for i in range(3)] == ["r1"] * 3
        metrics = {(s.name, s.labels.get("replica")): s.value
                   for f in text_string_to_metric_families(httpx.get(router.base_url + "/metrics").text)
                   for s in f.samples}
        assert metrics[("minillm_router_failures_total", fakes[0].url)] == 1
        assert metrics[("minillm_router_replica_alive", fakes[0].url)] == 0
        assert metrics[("minillm_router_requests_total", fakes[1].url)] == 4


def test_stream_failing_before_its_first_event_is_retried_on_another_replica(fakes):
    with router_over(fakes, "round_robin") as router:
        fakes[0].mode = "mute"
        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="-", max_retries=0, timeout=20)
        stream = client.completions.create(model="tiny", prompt="x", max_tokens=4, stream=True)
        assert [c.choices[0].text for c in stream if c.choices] == ["r1", ""]  # the mute request went to r0 first
        assert fakes[0].prompts == ["x"] and fakes[1].prompts == ["x"]


def test_stream_cut_mid_way_ends_with_an_error_event_the_client_raises(fakes):
    with router_over(fakes, "round_robin") as router:
        fakes[0].mode = fakes[1].mode = "break"
        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="-", max_retries=0, timeout=20)
        texts = []
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            for chunk in client.completions.create(model="tiny", prompt="x", max_tokens=4, stream=True):
                texts.append(chunk.choices[0].text)
        assert texts == ["r0"]
        lines = httpx.post(router.base_url + "/v1/completions", timeout=20,
                           json={"model": "tiny", "prompt": "x", "stream": True}).text.splitlines()
        assert lines[-2:] == ["data: [DONE]", ""] and '"replica_failed"' in lines[-4]  # r1's stream, cut
        assert router.app.state.router.state.replicas[1].failures == 1


def test_client_leaving_mid_stream_closes_the_replicas_stream_and_frees_its_slot(fakes):
    fakes[0].mode = "slow"
    with router_over(fakes, "round_robin") as router:
        state = router.app.state.router.state
        with httpx.stream("POST", router.base_url + "/v1/completions", timeout=10,
                          json={"model": "tiny", "prompt": "x", "stream": True}) as response:
            # Hold the line iterator: a generator dropped after next() is closed at once, and closing it closes
            # the connection, so the client would have left before the check below (a flake on a busy machine)
            lines = response.iter_lines()
            first = next(lines)
            assert state.replicas[0].in_flight == 1, f"the stream is open, its slot held (first line: {first!r})"
        assert fakes[0].closed.wait(15), "the replica's stream outlived the client"
        assert wait_until(lambda: state.replicas[0].in_flight == 0, 15)
        assert state.replicas[0].failures == 0 and state.replicas[0].alive


def test_no_replica_alive_is_a_503_in_openai_error_shape(fakes):
    with router_over(fakes, "prefix_aware") as router:
        for f in fakes:
            f.server.stop()
        with pytest.raises(openai.InternalServerError) as caught:
            complete(router.base_url, "x = 1")
        assert caught.value.status_code == 503
        error = caught.value.response.json()["error"]
        assert error["type"] == "service_unavailable" and "no replica is alive" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        assert httpx.get(router.base_url + "/health").status_code == 503


def test_replica_back_after_a_restart_returns_to_rotation_through_the_health_check(fakes):
    with router_over(fakes, "round_robin", health_interval=0.1) as router:
        state = router.app.state.router.state
        port = int(fakes[0].url.rsplit(":", 1)[1])
        fakes[0].server.stop()
        assert wait_until(lambda: not state.replicas[0].alive, 5), "the health check missed a dead replica"
        assert {complete(router.base_url, f"x = {i}") for i in range(2)} == {"r1"}
        fakes[0] = FakeReplica("r0").start(port)
        assert wait_until(lambda: state.replicas[0].alive, 5), "the health check missed a replica back"
        assert {complete(router.base_url, f"x = {i}") for i in range(2)} == {"r0", "r1"}


def test_tenant_sessions_share_system_prompts_and_grow_turn_by_turn():
    sessions = tenant_sessions(tenants=2, sessions=4, turns=3, system_tokens=40, turn_tokens=12, output_tokens=5)
    assert [len(s) for s in sessions] == [3] * 4
    for s in sessions:
        assert all(a.prompt and b.prompt.startswith(a.prompt) and len(b.prompt) > len(a.prompt)
                   for a, b in zip(s, s[1:]))
        assert all(c.max_tokens == 5 for c in s)
    first = [s[0].prompt.split("\n# next step\n")[0] for s in sessions]
    assert first[0] == first[2] != first[1] == first[3]   # session s belongs to tenant s % 2


# -- a real fleet ----------------------------------------------------------------------------------
PROMPTS = ["def fib(n):", "import os\n", "class Stack:", "for i in range(10):"]


@pytest.fixture(scope="module")
def fleet():
    with Fleet.start(replicas=2, policy="prefix_aware") as f:
        yield f


def fleet_client(fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="-", max_retries=0, timeout=60)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_fleet_hit_estimate_equals_each_replicas_own_hit_rate(fleet):
    """Sent one at a time (so each prompt's blocks are cached before the next) to a fresh fleet, the
    index's estimate and the engine's count must agree exactly, replica by replica."""
    client = fleet_client(fleet)
    for turn in range(3):
        for system in (SHARED, OTHER):
            client.completions.create(model="tiny", prompt=system + f"# turn {turn}\n" * (turn + 1), max_tokens=2)
    client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": SHARED},
                                                           {"role": "user", "content": "hello"}], max_tokens=2)
    hit_rates = []
    for replica in fleet.state.replicas:
        families = text_string_to_metric_families(httpx.get(replica.url + "/metrics").text)
        hit_rates.append(next(s.value for f in families for s in f.samples
                              if s.name == "minillm_prefix_cache_hit_rate"))
    assert hit_rates == pytest.approx([r.hit_estimate for r in fleet.state.replicas], abs=1e-9)
    assert max(hit_rates) > 0.3


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_fleet_greedy_outputs_equal_offline_generation(fleet):
    expected = [o.text for o in LLM("tiny").generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0,
                                                                             ignore_eos=True))]
    with route_in_thread(fleet.urls, policy="round_robin") as router:  # a second router: both replicas answer
        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="-", max_retries=0, timeout=60)
        got = [client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS[:2]]
        for p in PROMPTS[2:]:
            stream = client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            got.append("".join(c.choices[0].text for c in stream if c.choices))
        assert got == expected
        assert [r.routed for r in router.app.state.router.state.replicas] == [2, 2]


@pytest.mark.subprocess
@pytest.mark.timeout(150)
def test_killed_replica_costs_its_callers_an_error_never_a_hang_or_a_leaked_process(fleet):
    """Kill replica 0 once every caller has its first tokens: its callers get the error event, the
    others finish; the router stops sending to it; stopping the fleet leaves no process behind.
    (A request killed before its first token is retried: test_stream_failing_before_its_first_event...)"""
    client, state = fleet_client(fleet), fleet.state
    started = threading.Semaphore(0)

    def call(i: int) -> str:
        stream = client.completions.create(model="tiny", prompt=f"def task_{i}(x):", max_tokens=200, stream=True,
                                           extra_body={"ignore_eos": True})
        texts = []
        try:
            for chunk in stream:
                texts.append(chunk.choices[0].text if chunk.choices else "")
                if len(texts) == 1:
                    started.release()
            return "".join(texts)
        except openai.APIError as e:
            return f"error: {e.message}"

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(call, i) for i in range(6)]
        assert all(started.acquire(timeout=60) for _ in futures), "a caller got no first token"
        assert all(r.in_flight >= 1 for r in state.replicas)
        fleet.kill(0)
        results = [f.result(timeout=90) for f in futures]
    errors = [r for r in results if r.startswith("error")]
    assert len(errors) == state.replicas[0].failures >= 1
    assert all("failed mid-stream" in e for e in errors) and len(errors) < len(results)
    assert not state.replicas[0].alive
    routed = state.replicas[0].routed
    for p in PROMPTS[:3]:
        assert client.completions.create(model="tiny", prompt=p, max_tokens=3).choices[0].text
    assert state.replicas[0].routed == routed
    fleet.stop()
    assert all(p.poll() is not None for p in fleet.processes)
