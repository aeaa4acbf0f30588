"""Dataset identifiers of the SFTTrainer spec ("dataset_id") and their generalisation.

    news-chars-N-entries-M          M entries, N characters of input and N of response (+ prompt)
    news-tokens-Kplus-entries-M     M entries of at least K tokens ("16384plus", "128kplus")
    vision-WxH-Kplus-entries-M      M rows: one WxH JPEG + a chat of at least K tokens

The seven ids the spec names are KNOWN_DATASET_IDS; any id of the grammar above is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunebench.errors import InputError, suggest

# the SFTTrainer spec, "dataset_id" (finetune_* experiments); 128kplus appears in the stability experiment.
KNOWN_DATASET_IDS: tuple[str, ...] = (
    "news-chars-512-entries-4096",
    "news-chars-1024-entries-4096",
    "news-chars-2048-entries-4096",
    "news-tokens-16384plus-entries-4096",
    "news-tokens-128kplus-entries-320",
    "vision-384x384-16384plus-entries-4096",
    "vision-384x768-16384plus-entries-4096",
)
DEFAULT_DATASET_ID = "news-tokens-16384plus-entries-4096"

_CHARS = re.compile(r"^news-chars-(?P<n>[1-9]\d*)-entries-(?P<m>[1-9]\d*)$")
_TOKENS = re.compile(r"^news-tokens-(?P<k>[1-9]\d*)(?P<kilo>k?)plus-entries-(?P<m>[1-9]\d*)$")
_VISION = re.compile(
    r"^vision-(?P<w>[1-9]\d*)x(?P<h>[1-9]\d*)-(?P<k>[1-9]\d*)(?P<kilo>k?)plus-entries-(?P<m>[1-9]\d*)$"
)
GRAMMAR = "news-chars-N-entries-M, news-tokens-Kplus-entries-M, vision-WxH-Kplus-entries-M"


@dataclass(frozen=True)
class DatasetId:
    """A parsed dataset id. kind is 'chars', 'tokens' or 'vision'."""

    id: str
    kind: str
    entries: int
    chars: int | None = None  # news-chars: characters of input (and of response)
    min_tokens: int | None = None  # news-tokens / vision: lower bound of tokens per entry
    width: int | None = None  # vision: image width in pixels
    height: int | None = None  # vision: image height in pixels

    @property
    def is_vision(self) -> bool:
        return self.kind == "vision"

    @property
    def suffix(self) -> str:
        """File suffix: text data sets are JSON lines, vision data sets parquet (SFTTrainer spec)."""
        return ".parquet" if self.is_vision else ".jsonl"


def _kilo(k: str, kilo: str) -> int:
    return int(k) * (1024 if kilo else 1)


def parse_dataset_id(value: str) -> DatasetId:
    """Parse a dataset id; InputError naming dataset_id if it fits none of the forms."""
    text = str(value).strip()
    if m := _CHARS.match(text):
        return DatasetId(text, "chars", int(m["m"]), chars=int(m["n"]))
    if m := _TOKENS.match(text):
        return DatasetId(text, "tokens", int(m["m"]), min_tokens=_kilo(m["k"], m["kilo"]))
    if m := _VISION.match(text):
        return DatasetId(
            text, "vision", int(m["m"]), min_tokens=_kilo(m["k"], m["kilo"]), width=int(m["w"]), height=int(m["h"])
        )
    raise InputError(
        "dataset_id",
        f"unknown dataset id {text!r}." + suggest(text, KNOWN_DATASET_IDS),
        allowed=", ".join(KNOWN_DATASET_IDS) + f", or the forms {GRAMMAR}",
    )
