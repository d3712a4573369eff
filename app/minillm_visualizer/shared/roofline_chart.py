"""The roofline figure: attainable FLOP/s against arithmetic intensity, with operations placed on it."""
import numpy as np
import plotly.graph_objects as go

from minillm.perf import HardwareProfile, attainable_flops

TERA = 1e12


def roofline_chart(hw: HardwareProfile, dtype: str, points: list[dict]) -> go.Figure:
    """points: {"name", "intensity" (FLOP/byte), "flops" (FLOP/s achieved or predicted), "kind"}."""
    xs = np.logspace(-1, 5, 200)
    fig = go.Figure(go.Scatter(x=xs, y=[attainable_flops(hw, x, dtype) / TERA for x in xs], mode="lines",
                               name=f"roof: {hw.name}", line=dict(color="#212529", width=3),
                               hovertemplate="%{x:.1f} FLOP/B → %{y:.3g} TFLOP/s<extra></extra>"))
    ridge = hw.peak(dtype) / hw.bandwidth
    # On a log axis plotly draws a line (a shape) at the value itself, but puts its label (an
    # annotation) at log10 of the value: give the label its position in those units.
    fig.add_vline(x=ridge, line_dash="dot", line_color="#8c8c8c", annotation_text=f"ridge {ridge:.0f} FLOP/B",
                  annotation_x=float(np.log10(ridge)), annotation_position="bottom right")
    style = {"predicted": dict(symbol="circle-open", size=16, line=dict(width=3)),
             "measured": dict(symbol="star", size=16)}
    colors = {"prefill": "#4c72b0", "decode": "#55a868"}
    for p in points:
        phase = "prefill" if "prefill" in p["name"] else "decode"
        fig.add_scatter(x=[p["intensity"]], y=[p["flops"] / TERA], mode="markers", name=p["name"],
                        marker=dict(color=colors[phase], **style[p["kind"]]),
                        hovertemplate=f"{p['name']}: %{{x:.1f}} FLOP/B, %{{y:.3g}} TFLOP/s<extra></extra>")
    fig.update_layout(title=f"Roofline of {hw.name} ({dtype})", height=460, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte moved)"),
                      yaxis=dict(type="log", title="TFLOP/s"), legend=dict(orientation="h", y=-0.2))
    return fig
