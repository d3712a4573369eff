"""Serving: a load test of the OpenAI-compatible server, live; latency against throughput, the latency
distributions, the server's own /metrics, and what a million tokens cost."""
import math

import pandas as pd
import streamlit as st

from minillm.labkit.plug import SERVING_PARTS, LabPartError
from minillm.perf.cost import DEFAULT_PRICE_PER_HOUR, best_online_load
from minillm_visualizer.serving.charts import cost_chart, costs, distributions, dollars, latency_throughput, rate_label
from minillm_visualizer.serving.run import MINE, SWEEP_FRACTIONS, Load, Point, run, sweep_rates, with_slo
from minillm_visualizer.shared.engines import app_models
from minillm_visualizer.shared.learner_parts import LABS, default_folder
from minillm_visualizer.shared.sizing import cost_note, is_real, knob_defaults, resize
from minillm_visualizer.shared.style import MS

DEFAULTS = {"rate": 4.0, "requests": 8, "burstiness": 1.0, "prompt_tokens": 32, "max_tokens": 16, "sweep": False,
            "slo_ttft_ms": 500.0, "slo_tpot_ms": 100.0, "price": DEFAULT_PRICE_PER_HOUR}
# A real model: four requests of eight tokens (a point takes seconds on a 2-core CPU), SLOs a CPU can meet.
REAL = {"requests": 4, "max_tokens": 8, "slo_ttft_ms": 2000.0, "slo_tpot_ms": 300.0}
LAB = sorted(LABS.glob("lab08_*.ipynb"))

st.title("Serving")
st.markdown("A server is judged by its users: how long until the first token (TTFT), how fast the rest stream "
            "(TPOT, the gaps between tokens), and how many requests per second it can take before those get worse. "
            "This page starts minillm's OpenAI-compatible server on a loopback port, sends it a seeded load over "
            "HTTP at the arrival rate you choose, and measures every request as a client sees it, while the "
            "server's own `/metrics` are scraped live.")
st.caption(":material/menu_book: " + (f"Taught in **lab 08, serving**: `labs/{LAB[0].name}` (open the labs with "
                                      "`make lab`; its source is `solutions/lab08_serving.py`, and docs/serving.md "
                                      "goes with it). " if LAB else "")
           + "The server is `minillm/serve/` (`python -m minillm serve`), the load generator "
             "`minillm/serve/loadgen.py`, the metrics' definitions `minillm/perf/serving.py`.")

models = app_models()
knob_defaults("serve", DEFAULTS, REAL, models)
c = st.columns(6)
model = c[0].selectbox("Model", models, key="k_serve_model", on_change=resize("serve", DEFAULTS, REAL),
                       help="A real model starts on a smaller load.")
rate = c[1].number_input("Arrival rate (requests/s, 0 = all at once)", 0.0, 1000.0, step=1.0, key="k_serve_rate",
                         help="The mean rate at which requests are sent, whether or not the server keeps up "
                              "(an open loop, like real users). With the sweep on: the highest rate.")
requests = int(c[2].number_input("Requests", 1, 200, key="k_serve_requests", help="Per rate."))
burstiness = c[3].number_input("Burstiness", 0.05, 10.0, step=0.25, key="k_serve_burstiness",
                               help="The shape of the gamma gaps between arrivals, whose mean stays 1/rate: 1 is a "
                                    "Poisson process; below 1 requests come in clumps with quiet spells between.")
prompt_tokens = int(c[4].number_input("Prompt tokens", 1, 256, key="k_serve_prompt_tokens",
                                      help="Synthetic code-like prompts of this many tokens, the same at every rate."))
max_tokens = int(c[5].number_input("Max tokens", 2, 256, key="k_serve_max_tokens",
                                   help="Every request generates exactly this many tokens (end of text ignored)."))
s = st.columns([1.4, 1, 1, 1])
sweep = s[0].toggle("Sweep the rate", key="k_serve_sweep",
                    help=f"Run at {', '.join(f'{f:g}' for f in SWEEP_FRACTIONS)} times the arrival rate, then with "
                         "every request at once: the points of the latency-throughput curve.")
