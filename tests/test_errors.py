"""Bad input gets a clear error that names what was wrong."""
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from minillm import LLM, SamplingParams


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture_lists_the_supported_ones(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM"):
        LLM(str(d))


def test_missing_tensor_is_named(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.self_attn\.k_proj\.weight"):
        LLM(str(d))


def test_wrongly_shaped_tensor_gives_both_shapes(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:, :32].contiguous()
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"up_proj\.weight.*\(96, 32\).*expects \(96, 64\)"):
        LLM(str(d))


def test_missing_tokenizer(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        LLM(str(d))


def test_truncated_safetensors(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors.*(truncated|corrupt|cannot read)"):
        LLM(str(d))


def test_pickle_checkpoint_is_refused_not_unpickled(tmp_path, hf_llama):
    d = copy_model(hf_llama[0], tmp_path / "m")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin.*pickle"):
        LLM(str(d))


def test_unknown_model_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a bundled model name"):
        LLM(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("prompt, params, message", [
    ("", SamplingParams(), "prompt is empty"),
    ([], SamplingParams(), "empty"),
    ([1, 2, 99999], SamplingParams(), r"token ids must be integers in \[0, 320\)"),
    ([1] * 250, SamplingParams(max_tokens=10),
     r"250 tokens.*max_tokens \(10\) = 260 exceeds the context length of 256"),
])
def test_bad_requests_are_rejected_before_any_compute(llama_llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llama_llm.generate([prompt], params)
    assert not llama_llm.engine.has_unfinished()


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float8"), "dtype"), (dict(device="tpu"), "device"), (dict(max_model_len=1), "max_model_len"),
    (dict(kv_cache="ring"), "kv_cache"), (dict(scheduler="random"), "scheduler"),
])
def test_bad_engine_config_is_rejected_by_name(kwargs, message, hf_llama):
    with pytest.raises(ValueError, match=message):
        LLM(str(hf_llama[0]), **kwargs)


def test_max_model_len_beyond_the_model_is_rejected(hf_llama):
    with pytest.raises(ValueError, match="max_model_len 999 exceeds"):
        LLM(str(hf_llama[0]), max_model_len=999)
