"""Splits items with str.splitlines(), which also breaks lines at form feed, vertical tab, \\x1c-\\x1e, NEL,
U+2028 and U+2029: text holding one of them is cut into two lines (SSE ends lines at CR, LF and CRLF only)."""
EXERCISE = "8.1"


def parse_sse(lines):
    data = []

    def decode(payload):
        if payload == "[DONE]":
            return payload
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            return payload

    for item in lines:
        for line in item.splitlines() or [""]:
            if line == "":
                if data:
                    yield decode("\n".join(data))
                data = []
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                if field == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield decode("\n".join(data))