slo_ttft = s[1].number_input("SLO: TTFT (ms)", 1.0, 60000.0, step=100.0, key="k_serve_slo_ttft_ms")
slo_tpot = s[2].number_input("SLO: TPOT (ms)", 1.0, 10000.0, step=10.0, key="k_serve_slo_tpot_ms")
price = s[3].number_input("Machine price ($/hour)", 0.001, 1000.0, step=0.01, format="%.3f", key="k_serve_price",
                          help=f"What the machine costs per hour. The default, ${DEFAULT_PRICE_PER_HOUR}, is a "
                               "2-vCPU on-demand cloud VM, the kind of machine these CPU figures come from; a cloud "
                               "GPU rents for dollars an hour.")
slo = {"ttft": slo_ttft / MS, "tpot": slo_tpot / MS}

try:
    rates = sweep_rates(rate, sweep)
except ValueError as exc:
    st.error(f"Cannot sweep: {exc}", icon=":material/error:")
    st.stop()
m = st.columns([1.4, 3])
mine = m[0].toggle("Run with my lab 08 notebook", key="k_serve_mine",
                   help="The next run uses your parts: the load generator parses the stream with your parse_sse "
                        "(8.1) and sends at your arrival_times (8.4); the server admits with your admit (8.5) and "
                        "its engine masks structured output with your apply_grammar_mask (8.6).")
folder = m[1].text_input("Notebook folder (or a lab 08 notebook)", default_folder(), key="k_serve_folder",
                         disabled=not mine)
if mine:
    named = ", ".join(f"{SERVING_PARTS[n]} `{n}`" for n in MINE)
    st.caption(f"Your parts: {named}, 8.6 `apply_grammar_mask`, from `{folder}`.")
load = Load(requests, prompt_tokens, max_tokens, burstiness)
if is_real(model):
    st.caption(":material/timer: " + cost_note(model, f"Each point sends {requests} requests: their prefills of "
               f"{prompt_tokens} tokens, then {max_tokens - 1} decode steps when they batch together (more when they "
               f"arrive apart), seconds a point; the first press also loads the model and starts its server."))
pressed = st.button(f"Run the load test ({len(rates) * requests} requests: {', '.join(map(rate_label, rates))})",
               key="serve_b_run", type="primary", icon=":material/play_arrow:")

st.subheader("The server's /metrics")
live = st.empty()


def metrics_panel(figures: dict[str, float], text: str, requested: int) -> None:
    """The counters' changes over the last point and the gauges as last scraped."""
    with live.container():
        m = st.columns(7)
        m[0].metric("Responses started", f"{figures['minillm_requests_total']:.0f} of {requested}",
                    help="minillm_requests_total for /v1/completions: counted as each response starts streaming.")
        m[1].metric("Finished", f"{figures['minillm_e2e_request_latency_seconds_count']:.0f}",
                    help="minillm_e2e_request_latency_seconds_count: observed as each request finishes.")
        m[2].metric("Tokens generated", f"{figures['minillm_generation_tokens_total']:.0f}",
                    help="minillm_generation_tokens_total: counted as each request finishes.")
        m[3].metric("Running", f"{figures['minillm_num_requests_running']:.0f}",
                    help="minillm_num_requests_running: sequences in the batch at the scrape.")
        m[4].metric("Waiting", f"{figures['minillm_num_requests_waiting']:.0f}",
                    help="minillm_num_requests_waiting: requests queued for a place in the batch.")
        m[5].metric("KV cache used", f"{figures['minillm_kv_cache_usage_ratio']:.1%}",
                    help="minillm_kv_cache_usage_ratio: the share of the pool's KV blocks held by sequences.")
        count = figures["minillm_time_to_first_token_seconds_count"]
        ttft = figures["minillm_time_to_first_token_seconds_sum"] / count if count else math.nan
        m[6].metric("Mean TTFT (server)", f"{MS * ttft:.0f} ms" if count else "-",
                    help="The histogram's sum over its count: measured by the engine from the request's arrival, "
                         "so without the HTTP round trip the client's TTFT includes.")
        with st.expander("Raw /metrics (Prometheus text format)"):
            st.code("\n".join(line for line in text.splitlines() if "_created" not in line), language="text")


