"""Artificial data sets of spec 004 and their token accounting.

    ensure_dataset(id) -> Path         generate once, verify on every use (generate.py)
    token_counts(id, model, ...)       per-entry tokens, capped, cached (tokens.py)
    processed_tokens(counts, ...)      dataset tokens of a run (ado-sfttrainer.md §7.3)
    resolve_tokenizer(model, ...)      which tokenizer counts, never downloading (resolve.py)
"""

from tunebench.datasets.entries import PROMPT_TEMPLATE, RESPONSE_TEMPLATE
from tunebench.datasets.generate import (
    GENERATOR_VERSION,
    Manifest,
    dataset_path,
    ensure_dataset,
    generate_dataset,
    read_manifest,
    verify,
)
from tunebench.datasets.ids import DEFAULT_DATASET_ID, KNOWN_DATASET_IDS, DatasetId, parse_dataset_id
from tunebench.datasets.resolve import ResolvedTokenizer, resolve_tokenizer
from tunebench.datasets.tokens import TokenCounts, entries_per_step, processed_tokens, token_counts

__all__ = [
    "DEFAULT_DATASET_ID",
    "GENERATOR_VERSION",
    "KNOWN_DATASET_IDS",
    "PROMPT_TEMPLATE",
    "RESPONSE_TEMPLATE",
    "DatasetId",
    "Manifest",
    "ResolvedTokenizer",
    "TokenCounts",
    "dataset_path",
    "ensure_dataset",
    "entries_per_step",
    "generate_dataset",
    "parse_dataset_id",
    "processed_tokens",
    "read_manifest",
    "resolve_tokenizer",
    "token_counts",
    "verify",
]
