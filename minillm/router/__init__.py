"""The cache-aware router in front of N OpenAI-compatible replicas, and its routing policies.

    policies.py         which replica serves a request: round robin, least loaded, prefix aware
                        (plain Python: the simulator, minillm/sim, imports them too)
    prefix_index.py     the router's guess at what each replica's prefix cache holds
    replica_state.py    what the router knows of its replicas, and the one place that changes it
    replica_metrics.py  the router's /metrics
    proxy.py            the HTTP router: routes, relays streams, retries, health checks
    fleet.py            N replica servers as subprocesses behind a router, on one machine

The policies measured on a real fleet: experiments/routing_trial.py (python -m minillm.bench cluster).

    python -m minillm route --replicas 2 --policy prefix_aware

The router needs the serve extra (FastAPI, httpx, prometheus_client), never the simulator's (SimPy).
Nothing is imported here, so `import minillm.router.policies` costs the simulator no web stack.
"""
