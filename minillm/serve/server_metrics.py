"""Prometheus metrics of one server, served at `/metrics` in Prometheus' text format.

Each app has its own CollectorRegistry (not the process-wide default), so two servers in one
process (tests, a benchmark beside the app) count apart. Latencies follow the serving convention
(TTFT = first token - arrival, ITL = gaps between tokens, E2E = last token - arrival); the engine
measures them per sample and they are observed when the sample finishes. The gauges are read from
the engine when /metrics is scraped, so they are as fresh as the scrape.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minillm.async_llm import AsyncLLM
from minillm.outputs import Completion

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
MODEL_PATH = "/v1/models/"  # /v1/models/{id}: counted under one label, whatever the id


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("minillm_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.ttft = Histogram("minillm_time_to_first_token_seconds", "time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("minillm_inter_token_latency_seconds", "gaps between consecutive tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("minillm_e2e_request_latency_seconds", "arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        # A stream's status (200) is sent before its first token: one that then fails is counted here too
        self.stream_errors = Counter("minillm_stream_errors", "streams ended by an error event, by its status",
                                     ["status"], registry=r)
        self.prompt_tokens = Counter("minillm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("minillm_generation_tokens", "tokens generated", registry=r)
        self.kv_usage = Gauge("minillm_kv_cache_usage_ratio", "share of KV blocks held by sequences", registry=r)
        self.waiting = Gauge("minillm_num_requests_waiting", "requests queued (queue depth)", registry=r)
        self.running = Gauge("minillm_num_requests_running", "sequences in the running batch", registry=r)
        self.prefix_hit_rate = Gauge("minillm_prefix_cache_hit_rate", "share of prompt blocks found cached",
                                     registry=r)

    def observe(self, completion: Completion) -> None:
        """One finished sample's latencies and tokens."""
        m = completion.metrics
        if m.get("ttft") is not None:
            self.ttft.observe(m["ttft"])
        for gap in m.get("itl") or []:
            self.itl.observe(gap)
        if m.get("e2e") is not None:
            self.e2e.observe(m["e2e"])
        self.generation_tokens.inc(len(completion.token_ids))

    def render(self, llm: AsyncLLM) -> bytes:
        kv = llm.kv_stats()
        self.kv_usage.set(kv.used_blocks / kv.total_blocks if kv.total_blocks else 0.0)
        self.waiting.set(llm.num_waiting)
        self.running.set(llm.num_running)
        self.prefix_hit_rate.set(kv.prefix_hit_rate)
        return generate_latest(self.registry)


class CountRequests:
    """ASGI middleware: count every HTTP response by endpoint and status, errors included. Plain
    ASGI rather than Starlette's BaseHTTPMiddleware, which would sit between a streaming response
    and the client's disconnect. An exception that escapes the app becomes a 500 outside this
    middleware (Starlette's ServerErrorMiddleware), so it is counted here as a 500 on its way out."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else MODEL_PATH + "{id}" if path.startswith(MODEL_PATH) else "other"
        started = False

        async def counting_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.metrics.requests.labels(endpoint, "500").inc()
            raise
