"""Run a learner's lab parts inside the real engine.

    from minillm.labkit import plug
    llm = plug("labs/lab03_paged.ipynb")     # an LLM whose block allocator and prefix cache are yours
    llm = plug("labs/", labs=["02", "04"])   # your sampler and your step policy
    llm.generate(["def fib(n):"])

    parts = lab_parts("labs/lab08_serving.ipynb", "08")   # parts of the serving stack, by name
    parts = lab_parts("labs/lab09_scaling.ipynb", "09")   # parts of the scaling pieces (router, simulator, ...)
    run_load(url, items, parse_sse=parts["parse_sse"], arrivals=parts["arrival_times"])

Each exercise below implements one part of the engine with the engine's own interface, so the
engine can run it in place of its own (`EngineConfig.components`). Every call of a plugged part
is guarded: an exception raised in it (or by the engine, about what it did) becomes a
LabPartError naming the exercise. A part the notebook does not define is an error too: nothing
ever falls back to the engine's own part silently.
"""
import functools
import inspect
import re
from collections import Counter
from pathlib import Path
from types import ModuleType

from minillm.config import Components
from minillm.labkit.cell_loader import Lab, load_notebook

# Components field -> (exercise, the name the notebook defines). Which lab builds which part.
PARTS = {
    "sample": ("2.5", "sample"),
    "block_allocator": ("3.1", "BlockAllocator"),
    "match_prefix": ("3.5", "match_prefix"),
    "evictable_blocks": ("3.6", "EvictableBlocks"),
    "static_step": ("4.1", "static_step"),
    "continuous_step": ("4.3", "continuous_step"),
    "make_room": ("4.4", "make_room"),
    "verify": ("5.3", "verify"),
    "propose_ngram": ("5.4", "propose_ngram"),
    "propose_heads": ("5.7", "propose_heads"),
    "quantize_int8": ("6.1", "quantize_int8"),
    "quantize_int4": ("6.2", "quantize_int4"),
    "pack_int4": ("6.3", "pack_int4"),
    "int4_linear": ("6.5", "int4_linear"),
    "paged_decode": ("7.6", "paged_decode_attention"),
    "grammar_mask": ("8.6", "apply_grammar_mask"),
}
CLASSES = {"block_allocator", "evictable_blocks"}  # parts the engine instantiates
LABS = sorted({exercise.split(".")[0].zfill(2) for exercise, _ in PARTS.values()})

# Parts that plug into the serving stack around the engine, by the name the notebook defines: the load
# generator's parse_sse= and arrivals=, the server's admission=, the agent harness's breaker= (a class: the
# harness makes one per session); the metrics run on the load generator's records.
SERVING_PARTS = {
    "parse_sse": "8.1",
    "request_metrics": "8.2",
    "goodput": "8.3",
    "arrival_times": "8.4",
    "admit": "8.5",
    "LoopBreaker": "8.8",
}
# Parts of lab 09 plugged into the scaling pieces: the tensor-parallel layers' weight cuts
# (tp/parallel_linear.py) and an MLP over simulated ranks, the KV transfer between two engines'
# pools, a routing policy (a class: the simulator and the router make their own), the simulator's
# autoscaling rule.
SCALING_PARTS = {
    "shard_columns": "9.1",
    "shard_rows": "9.1",
    "tp_mlp_forward": "9.2",
    "pack_kv": "9.3",
    "unpack_kv": "9.3",
    "PrefixAware": "9.4",
    "autoscale_rule": "9.5",
}
STACK_PARTS = {**SERVING_PARTS, **SCALING_PARTS}  # every part plugged outside engine Components, by name


class LabPartError(RuntimeError):
    """A learner's part failed inside the engine (or is missing); the message names the exercise."""


def plug(source, labs: list[str] | None = None, model: str | None = None, **config):
    """An LLM (the bundled default model unless `model` is given) whose parts from `labs` (all
    that `source` has, by default) are the learner's. source: a lab notebook, a folder of them, or
    definitions already loaded (a module, a dict, or the grader's `lab`). config: the flat knobs of LLM(...)."""
    from minillm.llm import LLM
    components = lab_components(source, labs)
    if components.paged_decode is not None:  # a Triton kernel: it runs in the Triton attention backend
        config.setdefault("attention_backend", "triton")
    return LLM(model, components=components, **config)


def lab_components(source, labs: list[str] | None = None) -> Components:
    """The learner's parts from `source`, guarded, as engine Components."""
    found = _namespaces(source)
    wanted = [str(lab).zfill(2) for lab in labs] if labs is not None else [lab for lab in LABS if lab in found]
    unknown = [lab for lab in wanted if lab not in LABS]
    if unknown:
        raise ValueError(f"labs {unknown} build no engine part; the labs that do are {', '.join(LABS)}")
    if not wanted:
        raise LabPartError(f"{_describe(source)} holds no lab notebook with engine parts (labs {', '.join(LABS)})")
    parts, where = {}, []
    for lab in wanted:
        if lab not in found:
            raise LabPartError(f"lab {lab} was asked for, but {_describe(source)} has no lab {lab} notebook")
        origin = found[lab][2]
        where.append(origin)
        for field, (exercise, name) in PARTS.items():
            if exercise.split(".")[0].zfill(2) == lab:
                guard = _guard_class if field in CLASSES else _guard
                parts[field] = guard(_defined(found[lab], exercise, name, "the engine"), exercise, name, origin)
    return Components(**parts, source=", ".join(where))


