"""Yields an event only at its blank line: a stream that ends without one loses its last event."""
EXERCISE = "8.1"


def parse_sse(lines):
    import re
    data = []
    for item in lines:
        pieces = re.split(r"\r\n|\r|\n", item)
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()
        for line in pieces:
            if line == "":
                if data:
                    payload = "\n".join(data)
                    try:
                        yield payload if payload == "[DONE]" else json.loads(payload)
                    except json.JSONDecodeError:
                        yield payload
                data = []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
