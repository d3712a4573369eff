"""The lab kit: builds the learner notebooks, loads them without a kernel, grades them.

In a notebook:  from minillm.labkit import check;  check("1.3")
                from minillm.labkit import compare   (predict, then measure: predict.py)
Maintainers:    python -m minillm.labkit build   (what `make labs` runs)
"""
from minillm.labkit.grading import check, exercise
from minillm.labkit.predict import compare
from minillm.labkit.real_model import REAL_MODEL, quick_run, real_model_installed

__all__ = ["check", "compare", "exercise", "REAL_MODEL", "quick_run", "real_model_installed"]