status = st.empty()
if pressed:
    st.session_state.pop("serve_result", None)
    requested = requests

    def on_point(i: int, point: Point) -> None:
        status.caption(f"Point {i + 1} of {len(rates)} done ({rate_label(point.rate)}): "
                       f"{point.summary['completed']} of {requests} requests in {point.duration:.1f} s.")

    try:
        with st.spinner(f"Sending {len(rates) * requests} requests to {model}'s server..."):
            points = run(model, load, rates, slo, lambda fig, text: metrics_panel(fig, text, requested), on_point,
                         folder if mine else None)
    except LabPartError as exc:
        st.error(f"Your lab 08 parts could not run: {exc}", icon=":material/error:")
        st.stop()
    st.session_state["serve_result"] = {"model": model, "load": load, "points": points, "mine": mine}
    status.empty()
result = st.session_state.get("serve_result")
if result is None:
    live.info("Press **Run the load test**: the server starts on the first press, then its figures show here "
              "while the requests stream.")
    st.stop()

points = with_slo(result["points"], slo)
last, loaded = points[-1], result["load"]
if not pressed:
    metrics_panel(last.server_figures, last.server_text, loaded.requests)
whose = " with your lab 08 parts" if result.get("mine") else ""
st.caption(f"Last run: {result['model']}{whose}, {loaded.requests} requests per rate, prompts of "
           f"{loaded.prompt_tokens} tokens, {loaded.max_tokens} tokens each, burstiness {loaded.burstiness:g}. The "
           f"panel shows the last point ({rate_label(last.rate)}): counters as changes over it, gauges as last "
           f"scraped.")

st.subheader("What the clients saw")
table = pd.DataFrame([{
    "offered": rate_label(p.rate), "completed": p.summary["completed"], "failed": p.summary["failed"],
    "duration (s)": p.duration, "requests/s": p.summary["request_throughput"],
    "output tok/s": p.summary["output_throughput"], "TTFT p50 (ms)": MS * p.summary["ttft_median"],
    "TTFT p90 (ms)": MS * p.summary["ttft_p90"], "TPOT p50 (ms)": MS * p.summary["tpot_median"],
    "ITL p99 (ms)": MS * p.summary["itl_p99"], "goodput (req/s)": p.summary["goodput"],
    "in SLO": p.summary["slo_attainment"]} for p in points])
st.dataframe(table, hide_index=True, column_config={
    "in SLO": st.column_config.NumberColumn(format="percent", help="Completed requests meeting both SLOs."),
    **{c: st.column_config.NumberColumn(format="%.2f") for c in ("duration (s)", "requests/s", "output tok/s",
                                                                   "goodput (req/s)")},
    **{c: st.column_config.NumberColumn(format="%.0f") for c in table.columns if c.endswith("(ms)")}})
st.caption("TTFT: first token's arrival minus the request's send time (queueing and prefill). TPOT: the time after "
           "the first token, per token after the first (lab 08, exercise 8.2). ITL: every gap between streamed "
           "tokens. Goodput: requests per second that met both SLOs; "
           "change the SLOs and the figures follow without rerunning.")
st.plotly_chart(latency_throughput(points, slo), key="serve_curve")
st.caption("Each marker is one offered rate. While the server keeps up, throughput follows the offered load and "
           "latency stays flat; past the knee, requests queue: TTFT climbs while throughput barely moves. Batching "
           "more sequences per step raises throughput and the time of each step, which is TPOT.")

shown = points[-1]
if len(points) > 1:
    label = st.columns(3)[0].selectbox("Distributions of", [rate_label(p.rate) for p in points],
                                       index=len(points) - 1, key="k_serve_shown")
    shown = next(p for p in points if rate_label(p.rate) == label)
st.plotly_chart(distributions(shown, slo), key="serve_distributions")

st.subheader("What a million tokens cost")
rows = costs(points, price)
online = best_online_load([p.summary for p in points])
chosen = next((i for i, p in enumerate(points) if p.summary is online), None)
st.plotly_chart(cost_chart(rows, price, chosen), key="serve_cost")
verdict = (f"Online, only tokens that arrive within the SLOs are worth selling, so a service runs where they come "
           f"fastest: here {rows[chosen]['rate']}, {online['good_output_throughput']:.1f} good tokens/s, "
           f"{dollars(rows[chosen]['goodput'])} per million." if chosen is not None else
           "No request met the SLOs at any rate: loosen them, or lower the rate.")
st.caption(f"Cost per million output tokens, from each point's measured throughput at ${price:g} an hour "
           f"(lab 08, exercise 8.7, derives it). {verdict}")
