"""Plotly figures of KV memory: the pool over the run, and contiguous vs paged waste side by side."""
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.arith import cdiv
from minillm.bench.memory import concurrency, contiguous_waste, paged_waste
from minillm.bench.synthetic_traffic import Request
from minillm_visualizer.shared.engine_run import SampleView, StepRecord
from minillm_visualizer.shared.style import CACHED, FREE


def pool_over_time(records: list[StepRecord], cursor: int | None = None) -> go.Figure:
    """Used, cached and free blocks after every step, and the share of used slots left empty."""
    steps = [r.event.step for r in records]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name, attr, color in (("used", "used_blocks", "#4c72b0"), ("cached", "cached_blocks", CACHED),
                              ("free", "free_blocks", FREE)):
        fig.add_scatter(x=steps, y=[getattr(r.event.kv, attr) for r in records], name=f"{name} blocks",
                        stackgroup="pool", line_color=color)
    fig.add_scatter(x=steps, y=[100 * r.event.kv.fragmentation for r in records], name="fragmentation %",
                    line=dict(color="#c44e52", dash="dot"), secondary_y=True)
    fig.update_layout(title="The pool over the run", height=300, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis_title="engine step")
    fig.update_yaxes(title_text="blocks", secondary_y=False)
    fig.update_yaxes(title_text="% of used slots empty", secondary_y=True, range=[0, 100], dtick=20, showgrid=False)
    if cursor is not None:
        fig.add_vline(x=cursor, line_color="#212529", line_width=2)
    return fig


def workload_of(samples: dict[str, SampleView]) -> list[Request]:
    """The run's own requests as the allocator replay wants them: prompt, output and max lengths."""
    return [Request(s.prompt_tokens, len(s.token_times), s.max_tokens) for s in samples.values() if s.token_times]


def waste_rows(workload: list[Request], block_size: int, pool_tokens: int, max_model_len: int) -> list[dict]:
    """Time-weighted share of reserved KV slots holding no token, and requests that fit at once in
    a pool of pool_tokens, for contiguous and paged allocation of the same requests. Concurrency is
    left out (None) where one request alone would not fit the pool: the replay could never admit it."""
    full = lambda r: max_model_len  # noqa: E731
    capped = lambda r: r.prompt_len + r.max_tokens  # noqa: E731
    variants = [(f"contiguous, max_model_len ({max_model_len})", lambda: contiguous_waste(workload, full),
                 lambda: concurrency(workload, pool_tokens, block_size, full)),
                ("contiguous, prompt + max_tokens", lambda: contiguous_waste(workload, capped),
                 lambda: concurrency(workload, pool_tokens, block_size, capped)),
                (f"paged, block {block_size}", lambda: paged_waste(workload, block_size),
                 lambda: concurrency(workload, pool_tokens, block_size))]
    if block_size != 1:
        variants.append(("paged, block 1", lambda: paged_waste(workload, 1),
                         lambda: concurrency(workload, pool_tokens, 1)))
    need = {"contiguous, max": max_model_len, "contiguous, prompt": max(capped(r) for r in workload),
            "paged": max(cdiv(r.prompt_len + r.output_len, block_size) * block_size for r in workload)}
    return [{"allocation": name, "KV waste %": round(100 * waste(), 1),
             "requests at once": round(conc(), 2)
             if next(v for k, v in need.items() if name.startswith(k)) <= pool_tokens
             else None} for name, waste, conc in variants]


def waste_chart(rows: list[dict]) -> go.Figure:
    fig = go.Figure(go.Bar(x=[r["KV waste %"] for r in rows], y=[r["allocation"] for r in rows], orientation="h",
                           marker_color=["#c44e52" if r["allocation"].startswith("contiguous") else "#55a868"
                                         for r in rows], text=[f"{r['KV waste %']}%" for r in rows]))
    fig.update_layout(title="Reserved KV memory holding no token (same requests)", height=260,
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="% of reserved slots, time-weighted",
                      yaxis=dict(autorange="reversed"))
    return fig
