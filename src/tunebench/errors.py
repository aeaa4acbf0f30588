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
from typing import Any


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


# Names people type for tunebench's (other tools' spellings, abbreviations), one table for every
# suggestion: LoRA's rank is the spec's property r, a sequence length is model_max_length.
ALIASES = {
    "lora_r": "r",
    "lora_rank": "r",
    "rank": "r",
    "max_seq_length": "model_max_length",
    "max_seq_len": "model_max_length",
    "seq_len": "model_max_length",
    "sequence_length": "model_max_length",
    "max_length": "model_max_length",
    "num_gpus": "number_gpus",
    "gpus": "number_gpus",
    "num_nodes": "number_nodes",
    "nodes": "number_nodes",
    "model": "model_name",
    "gpu": "gpu_model",
    "gpu_type": "gpu_model",
    "epochs": "num_train_epochs",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation": "gradient_accumulation_steps",
    "dataset": "dataset_id",
    "dtype": "torch_dtype",
    "--price": "--price-per-gpu-hour",
    "--cost": "--price-per-gpu-hour",
    "--gpus": "--max-gpus",
    "--oom-risk": "--max-oom-risk",
}


def suggest(value: str, choices: Iterable[str], n: int = 3) -> str:
    """' Did you mean X?' for the likeliest choices, else '': an alias's name (ALIASES), then choices that
    start with value (shortest first: a truncated name), then close matches (difflib)."""
    choices = list(choices)
    text = str(value)
    matches = [ALIASES[text.lower()]] if ALIASES.get(text.lower()) in choices else []
    if len(text) >= 3:
        matches += sorted((c for c in choices if c.lower().startswith(text.lower()) and c != text), key=len)
    matches += difflib.get_close_matches(text, choices, n=n, cutoff=0.6)
    lowered = {c.lower(): c for c in choices}
    matches += [lowered[m] for m in difflib.get_close_matches(text.lower(), lowered, n=n, cutoff=0.6)]
    matches = list(dict.fromkeys(matches))[:n]
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


def parse_json(text: str, unique_keys: bool = False) -> object:
    """JSON text as Python values. ValueError for text that is not JSON, including nesting deeper than the
    interpreter's recursion limit (the json module recurses per level and raises RecursionError); unique_keys:
    also for an object that names a key twice (json keeps the last silently), where the keys are the request
    (a --batch line), not where others' files are read as their own readers read them (a config.json, data)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} twice in one object")
        out[key] = value
    return out
