"""Verification: which proposed tokens the target accepts, and the token it adds after them.

The target scores the k proposed tokens in one forward: p_i is its distribution at the position of
proposal x_i (after the tokens before it), and p_{k+1} the one after the last proposal.
  * Greedy: accept the longest prefix where x_i is the target's own argmax; then add the argmax
    at the first mismatch (or after all k: the bonus token).
  * Sampling (Leviathan et al. 2023, Chen et al. 2023): accept x_i with probability
    min(1, p_i(x_i) / q_i(x_i)), where q_i is the distribution x_i was drawn from; at the first
    rejection, draw from normalise(max(0, p_i - q_i)) and stop; if all k are accepted, draw a
    bonus token from p_{k+1}. Every emitted token is then distributed exactly as the target's own
    sample would be. Temperature, top-k and top-p shape p and q alike (the proposer draws from q so
    shaped), and the request's seeded generator makes the draws reproducible.
A proposer that gives no distribution (prompt lookup) proposes x_i with certainty: q_i is one-hot.
"""
import torch

from minillm.sampling import top_k_filter, top_p_filter


def target_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distributions the target samples from: [n, vocab] logits -> [n, vocab] probabilities."""
    return top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p).softmax(-1)


def accept(p: float, q: float, generator: torch.Generator) -> bool:
    """Keep a token drawn from q with probability min(1, p / q) (p, q: its probability under each)."""
    return q <= p or float(torch.rand((), generator=generator)) * q < p


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the target wants more mass than the proposer gave: normalise(max(0, p - q)). [vocab] -> [vocab]."""
    r = (p - q).clamp_(min=0)
    total = r.sum()
    return r / total if total > 0 else p  # p == q: a rejection cannot happen, but keep a distribution


def verify(logits: torch.Tensor, proposals: list[int], q: torch.Tensor | None, temperature: float, top_k: int,
           top_p: float, generator: torch.Generator) -> tuple[int, int]:
    """logits: [k + 1, vocab], the target's at the proposals' positions and one after; proposals: the
    k tokens; q: [k, vocab], the distributions they were drawn from (None: drawn with certainty).
    -> (how many proposals are accepted, the token that follows them)."""
    k = len(proposals)
    if temperature == 0:
        best = logits.argmax(-1).tolist()
        m = next((i for i in range(k) if proposals[i] != best[i]), k)
        return m, best[m]
    p = target_probs(logits, temperature, top_k, top_p)  # [k + 1, vocab]
    for i, x in enumerate(proposals):
        qx = 1.0 if q is None else float(q[i, x])
        if not accept(float(p[i, x]), qx, generator):
            q_i = torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).to(p) if q is None else q[i]
            return i, int(torch.multinomial(residual(p[i], q_i), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))  # all accepted: the bonus token
