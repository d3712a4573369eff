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
    """Feed a fixed continuation through the engine's cache one token at a time and compare each
    step's logits with a full forward: catches position offsets that greedy ties might hide."""
    from minillm.engine.runner import ScheduledSeq
    engine = llama_llm.engine
    ids = torch.randint(1, 320, (30,), generator=torch.Generator().manual_seed(12)).tolist()
    engine.add_request(ids[:10], SamplingParams(max_tokens=25, temperature=0))
    seq = engine.scheduler.waiting[0]
    full = llama_llm.logits(ids)
    batch = engine.scheduler.schedule(0.0)
    for pos in range(10, 30):
        logits = engine.runner.execute(batch)[0]
        torch.testing.assert_close(logits, full[pos - 1], atol=1e-4, rtol=0)
        seq.num_computed_tokens = pos
        seq.token_ids.append(ids[pos])
        assert engine.cache_manager.reserve(seq, 1)
        batch = [ScheduledSeq(seq, 1)]
    engine.abort(seq.request_id)
    assert not engine.has_unfinished()
