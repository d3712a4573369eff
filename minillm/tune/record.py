"""The results file of a search: everything measured and predicted, written as it goes.

    {"inputs": {...}, "profiles": {scheme: StepProfile}, "predicted": {"key @n": figures},
     "measured": {"key @n": figures}, "quality": {scheme: ...}, "recommendation": {...}}

A search resumed with the same file and the same inputs reads what is there and measures only what is
missing; with other inputs it stops, naming what changed (the old measurements answer another question).
"""
import json
import os
from pathlib import Path

SECTIONS = ("profiles", "predicted", "measured", "quality")


class Results:
    def __init__(self, path: str | Path, inputs: dict) -> None:
        self.path = Path(path)
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {"inputs": inputs}
        old = self.data.get("inputs", {})
        changed = {k: (old.get(k), v) for k, v in inputs.items() if old.get(k) != v}
        if changed:
            raise ValueError(f"{self.path} holds a search with other inputs ("
                             + ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in changed.items())
                             + "): pass the same inputs to resume it, or another --results file")
        for section in SECTIONS:
            self.data.setdefault(section, {})

    def get(self, section: str, key: str):
        return self.data[section].get(key)

    def put(self, section: str, key: str, value) -> None:
        self.data[section][key] = value
        self.save()

    def cached(self, section: str, name: str, compute, *args):
        """The file's value, or compute(*args) written there at once: a resumed search repeats nothing."""
        value = self.get(section, name)
        if value is None:
            value = compute(*args)
            self.put(section, name, value)
        return value

    def count(self, section: str) -> int:
        return len(self.data[section])

    def save(self) -> None:
        """Atomically: a Ctrl-C mid-write leaves the last complete file."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)
