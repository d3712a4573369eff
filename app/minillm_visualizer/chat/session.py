"""The Chat page's conversation: an engine of its own, the turns so far, and what the engine did for each.

Every turn's prompt is the whole conversation rendered with the model's chat template (the model keeps
nothing between requests). The earlier turns' K/V blocks are still in the pool, named by the prefix cache,
so only the new turn's tokens are computed: each Turn records how many prompt tokens the cache served, and
a picture of the pool at the turn's last step with this turn's blocks marked HIT (found in the cache) or
NEW (computed for this turn).
"""
from collections.abc import Iterator
from dataclasses import dataclass, replace

from minillm import EngineConfig, SamplingParams
from minillm.arith import cdiv
from minillm.chat_template import ChatTemplate
from minillm.models.model_config import ModelConfig
from minillm.models.registry import resolve_model_path
from minillm.step import KVStats
from minillm_visualizer.shared.engines import build_engine

CONTEXT = 1024  # tokens a conversation may reach (the model's own context when it is shorter)
BLOCK_SIZE = 16
POOL_CONVERSATIONS = 2  # the pool holds twice that: room for the blocks earlier turns leave behind
HIT, NEW = "hit", "new"  # a turn's blocks in the pool picture: found in the prefix cache, or computed now


@dataclass
class Turn:
    """One exchange, and what the engine did for it (times in seconds)."""
    user: str
    answer: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache: not recomputed
    ttft: float | None = None
    tpot: float | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    kv: KVStats | None = None  # the pool at the turn's last step; this turn's blocks are HIT or NEW

    @property
    def decode_rate(self) -> float | None:
        """Decode tokens/s: 1 / TPOT (None for a one-token answer)."""
        return 1 / self.tpot if self.tpot else None


class ChatSession:
    def __init__(self, model: str) -> None:
        cfg = ModelConfig.from_file(resolve_model_path(model) / "config.json")
        length = min(CONTEXT, cfg.max_position_embeddings)
        self.model = model
        self.engine = build_engine(EngineConfig.from_knobs(
            model=model, max_model_len=length, block_size=BLOCK_SIZE, enable_prefix_caching=True,
            num_kv_blocks=POOL_CONVERSATIONS * cdiv(length, BLOCK_SIZE)))
        self.template = ChatTemplate.for_model(self.engine.model_dir)
        self.turns: list[Turn] = []

    def reset(self) -> None:
        """A new conversation; the pool keeps its cached blocks (a new system message may still hit them)."""
        self.turns = []

    def messages(self, user: str, system: str = "") -> list[dict]:
        """The conversation so far, then the user's new message."""
        opening = [{"role": "system", "content": system}] if system.strip() else []
        history = [m for t in self.turns for m in ({"role": "user", "content": t.user},
                                                   {"role": "assistant", "content": t.answer})]
        return [*opening, *history, {"role": "user", "content": user}]

    def ask(self, user: str, params: SamplingParams, system: str = "") -> Iterator[str]:
        """Stream the answer's text as the engine writes it; once the answer is complete the turn joins
        self.turns (an answer cut short, by a rerun of the page, is aborted and forgotten). A conversation
        that fills the context raises ValueError before anything is queued."""
        prompt = self.template.render(self.messages(user, system))
        turn = Turn(user, prompt_tokens=len(self.engine.tokenizer.encode(prompt)))
        room = self.engine.max_model_len - turn.prompt_tokens
        if room < 1:
            raise ValueError(f"the conversation fills the {self.engine.max_model_len}-token context: start a new "
                             f"conversation")
        rid = self.engine.add_request(prompt, replace(params, max_tokens=min(params.max_tokens, room)))
        done, parts = None, []
        try:
            while done is None:
                for chunk in self.engine.step():
                    if chunk.request_id == rid:
                        parts.append(chunk.text)
                        done = chunk.output or done
                        yield chunk.text
                self._picture(rid, turn)
        finally:
            if done is None:
                self.engine.abort(rid)
        m = done.metrics
        turn.answer, turn.finish_reason = "".join(parts), done.finish_reason
        turn.cached_tokens, turn.ttft, turn.tpot = m["cached_prompt_tokens"], m["ttft"], m["tpot"]
        turn.output_tokens = m["output_tokens"]
        turn.kv = turn.kv or self.engine.view.kv_stats()  # answered in one step: no picture while it ran
        self.turns.append(turn)

    def _picture(self, rid: str, turn: Turn) -> None:
        """While the request runs: the pool, with its blocks marked HIT (the prefix cache's) or NEW."""
        seq = next((s for s in self.engine.view.sequences() if s.request_id == rid), None)
        if seq is None:
            return
        kv = self.engine.view.kv_stats()
        owner, hits = list(kv.block_owner), seq.num_cached_prompt_tokens // kv.block_size
        for i, block in enumerate(seq.block_table):
            owner[block] = HIT if i < hits else NEW
        turn.kv = replace(kv, block_owner=owner)
