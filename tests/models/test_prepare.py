"""models/prepare.py: a model shared with other engines is quantized on a copy that shares the weights it keeps,
and never changes under them; a head quantization gives the LM head a scheme of its own."""
import torch

from minillm.layers.linear import Linear
from minillm.models.prepare import load_model, prepare_model
from minillm.models.registry import resolve_model_path
from minillm.quant import QuantConfig, QuantizedLinear

TINY = resolve_model_path("tiny")
CPU = torch.device("cpu")


def test_a_shared_model_is_quantized_on_a_copy_that_shares_what_it_keeps():
    shared = load_model(TINY, torch.float32, CPU)
    before = {name: t.clone() for name, t in shared.state_dict().items()}
    prepared = prepare_model(TINY, torch.float32, CPU, QuantConfig("int8"), model=shared, shared=True)
    assert prepared is not shared and getattr(shared, "quant_config", None) is None
    assert isinstance(shared.model.layers[0].mlp.down_proj, Linear)
    assert isinstance(prepared.model.layers[0].mlp.down_proj, QuantizedLinear)
    assert prepared.model.embed_tokens.weight.data_ptr() == shared.model.embed_tokens.weight.data_ptr()
    assert all(torch.equal(before[name], t) for name, t in shared.state_dict().items())


def test_an_unchanged_model_is_not_copied_and_one_of_its_own_is_quantized_in_place():
    own = load_model(TINY, torch.float32, CPU)
    assert prepare_model(TINY, torch.float32, CPU, model=own, shared=True) is own  # nothing to change: no copy
    assert prepare_model(TINY, torch.float32, CPU, QuantConfig("int8"), model=own) is own
    assert isinstance(own.model.layers[0].self_attn.qkv_proj, QuantizedLinear)


def test_a_head_quantization_gives_the_lm_head_its_own_scheme():
    model = prepare_model(TINY, torch.float32, CPU, QuantConfig("int4", group_size=32), QuantConfig("int8"))
    assert model.lm_head.scheme == "int8" and model.model.layers[0].mlp.down_proj.scheme == "int4"
