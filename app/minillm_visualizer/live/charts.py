"""Plotly figures of the live engine: the memory gauge, latency and throughput."""
import plotly.graph_objects as go

from minillm.step import KVStats
from minillm_visualizer.shared.engine_run import SampleView, StepRecord
from minillm_visualizer.shared.style import CACHED, FREE, MIB


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
