"""The draft-model proposer: a smaller model with the target's tokenizer guesses k tokens, one
forward per token, all speculating sequences batched together.

The draft may also be the target itself, quantized (draft_model "self" with a draft_quantization, and
a draft_head_quantization for its LM head apart): self-speculation. An int8 or int4 copy streams a
quarter or less of the bytes per token and agrees with the full-precision model's greedy choice most
of the time, so on a memory-bound machine it guesses cheaply and well; it shares the target's
embedding and norms, and only its quantized matrices are new. It also takes the K/V of the tokens the
target has computed from the target's pool, so that it never computes a prompt.

The draft keeps its own paged KV cache, in step with the target's: for each sequence a shadow
Sequence holds the tokens the draft has seen and how many it has computed. Before proposing, the
shadow is reconciled with the target's tokens: proposals the target rejected are cut off (with
their K/V), and the tokens the target added are fed to the draft in its first forward.
"""
import torch

from minillm.cache.paged import PagedCacheManager
from minillm.config import SELF_DRAFT
from minillm.models.prepare import load_model, prepare_model
from minillm.models.registry import resolve_model_path
from minillm.quant.quant_config import QuantConfig
from minillm.sequence import Phase, Sequence
from minillm.speculative.target import ProposerTarget
from minillm.speculative.verify import target_probs
from minillm.step import ScheduledSeq
from minillm.tokenizer import Tokenizer

DRAFT_BLOCK_SIZE = 16


def quantized_self_draft() -> dict:
    """The fields of SpeculativeConfig("draft", ...) for the self draft that measured best on SmolLM2 (bench spec):
    int4 layers with a free minimum per 32 weights (the shape of a GGUF file's Q4_1 blocks) and an int8 LM head (an
    int4 head would cost less again, but change the draft's choice more often)."""
    return {"draft_model": SELF_DRAFT,
            "draft_quantization": QuantConfig("int4", group_size=32, int4_range="min-max"),
            "draft_head_quantization": QuantConfig("int8")}


class DraftProposer:
    def __init__(self, draft_model: str, target: ProposerTarget, quantization: QuantConfig | None = None,
                 head_quantization: QuantConfig | None = None) -> None:
        if draft_model == SELF_DRAFT:  # self-speculation: the target's weights, quantized (EngineConfig checks)
            path, model = target.model_dir, target.model
        else:
            path = resolve_model_path(draft_model)
            model = load_model(path, target.dtype, target.device)
            check_same_vocabulary(Tokenizer(path), target.tokenizer, model.config.vocab_size,
                                  target.model.config.vocab_size, draft_model)
        self.model = prepare_model(path, target.dtype, target.device, quantization, head_quantization, model=model,
                                   shared=draft_model == SELF_DRAFT)  # the target's weights are the target's still
        self.cache = PagedCacheManager(self.model.config, target.kv_slots // DRAFT_BLOCK_SIZE + 1, DRAFT_BLOCK_SIZE,
                                       target.dtype, target.device, enable_prefix_caching=False)
        self.runner = target.make_runner(self.model, self.cache)
        # A self draft has the target's layers and shapes: it takes the K/V of the tokens the target has computed
        # from the target's paged pool instead of computing them again (the prompt's prefill, which would land in
        # the time per output token). The target's K/V are its full-precision ones; the draft's guesses are still
        # only guesses, verified exactly.
        self.target_cache = target.cache if draft_model == SELF_DRAFT and isinstance(target.cache,
                                                                                    PagedCacheManager) else None
        self.shadows: dict[int, tuple[Sequence, int]] = {}  # id(seq) -> (shadow, tokens before its proposals)

    def propose(self, seqs: list[Sequence], limits: list[int]) -> None:
        shadows = [self._shadow(seq) for seq in seqs]
        tokens = {id(seq): [] for seq in seqs}
        probs = {id(seq): [] for seq in seqs}  # the distributions the proposals were drawn from
        for step in range(max(limits)):
            pairs, batch = [], []
            for seq, shadow, k in zip(seqs, shadows, limits):
                n = 0 if shadow is None else len(shadow.token_ids) - shadow.num_computed_tokens
                if step < k and n and self.cache.reserve(shadow, n):  # no room in the draft's pool: it stops
                    pairs.append((seq, shadow))
                    batch.append(ScheduledSeq(shadow, n, Phase.DECODE, samples=True))
            if not batch:
                break
            logits = self.runner.execute(batch)  # [len(batch), vocab]: the draft's next-token logits
            for (seq, shadow), item, row in zip(pairs, batch, logits):
                shadow.num_computed_tokens += item.num_tokens
                p = seq.params
                if p.temperature == 0:
                    token, q = int(row.argmax()), None
                else:
                    q = target_probs(row[None], p.temperature, p.top_k, p.top_p)[0]
                    token = int(torch.multinomial(q, 1, generator=seq.generator))
                shadow.token_ids.append(token)
                tokens[id(seq)].append(token)
                probs[id(seq)].append(q)
        for seq in seqs:
            seq.spec_tokens, drawn = tokens[id(seq)], probs[id(seq)]
            seq.spec_probs = torch.stack(drawn) if drawn and drawn[0] is not None else None

    def verified(self, seq: Sequence, accepted: int, hidden: torch.Tensor) -> None:
        pass  # reconciled lazily, from the target's tokens, before the next proposals

    def release(self, seq: Sequence) -> None:
        shadow, _ = self.shadows.pop(id(seq), (None, 0))
        if shadow is not None:
            self.cache.free(shadow)

    def _shadow(self, seq: Sequence) -> Sequence | None:
        """The draft's view of seq, cut back to the tokens the target kept and extended with the
        ones it added. None if the draft's pool has no room for it."""
        shadow, base = self.shadows.get(id(seq), (None, 0))
        if shadow is None:
            shadow = Sequence(seq.request_id, None, seq.token_ids, seq.params, seq.generator, None, (), seq.index)
            if self.cache.allocate(shadow) is None:
                return None
            if self.target_cache is not None:  # the target's K/V of what it has computed: the shadow has them too
                self.cache.copy_tokens(self.target_cache, seq, shadow, seq.num_computed_tokens)
                shadow.num_computed_tokens = seq.num_computed_tokens
        else:
            keep, limit = base, min(len(shadow.token_ids), len(seq.token_ids))
            while keep < limit and shadow.token_ids[keep] == seq.token_ids[keep]:
                keep += 1  # the tokens before the last proposals were the target's; so are the proposals it kept
            shadow.token_ids = shadow.token_ids[:keep] + seq.token_ids[keep:]
            if shadow.num_computed_tokens > keep:
                shadow.num_computed_tokens = keep
                self.cache.trim(shadow)
        self.shadows[id(seq)] = (shadow, len(seq.token_ids))
        return shadow


def check_same_vocabulary(draft: Tokenizer, target: Tokenizer, draft_vocab: int, target_vocab: int,
                          name: str) -> None:
    """Proposals are token ids: the draft must mean by each id what the target does."""
    if draft_vocab != target_vocab:
        raise ValueError(f"draft model {name!r} has a vocabulary of {draft_vocab} tokens, the target one of "
                         f"{target_vocab}: a draft must share the target's tokenizer")
    if draft.vocab() != target.vocab():
        raise ValueError(f"draft model {name!r} has a different tokenizer from the target's (the same ids stand "
                         f"for other tokens): a draft must share the target's tokenizer")
