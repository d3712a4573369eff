"""EngineConfig's groups: every setting is explained where it is declared, and each flat knob of
`LLM(model, **knobs)` lands in the group field knobs.py names."""
import ast
import inspect
import textwrap
from dataclasses import fields

import pytest

from minillm.config import Components, EngineConfig, SpeculativeConfig
from minillm.config.cache_config import CacheConfig, CacheKind
from minillm.config.kernel_config import KernelConfig
from minillm.config.knobs import GROUPS, KNOBS, OWN_KNOBS
from minillm.config.parallel_config import ParallelConfig
from minillm.config.scheduler_config import SchedulerConfig, SchedulerPolicy
from minillm.quant.quant_config import QuantConfig

CONFIGS = [EngineConfig, CacheConfig, SchedulerConfig, KernelConfig, ParallelConfig, SpeculativeConfig, QuantConfig,
           Components]


def documented_fields(cls) -> set[str]:
    """The fields of cls's body followed by a string: the attribute docstrings mkdocstrings renders."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {node.target.id for node, after in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_of_every_config_has_a_docstring_beneath_it(cls):
    missing = [f.name for f in fields(cls) if f.name not in documented_fields(cls)]
    assert not missing, f"{cls.__name__} fields without a docstring beneath them: {missing}"


# A value other than the default for each knob, valid with every other knob at its default.
SAMPLES = {"kv_cache": CacheKind.CONTIGUOUS, "block_size": 8, "num_kv_blocks": 12, "kv_cache_memory": 2**20,
           "enable_prefix_caching": False, "kv_offload": "host", "kv_offload_blocks": 7, "kv_offload_dir": "/tmp/kv",
           "scheduler": SchedulerPolicy.STATIC, "max_num_seqs": 3, "max_num_batched_tokens": 99,
           "enable_chunked_prefill": False, "attention_backend": "triton", "cpu_decode_kernel": False,
           "cpu_decode_layers": False, "compile_decode": True, "profile_attention": True, "tensor_parallel_size": 2}


def test_the_samples_name_every_knob_once():
    assert set(SAMPLES) == set(KNOBS)


@pytest.mark.parametrize("knob", list(KNOBS))
def test_each_flat_knob_reaches_its_group(knob):
    if knob == "attention_backend":
        pytest.importorskip("triton")
    group, setting = KNOBS[knob]
    config = EngineConfig.from_knobs("tiny", device="cpu", dtype="float32", **{knob: SAMPLES[knob]})
    assert getattr(getattr(config, group), setting) == SAMPLES[knob]
    assert getattr(GROUPS[group](), setting) != SAMPLES[knob], "the sample must differ from the default"
    others = {name: getattr(config, name) for name in GROUPS if name != group}
    assert others == {name: kind() for name, kind in GROUPS.items() if name != group}, "one group changes only"


def test_the_knobs_cover_every_group_field_once():
    targets = sorted(KNOBS.values())
    assert targets == sorted((group, f.name) for group, kind in GROUPS.items() for f in fields(kind))
    assert set(OWN_KNOBS) | {"model"} | set(GROUPS) == {f.name for f in fields(EngineConfig)}


def test_an_unknown_knob_is_named_with_the_accepted_ones():
    with pytest.raises(TypeError, match=r"unknown engine knob 'blok_size': the knobs are model, .*block_size"):
        EngineConfig.from_knobs("tiny", blok_size=8)


def test_the_grouped_constructor_and_the_flat_knobs_build_the_same_config():
    flat = EngineConfig.from_knobs("tiny", block_size=32, scheduler="static", max_num_seqs=3)
    grouped = EngineConfig("tiny", cache=CacheConfig(block_size=32),
                           scheduler=SchedulerConfig("static", max_num_seqs=3))
    assert flat == grouped


def test_a_group_in_place_of_another_is_refused_by_name():
    with pytest.raises(TypeError, match="cache must be a minillm.config.CacheConfig, got SchedulerConfig"):
        EngineConfig("tiny", cache=SchedulerConfig())
