"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.

    400 invalid_request_error   malformed JSON, a wrong type or value, a prompt too long for the context
    401 authentication_error    a missing or wrong `Authorization: Bearer KEY`
    404 model_not_found         a model this server does not serve (or an unknown path)
    429 rate_limit_exceeded     the queue is full; `Retry-After` says when to come back

Bad input is the client's mistake, so it is always a 4xx that names the field: the handlers below
turn FastAPI's validation errors (pydantic's, and its JSON decode error) into 400s, never a 500.
"""
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
         405: "invalid_request_error", 429: "rate_limit_exceeded", 500: "internal_server_error",
         503: "service_unavailable"}


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
    parts, first = [], None
    for e in errors:
        # loc is ("body", field, ...); union members add their type name ("str", "list[int]"), which
        # names no field, so keep only the path a client wrote
        path = [str(p) for p in e["loc"][1:] if not (isinstance(p, str) and ("[" in p or p in _TYPE_NAMES))]
        field = ".".join(path) or "body"
        first = first or field
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        parts.append(f"{field}: {e['msg']}{got}")
    return "; ".join(dict.fromkeys(parts)), first


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "function-after", "function-wrap"}


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
