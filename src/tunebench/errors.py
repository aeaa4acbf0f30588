"""Input errors: a request tunebench cannot understand.

An entity that breaks a validity rule is *not* an error (it is recorded with is_valid false);
an unknown experiment, property, model or GPU, or a value of the wrong type or outside its
domain, is. The CLI prints ``str(error)`` on one line and exits with code 2.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections.abc import Iterable


class InputError(ValueError):
    """A bad input value, named by field, with the allowed values."""

    def __init__(self, field: str, message: str, allowed: str | None = None):
        self.field = field
        self.message = message
        self.allowed = allowed
        text = f"{field}: {message}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


def suggest(value: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean X?' for a close match among choices, else ''."""
    matches = difflib.get_close_matches(str(value), list(choices), n=n, cutoff=0.6)
    if not matches:
        lowered = {c.lower(): c for c in choices}
        matches = [lowered[m] for m in difflib.get_close_matches(str(value).lower(), lowered, n=n, cutoff=0.6)]
    return f" Did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""


def one_of(values: Iterable[object], limit: int = 12) -> str:
    """A short 'a, b, c, ...' rendering of allowed values."""
    items = [str(v) for v in values]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f", ... ({len(items)} in all)"
    return ", ".join(items)


def shown(value: object, limit: int = 60) -> str:
    """repr(value) for an error message, its middle cut when longer than limit characters (a 50,000-
    character value echoed back would bury the message)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return f"{text[:half]}…{text[-half:]} ({len(text):,} characters)"


def one_line(text: str) -> str:
    """text as one printable line: line breaks and tabs become spaces, other control characters are
    escaped (a value echoed back can neither break the line nor send terminal escape sequences)."""
    out = []
    for ch in text:
        if ch in "\r\n\t":
            out.append(" ")
        elif unicodedata.category(ch) == "Cc":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def has_control_characters(text: str) -> bool:
    """Whether text holds a control character (line breaks, tabs and escapes included)."""
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def parse_json(text: str) -> object:
    """JSON text as Python values. ValueError for text that is not JSON, including nesting deeper than the
    interpreter's recursion limit (the json module recurses per level and raises RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
