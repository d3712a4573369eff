"""What the server's OpenAPI schema (/openapi.json) says it answers, so that a client generated from
it, or a fuzzer checking every response against it (tests/serve/test_serve_fuzz.py), reads the truth.

FastAPI documents a 422 for every body it validates; this server answers 400 in OpenAI's error
shape instead (serve/errors.py), so the 422 is dropped and the errors each endpoint can send are
listed. A generation endpoint answers JSON, or server-sent events when `stream` is true. The request
fields whose validators refuse more than their types do say so in the schema too (the *_SCHEMA below).
"""
from fastapi import FastAPI
from pydantic import BaseModel, WithJsonSchema


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# What the schema (/openapi.json) says of the fields whose validators refuse more than their types do, so
# that a client or a fuzzer reading it sends only what is accepted. The types stay wide where a validator
# gives a better message than pydantic's (an empty prompt, a tool choice), and WithJsonSchema says the truth.
_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT_SCHEMA = WithJsonSchema({"anyOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1}, _IDS,
                                          {"type": "array", "items": _IDS, "minItems": 1}]})
STOP_SCHEMA = WithJsonSchema({"anyOf": [_TEXT, {"type": "array", "items": _TEXT}, {"type": "null"}]})
TOOL_CHOICE_SCHEMA = WithJsonSchema({"anyOf": [{"enum": ["none", "auto"]}, {"type": "null"}],
                                     "description": "'auto' only with no tools: tool calls are not supported"})
LOGIT_BIAS_SCHEMA = WithJsonSchema({"anyOf": [{"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                                "additionalProperties": {"type": "number", "minimum": -100,
                                                                         "maximum": 100}}, {"type": "null"}]})
SUFFIX_SCHEMA = WithJsonSchema({"anyOf": [{"type": "string", "maxLength": 0}, {"type": "null"}]})


def _errors(*statuses: int) -> dict:
    return {s: {"model": ErrorResponse, "description": d} for s, d in (
        (400, "invalid request: the message names the field"), (401, "missing or wrong API key"),
        (404, "unknown model"), (413, "request body over the limit"), (429, "queue full: see Retry-After"),
        (500, "the engine failed on this request (the others go on)"),
        (503, "the server shut down before the request finished")) if s in statuses}


_CHOICES = {"type": "object", "required": ["id", "object", "created", "model", "choices"],
            "properties": {"id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
                           "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}},
                           "usage": {"type": ["object", "null"]}}}
# One server-sent event: its data is a chunk's JSON, an error's JSON, or [DONE] (serve/sse.py).
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
GENERATION = {200: {"description": "the completion, or its server-sent events with stream=true",
                    "content": {"application/json": {"schema": _CHOICES}, "text/event-stream": {"schema": _EVENT}}},
              **_errors(400, 401, 404, 413, 429, 500, 503)}
MODEL = {200: {"description": "the model served"}, **_errors(401, 404)}
LISTING = _errors(401)
PROMETHEUS = {200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
              **_errors(401)}


def drop_422(app: FastAPI) -> None:
    """Build the schema as FastAPI does, then remove the 422 responses this server never sends."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema
    app.openapi = openapi
