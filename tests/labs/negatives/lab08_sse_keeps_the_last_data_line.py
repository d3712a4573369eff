"""Keeps only the last data line of an event instead of joining them with newlines."""
EXERCISE = "8.1"


def parse_sse(lines):
    import re
    data = None

    def decode(payload):
        if payload == "[DONE]":
            return payload
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            return payload

    for item in lines:
        pieces = re.split(r"\r\n|\r|\n", item)
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()
        for line in pieces:
            if line == "":
                if data is not None:
                    yield decode(data)
                data = None
            elif line.startswith("data:"):
                value = line[5:]
                data = value[1:] if value.startswith(" ") else value
    if data is not None:
        yield decode(data)
