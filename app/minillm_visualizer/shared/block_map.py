"""The KV block map: one cell per block of the pool, coloured by its owner; each request keeps one colour
on the live engine and the paged memory explorer."""
import math

import plotly.graph_objects as go
from plotly.colors import qualitative

from minillm.step import KVStats
from minillm_visualizer.shared.style import CACHED, FREE, SHARED

PALETTE = qualitative.Set2 + qualitative.Pastel1 + qualitative.Set3


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
