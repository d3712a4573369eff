"""Cluster: a fleet of replicas behind a router, simulated on the engine's step costs, animated over time;
and the simulator checked against one or two replicas of the real engine."""
import pandas as pd
import streamlit as st

from minillm.models.registry import bundled_models
from minillm.perf import PROFILES
from minillm.perf.shapes import shape_names
from minillm.router.policies import POLICIES
from minillm_visualizer.cluster.charts import (
    fleet_over_time,
    kv_heatmap,
    latency_over_time,
    queue_bars,
    simulator_errors,
)
from minillm_visualizer.cluster.run import (
    SLO,
    SPLITS,
    THIS_MACHINE,
    Fleet,
    Traffic,
    latency_windows,
    measured_replica,
    real_vs_simulated,
    roofline_replica,
    simulate_fleet,
    transfer_seconds_per_token,
)
from minillm_visualizer.shared.engines import model_choices
from minillm_visualizer.shared.learner_parts import LABS

LAB = sorted(LABS.glob("lab09_*.ipynb"))
WINDOWS = 24  # latency windows over the arrivals
ROUTERS = {"round_robin": "round robin", "least_loaded": "least loaded", "prefix_aware": "prefix-aware"}
DEFAULTS = {"replicas": 4, "router": "least_loaded", "split": "off", "autoscale": False, "per_replica": 8.0,
            "sessions": 200, "rate": 4.0, "burstiness": 0.3, "tenants": 4, "seed": 0,
            "hardware": "H100 SXM", "model": "Llama-3.1-8B", "real_requests": 8, "real_load": 0.8,
            "real_replicas": 1}

st.title("Cluster")
st.markdown("One engine serves one GPU's worth of requests; a service runs many replicas behind a router. Which "
            "replica gets a request decides whether its prompt prefix is already cached there, and how long it "
            "queues. This page simulates a fleet serving agent sessions (many tenants, bursty, calls that grow "
            "the history), each replica stepping as the engine's measured or roofline step costs say, and plays "
            "the queues and KV use of every replica back over time.")
st.caption(":material/menu_book: " + (f"Taught in **lab 09, scaling out**: `labs/{LAB[0].name}` (open the labs with "
                                      "`make lab`; its source is `solutions/lab09_scaling.py`, and docs/scaling.md "
                                      "goes with it; the lab calibrates this simulator on your own engine). "
                                      if LAB else "")
           + "The simulator is `minillm/sim/` (a discrete-event model on SimPy: `cluster.py`, `replica.py`, "
             "`routing.py`, `autoscale.py`, `workloads.py`); `python -m minillm bench cluster` prints the same "
             "comparisons. The routers are the ones the real router uses.")

for name, value in DEFAULTS.items():
    st.session_state.setdefault(f"k_cluster_{name}", value)
h = st.columns([1.2, 1.2, 3])
hardware = h[0].selectbox("Hardware", [*PROFILES, THIS_MACHINE], key="k_cluster_hardware",
                          help="A GPU: step costs predicted by the roofline at 60% of its peaks. This machine: step "
                               "costs fitted to the real engine running a bundled model here (measured once).")
models = model_choices() if hardware == THIS_MACHINE else shape_names()
if st.session_state["k_cluster_model"] not in models:
    st.session_state["k_cluster_model"] = models[0]  # a public model's shape cannot run on this machine
model = h[1].selectbox("Model", models, key="k_cluster_model")
f = st.columns([1, 2.2, 1, 1.4, 1])
replicas = int(f[0].number_input("Replicas", 1, 64, key="k_cluster_replicas",
                                 help="All of them: with disaggregation, prefill and decode pools together; with "
                                      "autoscaling, how many serve at the start."))
router = f[1].radio("Router", list(POLICIES), format_func=ROUTERS.get, key="k_cluster_router", horizontal=True,
                    help="Round robin: in turn. Least loaded: the fewest requests waiting or running. Prefix-aware: "
                         "the replica that caches most of the prompt, unless it is much busier than the least loaded.")
