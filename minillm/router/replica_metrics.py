"""The router's `/metrics` in Prometheus' text format, one series per replica (label `replica`).

    minillm_router_requests_total         requests routed to the replica (a retry counts again)
    minillm_router_failures_total         of those, failed there (no connection, broken stream, 5xx)
    minillm_router_in_flight              requests in flight there through this router (its load)
    minillm_router_replica_alive          1 while in rotation, 0 while out
    minillm_router_prefix_hit_estimate    share of the prompt tokens routed there that the router's
                                          index expected cached (the replica's own gauge,
                                          minillm_prefix_cache_hit_rate, says what really hit)

The figures are read from RouterState when scraped (a collector, not counters kept in step with it),
so the state has one owner.
"""
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minillm.router.replica_state import RouterState


class RouterCollector:
    def __init__(self, state: RouterState) -> None:
        self.state = state

    def collect(self):
        requests = CounterMetricFamily("minillm_router_requests", "requests routed to the replica", labels=["replica"])
        failures = CounterMetricFamily("minillm_router_failures", "requests that failed at the replica",
                                       labels=["replica"])
        in_flight = GaugeMetricFamily("minillm_router_in_flight", "requests in flight at the replica",
                                      labels=["replica"])
        alive = GaugeMetricFamily("minillm_router_replica_alive", "1 while the replica is in rotation",
                                  labels=["replica"])
        hits = GaugeMetricFamily("minillm_router_prefix_hit_estimate",
                                 "share of routed prompt tokens the router expected cached", labels=["replica"])
        for r in self.state.replicas:
            requests.add_metric([r.url], r.routed)
            failures.add_metric([r.url], r.failures)
            in_flight.add_metric([r.url], r.in_flight)
            alive.add_metric([r.url], float(r.alive))
            hits.add_metric([r.url], r.hit_estimate)
        yield from (requests, failures, in_flight, alive, hits)


def metrics_registry(state: RouterState) -> CollectorRegistry:
    """A registry of its own (not the process-wide default), so two routers in one process count apart."""
    registry = CollectorRegistry()
    registry.register(RouterCollector(state))
    return registry
