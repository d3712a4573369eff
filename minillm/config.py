"""EngineConfig: every knob of the engine in one dataclass, validated once when it is built.

`Components` swaps parts of the engine for other implementations of the same interface: the labs
plug the learner's sampler, block allocator, prefix cache and step policy in through it
(`minillm.labkit.plug`), so the learner's code runs inside the real engine.
"""
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from minillm.models.registry import DEFAULT_MODEL
from minillm.quant.quant_config import QuantConfig
from minillm.sequence import Label


class CacheKind(Label):
    PAGED = "paged"
    CONTIGUOUS = "contiguous"


class SchedulerPolicy(Label):
    CONTINUOUS = "continuous"
    STATIC = "static"
    SEQUENTIAL = "sequential"


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Components:
    """Replacements for parts of the engine; None keeps the engine's own. Each must implement the
    interface of the part it replaces (see the module named in each comment)."""
    sample: Callable | None = None            # sampling.sample(logits, temperature, top_k, top_p, generator)
    block_allocator: Callable | None = None   # cache/allocator.BlockAllocator(num_blocks, block_size)
    match_prefix: Callable | None = None      # cache/prefix.match_prefix(token_ids, block_size, cache, hash_fn)
    evictable_blocks: Callable | None = None  # cache/prefix.EvictableBlocks()
    hash_fn: Callable | None = None           # cache/prefix.chain_hash(parent_hash, tokens): names a full block
    continuous_step: Callable | None = None   # engine/policy.continuous_step(sched, budget, max_num_seqs, chunked)
    static_step: Callable | None = None       # engine/policy.static_step(sched, max_num_seqs)
    make_room: Callable | None = None         # engine/policy.make_room(sched, seq, num_tokens)
    verify: Callable | None = None            # speculative/verify.verify(logits, proposals, q, temp, top_k, top_p, gen)
    propose_ngram: Callable | None = None     # speculative/ngram.propose_ngram(token_ids, n, k)
    quantize_int8: Callable | None = None     # quant/codecs.quantize_int8(w) -> (q, scale)
    quantize_int4: Callable | None = None     # quant/codecs.quantize_int4(w, group_size) -> (codes, scale, zero)
    pack_int4: Callable | None = None         # quant/codecs.pack_int4(codes) -> packed
    int4_linear: Callable | None = None       # quant/linear.int4_linear(x, packed, scale, zero, bias) -> y
    paged_decode: Callable | None = None      # kernels/paged_decode.paged_decode_attention(q, k_slots, v_slots,
    #                                           block_tables, context_lens, block_size, max_context, rows, out)
    grammar_mask: Callable | None = None      # structured/mask.apply_grammar_mask(logits, bitmask) -> logits
    source: str = "minillm"                   # whose parts these are, for messages

    def replaced(self) -> list[str]:
        """Names of the parts this replaces."""
        return [f.name for f in fields(self) if f.name != "source" and getattr(self, f.name) is not None]