split = f[2].selectbox("Prefill : decode", list(SPLITS), key="k_cluster_split",
                       help="Off: every replica prefills and decodes. Else the replicas split into a prefill pool and "
                            "a decode pool in this ratio; prompts' K/V travel between them over a 50 GB/s link.")
autoscale = f[3].toggle("Autoscale", key="k_cluster_autoscale",
                        help="Every 5 s, ask for enough replicas that each holds the target; new ones serve after "
                             f"{Fleet.startup_s:g} s (loading weights, warming up), surplus ones drain and leave.")
per_replica = float(f[4].number_input("Target per replica", 1.0, 256.0, step=1.0, key="k_cluster_per_replica",
                                      disabled=not autoscale, help="Requests waiting or running per replica."))
t = st.columns(5)
sessions = int(t[0].number_input("Agent sessions", 1, 2000, key="k_cluster_sessions",
                                 help="Each makes 1 to 50 calls (a few on average), each call's prompt the whole "
                                      "history so far, with a tool pause between calls."))
rate = float(t[1].number_input("Sessions per second", 0.01, 100.0, step=0.5, key="k_cluster_rate"))
burstiness = float(t[2].number_input("Burstiness", 0.05, 10.0, step=0.25, key="k_cluster_burstiness",
                                     help="The shape of the gamma gaps between session starts (their mean stays "
                                          "1/rate): 1 is Poisson; below 1, sessions come in bursts."))
tenants = int(t[3].number_input("Tenants", 1, 256, key="k_cluster_tenants",
                                help="Each tenant has its own system prompt (500 to 2,000 tokens) shared by its "
                                     "sessions: fewer tenants, more sharing for a prefix-aware router to find."))
seed = int(t[4].number_input("Seed", 0, 10_000, key="k_cluster_seed"))

try:
    if hardware == THIS_MACHINE:
        profile, knobs = measured_replica(model)
        transfer = transfer_seconds_per_token(model, "float32")
    else:
        profile, knobs = roofline_replica(model, hardware)
        transfer = transfer_seconds_per_token(model)
    fleet = Fleet(replicas, router, split, autoscale, per_replica)
    traffic = Traffic(sessions, rate, burstiness, tenants, seed)
    run = simulate_fleet(profile, knobs, traffic, fleet, transfer)
except ValueError as exc:
    st.error(f"Cannot simulate this fleet: {exc}", icon=":material/error:")
    st.stop()

s = run.summary
st.subheader(f"{replicas} replica{'s' * (replicas > 1)} of {model} on {hardware}, {ROUTERS[router]}")
m = st.columns(4)
m[0].metric("Requests completed", f"{s['completed']:,} of {run.calls_made:,}",
            help="Every call of every session is one request; the simulation runs until the last one finishes.")
m[1].metric("Output tokens/s", f"{s['output_throughput']:,.0f}")
m[2].metric("Prefix hit rate", f"{s['prefix_hit_rate']:.1%}",
            help="The share of prompt tokens found in the serving replica's prefix cache, not computed again.")
m[3].metric("Replica-hours", f"{run.replica_seconds / 3600:.2f}",
            help="Replicas held (serving, starting or draining) times the time: what the fleet costs.")
m = st.columns(5)
for col, (label, key, digits) in zip(m, (("TTFT p50", "ttft_median", 0), ("TTFT p99", "ttft_p99", 0),
                                         ("TPOT p50", "tpot_median", 1), ("TPOT p99", "tpot_p99", 1))):
    col.metric(label, f"{1000 * s[key]:.{digits}f} ms")
m[4].metric("In SLO", f"{s['slo_attainment']:.1%}",
            help=f"Requests with TTFT <= {SLO['ttft']:g} s and TPOT <= {1000 * SLO['tpot']:g} ms.")
st.caption(f"Simulated {run.duration:.0f} s of {sessions} sessions ({run.calls_made} calls). Step costs: "
           f"{profile.source}: {profile.describe()}. Each replica holds "
           f"{knobs['kv_blocks']:,} KV blocks of {knobs['block_size']} tokens and batches up to "
           f"{knobs['max_num_seqs']} sequences." + (" The simulator does not hold prompts to the model's context "
                                                    "length: the sessions are GPU-sized." if hardware == THIS_MACHINE
                                                    else ""))

