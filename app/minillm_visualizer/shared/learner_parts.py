"""The learner's own parts in the engine: the "Run with my lab notebook" switch, the engine parts it
builds from their lab notebooks when Run is pressed, and the words that say whose parts ran.

The notebooks are read at each Run (never on a redraw), so an edit is picked up by the next Run.
Whatever goes wrong in the learner's code becomes a message that names the exercise: the page
stays up, and turning the switch off runs the reference engine again.
"""
import traceback
from pathlib import Path

import streamlit as st

from minillm.config import Components
from minillm.labkit.plug import PARTS, LabPartError, lab_components

# The labs that build engine parts (minillm.labkit.plug.LABS), as the switch names them: the run pages'
# sidebar offers those of labs 02-04; lab 05's (the verifier and prompt lookup) run on the Speculative
# decoding page, which has a switch of its own.
LAB_PARTS = {"02": "lab 02 · sampler", "03": "lab 03 · block allocator & prefix cache", "04": "lab 04 · scheduler",
             "07": "lab 07 · paged decode kernel (Triton backend)"}
KERNELS_LAB = "07"  # its kernel runs on the Triton backend: slow in the CPU interpreter, so not chosen by default
SPEC_LAB = "05"   # the Speculative decoding page has its own switch for lab 05
QUANT_LAB = "06"  # and the Quantization page one for lab 06
SERVING_LAB = "08"  # and the Serving page one for lab 08 (the grammar mask in its engine, the serving parts around it)
NOTEBOOKS = "lab[0-9][0-9]_*.ipynb"
LABS = Path(__file__).resolve().parents[3] / "labs"  # the repository's labs/, beside app/


def default_folder() -> str:
    """The repository's labs/ (beside app/), written relative to the working directory when it is inside it."""
    try:
        return str(LABS.relative_to(Path.cwd()))
    except ValueError:
        return str(LABS)


def notebook_switch() -> None:
    """The sidebar switch, the labs whose parts to use, and the notebook folder."""
    sb = st.sidebar
    sb.toggle("Run with my lab notebook", key="k_mine", help="The next Run uses the engine parts you wrote in "
              "your lab notebooks in place of the engine's own. The notebooks are read when you press Run.")
    if not st.session_state["k_mine"]:
        return
    sb.multiselect("My parts", list(LAB_PARTS), format_func=LAB_PARTS.get, key="k_mine_labs",
                   placeholder="Choose the labs whose parts to use")
    sb.text_input("Notebook folder", key="k_mine_folder", help="The folder of your labNN_*.ipynb notebooks.")
    folder = Path(st.session_state["k_mine_folder"]).expanduser()
    found = {p.name[3:5]: p.name for p in folder.glob(NOTEBOOKS)} if folder.is_dir() else {}
    if not found:
        sb.warning(no_notebooks(folder))
        return
    wanted = st.session_state["k_mine_labs"]
    if any(lab in found for lab in wanted):
        sb.caption("Run reads " + ", ".join(f"`{found[lab]}`" for lab in wanted if lab in found))
    for lab in wanted:
        if lab not in found:
            sb.warning(f"`{folder}` has no lab {lab} notebook (lab{lab}_*.ipynb).")


def no_notebooks(folder: Path) -> str:
    if not folder.is_dir():
        return f"There is no folder `{folder}`: give the folder of your lab notebooks (labNN_*.ipynb)."
    return f"`{folder}` holds no lab notebook (labNN_*.ipynb): give the folder of your lab notebooks."


def learner_components(folder: str, labs: list[str]) -> Components:
    """The engine parts of `labs` from the notebooks in `folder` (read now), guarded so that their
    failures name the exercise. Raises ValueError for a folder or a choice the page can explain."""
    path = Path(folder).expanduser()
    if not path.is_dir() or not any(path.glob(NOTEBOOKS)):
        raise ValueError(no_notebooks(path))
    if not labs:
        raise ValueError("no lab is chosen under 'My parts': choose the labs whose parts the engine should use")
    return lab_components(path, labs)


def describe(components: Components) -> str:
    """Which exercises a run's parts come from, and from which notebooks."""
    exercises = sorted(PARTS[field] for field in components.replaced() if field in PARTS)
    names = ", ".join(f"{exercise} `{name}`" for exercise, name in exercises)
    return f"exercises {names}, from {components.source}"


def failure(exc: BaseException) -> str:
    """An error from the learner's code in words: the exercise, and where in their notebook it was raised."""
    text = str(exc) if isinstance(exc, LabPartError) else f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc
    if isinstance(cause, NotImplementedError):
        return text
    for e in _chain(exc):  # the innermost exception first: its frames reach deepest into the learner's code
        cells = [f for f in traceback.extract_tb(e.__traceback__) if ".ipynb, cell" in f.filename]
        if cells:
            frame = cells[-1]
            code = f": `{frame.line}`" if frame.line else ""
            return f"{text} (raised in {frame.filename}, line {frame.lineno}{code})"
    return text


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from, innermost first."""
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out[::-1]