def lab_parts(source, lab: str) -> dict:
    """The learner's parts of `lab` plugged outside the engine (STACK_PARTS), by name, guarded like engine
    parts (a class gives guarded instances). source: as for lab_components."""
    lab = str(lab).zfill(2)
    found = _namespaces(source)
    if lab not in found:
        raise LabPartError(f"lab {lab} was asked for, but {_describe(source)} has no lab {lab} notebook")
    parts = {}
    for name, exercise in STACK_PARTS.items():
        if exercise.split(".")[0].zfill(2) == lab:
            part = _defined(found[lab], exercise, name, "the serving stack")
            guard = _guard_class if inspect.isclass(part) else _guard
            parts[name] = guard(part, exercise, name, found[lab][2])
    if not parts:
        raise ValueError(f"lab {lab} builds no part plugged outside the engine; the labs that do are "
                         f"{', '.join(sorted({e.split('.')[0].zfill(2) for e in STACK_PARTS.values()}))}")
    return parts


def _defined(found: tuple[dict, dict, str], exercise: str, name: str, where: str):
    """The notebook's definition of `name`, or a LabPartError that says why there is none."""
    namespace, problems, origin = found
    if name not in namespace:
        reasons = "; ".join(problems.get(exercise, []) + problems.get("setup", [])) or \
            f"renamed or deleted? {where} looks for the name the exercise gives"
        raise LabPartError(f"Exercise {exercise}: {origin} defines no `{name}`, so it cannot run in {where}: "
                           f"{reasons}")
    return namespace[name]


def calls(components: Components) -> dict[str, int]:
    """How often the engine called each plugged part (its methods, for a class)."""
    return {field: sum(getattr(getattr(components, field), "calls", Counter()).values())
            for field in components.replaced()}


def _namespaces(source) -> dict[str, tuple[dict, dict, str]]:
    """lab number -> (definitions, loader problems by exercise, where they came from)."""
    if isinstance(source, Lab):
        return {source._exercise.split(".")[0].zfill(2): (source._namespace, source._problems, source._where)}
    if isinstance(source, (ModuleType, dict)):
        namespace = vars(source) if isinstance(source, ModuleType) else source
        lab = _lab_number(str(namespace.get("__file__", "")))
        if lab is None:
            raise ValueError("cannot tell which lab these definitions are from: load them from a labNN_*.ipynb "
                             "file, or pass the notebook's path")
        return {lab: (namespace, {}, f"lab {lab}")}
    path = Path(source)
    files = sorted(path.glob("lab[0-9][0-9]_*.ipynb")) if path.is_dir() else [path]
    if not path.exists():
        raise FileNotFoundError(f"no lab notebook or folder at {path}")
    out = {}
    for file in files:
        lab = _lab_number(file.name)
        if lab is None:
            raise ValueError(f"{file.name} is not named like a lab notebook (labNN_topic.ipynb)")
        loaded = load_notebook(file)
        out[lab] = (loaded.namespace, loaded.problems, str(file))
    return out


def _lab_number(name: str) -> str | None:
    match = re.search(r"lab(\d\d)_", Path(name).name)
    return match.group(1) if match else None


def _describe(source) -> str:
    return str(source) if isinstance(source, (str, Path)) else type(source).__name__


def _failure(exercise: str, name: str, where: str, e: Exception) -> LabPartError:
    if isinstance(e, NotImplementedError):
        return LabPartError(f"Exercise {exercise} ({name}, {where}) is not implemented yet: {e}")
    return LabPartError(f"Exercise {exercise} ({name}, {where}) failed inside the engine: {type(e).__name__}: {e}")


def _guard(fn, exercise: str, name: str, where: str, calls: Counter | None = None):
    """fn, counting its calls, with any exception turned into a LabPartError naming the exercise."""
    calls = Counter() if calls is None else calls

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        calls[name] += 1
        try:
            result = fn(*args, **kwargs)
        except LabPartError:
            raise  # a part it called failed: that message already names the exercise
        except Exception as e:
            raise _failure(exercise, name, where, e) from e
        return _guard_generator(result, exercise, name, where) if inspect.isgenerator(result) else result

    guarded.calls = calls
    guarded.label = f"Exercise {exercise} ({name}, {where})"  # how the engine names it in its own errors
    return guarded


def _guard_generator(generator, exercise: str, name: str, where: str):
    """A generator's items, with an exception raised while it runs turned into a LabPartError (parse_sse)."""
    try:
        yield from generator
    except LabPartError:
        raise
    except Exception as e:
        raise _failure(exercise, name, where, e) from e


def _guard_class(cls, exercise: str, name: str, where: str):
    """A factory of guarded instances of the learner's class."""
    calls = Counter()

    def make(*args, **kwargs):
        return _GuardedObject(_guard(cls, exercise, name, where, calls)(*args, **kwargs), exercise, name, where,
                              calls)

    make.calls = calls
    return make


class _GuardedObject:
    """Forwards to a learner's object; its methods (and properties) are guarded like functions."""

    def __init__(self, obj, exercise: str, name: str, where: str, calls: Counter) -> None:
        object.__setattr__(self, "_target", (obj, exercise, name, where, calls))

    def __getattr__(self, attr: str):
        obj, exercise, name, where, calls = object.__getattribute__(self, "_target")
        qualified = f"{name}.{attr}"
        try:
            value = getattr(obj, attr)
        except AttributeError as e:
            raise LabPartError(f"Exercise {exercise} ({where}): {name} has no `{attr}`, which the engine "
                               f"uses") from e
        except Exception as e:  # a property that failed
            raise _failure(exercise, qualified, where, e) from e
        return _guard(value, exercise, qualified, where, calls) if callable(value) else value

    def __setattr__(self, attr: str, value) -> None:
        setattr(object.__getattribute__(self, "_target")[0], attr, value)

    def __len__(self) -> int:
        return self.__getattr__("__len__")()
