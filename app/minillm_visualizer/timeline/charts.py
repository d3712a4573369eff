"""Plotly figures of the scheduler's decisions: the steps x requests Gantt, queues, the token budget."""
import plotly.graph_objects as go

from minillm_visualizer.shared.engine_run import StepRecord

# state -> (code, colour); "running" = admitted, holding its blocks, but given no tokens this step.
STATES = {"waiting": (0, "#ced4da"), "preempted": (1, "#c44e52"), "running": (2, "#f2c14e"),
          "prefill": (3, "#4c72b0"), "decode": (4, "#55a868")}


def gantt(records: list[StepRecord], keys: list[str], cursor: int | None = None) -> go.Figure:
    """One row per sample, one column per step, coloured by what the scheduler did with it."""
    steps = [r.event.step for r in records]
    z = [[STATES[r.states[k]][0] + 0.5 if k in r.states else None for r in records] for k in keys]
    hover = [[f"{k} at step {r.event.step}: {r.states.get(k, 'not in the engine')}" for r in records] for k in keys]
    n = len(STATES)
    scale = []
    for code, color in STATES.values():
        scale += [[code / n, color], [(code + 1) / n, color]]
    fig = go.Figure(go.Heatmap(x=steps, y=keys, z=z, customdata=hover, zmin=0, zmax=n, colorscale=scale,
                               hovertemplate="%{customdata}<extra></extra>", xgap=0, ygap=1,
                               colorbar=dict(tickvals=[c + 0.5 for c, _ in STATES.values()],
                                             ticktext=list(STATES), title="state")))
    fig.update_layout(title="What each request did, step by step", height=120 + 16 * len(keys),
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="engine step",
                      yaxis=dict(autorange="reversed", title="request"))
    _cursor(fig, cursor)
    return fig


def queue_chart(records: list[StepRecord], cursor: int | None = None) -> go.Figure:
    steps = [r.event.step for r in records]
    fig = go.Figure()
    fig.add_scatter(x=steps, y=[r.event.waiting for r in records], name="waiting", line_color="#8c8c8c")
    fig.add_scatter(x=steps, y=[r.event.running for r in records], name="running", line_color="#55a868")
    fig.add_scatter(x=steps, y=[r.event.num_preemptions for r in records], name="preemptions so far",
                    line_color="#c44e52", line_dash="dot")
    fig.update_layout(title="Queues", height=260, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="engine step",
                      yaxis_title="sequences")
    _cursor(fig, cursor)
    return fig


def budget_chart(records: list[StepRecord], budget: int, cursor: int | None = None) -> go.Figure:
    """Tokens computed per step, prefill and decode stacked, against the step's token budget."""
    steps = [r.event.step for r in records]
    fig = go.Figure()
    for phase, color in (("prefill", STATES["prefill"][1]), ("decode", STATES["decode"][1])):
        fig.add_bar(x=steps, y=[sum(w.num_tokens for w in r.event.scheduled if w.phase == phase) for r in records],
                    name=phase, marker_color=color)
    fig.add_hline(y=budget, line_dash="dash", annotation_text=f"budget {budget}")
    fig.update_layout(barmode="stack", title="Token budget used per step", height=260, bargap=0,
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="engine step", yaxis_title="tokens")
    _cursor(fig, cursor)
    return fig


def _cursor(fig: go.Figure, step: int | None) -> None:
    if step is not None:
        fig.add_vline(x=step, line_color="#212529", line_width=2)
