"""StepProfile: what one engine step costs, as a function of what the step computes.

A step's time is modelled as linear in its work:

    t = fixed + per_prefill_token * P + per_decode_seq * D + per_context_token * C

P prompt tokens computed (prefill chunks), D sequences decoding one token each, C the context tokens
those decodes attend over. `fit` finds the coefficients by least squares from measured steps of the
real engine (`python -m minillm.bench profile`); `from_roofline` predicts them for a real model on
real hardware from the roofline (minillm/perf), for plans on paper.
"""
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch


@dataclass(frozen=True)
class StepProfile:
    fixed: float                # seconds per step whatever it holds (scheduling, the LM head's launch, ...)
    per_prefill_token: float    # seconds per prompt token computed
    per_decode_seq: float       # seconds per decoding sequence (its weights pass is shared: small on a GPU)
    per_context_token: float    # seconds per context token a decode attends over (reading its K/V)
    source: str = ""            # where the figures come from (a machine and model, or a roofline)

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        return (self.fixed + self.per_prefill_token * prefill_tokens + self.per_decode_seq * decode_seqs
                + self.per_context_token * context_tokens)

    @classmethod
    def fit(cls, steps: list[tuple[int, int, int, float]], source: str = "") -> "StepProfile":
        """steps: (prefill tokens, decode seqs, context tokens, measured seconds) per step.
        Least squares over the four coefficients, each step weighted by 1 / its time so that the fit
        minimises relative error: a few long prefill steps would otherwise decide the cost of the
        many short decode steps (and so TPOT). A negative coefficient (noise) is clamped to 0."""
        if len(steps) < 4:
            raise ValueError(f"fitting a step profile needs at least 4 measured steps, got {len(steps)}")
        if any(t <= 0 for *_, t in steps):
            raise ValueError("every measured step time must be > 0 seconds")
        x = torch.tensor([[1.0, p, d, c] for p, d, c, _ in steps], dtype=torch.float64)  # [steps, 4]
        y = torch.tensor([[t] for *_, t in steps], dtype=torch.float64)                 # [steps, 1]
        coef = torch.linalg.lstsq(x / y, torch.ones_like(y)).solution.clamp_min(0).flatten().tolist()
        return cls(*coef, source=source)

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
