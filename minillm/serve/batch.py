"""The Batch API: a file of requests run offline, all at once, for the highest throughput.

OpenAI's batch file format, one JSON object a line:

    in   {"custom_id": "q1", "method": "POST", "url": "/v1/completions", "body": {...the request...}}
    out  {"id": "batch_req_...", "custom_id": "q1", "error": null,
          "response": {"status_code": 200, "request_id": "...", "body": {...the completion...}}}

A request the server would refuse (a bad body, a prompt too long for the context) gets its
status_code 400 and an error body, as it would over HTTP; a line that is no request at all (not
JSON, no custom_id, a wrong url) gets "response": null and an error {code, message, line}.

Every valid request goes into one LLMEngine before the first step, so the scheduler always has
a full batch: no arrival gaps, no latency target, the cheapest tokens this hardware makes. `echo`
and `max_tokens: 0` (prompt scoring) answer as /v1/completions does (serve/echo.py): the prompts
are scored by one forward each as their line is read, and a scoring-only request is answered then.
An output line is written and flushed as its request finishes, so a killed run loses only the
requests in flight; a rerun skips every custom_id (or bad line) already in the output.
"""
import json
import time
import uuid
from pathlib import Path

from pydantic import ValidationError

from minillm.chat_template import ChatTemplate
from minillm.config import EngineConfig
from minillm.engine.engine import LLMEngine
from minillm.models.registry import DEFAULT_MODEL
from minillm.outputs import RequestOutput
from minillm.serve.completions import DEFAULT_MAX_TOKENS, generated_choices, scored_choices
from minillm.serve.echo import EchoedPrompt, echo_now
from minillm.serve.errors import error_body, validation_message
from minillm.serve.protocol import ChatRequest, CompletionRequest
from minillm.serve.responses import chat_choice, envelope, new_id, usage

URLS = ("/v1/completions", "/v1/chat/completions")


class BadLine(Exception):
    """A line that is no request: it gets response null and this error (code, message)."""

    def __init__(self, code: str, message: str, custom_id=None) -> None:
        super().__init__(message)
        self.code, self.custom_id = code, custom_id


class Refused(Exception):
    """A request the server would answer with this status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def resume(output_path: Path) -> tuple[set, set]:
    """The custom_ids and bad-line numbers already answered in output_path. A trailing partial line
    (a run killed mid-write) is cut off, so the rerun appends to whole lines only."""
    if not output_path.exists():
        return set(), set()
    data = output_path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        with output_path.open("r+b") as f:
            f.truncate(len(complete))
    ids, lines = set(), set()
    for row in map(json.loads, complete.decode().splitlines()):
        error = row.get("error") or {}
        if "line" in error:
            lines.add(error["line"])
        else:
            ids.add(row["custom_id"])
    return ids, lines


def parse_line(text: str) -> tuple[str, str, dict]:
    """One input line -> (custom_id, url, raw body); raises BadLine."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadLine("invalid_json", f"the line is not valid JSON: {e}") from None
    if not isinstance(row, dict) or not isinstance(row.get("custom_id"), str) or not row["custom_id"]:
        raise BadLine("missing_custom_id", "each line needs a non-empty string custom_id")
    cid = row["custom_id"]
    if row.get("method") != "POST" or row.get("url") not in URLS:
        raise BadLine("invalid_url", f"method must be POST and url one of {', '.join(URLS)}, got "
                      f"{row.get('method')!r} {row.get('url')!r}", cid)
    if not isinstance(row.get("body"), dict):
        raise BadLine("missing_body", f"body must be a JSON object, got {type(row.get('body')).__name__}", cid)
    return cid, row["url"], row["body"]


def validated(url: str, raw: dict, model: str) -> CompletionRequest | ChatRequest:
    """The body as the endpoint at url reads it; what the server would refuse raises Refused."""
    kind = CompletionRequest if url == "/v1/completions" else ChatRequest
    try:
        body = kind.model_validate(raw)
    except ValidationError as e:
        # validation_message reads FastAPI's error locations, which start with "body"
        message, _ = validation_message([{**err, "loc": ("body", *err["loc"])} for err in e.errors()])
        raise Refused(400, message) from None
    if body.stream:
        raise Refused(400, "stream must be false in a batch: results are written to the output file")
    if body.model != model:
        raise Refused(404, f"model {body.model!r} does not exist: this batch runs {model!r}")
    return body


def completion_body(rid: str, model: str, url: str, body, outputs: list[RequestOutput], tokenizer,
                    shown: list[EchoedPrompt | None]) -> dict:
    """The JSON the server's non-streaming endpoint answers, from the finished prompts' outputs (and on
    /v1/completions, shown[i]: prompt i as echoed, None without echo)."""
    if url == "/v1/completions":
        kind = "text_completion"
        choices = generated_choices(tokenizer, body, shown, {(i, c.index): c for i, o in enumerate(outputs)
                                                             for c in o.outputs})
    else:
        kind = "chat.completion"
        choices = [chat_choice(tokenizer, c.index, c, body.top_logprobs or 0) for o in outputs for c in o.outputs]
    return envelope(rid, kind, model, choices,
                    usage=usage(sum(len(o.prompt_token_ids) for o in outputs),
                                sum(len(c.token_ids) for o in outputs for c in o.outputs)))


