"""The lab kit: builds the learner notebooks, loads them without a kernel, grades them.

In a notebook:  from minillm.labkit import check;  check("1.3")
Maintainers:    python -m minillm.labkit build   (what `make labs` runs)
"""
from minillm.labkit.grading import check, exercise

__all__ = ["check", "exercise"]
