"""Components: parts of the engine swapped for other implementations of the same interface.

The labs plug the learner's sampler, block allocator, prefix cache and step policy in through it
(`minillm.labkit.plug`), so the learner's code runs inside the real engine.
"""
from collections.abc import Callable
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Components:
    """Replacements for parts of the engine; None keeps the engine's own. Each must implement the
    interface of the part it replaces, named in its docstring. The flat knob `components` takes one."""

    sample: Callable | None = None
    """sampling.sample(logits, temperature, top_k, top_p, generator) -> token ids."""

    block_allocator: Callable | None = None
    """cache/allocator.BlockAllocator(num_blocks, block_size): the paged pool's free list."""

    match_prefix: Callable | None = None
    """cache/prefix_cache.match_prefix(token_ids, block_size, cache, hash_fn): the cached blocks a prompt
    starts with."""

    evictable_blocks: Callable | None = None
    """cache/prefix_cache.EvictableBlocks(): cached blocks no sequence holds, least recently used first."""

    hash_fn: Callable | None = None
    """cache/prefix_cache.chain_hash(parent_hash, tokens): the name of a full block."""

    continuous_step: Callable | None = None
    """engine/policy.continuous_step(sched, budget, max_num_seqs, chunked): one continuous-batching step."""

    static_step: Callable | None = None
    """engine/policy.static_step(sched, max_num_seqs): one static-batching step."""

    make_room: Callable | None = None
    """engine/policy.make_room(sched, seq, num_tokens): preempt until seq's next tokens fit the pool."""

    verify: Callable | None = None
    """speculative/verify.verify(logits, proposals, q, temp, top_k, top_p, gen): the accepted tokens."""

    propose_ngram: Callable | None = None
    """speculative/ngram.propose_ngram(token_ids, n, k): prompt lookup's proposals."""

    propose_heads: Callable | None = None
    """speculative/heads.propose_heads(hidden, blocks, lm_head, k) -> each sequence's k token ids: the heads'
    proposals from the last hidden states [B, hidden], made with certainty (q = None, at any temperature)."""

    quantize_int8: Callable | None = None
    """quant/codecs.quantize_int8(w) -> (q, scale)."""

    quantize_int4: Callable | None = None
    """quant/codecs.quantize_int4(w, group_size) -> (codes, scale, zero)."""

    pack_int4: Callable | None = None
    """kernels/int4_format.pack_int4(codes) -> packed: two 4-bit codes per byte."""

    int4_linear: Callable | None = None
    """quant/quantized_linear.int4_linear(x, packed, scale, zero, bias) -> y."""

    paged_decode: Callable | None = None
    """kernels/paged_decode.paged_decode_attention(q, k_slots, v_slots, block_tables, context_lens, block_size,
    max_context, rows, out): the Triton decode kernel's launcher (attention_backend='triton' only)."""

    grammar_mask: Callable | None = None
    """structured/mask.apply_grammar_mask(logits, bitmask) -> logits: structured output's token mask."""

    source: str = "minillm"
    """Whose parts these are, for messages."""

    def replaced(self) -> list[str]:
        """Names of the parts this replaces."""
        return [f.name for f in fields(self) if f.name != "source" and getattr(self, f.name) is not None]
