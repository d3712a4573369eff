"""Predict, then measure: the learner's number, the theory's line and the measurement, side by side.

Every lab's main experiment starts with a cell where the learner writes down a number worked out from the
lab's theory, before anything is measured:

    MY_PREDICTION = None   # tokens/s: your estimate of SmolLM2's decode speed here, from the roofline

and ends with one call that prints the three figures, the ratios between them and what the gap means:

    compare("SmolLM2 decode at batch 1", MY_PREDICTION, theory=bound, measured=tok_s, unit="tok/s",
            theory_name="bandwidth bound", gap="the share of the bound the engine reaches: ...")

The prediction is not graded. An empty one (None, or the Ellipsis left in the cell) gets a friendly nudge
and the rest of the comparison still prints, so a learner who skipped it sees what they skipped.
"""
import math
from dataclasses import dataclass

NUDGE = ("(no prediction written down: go back to the prediction cell, work the number out from the theory "
         "above, and run this cell again. The comparison means most when you have committed to a number first.)")


@dataclass(frozen=True)
class Comparison:
    """What compare() printed, for a test or a plot: the figures and the ratios between them."""
    what: str
    unit: str
    prediction: float | None
    theory: float | None
    measured: float
    theory_name: str = "theory"

    @property
    def measured_over_theory(self) -> float | None:
        return _ratio(self.measured, self.theory)

    @property
    def measured_over_prediction(self) -> float | None:
        return _ratio(self.measured, self.prediction)

    def lines(self) -> list[str]:
        rows = [("your prediction", self.prediction), (self.theory_name, self.theory), ("measured", self.measured)]
        width = max(len(name) for name, _ in rows)
        out = [f"{self.what}:"]
        for name, value in rows:
            shown = "—" if value is None else f"{_figure(value)} {self.unit}"
            out.append(f"  {name:<{width}}  {shown}")
        if self.measured_over_theory is not None:
            out.append(f"  measured / {self.theory_name}: {self.measured_over_theory:.2f}x")
        if self.measured_over_prediction is not None:
            out.append(f"  measured / your prediction: {self.measured_over_prediction:.2f}x")
        return out


def compare(what: str, prediction, *, measured: float, unit: str, theory: float | None = None,
            theory_name: str = "theory", gap: str = "") -> Comparison:
    """Print the learner's prediction, the theory's figure and the measurement of `what`, in `unit`, with
    the ratios of the measurement to each and `gap`, one sentence on what the difference means. An empty
    prediction (None or ...) prints a nudge instead of failing. -> the Comparison printed.

    A prediction that is not a finite number raises TypeError naming what it got."""
    if prediction is Ellipsis:
        prediction = None
    if prediction is not None:
        if isinstance(prediction, bool) or not isinstance(prediction, (int, float)) or not math.isfinite(prediction):
            raise TypeError(f"the prediction for {what!r} must be a finite number (or None while you work it out), "
                            f"got {prediction!r}")
        prediction = float(prediction)
    result = Comparison(what, unit, prediction, None if theory is None else float(theory), float(measured),
                        theory_name)
    print("\n".join(result.lines()))
    if prediction is None:
        print(NUDGE)
    if gap:
        print(f"  {gap}")
    return result


def _ratio(a: float, b: float | None) -> float | None:
    return None if b is None or b == 0 else a / b


def _figure(value: float) -> str:
    """Three significant figures, without scientific notation for the ranges the labs print."""
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:.3g}"
