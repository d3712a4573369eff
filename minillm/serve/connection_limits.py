"""What one connection may cost before its request reaches the app: header size and read timeouts.

uvicorn's default parser (httptools) takes headers of any size, and no uvicorn setting times out a
client that stops mid-request. So the server speaks HTTP through h11, whose parser refuses (400, then
closes) a request whose headers pass `max_header_bytes` (ConnectionGuard measures those that h11 took whole
in one read: 431), and adds two clocks:
- HeaderTimeoutH11: a request's headers must be complete `header_timeout_s` after the connection opens
  or after the request's first byte (uvicorn's keep-alive timeout covers an idle connection only);
- ConnectionGuard: while the app reads a body, each piece must come within `read_timeout_s`; a stalled
  body (or a Content-Length longer than what is sent) is a departed client to the app (which stops its
  work) and a 408 to the client, and the connection closes.
"""
import asyncio
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from minillm.serve.errors import APIError, error_response


@dataclass(frozen=True)
class ConnectionLimits:
    """`minillm serve --max-header-bytes --header-timeout --read-timeout --max-connections` (docs/serving.md)."""
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_connections: int = 1024  # uvicorn's limit_concurrency: past it, 503 at once

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "header_timeout_s", "read_timeout_s", "max_connections"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def uvicorn_options(self) -> dict:
        """The uvicorn.Config settings that enforce these limits."""
        return {"http": lambda *args, **kw: HeaderTimeoutH11(*args, header_timeout_s=self.header_timeout_s, **kw),
                "h11_max_incomplete_event_size": self.max_header_bytes, "limit_concurrency": self.max_connections}


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time."""

    def __init__(self, *args, header_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(self.header_timeout_s, self.transport.close)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in: the app's ConnectionGuard takes over
            self._cancel_header_timer()
        elif self._header_timer is None:  # the first bytes of a next request
            self._header_timer = self.loop.call_later(self.header_timeout_s, self.transport.close)

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None


class ConnectionGuard:
    """ASGI middleware: headers over max_header_bytes -> 431; a request body that stalls for read_timeout_s
    -> 408, the app told the client left. (h11 caps only headers still incomplete when a read ends: ones
    that arrive whole in one read reach the app, and are measured here.)"""

    def __init__(self, app, limits: ConnectionLimits) -> None:
        self.app, self.read_timeout_s, self.max_header_bytes = app, limits.read_timeout_s, limits.max_header_bytes
        self.state = getattr(app, "state", None)  # DrainingServer finds the app's end_streams there

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])  # "name: value\r\n"
        if size > self.max_header_bytes:
            error = APIError(431, f"the request headers are {size} bytes, over the limit of {self.max_header_bytes} "
                             f"bytes (--max-header-bytes)", code="request_header_fields_too_large",
                             headers={"Connection": "close"})
            return await error_response(error)(scope, receive, send)
        body_done, timed_out, started = False, False, False

        async def timed_receive():
            nonlocal body_done, timed_out
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:  # past the body the app only listens for a disconnect: no clock
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def guarded_send(message) -> None:
            nonlocal started
            if timed_out and not started:
                return  # the app's answer to a "departed" client: the 408 goes instead
            started = True
            await send(message)

        await self.app(scope, timed_receive, guarded_send)
        if timed_out and not started:
            error = APIError(408, f"the request body stalled: no data for {self.read_timeout_s:g} s "
                             f"(--read-timeout)", code="request_timeout", headers={"Connection": "close"})
            await error_response(error)(scope, receive, send)
