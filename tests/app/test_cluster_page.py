"""The Cluster page: a simulated fleet serves every call of the agent sessions it was given, draws its queues, KV use
and latency over time, routes shared prompts to the replicas that cache them when asked to, splits or scales the
fleet, says why a fleet cannot be, and puts one replica of the real engine beside its simulation."""
import numpy as np
import pytest
from app_pages import APP, errors, figures

from minillm.sim import simulate
from minillm.sim.workloads import agent_sessions
from minillm_visualizer.cluster.run import latency_windows, roofline_replica

DEFAULT_TRAFFIC = dict(n=200, rate=4.0, seed=0, tenants=4, burstiness=0.3)  # the page's defaults
QUEUES, FLEET, KV = "Queues per replica", "The fleet over time", "KV cache use per replica"


@pytest.fixture
def cluster():
    """The page alone, with its defaults: 4 replicas of Llama-3.1-8B on an H100 (roofline), least loaded."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.switch_page("minillm_visualizer/cluster/cluster.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def change(at, kind: str, key: str, value):
    getattr(at, kind)(key=key).set_value(value).run()
    assert not at.exception, [e.value for e in at.exception]


def latency_figure(at) -> dict:
    return next(f for title, f in figures(at).items() if title.startswith("Latency over time"))


def test_every_call_of_every_session_completes_and_the_charts_are_drawn(cluster):
    assert cluster.title[0].value == "Cluster" and not errors(cluster)
    calls = sum(len(s.calls) for s in agent_sessions(**DEFAULT_TRAFFIC))
    assert calls > DEFAULT_TRAFFIC["n"], "sessions make several calls each"
    assert metrics(cluster)["Requests completed"] == f"{calls:,} of {calls:,}"
    profile, knobs = roofline_replica("Llama-3.1-8B", "H100 SXM")
    alone = simulate([], profile, replicas=4, router="least_loaded", sessions=agent_sessions(**DEFAULT_TRAFFIC),
                     **knobs)
    ttft = [r.token_times[0] - r.arrival for r in alone.requests]
    assert metrics(cluster)["TTFT p99"] == f"{1000 * np.percentile(ttft, 99):.0f} ms", "the page's fleet, numpy's p99"
    shown = figures(cluster)
    assert {QUEUES, FLEET, KV} <= set(shown) and latency_figure(cluster)
    times = shown[FLEET]["data"][0]["x"]
    assert times == sorted(times) and len(shown[QUEUES]["frames"]) == len(times), "one animation frame per sample"
    assert shown[QUEUES]["data"][0]["x"] == ["R0", "R1", "R2", "R3"]
    heat = shown[KV]["data"][0]
    assert heat["y"] == ["R0", "R1", "R2", "R3"] and len(heat["z"][0]) == len(times)
    used = [v for row in heat["z"] for v in row]
    assert all(0 <= v <= 1 for v in used) and max(used) > 0, "KV use is a share of each replica's blocks"
    serving = shown[FLEET]["data"][2]["y"]
    assert set(serving) == {4}, "without autoscaling the fleet keeps its 4 replicas"
    for trace in latency_figure(cluster)["data"]:
        assert all(y is None or y >= 0 for y in trace["y"])
    p50, p99 = (t["y"] for t in latency_figure(cluster)["data"][:2])
    assert all(a <= b for a, b in zip(p50, p99) if a is not None), "TTFT p50 never above p99 in a window"


def test_the_slider_moves_the_queues_frame_and_the_markers(cluster):
    times = figures(cluster)[FLEET]["data"][0]["x"]
    cluster.select_slider(key="k_cluster_time").set_value(times[3]).run()
    shown = figures(cluster)
    assert shown[QUEUES]["layout"]["sliders"][0]["active"] == 3
    assert shown[KV]["layout"]["shapes"][0]["x0"] == times[3]


def test_the_replica_pool_is_what_the_gpu_holds_after_the_weights():
    """Llama-3.1-8B: 8.03e9 parameters in bf16; K/V per token 2 x 32 layers x 8 heads x 128 x 2 bytes (its config)."""
    _, knobs = roofline_replica("Llama-3.1-8B", "H100 SXM")
    expected = (0.9 * 80e9 - 2 * 8.03e9) / (2 * 32 * 8 * 128 * 2 * 16)
    assert knobs["kv_blocks"] == pytest.approx(expected, rel=0.01)


def test_prefix_aware_routing_finds_the_shared_prompts(cluster):
    change(cluster, "number_input", "k_cluster_sessions", 60)  # fewer sessions: four quick simulations
    change(cluster, "number_input", "k_cluster_tenants", 2)
    hits = {}
    for router in ("round_robin", "prefix_aware"):
        change(cluster, "radio", "k_cluster_router", router)
        hits[router] = float(metrics(cluster)["Prefix hit rate"].rstrip("%")) / 100
    assert hits["prefix_aware"] > hits["round_robin"] + 0.2, hits
    change(cluster, "number_input", "k_cluster_replicas", 1)
    alone = {router: (change(cluster, "radio", "k_cluster_router", router), metrics(cluster)["Prefix hit rate"])[1]
             for router in ("round_robin", "prefix_aware")}
    assert len(set(alone.values())) == 1, f"one replica leaves the router no choice: {alone}"


def test_a_disaggregated_fleet_and_an_autoscaled_one_serve_every_call(cluster):
    calls = metrics(cluster)["Requests completed"]
    fixed_cost = float(metrics(cluster)["Replica-hours"])
    change(cluster, "selectbox", "k_cluster_split", "1:1")
    assert metrics(cluster)["Requests completed"] == calls and not errors(cluster)
    assert figures(cluster)[KV]["data"][0]["y"] == ["D0", "D1", "P0", "P1"]
    change(cluster, "selectbox", "k_cluster_split", "off")
    change(cluster, "toggle", "k_cluster_autoscale", True)
    assert metrics(cluster)["Requests completed"] == calls and not errors(cluster)
    serving = figures(cluster)[FLEET]["data"][2]["y"]
    assert min(serving) < 4 or max(serving) > 4, "the autoscaler changed the fleet's size"
    assert float(metrics(cluster)["Replica-hours"]) != fixed_cost


def test_this_machines_measured_step_costs_drive_the_fleet(cluster):
    calls = metrics(cluster)["Requests completed"]
    change(cluster, "selectbox", "k_cluster_hardware", "This machine (measured)")
    assert cluster.selectbox(key="k_cluster_model").value == "tiny", "only a bundled model runs here"
    change(cluster, "selectbox", "k_cluster_model", "pico")
    assert metrics(cluster)["Requests completed"] == calls and not errors(cluster)
    assert any("pico on this machine" in c.value for c in cluster.caption)
    assert cluster.subheader[0].value == "4 replicas of pico on This machine (measured), least loaded"


@pytest.mark.parametrize(("kind", "key", "value", "message"), [
    ("selectbox", "k_cluster_model", "Llama-3.1-70B", "Cannot simulate this fleet: Llama-3.1-70B's weights (141 GB"),
    ("number_input", "k_cluster_replicas", 1, "Cannot simulate this fleet: disaggregation needs at least 2 replicas"),
    ("toggle", "k_cluster_autoscale", True, "Cannot simulate this fleet: the simulator does not autoscale a "
                                            "disaggregated fleet"),
])
def test_a_fleet_that_cannot_be_gets_a_message(cluster, kind, key, value, message):
    if key != "k_cluster_model":
        change(cluster, "selectbox", "k_cluster_split", "1:3")
    change(cluster, kind, key, value)
    assert any(e.startswith(message) for e in errors(cluster)), errors(cluster)
    assert not figures(cluster), "nothing is drawn for a fleet that does not exist"


def test_latency_windows_are_numpy_percentiles_of_each_windows_arrivals():
    rng = np.random.default_rng(0)
    requests = [{"arrival": float(a), "ttft": float(t), "tpot": None if k % 5 == 0 else float(p)}
                for k, (a, t, p) in enumerate(zip(rng.uniform(0, 10, 200), rng.lognormal(-2, 1, 200),
                                                   rng.lognormal(-4, 0.5, 200)))]
    windows = latency_windows(requests, 2.5)
    assert [w["start"] for w in windows] == [0, 2.5, 5, 7.5] and sum(w["requests"] for w in windows) == 200
    for w in windows:
        inside = [r for r in requests if w["start"] <= r["arrival"] < w["start"] + 2.5]
        for q in (50, 99):
            assert w[f"ttft_p{q}"] == pytest.approx(np.percentile([r["ttft"] for r in inside], q))
            assert w[f"tpot_p{q}"] == pytest.approx(np.percentile([r["tpot"] for r in inside if r["tpot"]], q))
    with pytest.raises(ValueError, match="window width must be > 0"):
        latency_windows(requests, 0)


@pytest.mark.timeout(120)
def test_the_real_engine_beside_the_simulator(cluster):
    change(cluster, "selectbox", "k_cluster_real_model", "pico")
    change(cluster, "number_input", "k_cluster_real_requests", 4)
    cluster.button(key="cluster_b_real").click().run()
    assert not cluster.exception and not errors(cluster)
    model, rows, about = cluster.session_state["cluster_real"]
    assert model == "pico" and about["requests"] == 4
    by_figure = {r["figure"]: r for r in rows}
    assert by_figure["requests completed"]["real"] == by_figure["requests completed"]["simulated"] == 4
    for r in rows:
        assert r["real"] > 0 and r["error"] == pytest.approx((r["simulated"] - r["real"]) / r["real"])
    bars = figures(cluster)["The simulator against the real engine"]["data"][0]
    assert bars["x"] == [r["figure"] for r in rows]
    assert bars["y"] == pytest.approx([100 * r["error"] for r in rows])


@pytest.mark.timeout(180)
def test_two_real_replicas_in_processes_beside_the_simulated_pair(cluster):
    """Two replica processes behind round robin: every request completes on one of them, and the simulation
    runs on the profile their own calibrations measured (with its spread), two replicas, round robin."""
    change(cluster, "selectbox", "k_cluster_real_model", "pico")
    change(cluster, "radio", "k_cluster_real_replicas", 2)
    change(cluster, "number_input", "k_cluster_real_requests", 6)
    cluster.button(key="cluster_b_real").click().run()
    assert not cluster.exception and not errors(cluster)
    model, rows, about = cluster.session_state["cluster_real"]
    assert (model, about["requests"], about["replicas"]) == ("pico", 6, 2)
    assert "in 2 processes on this machine" in about["profile"].source and len(about["profile"].spread) == 64
    by_figure = {r["figure"]: r for r in rows}
    assert by_figure["requests completed"]["real"] == by_figure["requests completed"]["simulated"] == 6
    assert all(r["real"] > 0 for r in rows)
    assert "2 replicas, 6 requests" in " ".join(c.value for c in cluster.caption)