SPEC_METHODS = ("ngram", "draft", "heads", "mlp")
SELF_DRAFT = "self"  # SpeculativeConfig.draft_model: the target's own weights (quantized) as its draft
ATTENTION_BACKENDS = ("torch", "triton")
OFFLOAD_KINDS = ("host", "disk")  # cache/offload.py's tiers


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: before each step a proposer guesses up to k tokens per decoding
    sequence, and the target verifies them all in that step's forward (minillm/speculative/)."""
    method: str                  # ngram (prompt lookup) | draft (a smaller model) | heads (multi-token prediction)
                                 # | mlp (a recurrent MLP speculator on the target's hidden state)
    k: int = 4                   # proposals per sequence and step
    ngram: int = 3               # ngram: the longest n-gram looked up (shorter ones are tried too)
    draft_model: str = "pico"    # draft: a bundled name or model directory with the target's tokenizer, or
                                 # "self": the target's own weights, quantized as draft_quantization says
    draft_quantization: QuantConfig | None = None  # draft: weight-only quantization of the draft's copy
    draft_head_quantization: QuantConfig | None = None  # draft: its LM head's own (int8 beside int4 layers, say)
    heads: str | None = None     # heads: a file of trained heads; None: the target's spec_heads.safetensors
    speculator: str | None = None  # mlp: a trained speculator's file; None: the target's spec_mlp.safetensors

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPEC_METHODS)}, got {self.method!r}")
        for name, value in (("k", self.k), ("ngram", self.ngram)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative {name} must be an integer >= 1, got {value!r}")
        for name in ("draft_quantization", "draft_head_quantization"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, QuantConfig):
                raise TypeError(f"{name} must be a minillm.QuantConfig or None, got {type(value).__name__}")
            if value is not None and self.method != "draft":
                raise ValueError(f"{name} quantizes a draft model: it needs method 'draft', got {self.method!r}")
        if self.draft_head_quantization is not None and "lm_head" in getattr(self.draft_quantization, "projections",
                                                                             ()):
            raise ValueError(f"draft_quantization {self.draft_quantization.label()} quantizes the LM head already: "
                             f"leave draft_head_quantization None, or take lm_head out of its projections")
        if self.method == "draft" and self.draft_model == SELF_DRAFT and self.draft_quantization is None:
            raise ValueError("draft_model 'self' needs a draft_quantization: the target's own full-precision "
                             "weights as its draft would cost a whole target forward per proposal")


@dataclass
class EngineConfig:
    """Every knob of the engine, each a plain constructor argument (so two configurations can run side by
    side), checked once here: a bad value or a combination the engine cannot run raises ValueError (TypeError
    for a wrong config type) naming it and what is accepted. `LLM(model, **knobs)` builds one. Each field's
    comment says what it does; docs/engine.md says why each is there."""
    model: str = DEFAULT_MODEL     # a bundled model name or a Hugging Face model directory
    dtype: str = "auto"            # auto: float32 on CPU, bfloat16 on CUDA
    device: str = "auto"           # auto: cuda when available, else cpu
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0                  # seeds requests that give no seed of their own
    kv_cache: CacheKind = CacheKind.PAGED  # paged: one block pool shared by all sequences; contiguous: the baseline
    block_size: int = 16           # token slots per KV block (paged)
    num_kv_blocks: int | None = None     # pool size in blocks; None: from kv_cache_memory
    kv_cache_memory: int | None = None   # pool size in bytes; None: 256 MiB on CPU, half the free GPU memory
    enable_prefix_caching: bool = True   # reuse the K/V of prompt prefixes seen before (paged)
    attention_backend: str = "torch"     # torch | triton: the Triton kernels of minillm/kernels (paged; int4 too)
    cpu_decode_kernel: bool = True       # torch backend, CPU, float32: decode rows read the paged pool in place (C++)
    cpu_decode_layers: bool = True       # with that kernel, a decode step of 1-16 rows runs each layer as one C++ call
    kv_offload: str | None = None        # a second KV tier (paged): "host" (CPU memory) or "disk" (a file); None: none
    kv_offload_blocks: int = 1024        # its capacity in blocks (least recently used ones leave first)
    kv_offload_dir: str | None = None    # disk: the folder of its file (None: a temporary one)
    scheduler: SchedulerPolicy = SchedulerPolicy.CONTINUOUS  # continuous | static | sequential (engine/policy.py)
    max_num_seqs: int = 64               # sequences running at once
    max_num_batched_tokens: int = 1024   # tokens computed per step (the step's token budget)
    enable_chunked_prefill: bool = True  # split long prompts across steps (continuous only)
    speculative: SpeculativeConfig | None = None  # speculative decoding (None: one token per sequence per step)
    quantization: QuantConfig | None = None  # weight-only quantization (None: the checkpoint's own weights)
    profile_attention: bool = False      # time attention apart in each step (a clock read per layer)
    compile_decode: bool = False         # torch.compile decode steps (engine/compiled.py): minutes to compile first
    tensor_parallel_size: int = 1        # ranks sharing each layer's heads and MLP (tp/); >1 starts workers
    components: Components = field(default_factory=Components)  # the engine's own parts unless replaced

    def __post_init__(self) -> None:
        self.model = str(self.model)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}") from None
            if self.torch_device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device {self.device!r} was asked for, but torch sees no CUDA GPU")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}")
        for name, value in (("block_size", self.block_size), ("num_kv_blocks", self.num_kv_blocks),
                            ("kv_cache_memory", self.kv_cache_memory), ("max_num_seqs", self.max_num_seqs),
                            ("max_num_batched_tokens", self.max_num_batched_tokens)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.kv_cache = _choice("kv_cache", self.kv_cache, CacheKind)
        self._check_offload()
        self.scheduler = _choice("scheduler", self.scheduler, SchedulerPolicy)
        self._check_attention_backend()
        self._check_tensor_parallel()
        self._check_compile()
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise TypeError(f"speculative must be a minillm.config.SpeculativeConfig or None, "
                            f"got {type(self.speculative).__name__}")
        if self.quantization is not None and not isinstance(self.quantization, QuantConfig):
            raise TypeError(f"quantization must be a minillm.QuantConfig or None, "
                            f"got {type(self.quantization).__name__}")
        spec = self.speculative
        if spec is not None and spec.method == "draft" and spec.draft_model == SELF_DRAFT:
            if self.quantization is not None:
                raise ValueError(f"draft_model 'self' quantizes the target's full-precision weights, but the target "
                                 f"is quantized ({self.quantization.label()}): leave quantization None, or draft "
                                 f"with another model")
            if self.tensor_parallel_size != 1:
                raise ValueError(f"draft_model 'self' copies the target's layers in this process: it runs with "
                                 f"tensor_parallel_size=1 only, got {self.tensor_parallel_size}")
        if not isinstance(self.components, Components):
            raise TypeError(f"components must be a minillm.config.Components, got {type(self.components).__name__}")
        if self.components.paged_decode is not None and self.attention_backend != "triton":
            raise ValueError("components.paged_decode is a Triton kernel's launcher: it runs only with "
                             f"attention_backend='triton', got {self.attention_backend!r}")

    def _check_offload(self) -> None:
        if self.kv_offload is None:
            return
        if self.kv_offload not in OFFLOAD_KINDS:
            raise ValueError(f"kv_offload must be None or one of {', '.join(OFFLOAD_KINDS)}, got {self.kv_offload!r}")
        if self.kv_cache != CacheKind.PAGED or not self.enable_prefix_caching:
            raise ValueError("kv_offload keeps prefix-cache blocks in a second tier: it needs kv_cache='paged' and "
                             "enable_prefix_caching=True")
        if not isinstance(self.kv_offload_blocks, int) or self.kv_offload_blocks < 1:
            raise ValueError(f"kv_offload_blocks must be a positive integer, got {self.kv_offload_blocks!r}")

    def _check_attention_backend(self) -> None:
        for name in ("cpu_decode_kernel", "cpu_decode_layers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if self.attention_backend != "triton":
            return
        if self.kv_cache != CacheKind.PAGED:
            raise ValueError(f"attention_backend 'triton' reads K/V in place in the paged pool: it needs "
                             f"kv_cache='paged', got {self.kv_cache.value!r}")
        if importlib.util.find_spec("triton") is None:
            raise ValueError("attention_backend 'triton' needs the triton package (Linux only): "
                             "pip install -e '.[triton]', or use attention_backend='torch'")
        if self.torch_device.type == "cpu" and self.torch_dtype == torch.bfloat16:
            raise ValueError("attention_backend 'triton' on the CPU runs in Triton's interpreter, which has no "
                             "bfloat16 arithmetic: use dtype 'float32' or 'float16' there")

    def _check_tensor_parallel(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
        if tp == 1:
            return
        # Each rank's shard must see the same attention inputs: only the paged torch context is broadcast,
        # and a tier or a quantized layer would hold (or cut) rank 0's weights and K/V alone.
        unsupported = {"device": (self.torch_device.type, "cpu"), "kv_cache": (self.kv_cache.value, "paged"),
                       "attention_backend": (self.attention_backend, "torch"), "kv_offload": (self.kv_offload, None),
                       "quantization": (self.quantization, None)}
        for name, (value, accepted) in unsupported.items():
            if value != accepted:
                raise ValueError(f"tensor_parallel_size {tp} runs with {name}={accepted!r} only (gloo on CPU, the "
                                 f"paged torch attention, full-precision weights), got {name}={value!r}")

    def _check_compile(self) -> None:
        if not isinstance(self.compile_decode, bool):
            raise ValueError(f"compile_decode must be True or False, got {self.compile_decode!r}")
        if not self.compile_decode:
            return
        # The compiled step is the paged torch attention over the model's own layers, in one process.
        needs = {"kv_cache": (self.kv_cache.value, "paged"), "attention_backend": (self.attention_backend, "torch"),
                 "tensor_parallel_size": (self.tensor_parallel_size, 1), "quantization": (self.quantization, None)}
        for name, (value, accepted) in needs.items():
            if value != accepted:
                raise ValueError(f"compile_decode runs with {name}={accepted!r} only (the paged torch attention "
                                 f"over full-precision weights, in one process), got {name}={value!r}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]


def _choice(name: str, value, enum):
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(e.value for e in enum)}, got {value!r}") from None
