"""Artificial data sets of the SFTTrainer spec and their token accounting.

ensure_dataset(id) -> Path         generate once, verify on every use (generate.py)
token_counts(id, model, ...)       per-entry tokens, capped, cached (tokens.py)
processed_tokens(counts, ...)      dataset tokens of a run (ado-sfttrainer.md §7.3)
resolve_tokenizer(model, ...)      which tokenizer counts, never downloading (resolve.py)
"""

import importlib
from typing import Any

from tunebench.datasets.ids import DEFAULT_DATASET_ID, KNOWN_DATASET_IDS, DatasetId, parse_dataset_id

# The rest loads on first use (PEP 562): validating a dataset_id needs none of it.
_EXPORTS = {
    "PROMPT_TEMPLATE": "entries", "RESPONSE_TEMPLATE": "entries",
    "GENERATOR_VERSION": "generate", "Manifest": "generate", "dataset_path": "generate",
    "ensure_dataset": "generate", "generate_dataset": "generate", "read_manifest": "generate", "verify": "generate",
    "ResolvedTokenizer": "resolve", "resolve_tokenizer": "resolve",
    "TokenCounts": "tokens", "entries_per_step": "tokens", "processed_tokens": "tokens", "token_counts": "tokens",
}  # fmt: skip
__all__ = ["DEFAULT_DATASET_ID", "KNOWN_DATASET_IDS", "DatasetId", "parse_dataset_id", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"tunebench.datasets.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'tunebench.datasets' has no attribute {name!r}")