class BatchRun:
    """One run over an input file: queue every request, step the engine, write each answer."""

    def __init__(self, engine: LLMEngine, model: str, out) -> None:
        self.engine, self.model, self.out = engine, model, out
        self.template = ChatTemplate.for_model(engine.model_dir)
        self.pending: dict[str, dict] = {}  # custom_id -> url, body, prompts' engine ids, finished outputs
        self.counts = {"succeeded": 0, "failed": 0, "prompt_tokens": 0, "output_tokens": 0}

    def write(self, custom_id, response: dict | None, error: dict | None) -> None:
        self.out.write(json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
                                   "response": response, "error": error}) + "\n")
        self.out.flush()  # whole lines only reach the file, each as soon as it is known
        self.counts["succeeded" if response and response["status_code"] == 200 else "failed"] += 1

    def queue(self, cid: str, url: str, body) -> None:
        """Add the request's prompts to the engine (a prompt it refuses refuses the whole request); one
        that only scores its prompts is answered at once."""
        shown = None
        if url == "/v1/completions":
            prompts, logprobs = body.prompts(), body.logprobs
            max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
            shown = self.echoes(body) if body.echo or max_tokens == 0 else None
            if max_tokens == 0:  # nothing to generate: answered now
                rid = new_id("cmpl")
                return self.answer(cid, rid, envelope(rid, "text_completion", self.model, scored_choices(body, shown),
                                                      usage=usage(sum(len(p.ids) for p in shown), 0)))
        else:
            try:
                prompt = self.template.render(body.template_messages())
            except ValueError as e:
                raise Refused(400, str(e)) from None
            inputs = self.engine.input_processor  # no max_tokens: the rest of the context, as the KV pool holds it
            room = inputs.max_new_tokens(len(inputs.prompt_ids(prompt)[1]), body.samples)
            prompts, max_tokens, logprobs = [prompt], body.requested_max_tokens or max(room, 1), body.engine_logprobs
        ids = []
        try:
            params = body.sampling_params(max_tokens, logprobs, self.engine.model_config.vocab_size)
            for i, prompt in enumerate(prompts):
                ids.append(self.engine.add_request(prompt, params, f"{cid}#{i}"))
        except ValueError as e:
            for rid in ids:
                self.engine.abort(rid)
            raise Refused(400, str(e)) from None
        self.pending[cid] = {"url": url, "body": body, "ids": ids, "done": {}, "shown": shown or [None] * len(ids)}

    def echoes(self, body: CompletionRequest) -> list[EchoedPrompt]:
        """The prompts as echo returns them, scored now (a forward each) when logprobs are asked."""
        out = []
        for i, prompt in enumerate(body.prompts()):
            try:
                out.append(echo_now(self.engine, prompt, body.logprobs if body.echo else None))
            except ValueError as e:
                raise Refused(400, f"prompt {i}: {e}") from None
        return out

    def finish(self, cid: str) -> None:
        job = self.pending.pop(cid)
        outputs = [job["done"][rid] for rid in job["ids"]]
        rid = new_id("cmpl" if job["url"] == "/v1/completions" else "chatcmpl")
        failed = [c for o in outputs for c in o.outputs if c.error is not None]
        if failed:  # constraints that left no token (400), or the engine failed on it alone (500): serve/generation.py
            status = 500 if failed[0].fault else 400
            return self.write(cid, {"status_code": status, "request_id": rid,
                                    "body": error_body(status, failed[0].error)}, None)
        self.answer(cid, rid, completion_body(rid, self.model, job["url"], job["body"], outputs, self.engine.tokenizer,
                                              job["shown"]))

    def answer(self, cid: str, rid: str, body: dict) -> None:
        """Write a request's 200 answer, and count its tokens."""
        self.counts["prompt_tokens"] += body["usage"]["prompt_tokens"]
        self.counts["output_tokens"] += body["usage"]["completion_tokens"]
        self.write(cid, {"status_code": 200, "request_id": rid, "body": body}, None)

    def drain(self) -> None:
        """Step until every queued request is finished, writing each as it ends."""
        owner = {rid: cid for cid, job in self.pending.items() for rid in job["ids"]}
        while self.pending:
            for chunk in self.engine.step():
                if chunk.request is not None:
                    cid = owner.pop(chunk.request_id)
                    job = self.pending[cid]
                    job["done"][chunk.request_id] = chunk.request
                    if len(job["done"]) == len(job["ids"]):
                        self.finish(cid)


def run_batch(input_path, output_path, model: str | None = DEFAULT_MODEL, **engine_config) -> dict:
    """Answer every line of input_path into output_path (appending; lines already answered are
    skipped). model: a bundled name or model directory (None: the default); the lines' body.model
    must name it. engine_config: the flat knobs of LLM(...). -> counts, tokens, generation seconds
    and output tokens/s of this run."""
    model = model or DEFAULT_MODEL
    input_path, output_path = Path(input_path), Path(output_path)
    done_ids, done_lines = resume(output_path)
    engine = LLMEngine(EngineConfig.from_knobs(model, **engine_config))
    seen: set[str] = set()
    skipped = 0
    with output_path.open("a", encoding="utf-8") as out:
        run = BatchRun(engine, model, out)
        for number, text in enumerate(input_path.read_text(encoding="utf-8").splitlines(), start=1):
            if not text.strip():
                continue
            try:
                cid, url, raw = parse_line(text)
                if cid in seen:
                    raise BadLine("duplicate_custom_id", f"custom_id {cid!r} already appears on an earlier line", cid)
            except BadLine as e:
                if number in done_lines:
                    skipped += 1
                else:
                    run.write(e.custom_id, None, {"code": e.code, "message": str(e), "line": number})
                continue
            seen.add(cid)
            if cid in done_ids:
                skipped += 1
                continue
            try:
                run.queue(cid, url, validated(url, raw, model))
            except Refused as e:
                run.write(cid, {"status_code": e.status, "request_id": new_id("req"),
                                "body": error_body(e.status, str(e))}, None)
        start = time.perf_counter()
        run.drain()
        seconds = time.perf_counter() - start
    return {**run.counts, "skipped": skipped, "seconds": seconds,
            "output_throughput": run.counts["output_tokens"] / seconds if seconds > 0 else 0.0}
