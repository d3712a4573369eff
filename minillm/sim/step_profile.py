"""StepProfile: what one engine step costs, as a function of what the step computes.

P prompt tokens computed (prefill chunks), D sequences decoding one token each, C the context tokens
those decodes attend over. A profile predicted from the roofline is linear in them:

    t = fixed + per_prefill_token * P + per_decode_seq * D + per_context_token * C

A profile measured on the real engine is a curve in the tokens the step runs through the weights:

    t = fixed + tokens(P + D) + per_context_token * C

fixed is then the cost of a step of one token, and tokens(N) what the other N - 1 add. The curve is
there because a CPU's matmul is not linear in its rows: one decode runs as matrix-vector products,
two as a matrix product, so the second token of a step costs several times what the third does; and
a decode is one more row of the same matmuls as a step's prompt tokens, so both share one curve.
One slope per kind of token misprices the small steps, and so every TPOT.

A measured profile also keeps how much real steps vary around that price (`spread`): the same step
takes longer when the machine is busy elsewhere, a cache is cold, the OS takes the core. A
simulated step costs its price times a ratio drawn from those measured, so the simulator's queues
see the variance that lengthens waits (the Pollaczek-Khinchine formula: an M/G/1 queue's mean wait
grows with the service time's second moment, not its mean alone). A deterministic model of the same
mean predicts the tails (TTFT and TPOT p99) short. Long steps stray less, relatively (a pause of
the core is a smaller share of them), so those that cost LONG_STEP one-token steps or more keep a
spread of their own (`long_spread`): with one spread for all, every long prefill would draw the
short steps' wide ratios, and TTFT p99 came out long. Nor do real steps stray independently: a slow
step is followed by slow ones, which `persistence` keeps (minillm/sim/pace.py).

`fit` finds the coefficients by least squares from measured steps of the real engine
(`python -m minillm.bench profile`); `from_roofline` predicts them for a real model on real
hardware from the roofline (minillm/perf), for plans on paper.
"""
import bisect
import dataclasses
import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from minillm.sim.pace import at_share, next_pace, persistence, quantile

