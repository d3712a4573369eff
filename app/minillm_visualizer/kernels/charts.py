"""The Kernels page's figures, drawn from a recorded launch (kernel_trace.py): the grid of programs, each
buffer's elements coloured by the program that touched them, and how a paged decode program walks the pool."""
import numpy as np
import plotly.express as px
import plotly.graph_objects as go

from minillm_visualizer.kernels.trace import Launch

PALETTE = px.colors.qualitative.Plotly + px.colors.qualitative.Pastel + px.colors.qualitative.Dark2
SEVERAL = "#adb5bd"  # an element more than one program touched


def color(program: int) -> str:
    return PALETTE[program % len(PALETTE)]


def _scale(programs: int) -> list:
    """A discrete colour scale: program p (z = p) gets color(p), for z in [-0.5, programs - 0.5]."""
    stops = []
    for p in range(programs):
        stops += [(p / programs, color(p)), ((p + 1) / programs, color(p))]
    return stops


def label(launch: Launch, program: int) -> str:
    return "program (" + ", ".join(map(str, launch.program_id(program))) + ")"


def grid_chart(launch: Launch) -> go.Figure:
    """The launch grid: one cell per program, axis 0 down, axis 1 across (axis 2 folded into it)."""
    gx, gy, gz = launch.grid
    z = np.arange(launch.programs).reshape(gx, gy * gz)
    text = [[", ".join(map(str, launch.program_id(int(p)))) for p in row] for row in z]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale=_scale(launch.programs),
                               zmin=-0.5, zmax=launch.programs - 0.5, showscale=False, xgap=2, ygap=2,
                               hovertemplate="program (%{text})<extra></extra>"))
    fig.update_layout(title=f"Grid: {launch.programs} programs of {launch.kernel}", height=min(320, 90 + 34 * gx),
                      margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(title="program_id(1)" if gy > 1 else "", showticklabels=False),
                      yaxis=dict(title="program_id(0)", autorange="reversed", showticklabels=False))
    return fig


def _as_2d(shape: tuple[int, ...], span: int) -> tuple[int, int]:
    if len(shape) < 2 or int(np.prod(shape)) != span:
        return 1, span
    return shape[0], span // shape[0]


def buffer_map(launch: Launch, name: str, follow: int | None = None, values: np.ndarray | None = None) -> go.Figure:
    """One buffer, an element a cell, coloured by the program that loaded or stored it (grey: several did).
    follow: one program's elements stand out, the rest fade. values: numbers to write in the cells."""
    b = launch.buffers[name]
    rows, cols = _as_2d(b.shape, b.span)
    owners = launch.owners(name)
    loads, stores = launch.counts(name, "load"), launch.counts(name, "store")
    single = np.array([min(o) if len(o) == 1 else np.nan for o in owners], dtype=float)
    several = np.array([1.0 if len(o) > 1 else np.nan for o in owners])
    shape = b.shape if int(np.prod(b.shape)) == b.span else (b.span,)
    hover = [f"{name}{[int(j) for j in np.unravel_index(i, shape)]} · {_who(launch, o)} · loads {loads[i]}, "
             f"stores {stores[i]}" for i, o in enumerate(owners)]
    grid = lambda a: np.asarray(a).reshape(rows, cols)  # noqa: E731
    gap = 1 if rows <= 40 else 0  # a tall pool's cells are too thin for gaps
    common = dict(text=grid(hover), hovertemplate="%{text}<extra></extra>", showscale=False, xgap=gap, ygap=gap)
    faded = 0.25 if follow is not None else 1.0
    fig = go.Figure([go.Heatmap(z=grid(single), colorscale=_scale(launch.programs), zmin=-0.5,
                                zmax=launch.programs - 0.5, opacity=faded, **common),
                     go.Heatmap(z=grid(several), colorscale=[(0, SEVERAL), (1, SEVERAL)], opacity=faded, **common)])
    if follow is not None:
        mine = np.full(b.span, np.nan)
        mine[launch.footprint(name, follow)] = follow
        fig.add_heatmap(z=grid(mine), colorscale=_scale(launch.programs), zmin=-0.5, zmax=launch.programs - 0.5,
                        **common)
    if values is not None:
        fig.add_heatmap(z=grid(np.zeros(b.span)), text=grid([str(v) for v in values.ravel()]), texttemplate="%{text}",
                        colorscale=[(0, "rgba(0,0,0,0)"), (1, "rgba(0,0,0,0)")], showscale=False, hoverinfo="skip")
    kind = " and ".join(k for k, c in (("loaded", loads), ("stored", stores)) if c.any()) or "untouched"
    fig.update_layout(title=f"{name}: {list(b.shape)} {b.dtype}, {kind}", height=min(640, 70 + rows * 22),
                      margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(title=_columns(b.shape, rows), showgrid=False, zeroline=False),
                      yaxis=dict(title="dim 0" if rows > 1 else "", autorange="reversed", showgrid=False,
                                 zeroline=False, showticklabels=rows > 1))
    return fig


def _who(launch: Launch, programs: set[int]) -> str:
    if not programs:
        return "untouched"
    names = [label(launch, p).removeprefix("program ") for p in sorted(programs)]
    return "program" + ("s " if len(names) > 1 else " ") + " ".join(names[:6]) + (" ..." if len(names) > 6 else "")


def _columns(shape: tuple[int, ...], rows: int) -> str:
    if rows == 1:
        return "element"
    return "dim 1" if len(shape) == 2 else f"dims 1-{len(shape) - 1} flattened ({' x '.join(map(str, shape[1:]))})"


def walk(launch: Launch, program: int) -> list[tuple[int, list[int]]]:
    """The pool slots one paged decode program read, tile by tile: [(loop step, slots in token order)]."""
    k = launch.buffers["k_ptr"]
    per_slot = k.span // k.shape[0]
    steps = []
    for step, access in enumerate(launch.of("k_ptr", "load", program)):
        slots = access.index // per_slot
        _, first = np.unique(slots, return_index=True)
        steps.append((step, slots[np.sort(first)].tolist()))
    return steps


def walk_chart(launch: Launch, program: int, block_size: int) -> go.Figure:
    """Token position against the pool slot it was read from: a run of block_size slots per block, then a jump."""
    fig = go.Figure()
    t = 0
    for step, slots in walk(launch, program):
        tokens = list(range(t, t + len(slots)))
        fig.add_scatter(x=tokens, y=slots, mode="lines+markers", name=f"loop step {step}",
                        customdata=[[s // block_size, s % block_size] for s in slots],
                        hovertemplate="token %{x} → slot %{y} (block %{customdata[0]}, offset %{customdata[1]})"
                                      "<extra></extra>", marker=dict(size=6, color=color(program)),
                        line=dict(color=color(program), dash="dot" if step % 2 else "solid"))
        t += len(slots)
    slots_total = launch.buffers["k_ptr"].shape[0]
    for edge in range(0, slots_total + 1, block_size):
        fig.add_hline(y=edge - 0.5, line_color="#dee2e6", line_width=1)
    fig.update_layout(title=f"How {label(launch, program)} walks the pool: token → slot", height=420,
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="token position in the sequence",
                      yaxis=dict(title="slot in the K/V pool (grey lines: block edges)", range=[-1, slots_total]),
                      legend=dict(orientation="h", y=-0.2))
    return fig
