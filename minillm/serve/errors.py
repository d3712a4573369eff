"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.

    400 invalid_request_error   malformed JSON, a wrong type or value, a prompt too long for the context
    401 authentication_error    a missing or wrong `Authorization: Bearer KEY`
    404 model_not_found         a model this server does not serve (or an unknown path)
    413 request_too_large       a body over the server's --max-body-bytes
    429 rate_limit_exceeded     the queue is full; `Retry-After` says when to come back
    499 client_closed_request   (logged and counted only: the client left before the answer)
    503 service_unavailable     the server shut down before the request finished

Bad input is the client's mistake, so it is always a 4xx that names the field: the handlers below
turn FastAPI's validation errors (pydantic's, and its JSON decode error) into 400s, never a 500.
"""
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_exceeded",
         499: "client_closed_request", 500: "internal_server_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error the client should see as it is: status, message, the offending parameter, a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code),
                        status_code=error.status, headers=error.headers)


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """FastAPI's list of pydantic errors -> one sentence naming each bad field, and the first field.
    A body that is not JSON at all comes as a single `json_invalid` error."""
    if errors and errors[0].get("type") == "json_invalid":
        return f"the request body is not valid JSON: {errors[0].get('ctx', {}).get('error', errors[0]['msg'])}", None
    by_field: dict[str, list[dict]] = {}
    for e in errors:
        # loc is ("body", field, ...); a union adds the member's type ("str", "list[int]") after the field
        path = [str(p) for p in e["loc"][1:] if not _is_type_tag(p)]
        by_field.setdefault(".".join(path[:1]) or "body", []).append(e)
    parts = []
    for field, errs in by_field.items():
        tags = list(dict.fromkeys(p for e in errs for p in e["loc"][1:] if _is_type_tag(p)))
        if len(tags) > 1:  # no member of a union took the value: list what is accepted
            whole = next((e["input"] for e in errs if len(e["loc"]) == 3), None)
            got = f"got {whole!r}; " if whole is not None else ""
            parts.append(f"{field}: {got}accepted: {' | '.join(tags)}")
            continue
        for e in errs:
            path = ".".join(str(p) for p in e["loc"][1:] if not _is_type_tag(p)) or field
            got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
            parts.append(f"{path}: {e['msg']}{got}")
    return "; ".join(dict.fromkeys(parts)), next(iter(by_field), None)


def _is_type_tag(part) -> bool:
    return isinstance(part, str) and ("[" in part or part in _TYPE_NAMES or part.startswith("function-"))


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return JSONResponse(error_body(400, message, param), status_code=400)

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(exc.status_code, message, code="not_found" if exc.status_code == 404 else None),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # the client learns that it is our fault, not the internals (those go to the server log)
        return JSONResponse(error_body(500, f"internal server error: {type(exc).__name__}"), status_code=500)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal)
