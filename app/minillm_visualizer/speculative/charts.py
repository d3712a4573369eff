"""The speculative decoding page's pictures: each step's proposals marked in the text, acceptance and
tokens per target forward against k beside the theory, and the proposers side by side."""
import html

import plotly.graph_objects as go

from minillm.speculative.theory import expected_tokens_per_forward
from minillm_visualizer.shared.style import BOX
from minillm_visualizer.speculative.run import Segment

ACCEPTED = "background:#d3f9d8;color:#2b8a3e;border-radius:3px"
REJECTED = "background:#ffe3e3;color:#c92a2a;text-decoration:line-through;border-radius:3px"
UNREACHED = "color:#adb5bd;text-decoration:line-through"
OWN = "font-weight:700"
STEP = "border-left:2px solid #ced4da"  # where each target forward's tokens begin
LEGEND = (f'<span style="{ACCEPTED}">accepted proposal</span> · '
          f'<span style="{REJECTED}">first rejected proposal</span> · '
          f'<span style="{UNREACHED}">proposals after it, never checked</span> · '
          f'<span style="{OWN}">the target\'s own token</span> (its correction, or the bonus when every proposal '
          f'was accepted) · plain: a step with nothing proposed (the first token, or no guess) · '
          f'<span style="{STEP}">&nbsp;</span> a target forward begins')
C_MEASURED, C_THEORY, C_CEILING = "#4c72b0", "#dd8452", "#adb5bd"


def _span(text: str, style: str, emitted: bool = True) -> str:
    """A token: a newline shows as ↵ (a rejected one must be seen), and breaks the line only if emitted."""
    shown = html.escape(text.replace("\n", "\u21b5\n" if emitted else "\u21b5"))
    return f'<span style="{style}">{shown}</span>' if style else shown


def marked_text(prompt: str, segments: list[Segment], pieces: dict[int, str], prompt_chars: int = 240) -> str:
    """HTML of the prompt's end (grey) and the output, each step's tokens marked by what the target did
    with them; hovering a step tells what it was."""
    tail = prompt if len(prompt) <= prompt_chars else "\u2026" + prompt[-prompt_chars:]
    parts = [f'<span style="color:#868e96">{html.escape(tail)}</span>']
    for s in segments:
        words = [_span(pieces[t], ACCEPTED) for t in s.accepted]
        if s.rejected is not None:
            words.append(_span(pieces[s.rejected], REJECTED, emitted=False))
            words += [_span(pieces[t], UNREACHED, emitted=False) for t in s.unreached]
        words += [_span(pieces[t], OWN if s.verified else "") for t in s.own]
        proposed = len(s.accepted) + (s.rejected is not None) + len(s.unreached)
        title = (f"step {s.step}: {len(s.accepted)} of {proposed} proposals accepted" if s.verified
                 else f"step {s.step}: no proposals")
        parts.append(f'<span style="{STEP}" title="{html.escape(title)}">{"".join(words)}</span>')
    return f'<div style="{BOX}">{"".join(parts)}</div>'


def acceptance_chart(rows: list[dict], alpha: float) -> go.Figure:
    """Measured acceptance rate at each k, and the pooled rate the theory line uses."""
    ks = [r["k"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(x=ks, y=[r["acceptance rate"] for r in rows], mode="lines+markers", name="measured",
                    line_color=C_MEASURED, customdata=[[r["accepted"], r["reached"]] for r in rows],
                    hovertemplate="k = %{x}: alpha = %{y:.2f} (%{customdata[0]} of %{customdata[1]} reached)"
                                  "<extra></extra>")
    fig.add_hline(y=alpha, line_dash="dot", line_color=C_THEORY, annotation_text=f"pooled alpha = {alpha:.2f}")
    fig.update_layout(title="Acceptance rate against k", yaxis=dict(range=[0, 1.05], title="acceptance rate alpha"))
    return _small(fig, "k (proposals per step)")


def tokens_per_forward_chart(rows: list[dict], alpha: float) -> go.Figure:
    """Measured tokens per target forward at each k, the theory (1 - alpha^(k+1)) / (1 - alpha) at the
    pooled alpha, and the ceiling k + 1 (every proposal accepted)."""
    ks = [r["k"] for r in rows]
    grid = list(range(1, max(ks) + 1))
    fig = go.Figure()
    fig.add_scatter(x=grid, y=[k + 1 for k in grid], mode="lines", name="ceiling: k + 1", line_color=C_CEILING,
                    line_dash="dash", hoverinfo="skip")
    fig.add_scatter(x=grid, y=[expected_tokens_per_forward(alpha, k) for k in grid], mode="lines",
                    name=f"theory, alpha = {alpha:.2f}", line_color=C_THEORY,
                    hovertemplate="k = %{x}: %{y:.2f} in theory<extra></extra>")
    fig.add_scatter(x=ks, y=[r["tokens per forward"] for r in rows], mode="markers", name="measured",
                    marker=dict(size=10, color=C_MEASURED), customdata=[r["theory at this alpha"] for r in rows],
                    hovertemplate="k = %{x}: %{y:.2f} measured (theory at this k's alpha: %{customdata:.2f})"
                                  "<extra></extra>")
    fig.update_layout(title="Tokens per target forward against k",
                      yaxis=dict(title="tokens per forward", rangemode="tozero"))
    return _small(fig, "k (proposals per step)")


def compare_chart(rows: list[dict]) -> go.Figure:
    """Tokens/s of each proposer that ran, with its speedup over no speculation."""
    ran = [r for r in rows if r.get("tokens/s")]
    fig = go.Figure(go.Bar(x=[r["proposer"] for r in ran], y=[r["tokens/s"] for r in ran],
                           text=[f"{r['speedup']:.2f}x" for r in ran], textposition="outside",
                           marker_color=[C_CEILING if i == 0 else C_MEASURED for i in range(len(ran))],
                           hovertemplate="%{x}: %{y:.0f} tokens/s<extra></extra>"))
    top = max((r["tokens/s"] for r in ran), default=1)
    fig.update_layout(title="Tokens/s on the same prompts", yaxis=dict(title="output tokens/s", range=[0, 1.2 * top]))
    return _small(fig, "proposer")


def _small(fig: go.Figure, x: str) -> go.Figure:
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10), xaxis_title=x,
                      legend=dict(orientation="h", y=-0.25))
    return fig
