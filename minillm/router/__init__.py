"""The cache-aware router in front of N OpenAI-compatible replicas, and its routing policies.

    policies.py      which replica serves a request: round robin, least loaded, prefix aware
                     (plain Python: the simulator, minillm/sim, imports them too)
    prefix_index.py  the router's guess at what each replica's prefix cache holds
    state.py         what the router knows of its replicas, and the one place that changes it
    metrics.py       the router's /metrics
    app.py           the HTTP router: routes, relays streams, retries, health checks
    fleet.py         N replica servers as subprocesses behind a router, on one machine
    measure.py       the policies measured on a real fleet (python -m minillm.bench cluster)

    python -m minillm route --replicas 2 --policy prefix_aware

The router needs the serve extra (FastAPI, httpx, prometheus_client), never the simulator's (SimPy).
Nothing is imported here, so `import minillm.router.policies` costs the simulator no web stack.
"""
