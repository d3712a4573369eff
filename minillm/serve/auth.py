"""API keys: with one set, every request but `/health` needs `Authorization: Bearer KEY`, else 401.

Checked in plain ASGI before anything else reads the request, so a client without the key learns
nothing else (not even whether its JSON was valid). `/health` stays open for load balancers.
"""
import secrets

from fastapi.responses import JSONResponse

from minillm.serve.errors import error_body

OPEN_PATHS = ("/health",)


class RequireAPIKey:
    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization")
            if given is None or not secrets.compare_digest(given, self.expected):  # constant time
                message = ("missing API key: send the header 'Authorization: Bearer <key>'" if given is None
                           else "invalid API key in the Authorization header")
                response = JSONResponse(error_body(401, message, code="invalid_api_key"), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        await self.app(scope, receive, send)
