"""The loader builds the model without drawing initial weights (the checkpoint replaces them all): what it builds
matches a model built the usual way in everything the checkpoint does not fill."""
import torch

from minillm import LLM
from minillm.models.llama import LlamaForCausalLM
from minillm.models.loader import build_empty
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path


def test_an_empty_build_has_the_rotary_tables_tie_and_shapes_of_a_usual_one():
    cfg = ModelConfig.from_file(resolve_model_path("tiny") / "config.json")
    usual, empty = LlamaForCausalLM(cfg), build_empty(cfg, torch.device("cpu"))
    assert empty.lm_head.weight is empty.model.embed_tokens.weight and not empty.lm_head.weight.is_meta
    for (name, want), (other, got) in zip(usual.named_buffers(), empty.named_buffers(), strict=True):
        assert name == other and torch.equal(got, want), name
    assert [(n, p.shape) for n, p in usual.named_parameters()] == [(n, p.shape) for n, p in empty.named_parameters()]


def test_loading_a_model_draws_no_random_numbers():
    """Random initial weights would advance torch's generator: a user's seeded run would change with a load."""
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    LLM("tiny")
    assert torch.equal(torch.random.get_rng_state(), before)
