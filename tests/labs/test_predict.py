"""minillm.labkit.compare: the learner's prediction, the theory and the measurement side by side."""
import pytest

from minillm.labkit import compare
from minillm.labkit.predict import NUDGE


def test_the_three_figures_and_both_ratios_are_printed(capsys):
    result = compare("decode", 40, theory=50.0, measured=45.0, unit="tok/s", theory_name="bandwidth bound",
                     gap="the engine reaches 90% of the bound")
    out = capsys.readouterr().out
    assert "your prediction" in out and "40 tok/s" in out and "50 tok/s" in out and "45 tok/s" in out
    assert "measured / bandwidth bound: 0.90x" in out and "measured / your prediction: 1.12x" in out
    assert "the engine reaches 90% of the bound" in out and NUDGE not in out
    assert result.measured_over_theory == pytest.approx(0.9) and result.measured_over_prediction == pytest.approx(1.125)


@pytest.mark.parametrize("empty", [None, ...])
def test_an_empty_prediction_gets_a_nudge_and_the_rest_still_prints(capsys, empty):
    result = compare("speedup", empty, theory=2.0, measured=1.9, unit="x")
    out = capsys.readouterr().out
    assert NUDGE in out and "1.9 x" in out and "measured / theory: 0.95x" in out
    assert result.prediction is None and result.measured_over_prediction is None


@pytest.mark.parametrize("bad", ["40", float("nan"), True, [40]])
def test_a_prediction_that_is_not_a_number_is_refused_by_name(bad):
    with pytest.raises(TypeError, match="must be a finite number"):
        compare("decode", bad, measured=1.0, unit="tok/s")


def test_without_a_theory_line_only_the_prediction_ratio_is_given(capsys):
    compare("TTFT saved", 0.5, measured=0.25, unit="s")
    out = capsys.readouterr().out
    assert "measured / theory" not in out and "measured / your prediction: 0.50x" in out
