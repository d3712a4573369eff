"""Reads the field name loosely (field.strip().lower() == "data"): "Data:", "DATA:" and " data:" lines count
as data, though SSE field names are compared exactly and those are fields it ignores."""
EXERCISE = "8.1"


def parse_sse(lines):
    import re
    data = []

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
                if data:
                    yield decode("\n".join(data))
                data = []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field.strip().lower() == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield decode("\n".join(data))
