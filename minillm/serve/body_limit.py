"""A cap on request bodies: a larger one is refused with 413 before it is read whole.

Without a cap one client can send megabytes that the server parses and tokenizes while every
open stream waits. The Content-Length header is checked first; a body sent without one (chunked)
is counted as it arrives and refused once it passes the cap.
"""
from starlette.exceptions import HTTPException

from minillm.serve.errors import APIError, error_response

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024  # 2 MiB: a full 8k-token context as JSON token ids is ~60 kB


class LimitBody:
    """ASGI middleware: bodies over max_bytes -> 413 request_too_large."""

    def __init__(self, app, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    def _message(self, size: str) -> str:
        return f"the request body is {size}, over the limit of {self.max_bytes} bytes (--max-body-bytes)"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(APIError(413, self._message(f"{int(declared)} bytes"),
                                               code="request_too_large"))
            return await response(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # FastAPI re-raises an HTTPException met while reading the body
                    raise HTTPException(413, self._message(f"more than {received - 1} bytes"))
            return message

        await self.app(scope, counting_receive, send)
