"""The quantization page's pictures: the sensitivity heatmap, weights and KV blocks in one memory
budget, and two greedy texts with the token where they part marked."""
import html
import math

import plotly.graph_objects as go

from minillm.quant.quant_config import LAYER_PROJECTIONS
from minillm_visualizer.shared.style import BOX, FREE, MIB

WEIGHTS, KV = "#4c72b0", "#55a868"
SAME = ""
FIRST_DIFFERENT = "background:#ffd8a8;color:#d9480f;font-weight:700;border-radius:3px"
AFTER = "color:#868e96"
LEGEND = (f'The two texts are the same up to <span style="{FIRST_DIFFERENT}">the first token where they differ</span>; '
          f'<span style="{AFTER}">after it, each model continues its own text</span>.')


def sensitivity_heatmap(rows: list[dict], label: str) -> go.Figure:
    """Layers (rows) x projections (columns), coloured by the KL of quantizing that one matrix alone, on a
    log scale (the cells span orders of magnitude); the hover adds perplexity and top-1 agreement."""
    layers = sorted({r["layer"] for r in rows})
    cells = {(r["layer"], r["projection"]): r for r in rows}
    z, text, hover = [], [], []
    for layer in layers:
        row = [cells[(layer, p)] for p in LAYER_PROJECTIONS]
        z.append([math.log10(max(c["kl"], 1e-9)) for c in row])
        text.append([f"{c['kl']:.1e}" for c in row])
        hover.append([[c["kl"], c["perplexity"], 100 * c["top1"]] for c in row])
    ticks = list(range(math.floor(min(map(min, z))), math.ceil(max(map(max, z))) + 1))
    fig = go.Figure(go.Heatmap(
        z=z, x=[p.removesuffix("_proj") for p in LAYER_PROJECTIONS], y=[f"layer {i}" for i in layers],
        text=text, texttemplate="%{text}", customdata=hover, colorscale="YlOrRd", xgap=2, ygap=2,
        colorbar=dict(title="KL (nats)", tickvals=ticks, ticktext=[f"1e{t}" for t in ticks]),
        hovertemplate="%{y}, %{x} alone: KL %{customdata[0]:.2e} nats, perplexity %{customdata[1]:.3f}, "
                      "top-1 %{customdata[2]:.1f}%<extra></extra>"))
    fig.update_layout(title=f"Sensitivity: each matrix quantized alone ({label})", height=120 + 36 * len(layers),
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="projection",
                      yaxis=dict(autorange="reversed"))
    return fig


def budget_chart(rows: dict[str, dict], budget_bytes: int) -> go.Figure:
    """One bar per model: its weights, then the whole KV blocks that fit in the rest of the budget, then
    what is left (less than a block). rows: bar name -> quant_run.kv_fit's dict."""
    names = list(rows)
    fig = go.Figure()
    fig.add_bar(y=names, x=[min(r["weights"], budget_bytes) / MIB for r in rows.values()], name="weights",
                orientation="h", marker_color=WEIGHTS, customdata=[r["weights"] / MIB for r in rows.values()],
                hovertemplate="weights: %{customdata:.2f} MiB<extra></extra>")
    fig.add_bar(y=names, x=[r["kv"] / MIB for r in rows.values()], name="KV blocks", orientation="h",
                marker_color=KV, text=[f"{r['blocks']:,} blocks" for r in rows.values()], textposition="inside",
                customdata=[[r["blocks"], r["tokens"]] for r in rows.values()],
                hovertemplate="KV pool: %{x:.2f} MiB = %{customdata[0]:,} blocks, %{customdata[1]:,} tokens"
                              "<extra></extra>")
    fig.add_bar(y=names, x=[max(r["spare"], 0) / MIB for r in rows.values()], name="left over (under a block)",
                orientation="h", marker_color=FREE, hovertemplate="left over: %{x:.3f} MiB<extra></extra>")
    fig.add_vline(x=budget_bytes / MIB, line_dash="dot", line_color="#212529",
                  annotation_text=f"budget {budget_bytes / MIB:g} MiB", annotation_position="top")
    fig.update_layout(barmode="stack", title="Weights and KV blocks in one memory budget", height=220,
                      margin=dict(l=10, r=10, t=40, b=10), legend=dict(orientation="h", y=-0.3),
                      xaxis=dict(ticksuffix=" MiB"), yaxis=dict(autorange="reversed"))
    return fig


def parted_text(prompt: str, pieces: list[str], first: int | None, prompt_chars: int = 160) -> str:
    """HTML of the prompt's end (grey), then the output: the same as the other model's up to `first`
    (None: all of it), the token at `first` marked, the rest muted."""
    tail = prompt if len(prompt) <= prompt_chars else "\u2026" + prompt[-prompt_chars:]
    out = [f'<span style="color:#adb5bd">{html.escape(tail)}</span>']
    for i, piece in enumerate(pieces):
        style = SAME if first is None or i < first else FIRST_DIFFERENT if i == first else AFTER
        shown = html.escape(piece.replace("\n", "\u21b5\n") if i == first else piece)
        out.append(f'<span style="{style}">{shown}</span>' if style else shown)
    return f'<div style="{BOX}">{"".join(out)}</div>'
