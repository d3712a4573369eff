"""The serving page's pictures: latency against throughput over the offered rates, the TTFT and ITL
distributions of one point, and what a million output tokens cost at the measured speeds."""
import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.perf.cost import cost_per_million_tokens
from minillm.perf.serving import percentile, request_metrics
from minillm_visualizer.serving.run import Point
from minillm_visualizer.shared.style import MS, P50, P90, P99, SLO

THROUGHPUT, GOODPUT = "#4c72b0", "#55a868"
BARS = "#a5c8e4"


def rate_label(rate: float) -> str:
    return "all at once" if math.isinf(rate) else f"{rate:g} req/s"


def latency_throughput(points: list[Point], slo: dict[str, float]) -> go.Figure:
    """Left TTFT, right TPOT (median and p90, ms) against the output tokens/s each offered rate achieved,
    one marker per rate. Past the knee, more offered load buys little throughput and a lot of latency."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Time to first token", "Time per output token"))
    x = [p.summary["output_throughput"] for p in points]
    labels = [rate_label(p.rate) for p in points]
    for col, metric in ((1, "ttft"), (2, "tpot")):
        for stat, color in (("median", P50), ("p90", P90)):
            fig.add_scatter(x=x, y=[MS * p.summary[f"{metric}_{stat}"] for p in points], mode="lines+markers",
                            name=stat, legendgroup=stat, showlegend=col == 1, line_color=color, customdata=labels,
                            hovertemplate=f"%{{customdata}}: %{{x:.1f}} tok/s, {metric.upper()} {stat} "
                                          "%{y:.0f} ms<extra></extra>", row=1, col=col)
        if metric in slo:
            fig.add_hline(y=MS * slo[metric], line_dash="dot", line_color=SLO, row=1, col=col,
                          annotation_text=f"SLO {MS * slo[metric]:g} ms", annotation_position="top left")
        fig.update_xaxes(title_text="output tokens/s", rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=col)
    fig.update_layout(title="Latency against throughput", height=340, margin=dict(l=10, r=10, t=70, b=10),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def _histogram(fig: go.Figure, values: list[float], bins: int, unit: str, col: int) -> None:
    """The values' histogram (numpy's bins), then p50, p90 and p99 as vertical segments as tall as the
    tallest bar, in the legend with their values."""
    counts, edges = np.histogram(values, bins=bins)
    fig.add_bar(x=((edges[:-1] + edges[1:]) / 2).tolist(), y=counts.tolist(), width=np.diff(edges).tolist(),
                marker_color=BARS, showlegend=False, customdata=np.stack([edges[:-1], edges[1:]], -1).tolist(),
                row=1, col=col,
                hovertemplate=f"%{{customdata[0]:.0f}} to %{{customdata[1]:.0f}} ms: %{{y}} {unit}<extra></extra>")
    for q, color in ((50, P50), (90, P90), (99, P99)):
        x = percentile(values, q)
        fig.add_scatter(x=[x, x], y=[0, int(counts.max())], mode="lines", line=dict(color=color, dash="dash"),
                        name=f"p{q}", legendgroup=f"p{q}", showlegend=col == 1, row=1, col=col,
                        hovertemplate=f"p{q}: {x:.0f} ms<extra></extra>")


def distributions(point: Point, slo: dict[str, float]) -> go.Figure:
    """Histograms of one point: every request's TTFT (left) and every gap between streamed tokens (right), in
    ms, with their p50, p90 and p99. A long right tail is the requests that queued or shared a batch."""
    metrics = [request_metrics(r) for r in point.records if r.success]
    ttft = [MS * m.ttft for m in metrics]
    itl = [MS * gap for m in metrics for gap in m.itl]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"TTFT of {len(ttft)} requests",
                                                        f"{len(itl)} inter-token gaps"))
    _histogram(fig, ttft, 30, "requests", 1)
    _histogram(fig, itl, 40, "gaps", 2)
    if "ttft" in slo:
        fig.add_vline(x=MS * slo["ttft"], line_dash="dot", line_color=SLO, row=1, col=1,
                      annotation_text=f"SLO {MS * slo['ttft']:g} ms", annotation_position="top left")
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="count")
    fig.update_layout(title=f"TTFT and ITL distributions ({rate_label(point.rate)})", height=340, bargap=0.05,
                      margin=dict(l=10, r=10, t=70, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


def costs(points: list[Point], price_per_hour: float) -> list[dict]:
    """Per point: $ per million output tokens at the measured throughput, and at the goodput's tokens
    (only requests meeting every SLO count; inf when none did)."""
    rows = []
    for p in points:
        good = p.summary["good_output_throughput"]
        rows.append({"rate": rate_label(p.rate),
                     "throughput": cost_per_million_tokens(price_per_hour, p.summary["output_throughput"]),
                     "goodput": cost_per_million_tokens(price_per_hour, good) if good > 0 else math.inf})
    return rows


def dollars(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 else f"${value:.3g}"


def cost_chart(rows: list[dict], price_per_hour: float, online: int | None) -> go.Figure:
    """Grouped bars per offered rate: $ per million output tokens counting every token, and counting only
    the tokens of requests that met the SLOs (no bar: none did). `online`: the index of the point a
    service would run at (perf.cost.best_online_load: the most good tokens/s), marked."""
    fig = go.Figure()
    names = [r["rate"] for r in rows]
    for key, name, color in (("throughput", "all output tokens", THROUGHPUT),
                             ("goodput", "tokens of requests meeting the SLOs", GOODPUT)):
        values = [r[key] if math.isfinite(r[key]) else None for r in rows]
        fig.add_bar(x=names, y=values, name=name, marker_color=color,
                    text=[dollars(v) if v is not None else "none met the SLOs" for v in values],
                    textposition="outside", hovertemplate="%{x}: $%{y:.3g} per million tokens<extra></extra>")
    if online is not None:
        top = max(v for v in (rows[online]["throughput"], rows[online]["goodput"]) if math.isfinite(v))
        fig.add_annotation(x=names[online], y=top, yanchor="bottom", yshift=24, showarrow=False,
                           text="<b>online: the most tokens/s meeting the SLOs</b>", font_color=GOODPUT)
    fig.update_layout(barmode="group", title=f"Cost per million output tokens at ${price_per_hour:g}/hour",
                      height=340, margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.25),
                      yaxis=dict(title="$ per million tokens", rangemode="tozero"))
    return fig