# Step sizes in tokens where a measured curve has its points: dense where the matmuls change regime,
# an octave apart above (closer points fit the machine's noise, not its costs).
KNOTS = (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SPREAD_POINTS = 64  # a fitted profile's spread: the measured ratios' quantiles at (k + 1/2) / 64
LONG_STEP = 3.0     # a step priced at this many one-token steps or more draws from the long steps' spread
WARMUP_BINS = (1, 2, 4, 8, 16, 32)  # warmup[i]: the steps k after an idle pause with k < WARMUP_BINS[i] (and not
#   an earlier bin): k = 0 (the step that ends the pause), 1, 2-3, 4-7, 8-15, 16-31; from 32 on a step is warm


@dataclass(frozen=True)
class StepProfile:
    fixed: float                # seconds per step whatever it holds (scheduling, the LM head's launch, ...)
    per_prefill_token: float    # seconds per prompt token computed
    per_decode_seq: float       # seconds per decoding sequence (its weights pass is shared: small on a GPU)
    per_context_token: float    # seconds per context token a decode attends over (reading its K/V)
    source: str = ""            # where the figures come from (a machine and model, or a roofline)
    token_curve: tuple[tuple[int, float], ...] = ()  # measured: (N, seconds N tokens add to one), N ascending.
    #   With a curve, per_prefill_token and per_decode_seq both hold its mean cost of a token,
    #   tokens(N) / (N - 1) at its last point: the slope it goes on with past that point.
    spread: tuple[float, ...] = ()  # measured: real step time / price, equally likely values (empty: exact)
    long_spread: tuple[float, ...] = ()  # measured: the same, of the long steps alone (empty: they draw `spread`)
    warmup: tuple[float, ...] = ()  # measured: a step's cost after an idle pause over a warm step's, by WARMUP_BINS
    persistence: float = 0.0        # measured: how much of a step's pace the next step keeps (AR(1) rho, pace.py)

    def __post_init__(self) -> None:  # JSON gives lists: keep the curve a hashable tuple of pairs
        object.__setattr__(self, "token_curve", tuple((int(n), float(s)) for n, s in self.token_curve))
        object.__setattr__(self, "spread", tuple(float(r) for r in self.spread))
        object.__setattr__(self, "long_spread", tuple(float(r) for r in self.long_spread))
        object.__setattr__(self, "warmup", tuple(float(r) for r in self.warmup))
        if any(r <= 0 for r in self.spread + self.long_spread):
            raise ValueError("every ratio of a profile's spread and long_spread must be > 0")
        if any(r <= 0 for r in self.warmup) or len(self.warmup) > len(WARMUP_BINS):
            raise ValueError(f"a profile's warmup holds at most {len(WARMUP_BINS)} factors, each > 0; "
                             f"got {self.warmup}")
        if not 0 <= self.persistence < 1:
            raise ValueError(f"a profile's persistence must be in [0, 1), got {self.persistence}")
        object.__setattr__(self, "_sizes", [n for n, _ in self.token_curve])  # for bisect: every step looks here

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        if not self.token_curve:
            work = self.per_prefill_token * prefill_tokens + self.per_decode_seq * decode_seqs
        else:
            work = self.tokens_time(prefill_tokens + decode_seqs)
        return self.fixed + work + self.per_context_token * context_tokens

    def cold(self, steps_since_idle: int) -> float:
        """What a step costs relative to a warm one when it is the k-th after an idle pause (k = 0: the step
        that ends the pause); 1 from WARMUP_BINS[-1] on, and without a measured warmup."""
        i = bisect.bisect_right(WARMUP_BINS, steps_since_idle)
        return self.warmup[i] if i < len(self.warmup) else 1.0

    def is_long(self, price: float) -> bool:
        """Whether a step of that price is a long one: LONG_STEP one-token steps or more (its own spread)."""
        return price >= LONG_STEP * self.fixed

    def draw(self, rng: random.Random, pace: float = 0.0, price: float = 0.0) -> tuple[float, float]:
        """What one step of that price costs relative to it, and the pace it leaves for the next (pace.py):
        the spread's value (the long steps' if it is one) at the next pace, which keeps `persistence` of
        the last one (0: every step drawn afresh). Without a spread: (1, pace)."""
        if not self.spread:
            return 1.0, pace
        table = self.long_spread if self.long_spread and self.is_long(price) else self.spread
        if not self.persistence:
            return rng.choice(table), pace
        pace = next_pace(pace, self.persistence, rng)
        return quantile(table, pace), pace

    def strays(self, share: float, long: bool = False) -> float:
        """The ratio to its price that `share` of the measured steps (long: of the long steps) stayed under
        (1 without a spread)."""
        if not 0 <= share <= 1:
            raise ValueError(f"share must be in [0, 1], got {share}")
        table = self.long_spread if long else self.spread
        return at_share(table, share) if table else 1.0

    def describe(self) -> str:
        """The costs in words."""
        context = f"{1e9 * self.per_context_token:.1f} ns a context token a decode reads"
        if not self.token_curve:
            return (f"{1e3 * self.fixed:.2f} ms a step, {1e6 * self.per_prefill_token:.1f} µs a prompt token, "
                    f"{1e6 * self.per_decode_seq:.2f} µs a decoding sequence, {context}")
        (two, first), (last, total) = self.token_curve[0], self.token_curve[-1]
        cold = (f"; after an idle pause its steps cost {', '.join(f'{r:.0%}' for r in self.warmup)} of a warm "
                f"step's (steps {', '.join(warmup_bins(len(self.warmup)))})" if self.warmup else "")
        spread = (f"; 90% of steps take {self.strays(0.05):.0%} to {self.strays(0.95):.0%} of that"
                  if self.spread else "")
        if self.long_spread:
            spread += (f" ({self.strays(0.05, long=True):.0%} to {self.strays(0.95, long=True):.0%} for steps priced "
                       f"at {LONG_STEP:g} one-token steps or more)")
        spread += f", and a step keeps {self.persistence:.2f} of the last one's pace" if self.persistence else ""
        return (f"{1e3 * self.fixed:.2f} ms a step of one token, {1e3 * first:.2f} ms more at {two} tokens, "
                f"{1e3 * total:.1f} ms more at {last}, {1e6 * self.per_decode_seq:.0f} µs a token past that, "
                f"{context}{spread}{cold}")

    def tokens_time(self, tokens: int) -> float:
        """tokens(N) of a measured profile: linear between the curve's points (from (1, 0)), and past
        its last point at per_decode_seq a token (the curve's mean: a last segment is the noisiest)."""
        curve = self.token_curve
        if tokens >= curve[-1][0]:
            return curve[-1][1] + self.per_decode_seq * (tokens - curve[-1][0])
        i = bisect.bisect_left(self._sizes, tokens)
        (n0, s0), (n1, s1) = (1, 0.0) if i == 0 else curve[i - 1], curve[i]
        return s0 + (s1 - s0) * max(tokens - n0, 0) / (n1 - n0)

    @classmethod
    def fit(cls, steps: list[tuple[int, int, int, float]], source: str = "") -> "StepProfile":
        """steps: (prefill tokens, decode seqs, context tokens, measured seconds) per step. -> a measured
        profile: least squares over fixed, per context token, and tokens(N) at the KNOTS below the
        largest step measured (and at that step's size), each step weighted by 1 / its time so that the
        fit minimises relative error: a few long prefill steps would otherwise decide the cost of the
        many short decode steps (and so TPOT). Every coefficient is kept >= 0 and the curve rising
        (a step never costs less for computing more tokens): the unknowns are the curve's increments,
        solved by non-negative least squares. A point no step informs is dropped. The spread is the
        quantiles of each step's measured time over its fitted price (of the long steps apart, if at least
        half SPREAD_POINTS were measured); the persistence, how alike those ratios are from step to step
        (steps in the order they ran)."""
        if len(steps) < 4:
            raise ValueError(f"fitting a step profile needs at least 4 measured steps, got {len(steps)}")
        for i, (*work, t) in enumerate(steps):
            if not t > 0:  # NaN as well: the fit weighs each step by 1 / its time
                raise ValueError(f"every measured step time must be > 0 seconds; step {i}, {tuple(work)} "
                                 f"(prefill tokens, decode seqs, context tokens), took {t}")
        sizes = [p + d for p, d, _, _ in steps]
        if min(sizes) < 1:
            raise ValueError("every measured step must compute at least one token")
        knots = [k for k in KNOTS if k < max(sizes)] + ([max(sizes)] if max(sizes) > 1 else [])
        hats = torch.tensor([_hats(n, knots) for n in sizes], dtype=torch.float64).reshape(len(steps), -1)
        knots = [k for i, k in enumerate(knots) if hats[:, i].any()]
        hats = torch.tensor([_hats(n, knots) for n in sizes], dtype=torch.float64).reshape(len(steps), -1)
        rises = hats @ torch.ones(len(knots), len(knots), dtype=torch.float64).tril()  # curve = cumsum(increments)
        base = torch.tensor([[1.0, c] for _, _, c, _ in steps], dtype=torch.float64)
        y = torch.tensor([t for *_, t in steps], dtype=torch.float64)               # [steps]
        coef = nnls(torch.cat([base, rises], dim=1) / y[:, None], torch.ones_like(y)).tolist()
        curve = tuple(zip(knots, torch.tensor(coef[2:], dtype=torch.float64).cumsum(0).tolist()))
        slope = curve[-1][1] / (curve[-1][0] - 1) if curve else 0.0  # past the curve: its mean cost of a token
        fitted = cls(coef[0], slope, slope, coef[1], source=source, token_curve=curve or ((2, 0.0),))
        priced = [(t / price, price) for p, d, c, t in steps if (price := fitted.step_time(p, d, c)) > 0]
        in_order = [r for r, _ in priced]
        ratios = torch.tensor(in_order, dtype=torch.float64)
        long = torch.tensor([r for r, price in priced if fitted.is_long(price)], dtype=torch.float64)
        points = (torch.arange(SPREAD_POINTS, dtype=torch.float64) + 0.5) / SPREAD_POINTS
        return dataclasses.replace(fitted, spread=tuple(torch.quantile(ratios, points).tolist()) if len(ratios) else (),
                                   long_spread=tuple(torch.quantile(long, points).tolist())
                                   if len(long) >= SPREAD_POINTS // 2 else (),
                                   persistence=persistence(in_order))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "StepProfile":
        """From save()'s file, or the JSON `python -m minillm.bench profile --json PATH` writes."""
        record = json.loads(Path(path).read_text())
        record = record.get("profile", record)
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})

    @classmethod
    def from_roofline(cls, model_config, hardware, dtype: str = "bfloat16", efficiency: float = 0.6,
                      fixed: float = 2e-3) -> "StepProfile":
        """Predicted coefficients for model_config on a HardwareProfile: a decode step streams every weight
        once (shared by the batch), each sequence adds its K/V reads, each prompt token its FLOPs.
        efficiency: the share of the peaks real kernels reach."""
        from minillm.perf import decode_cost, predicted_time, prefill_cost
        one = predicted_time(hardware, decode_cost(model_config, batch=1, context=1, dtype=dtype), dtype)
        two = predicted_time(hardware, decode_cost(model_config, batch=2, context=1, dtype=dtype), dtype)
        long = predicted_time(hardware, decode_cost(model_config, batch=1, context=1025, dtype=dtype), dtype)
        per_token = predicted_time(hardware, prefill_cost(model_config, 1, 1024, dtype=dtype), dtype) / 1024
        return cls(fixed=fixed + one / efficiency, per_prefill_token=per_token / efficiency,
                   per_decode_seq=max(two - one, 0.0) / efficiency,
                   per_context_token=max(long - one, 0.0) / 1024 / efficiency,
                   source=f"roofline: {hardware.name}, {dtype}, {efficiency:.0%} of peak")


