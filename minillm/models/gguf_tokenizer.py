"""A GGUF file's tokenizer as Hugging Face files: tokenizer.json (a `tokenizers` byte-level BPE) and
tokenizer_config.json (special tokens and the chat template, where chat_template.py and transformers
look for them).

A GGUF stores no tokenizer.json, only its parts, under llama.cpp's key names:
    tokenizer.ggml.model        "gpt2" for a byte-level BPE (the only kind read here)
    tokenizer.ggml.tokens       the vocabulary, each token spelled in GPT-2's byte alphabet ("Ġthe")
    tokenizer.ggml.merges       "Ġ t" ... in rank order
    tokenizer.ggml.token_type   1 normal, 3 control (<|im_start|>), 4 user-defined, ...
    tokenizer.ggml.pre          names how text is split into words before BPE runs (PRE_TOKENIZERS)
    tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token, add_eos_token
    tokenizer.chat_template     Jinja2, as in tokenizer_config.json
"""
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that are matched whole in the text

# The splits, in order, that llama.cpp applies for each `tokenizer.ggml.pre` name (its llama-vocab.cpp),
# each one splitting the pieces the one before left. GPT-2's is the regex of tokenizers' ByteLevel.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt2": [GPT2_SPLIT],
    # Every numeral a word of its own first (llama.cpp splits StarCoder's vocabulary the same way; SmolLM2's
    # has no token with a digit beside another character), then GPT-2's split: "x  1" is x, "  ", 1.
    "smollm": [r"\p{N}", GPT2_SPLIT],
    "llama-bpe": [LLAMA3_SPLIT],
    "qwen2": [QWEN2_SPLIT],
}
# Llama 3's vocabulary takes a whole word that is a token as it is, before any merge (llama.cpp's
# ignore_merges for this split; tokenizer.json's "ignore_merges": true), and adds BOS unless the file
# says otherwise (llama.cpp's default for it; every other split defaults to no BOS).
IGNORE_MERGES = {"llama-bpe"}
ADDS_BOS_BY_DEFAULT = {"llama-bpe"}


def _field(meta: dict, key: str):
    if key not in meta:
        raise ValueError(f"the GGUF file has no {key!r}: cannot build its tokenizer without it")
    return meta[key]


def _pre_tokenizer(name: str | None):
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre = {name!r} is a pre-tokenizer minillm does not know, and splitting "
                         f"text another way than the vocabulary was learned gives wrong tokens; known: "
                         f"{', '.join(PRE_TOKENIZERS)}")
    splits = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[name]]
    # The splits above cut the words; ByteLevel then only respells bytes (use_regex=False: no second split).
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def adds_bos_eos(meta: dict) -> tuple[bool, bool]:
    """Whether encoding a text puts BOS before it and EOS after it (tokenizer.ggml.add_bos/eos_token)."""
    add_bos = meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.pre") in ADDS_BOS_BY_DEFAULT)
    return bool(add_bos), bool(meta.get("tokenizer.ggml.add_eos_token", False))


def _post_processor(tokens: list[str], bos: int | None, eos: int | None, add_bos: bool, add_eos: bool):
    """BOS/EOS around each encoded text when the file asks for them (encode(add_special_tokens=True))."""
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise ValueError("the GGUF file asks to add a BOS/EOS token but names no bos_token_id/eos_token_id")
    if not (add_bos or add_eos):
        return None
    first = [tokens[bos]] if add_bos else []
    last = [tokens[eos]] if add_eos else []
    specials = [(tokens[i], i) for i, wanted in ((bos, add_bos), (eos, add_eos)) if wanted]
    return processors.TemplateProcessing(single=[*first, "$A", *last],
                                         pair=[*first, "$A", *last, *first, "$B:1", *last],
                                         special_tokens=list(dict(specials).items()))


def build_tokenizer(meta: dict) -> Tokenizer:
    """meta: the file's metadata (key -> value) -> the tokenizer it describes."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer.ggml.model = {kind!r}: minillm reads byte-level BPE vocabularies ('gpt2', "
                         f"as Llama 3, SmolLM and Qwen2 files have), not SentencePiece ('llama') or others")
    if meta.get("tokenizer.ggml.add_space_prefix", False):
        raise ValueError("tokenizer.ggml.add_space_prefix is true: a byte-level BPE with a prefix space "
                         "is not supported")
    tokens = list(_field(meta, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ")) for m in _field(meta, "tokenizer.ggml.merges")]
    bad = next((m for m in merges if len(m) != 2), None)
    if bad is not None:
        raise ValueError(f"the merge {' '.join(bad)!r} in tokenizer.ggml.merges is not two tokens")
    pre = meta.get("tokenizer.ggml.pre")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre in IGNORE_MERGES)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    # Control tokens are matched whole and dropped by decode(skip_special_tokens=True); user-defined
    # ones are matched whole but are text (llama.cpp and transformers treat them so).
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    post = _post_processor(tokens, meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id"),
                           *adds_bos_eos(meta))
    if post is not None:
        tok.post_processor = post
    return tok


def tokenizer_config(meta: dict, context_length: int) -> dict:
    """tokenizer_config.json as transformers writes it: special tokens as text, the chat template."""
    tokens = meta["tokenizer.ggml.tokens"]
    add_bos, add_eos = adds_bos_eos(meta)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context_length,
              "add_bos_token": add_bos, "add_eos_token": add_eos, "clean_up_tokenization_spaces": False}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None:
            config[name] = tokens[token_id]
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config
