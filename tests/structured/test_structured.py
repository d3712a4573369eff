"""Structured output: the grammar mask against xgrammar's own, and outputs that always match their
schema, regex or grammar, inside batches of free requests (checked with `jsonschema` and `re`)."""
import json
import random
import re

import jsonschema
import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import SpeculativeConfig
from minillm.structured import StructuredOutput, apply_grammar_mask

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny")


@pytest.mark.parametrize("rows, vocab", [(1, 32), (3, 4096), (5, 1000), (2, 33)])
def test_grammar_mask_equals_xgrammars_own(rows, vocab):
    gen = torch.Generator().manual_seed(rows * vocab)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[0, 0] = -1  # every bit, the sign bit included
    logits = torch.randn(rows, vocab, generator=gen) * 5
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    got = apply_grammar_mask(logits, bitmask)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(got)])


def random_schema(rng: random.Random) -> dict:
    kinds = [{"type": "integer"}, {"type": "boolean"}, {"enum": ["red", "green", "blue"]},
             {"type": "string", "maxLength": rng.randint(1, 10)},
             {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}]
    names = rng.sample(["id", "name", "ok", "color", "size", "point", "tag"], rng.randint(1, 4))
    return {"type": "object", "properties": {n: rng.choice(kinds) for n in names}, "required": names}


def test_json_schema_outputs_always_validate_inside_a_batch_of_free_requests(llm):
    rng = random.Random(0)
    prompts = ["def parse(line):", "import json\n", "class Point:", "x = ", "# config\n", "{", "print(", "for i in"]
    params, schemas = [], []
    for i, _ in enumerate(prompts):
        schema = random_schema(rng) if i % 2 == 0 else None
        schemas.append(schema)
        params.append(SamplingParams(max_tokens=120, temperature=[0, 0.8, 1.2][i % 3], seed=i,
                                     structured=StructuredOutput(json_schema=schema) if schema else None))
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out, schema, p in zip(outs, schemas, params):
        if schema is None:
            alone = llm.generate(out.prompt, p, use_tqdm=False)[0]
            assert alone.token_ids == out.token_ids, "a free request changed when batched with constrained ones"
            continue
        assert out.finish_reason == "stop", f"{out.text!r} did not finish within max_tokens"
        jsonschema.validate(json.loads(out.text), schema)


def test_greedy_constrained_first_token_is_the_argmax_over_the_allowed_tokens(llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    prompt = "value = "
    ids = llm.tokenizer.encode(prompt)
    out = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0,
                                              structured=StructuredOutput(json_schema=schema)), use_tqdm=False)[0]
    # The reference: xgrammar's vocabulary as transformers' tokenizer reads it (not the engine's own reading).
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(llm.engine.model_dir / "tokenizer.json"))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=llm.engine.model_config.vocab_size,
                                              stop_token_ids=list(llm.engine.eos_token_ids))
    compiled = xgr.GrammarCompiler(info).compile_json_schema(schema, any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    for token in out.token_ids[:6]:
        logits = llm.logits(ids)[-1:].clone()  # [1, vocab]
        bitmask = xgr.allocate_token_bitmask(1, logits.shape[-1])
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        assert int(logits.argmax()) == token
        assert matcher.accept_token(token)
        ids.append(token)
    assert json.loads(out.text)["n"] is not None


# json_object leaves keys and strings unbounded: a small code model, sampled, may never close them, so that
# case runs greedy after a prompt of short dicts.
DICTS = 'd = {"a": 1, "b": 2}\ne = {"a": 3, "b": 4}\nf = '


@pytest.mark.parametrize("spec, check, prompt, temperature", [
    (StructuredOutput(regex=r"[a-z]{2,5}-[0-9]{3}"), lambda t: re.fullmatch(r"[a-z]{2,5}-[0-9]{3}", t), "x = ", 1.0),
    (StructuredOutput(json_object=True), lambda t: isinstance(json.loads(t), dict), DICTS, 0.0),
    (StructuredOutput(grammar='root ::= "yes" | "no" | "maybe"'), lambda t: t in {"yes", "no", "maybe"}, "x = ", 1.0),
])
def test_regex_json_object_and_grammar_outputs_match_for_every_sample(llm, spec, check, prompt, temperature):
    out = llm.generate(prompt, SamplingParams(max_tokens=100, temperature=temperature, seed=7, n=3, structured=spec),
                       use_tqdm=False)[0]
    for sample in out.outputs:
        assert sample.finish_reason == "stop" and check(sample.text), sample.text


def test_structured_output_survives_preemption():
    small = LLM("tiny", num_kv_blocks=12, block_size=16, enable_prefix_caching=False)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"]}
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=3, structured=StructuredOutput(json_schema=schema))
    outs = small.generate(["def f(x):\n" * 6] * 4, [SamplingParams(max_tokens=40, seed=s, temperature=1.0,
                          structured=params.structured) for s in range(4)], use_tqdm=False)
    assert small.engine.view.num_preemptions > 0
    for out in outs:
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of json_schema, json_object, regex, grammar; got none"),
    ({"regex": "a", "json_object": True}, "got regex, json_object"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": [1]}, "must be a JSON object"),
    ({"regex": ""}, "regex must be a non-empty string"),
])
def test_a_malformed_spec_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        StructuredOutput(**kwargs)


def test_an_uncompilable_schema_is_refused_before_anything_is_queued(llm):
    with pytest.raises(ValueError, match="json schema cannot be compiled: .*objectx"):
        llm.engine.add_request("x", SamplingParams(structured=StructuredOutput(json_schema={"type": "objectx"})))
    with pytest.raises(ValueError, match="regex cannot be compiled"):
        llm.engine.add_request("x", SamplingParams(structured=StructuredOutput(regex="a(b")))
    assert not llm.engine.has_unfinished()


def test_speculative_decoding_refuses_structured_requests():
    spec = LLM("tiny", speculative=SpeculativeConfig(method="ngram", k=2))
    with pytest.raises(ValueError, match="not supported with speculative decoding"):
        spec.generate("x", SamplingParams(structured=StructuredOutput(json_object=True)), use_tqdm=False)


def test_a_grammar_dead_end_ends_its_own_sequence_only(llm):
    """regex "a" allows nothing but its end after one token, and min_tokens 5 holds the end back: no token
    is left. That sample ends with an error naming both; the healthy ones, batched with it, are unchanged."""
    healthy = ["def fib(n):", "import os\n", "class Stack:"]
    free = SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
    alone = llm.generate(healthy, free, use_tqdm=False)
    dead = SamplingParams(max_tokens=12, min_tokens=5, structured=StructuredOutput(regex="a"))
    mixed = llm.generate([healthy[0], "x = ", *healthy[1:]], [free, dead, free, free], use_tqdm=False)
    assert [o.token_ids for o in mixed[:1] + mixed[2:]] == [o.token_ids for o in alone]
    ended = mixed[1].outputs[0]
    assert ended.finish_reason == "error" and ended.text == "a", ended
    assert "regex" in ended.error and "min_tokens (5)" in ended.error, ended.error