times = run.samples["time"]
busiest = max(range(len(times)), key=lambda i: sum(w or 0 for w in run.samples["waiting"][i])
              + sum(r or 0 for r in run.samples["running"][i]))
if st.session_state.get("k_cluster_time") not in times:
    st.session_state["k_cluster_time"] = times[busiest]  # a new run: start on its busiest moment
now = st.select_slider("Time (simulated seconds)", times, key="k_cluster_time", format_func=lambda x: f"{x:.1f} s",
                       help="Where the charts below are marked, and the queues' frame. Play on the queues' chart "
                            "animates the whole run in the browser.")
i = times.index(now)
st.plotly_chart(queue_bars(run, i), key="cluster_queues")
st.plotly_chart(fleet_over_time(run, now), key="cluster_fleet")
st.plotly_chart(kv_heatmap(run, now), key="cluster_kv")
width = max(times[-1], 1e-9) / WINDOWS
st.plotly_chart(latency_over_time(latency_windows(run.requests, width), width, now, SLO), key="cluster_latency")
table = pd.DataFrame(run.requests)
st.download_button("Download the requests (CSV)", table.to_csv(index=False), "cluster_requests.csv", "text/csv",
                   key="cluster_dl", on_click="ignore")

st.subheader("The simulator against the real engine")
st.caption("The same small workload twice: once through the real engine here (one replica, or two in processes of "
           "their own behind round robin; wall-clock arrivals, random-token prompts), once through the simulator on "
           "the step costs measured from the engine, each step drawing its time from the spread the measurement saw, "
           "slow steps following slow ones as they did (the median of 5 seeded simulations). The simulator aims to "
           "land within 15% of the real figures; the real engine itself varies from run to run on a shared machine, "
           "so run it a few times.")
bundled = [mdl for mdl in model_choices() if mdl in bundled_models()]
r = st.columns([1, 1, 1, 1, 2])
real_model = r[0].selectbox("Model (real run)", bundled, key="k_cluster_real_model")
real_replicas = r[1].radio("Replicas", [1, 2], key="k_cluster_real_replicas", horizontal=True,
                           help="Two: each a process of its own (one torch thread), the requests dealt round robin, "
                                "as the simulator's round-robin router deals them.")
real_requests = int(r[2].number_input("Requests", 2, 64, key="k_cluster_real_requests"))
real_load = float(r[3].number_input("Load", 0.1, 3.0, step=0.1, key="k_cluster_real_load",
                                    help="The arrival rate, per replica, as a share of what a replica serves one "
                                         "mean request at a time: above 1, requests batch and queue."))
if r[4].button(f"Run the real engine and the simulator ({real_requests} requests, seconds)", key="cluster_b_real",
               type="primary", icon=":material/play_arrow:"):
    with st.spinner(f"Replaying {real_requests} requests through {real_replicas} replica{'s' * (real_replicas > 1)} "
                    f"of {real_model} and simulating them..."):
        st.session_state["cluster_real"] = (real_model, *real_vs_simulated(real_model, real_requests, real_load,
                                                                           real_replicas))
if "cluster_real" in st.session_state:
    real_model, rows, about = st.session_state["cluster_real"]
    st.caption(f"Last run: {real_model}, {about['replicas']} replica{'s' * (about['replicas'] > 1)}, "
               f"{about['requests']} requests at {about['rate']:.2f}/s; step costs {about['profile'].source}.")
    left, right = st.columns([2, 3])
    left.dataframe(pd.DataFrame(rows), hide_index=True, column_config={
        "real": st.column_config.NumberColumn(format="%.4g"), "simulated": st.column_config.NumberColumn(format="%.4g"),
        "error": st.column_config.NumberColumn(format="percent")})
    right.plotly_chart(simulator_errors(rows), key="cluster_errors")
else:
    st.info("Press the button to run the real engine beside the simulator (the step costs are measured on the "
            "first press, once per server).")
