"""Server-sent events: how a streaming HTTP response (OpenAI, vLLM, SGLang) carries its chunks.

The wire format (WHATWG HTML, "server-sent events"), one field per line:

    data: {"choices": [{"text": "def"}]}      <- a data line; "data:" then an optional space
    : keep-alive                               <- a comment: ignored
                                               <- a blank line ends the event
    data: [DONE]                               <- OpenAI's end-of-stream marker

An event's several data lines are joined with "\n". Lines end in LF, CRLF or CR. Fields other
than data (event, id, retry) carry nothing a completion stream needs, so they are skipped.
"""
import json
import re
from collections.abc import Iterable, Iterator

DONE = "[DONE]"
_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_sse(lines: Iterable[str]) -> Iterator[dict | str]:
    """Decode a stream of SSE lines into its events' payloads, in order.

    lines: the response's lines, with or without their line endings (an item holding several
    lines is split). Yields each event's data decoded as JSON, the string "[DONE]" for the end
    marker, and the raw text of a payload that is not JSON. An event still open when the lines
    run out (no trailing blank line) is yielded too: a truncated stream should not lose its tail.
    """
    data: list[str] = []
    for item in lines:
        pieces = _LINE_END.split(item)
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()  # the item's own line ending, not an extra blank line
        for line in pieces:
            if line == "":
                if data:
                    yield _decode("\n".join(data))
                    data = []
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                if field == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield _decode("\n".join(data))


def _decode(payload: str) -> dict | str:
    if payload == DONE:
        return DONE
    try:
        return json.loads(payload)
    except json.JSONDecodeError:
        return payload
