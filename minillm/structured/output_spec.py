"""StructuredOutput: what a request's output must match. Plain data: it imports no grammar engine."""
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of: json_schema (a JSON Schema, as a dict or its JSON text), json_object (any JSON
    object), regex (the whole output matches it), grammar (EBNF in the GBNF dialect llama.cpp and
    xgrammar read, with a `root` rule)."""
    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(f"structured output needs exactly one of json_schema, json_object, regex, grammar; "
                             f"got {', '.join(given) or 'none'}")
        if isinstance(self.json_schema, str):
            try:
                schema = json.loads(self.json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
            object.__setattr__(self, "json_schema", schema)
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValueError(f"json_schema must be a JSON object (a dict), got {type(self.json_schema).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")

    def key(self) -> tuple[str, Any]:
        """A hashable name for the compiled grammar (equal specs share one compilation)."""
        if self.json_schema is not None:
            return "json_schema", json.dumps(self.json_schema, sort_keys=True)
        if self.json_object:
            return "json_object", None
        return ("regex", self.regex) if self.regex is not None else ("grammar", self.grammar)
