"""Plotly figures of the live engine: the KV block map, the memory gauge, latency and throughput."""
import math

import plotly.graph_objects as go
from plotly.colors import qualitative

from minillm.state import KVStats
from visualizer.run import SampleView, StepRecord

FREE, CACHED, SHARED = "#e9ecef", "#a5c8e4", "#212529"
PALETTE = qualitative.Set2 + qualitative.Pastel1 + qualitative.Set3
MIB = 2**20


def request_colors(request_ids: list[str]) -> dict[str, str]:
    """One colour per request, fixed for the whole run (by order of arrival)."""
    return {rid: PALETTE[i % len(PALETTE)] for i, rid in enumerate(dict.fromkeys(request_ids))}


def block_map(kv: KVStats, colors: dict[str, str], columns: int = 16) -> go.Figure:
    """One cell per KV block, coloured by owner: a request, several (shared), cached or free."""
    owners = kv.block_owner
    labels = ["free" if o is None else o for o in owners]
    palette = {"free": FREE, "cached": CACHED, "shared": SHARED, **colors}
    categories = list(dict.fromkeys(["free", "cached", "shared", *labels]))
    code = {c: i for i, c in enumerate(categories)}
    rows = max(1, math.ceil(len(owners) / columns))
    z = [[None] * columns for _ in range(rows)]
    text = [[""] * columns for _ in range(rows)]
    hover = [[""] * columns for _ in range(rows)]
    for block, label in enumerate(labels):
        r, c = divmod(block, columns)
        z[r][c] = code[label] + 0.5
        text[r][c] = "" if label in ("free", "cached") else ("S" if label == "shared" else label)
        hover[r][c] = f"block {block}: {label}"
    k = len(categories)
    scale = []
    for i, name in enumerate(categories):
        color = palette.get(name, "#999999")
        scale += [[i / k, color], [(i + 1) / k, color]]
    fig = go.Figure(go.Heatmap(z=z, text=text, customdata=hover, texttemplate="%{text}", zmin=0, zmax=k,
                               colorscale=scale, showscale=False, xgap=2, ygap=2,
                               hovertemplate="%{customdata}<extra></extra>"))
    unit = "sequence reservations (contiguous)" if kv.kind == "contiguous" else f"blocks of {kv.block_size} tokens"
    fig.update_layout(title=f"KV pool: {len(owners)} {unit}", height=90 + 26 * rows,
                      margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"))
    return fig


def memory_gauge(kv: KVStats) -> go.Figure:
    """Used / cached / free bytes of the pool as one stacked bar."""
    parts = [("used", kv.used_blocks, "#4c72b0"), ("cached", kv.cached_blocks, CACHED), ("free", kv.free_blocks, FREE)]
    fig = go.Figure()
    for name, blocks, color in parts:
        size = kv.used_bytes if name == "used" else blocks * kv.bytes_per_block
        fig.add_bar(y=["KV"], x=[size / MIB], name=f"{name}: {size / MIB:.2f} MiB", orientation="h",
                    marker_color=color, hovertemplate=f"{name}: %{{x:.2f}} MiB ({blocks} blocks)<extra></extra>")
    fig.update_layout(barmode="stack", height=170, margin=dict(l=10, r=10, t=40, b=10),
                      title=f"Memory: {kv.kind} KV cache", legend=dict(orientation="h", y=-0.35),
                      yaxis=dict(visible=False), xaxis=dict(ticksuffix=" MiB"))
    return fig


def ttft_chart(samples: dict[str, SampleView]) -> go.Figure:
    keys = [k for k, s in samples.items() if s.token_times]
    ttft = [1000 * (samples[k].token_times[0] - samples[k].arrival) for k in keys]
    fig = go.Figure(go.Bar(x=keys, y=ttft, marker_color="#dd8452", hovertemplate="%{x}: %{y:.1f} ms<extra></extra>"))
    return _small(fig, "Time to first token", "ms", "request (by arrival)")


def itl_chart(samples: dict[str, SampleView], t0: float) -> go.Figure:
    """Every gap between two consecutive tokens of a sample, at the time the second one came."""
    x, y = [], []
    for s in samples.values():
        for a, b in zip(s.token_times, s.token_times[1:]):
            x.append(b - t0)
            y.append(1000 * (b - a))
    fig = go.Figure(go.Scattergl(x=x, y=y, mode="markers", marker=dict(size=4, color="#55a868", opacity=0.6),
                                 hovertemplate="t=%{x:.2f}s: %{y:.1f} ms<extra></extra>"))
    return _small(fig, "Inter-token latency", "ms", "seconds since start")


def throughput_chart(records: list[StepRecord], t0: float, bin_s: float = 0.25) -> go.Figure:
    """Tokens sampled per second, in bins of bin_s seconds of wall time."""
    bins: dict[int, int] = {}
    for rec in records:
        b = int((rec.event.start + rec.event.duration - t0) / bin_s)
        bins[b] = bins.get(b, 0) + rec.event.output_tokens
    xs = list(range(max(bins) + 1)) if bins else []
    fig = go.Figure(go.Scatter(x=[(b + 1) * bin_s for b in xs], y=[bins.get(b, 0) / bin_s for b in xs],
                               mode="lines", line_shape="hv", fill="tozeroy", line_color="#4c72b0",
                               hovertemplate="%{y:.0f} tok/s<extra></extra>"))
    return _small(fig, "Throughput", "output tokens/s", "seconds since start")


def _small(fig: go.Figure, title: str, y: str, x: str) -> go.Figure:
    fig.update_layout(title=title, height=260, margin=dict(l=10, r=10, t=40, b=10), yaxis_title=y, xaxis_title=x)
    return fig
