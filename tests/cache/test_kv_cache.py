"""Decoding against the KV cache must give exactly what recomputing the whole sequence gives."""
import torch

from minillm import SamplingParams


def test_cached_decode_equals_recompute_every_step(llama_llm):
    prompt = torch.randint(1, 320, (23,), generator=torch.Generator().manual_seed(11)).tolist()
    out = llama_llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))[0]
    ids = list(prompt)
    for _ in range(48):
        ids.append(int(llama_llm.logits(ids)[-1].argmax()))
    assert out.token_ids == ids[len(prompt):]


def test_cached_logits_match_recompute_at_every_position(llama_llm):
    """Feed a fixed continuation through a paged cache one token at a time and compare each step's
    logits with a full forward: catches position offsets that greedy ties might hide."""
    from minillm.cache import make_cache_manager
    from minillm.engine.runner import ModelRunner
    from minillm.engine.scheduler import Scheduler
    from minillm.sequence import Sequence
    engine = llama_llm.engine
    cache = make_cache_manager(engine.config, engine.model_config, engine.dtype, engine.device)
    scheduler, runner = Scheduler(engine.config.scheduler, cache), ModelRunner(engine.model, cache, engine.device)
    ids = torch.randint(1, 320, (30,), generator=torch.Generator().manual_seed(12)).tolist()
    seq = Sequence("0", None, ids[:10], SamplingParams(max_tokens=25, temperature=0), torch.Generator(), None, ())
    scheduler.add(seq)
    full = llama_llm.logits(ids)
    batch = scheduler.schedule(0.0)
    for pos in range(10, 30):
        logits = runner.execute(batch)[0]
        torch.testing.assert_close(logits, full[pos - 1], atol=1e-4, rtol=0)
        scheduler.advance(batch)
        seq.token_ids.append(ids[pos])
        batch = scheduler.schedule(0.0)
        assert [(b.seq, b.num_tokens, b.phase) for b in batch] == [(seq, 1, "decode")]
    scheduler.abort("0")
    assert not scheduler.has_unfinished() and cache.stats([]).used_blocks == 0