def warmup_bins(n: int = len(WARMUP_BINS)) -> list[str]:
    """The first n WARMUP_BINS as the steps they hold: ['0', '1', '2-3', ...]."""
    edges = (0, *WARMUP_BINS[:n])
    return [str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])]


def _hats(tokens: int, knots: list[int]) -> list[float]:
    """Weights of tokens(N) on the curve's values at the knots: N's two neighbouring knots share 1 in
    proportion (below the first knot, with the point (1, 0))."""
    weights = [0.0] * len(knots)
    if tokens <= 1 or not knots:
        return weights
    i = min(bisect.bisect_left(knots, tokens), len(knots) - 1)
    lo = knots[i - 1] if i else 1
    if tokens >= knots[i]:
        weights[i] = 1.0
    else:
        weights[i] = (tokens - lo) / (knots[i] - lo)
        if i:
            weights[i - 1] = (knots[i] - tokens) / (knots[i] - lo)
    return weights


def nnls(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """argmin ||a x - b|| subject to x >= 0, by Lawson and Hanson's active-set method (1974).
    a: [m, n], b: [m] -> x: [n]. Variables enter the solved set while the gradient favours them;
    an unconstrained solve that drives one negative moves back to where it hits 0 and drops it.
    tol is in the gradient's units: it decides which variable enters, never which leaves (the variables are
    in the caller's units, say seconds, and a tolerance in the gradient's would drop every small one)."""
    n = a.shape[1]
    x = torch.zeros(n, dtype=a.dtype)
    free = torch.zeros(n, dtype=torch.bool)  # the set solved without its bound
    tol = 1e-12 * max(1.0, float(a.abs().sum(0).max()) * float(b.abs().max()))
    for _ in range(3 * n):
        gradient = a.T @ (b - a @ x)
        if free.all() or gradient[~free].max() <= tol:
            break
        free[torch.where(free, float("-inf"), gradient).argmax()] = True
        while True:
            z = torch.zeros(n, dtype=a.dtype)
            z[free] = torch.linalg.lstsq(a[:, free], b[:, None]).solution.flatten()
            if (z[free] > 0).all():
                x = z
                break
            steps = torch.where(free & (z <= 0), x / (x - z), float("inf"))
            first = steps.argmin()  # the first variable to hit its bound on the way from x to z
            x = x + steps[first] * (z - x)
            x[first] = 0.0  # exactly, whatever the rounding: it leaves, so every pass of this loop ends one
            free &= x > 0
            x[~free] = 0.0
    return x
