"""minillm's model against Hugging Face transformers on the same checkpoint."""
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.testing import make_hf_model


def random_ids(n: int, seed: int, vocab: int = 320) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def hf_greedy(hf, prompt: list[int], new: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("fixture", ["hf_llama", "hf_qwen2"])
def test_full_sequence_logits_match_transformers(fixture, request):
    path, hf = request.getfixturevalue(fixture)
    llm = LLM(str(path))
    for length, seed in [(1, 0), (37, 1), (200, 2)]:
        ids = random_ids(length, seed)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours = llm.logits(ids)
        assert ours.shape == ref.shape
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("fixture", ["hf_llama", "hf_qwen2"])
def test_greedy_generation_is_token_identical_to_transformers(fixture, request):
    path, hf = request.getfixturevalue(fixture)
    llm = LLM(str(path))
    for seed, length in [(3, 5), (4, 64)]:
        prompt = random_ids(length, seed)
        out = llm.generate([prompt], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
        assert out.token_ids == hf_greedy(hf, prompt, 40)
        assert out.finish_reason == "length"


def test_mistral_architecture_loads_and_matches(tmp_path):
    hf = make_hf_model(tmp_path, "mistral", seed=5)
    ids = random_ids(50, 6)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(LLM(str(tmp_path)).logits(ids), ref, atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path, hf_llama):
    _, hf = hf_llama
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    (tmp_path / "tokenizer.json").write_bytes((hf_llama[0] / "tokenizer.json").read_bytes())
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ids = random_ids(20, 7)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(LLM(str(tmp_path)).logits(ids), ref, atol=1e-4, rtol=0)


def test_causal_attention_keeps_its_shapes_and_matches_sdpa_for_any_query_length():
    """[q_len, heads, d] in, [q_len, heads, d] out, for decode (q_len 1), a chunk and a whole prompt,
    against PyTorch's scaled_dot_product_attention with an explicit causal mask and repeated kv heads."""
    from minillm.layers.attention import causal_attention
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(11, 2, 8, generator=gen), torch.randn(11, 2, 8, generator=gen)
    for q_len in (1, 4, 11):
        q = torch.randn(q_len, 6, 8, generator=gen)
        pos = torch.arange(11 - q_len, 11)
        mask = pos[:, None] >= torch.arange(11)[None, :]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(3, 1).transpose(0, 1), v.repeat_interleave(3, 1).transpose(0, 1),
            attn_mask=mask).transpose(0, 1)
        out = causal_attention(q, k, v)
        assert out.shape == (q_len, 6, 8)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
