"""A large JSON answer sent in pieces, each encoded in a worker thread.

A scoring answer (prompts x n choices, each with every prompt token's top logprobs) can run to a
hundred megabytes. Returned as a dict, FastAPI would encode it on the event loop in one go, and
json.dumps holds the GIL throughout, so even a worker thread encoding it whole would stall every
stream and /health. Encoded one choice at a time, the loop waits at most one choice's encoding (a few
ms), and a client that leaves stops the rest: Starlette cancels a streaming response on disconnect.
"""
import asyncio
import json

from fastapi.responses import StreamingResponse


def json_in_pieces(payload: dict, key: str = "choices") -> StreamingResponse:
    """payload as a JSON response body whose payload[key] (a list) is encoded item by item, off the loop."""
    head = {k: v for k, v in payload.items() if k != key}

    async def pieces():
        yield json.dumps(head)[:-1].encode() + f'{", " if head else ""}"{key}": ['.encode()
        for i, item in enumerate(payload[key]):
            yield (b", " if i else b"") + (await asyncio.to_thread(json.dumps, item)).encode()
        yield b"]}"
    return StreamingResponse(pieces(), media_type="application/json")
