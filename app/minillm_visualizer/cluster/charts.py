"""The cluster page's pictures: queues per replica (animated in the browser), the fleet over time, KV use
as a replicas x time heatmap, latency percentiles per arrival window, and the simulator's errors against
a real run. Every chart over time marks the time the page's slider is on."""
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm_visualizer.cluster.run import ClusterRun
from minillm_visualizer.shared.style import MS, P50, P99, SLO

RUNNING, WAITING, ALIVE = "#4c72b0", "#dd8452", "#55a868"
CURSOR = "#212529"
AIM = 0.15  # the simulator's aim against real runs (bench cluster): within 15%
FRAME_MS = 120


def _cursor(fig: go.Figure, t: float, **where) -> None:
    fig.add_vline(x=t, line_dash="dot", line_color=CURSOR, **where)


def queue_bars(run: ClusterRun, cursor: int) -> go.Figure:
    """Running and waiting requests per replica (stacked bars) at sample `cursor`; one Plotly frame per sample,
    so Play animates the whole run in the browser without rerunning the page. The y axis is fixed to the
    fullest replica of the run, so bars are comparable between frames."""
    s = run.samples

    def bars(i: int) -> list[dict]:
        return [dict(type="bar", x=run.labels, y=[v or 0 for v in s[name][i]], name=name, marker_color=color,
                     hovertemplate=f"%{{x}}: %{{y}} {name}<extra></extra>")
                for name, color in (("running", RUNNING), ("waiting", WAITING))]

    top = max((r or 0) + (w or 0) for rr, ww in zip(s["running"], s["waiting"]) for r, w in zip(rr, ww))
    names = [f"{t:.2f}" for t in s["time"]]
    play = dict(frame=dict(duration=FRAME_MS, redraw=True), fromcurrent=True, transition=dict(duration=0))
    still = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
    # Plain dicts, unvalidated: plotly's checks of every frame's bars cost more than the simulation.
    fig = go.Figure(data=bars(cursor), frames=[dict(data=bars(i), name=n) for i, n in enumerate(names)],
                    _validate=False)
    fig.update_layout(
        barmode="stack", title=dict(text="Queues per replica"), height=380, margin=dict(l=10, r=10, t=40, b=10),
        yaxis=dict(title="requests", range=[0, max(top, 1) * 1.05]), legend=dict(orientation="h", y=1.12, x=0.5),
        updatemenus=[dict(type="buttons", direction="left", x=0, y=-0.18, xanchor="left", showactive=False,
                          buttons=[dict(label="Play", method="animate", args=[None, play]),
                                   dict(label="Pause", method="animate", args=[[None], still])])],
        sliders=[dict(active=cursor, x=0.12, len=0.88, y=-0.1, currentvalue=dict(prefix="t = ", suffix=" s"),
                      steps=[dict(label=f"{t:.0f}", method="animate", args=[[n], still])
                             for t, n in zip(s["time"], names)])])
    fig.update_layout(margin=dict(b=90))
    return fig


def fleet_over_time(run: ClusterRun, t: float) -> go.Figure:
    """Requests waiting and running over the whole fleet, and the replicas taking requests (right axis)."""
    s = run.samples
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name, color in (("running", RUNNING), ("waiting", WAITING)):
        fig.add_scatter(x=s["time"], y=[sum(v or 0 for v in row) for row in s[name]], name=name, line_color=color,
                        hovertemplate=f"%{{x:.1f}} s: %{{y}} {name}<extra></extra>")
    fig.add_scatter(x=s["time"], y=[sum(bool(a) for a in row) for row in s["alive"]], name="replicas serving",
                    line=dict(color=ALIVE, shape="hv"), secondary_y=True,
                    hovertemplate="%{x:.1f} s: %{y} replicas<extra></extra>")
    _cursor(fig, t)
    most = max(sum(bool(a) for a in row) for row in s["alive"])
    fig.update_layout(title="The fleet over time", height=300, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", y=-0.25), xaxis_title="simulated seconds")
    fig.update_yaxes(title_text="requests", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="replicas", range=[0, most * 1.1], dtick=max(1, math.ceil(most / 5)),
                     secondary_y=True)
    return fig


def kv_heatmap(run: ClusterRun, t: float) -> go.Figure:
    """Each replica's share of KV blocks held by running requests (rows) over time (columns); blank where an
    autoscaled replica had not started yet. The colours run up to the fullest replica (at least 5%), so a
    lightly used pool still shows where its blocks go; the colour bar says the scale."""
    s = run.samples
    z = [[row[r] for row in s["kv"]] for r in range(len(run.labels))]  # [replicas, time]
    top = max(0.05, max(v for row in z for v in row if v is not None))
    fig = go.Figure(go.Heatmap(z=z, x=s["time"], y=run.labels, zmin=0, zmax=top, colorscale="Blues",
                               colorbar=dict(title="KV used", tickformat=".0%"),
                               hovertemplate="%{y} at %{x:.1f} s: %{z:.1%} of its KV blocks<extra></extra>"))
    _cursor(fig, t)
    fig.update_layout(title="KV cache use per replica", height=min(160 + 14 * len(run.labels), 900),
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="simulated seconds",
                      yaxis=dict(autorange="reversed", type="category"))
    return fig


def latency_over_time(windows: list[dict], width: float, t: float, slo: dict[str, float]) -> go.Figure:
    """TTFT and TPOT p50 / p99 (ms) of the requests arriving in each window, at the window's middle; the SLOs
    dotted. An empty window leaves a gap."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Time to first token", "Time per output token"))
    x = [w["start"] + width / 2 for w in windows]
    counts = [w["requests"] for w in windows]
    for col, metric in ((1, "ttft"), (2, "tpot")):
        for q, color in ((50, P50), (99, P99)):
            fig.add_scatter(x=x, y=[MS * w[f"{metric}_p{q}"] for w in windows], mode="lines+markers",
                            name=f"p{q}", legendgroup=f"p{q}", showlegend=col == 1, line_color=color,
                            customdata=counts, row=1, col=col,
                            hovertemplate=f"arrivals near %{{x:.0f}} s (%{{customdata}}): {metric.upper()} p{q} "
                                          "%{y:.1f} ms<extra></extra>")
        fig.add_hline(y=MS * slo[metric], line_dash="dot", line_color=SLO, row=1, col=col,
                      annotation_text=f"SLO {MS * slo[metric]:g} ms", annotation_position="top left")
        _cursor(fig, t, row=1, col=col)
        fig.update_xaxes(title_text="arrival (simulated seconds)", row=1, col=col)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=col)
    fig.update_layout(title=f"Latency over time (arrivals in {width:.3g} s windows)", height=340,
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


def simulator_errors(rows: list[dict]) -> go.Figure:
    """(simulated - real) / real per figure, as bars, with the ±15% band the simulator aims for."""
    fig = go.Figure(go.Bar(x=[r["figure"] for r in rows], y=[100 * r["error"] for r in rows],
                           marker_color=[RUNNING if abs(r["error"]) <= AIM else WAITING for r in rows],
                           text=[f"{100 * r['error']:+.0f}%" for r in rows], textposition="outside",
                           hovertemplate="%{x}: simulated %{y:+.1f}% off the real run<extra></extra>"))
    fig.add_hrect(y0=-100 * AIM, y1=100 * AIM, fillcolor=ALIVE, opacity=0.12, line_width=0)
    fig.update_layout(title="The simulator against the real engine", height=300, margin=dict(l=10, r=10, t=40, b=10),
                      yaxis=dict(title="simulated - real, % of real", ticksuffix="%"))
    return fig
