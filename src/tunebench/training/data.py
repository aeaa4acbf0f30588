"""Training data of a measured run: JSONL records -> token ids with completion-only labels.

Each record's text field (the SFTTrainer spec: ``output``, ``"<prompt>\\n\\n### Response: <response>"``) is
tokenized with the tokenizer's special tokens (BOS), EOS appended (fms-hf-tuning's template
``{{ element['output'] }}{{ eos_token }}``, hf-stack.md §7.2.4) and truncated to
``max_length = min(max_seq_length, tokenizer.model_max_length)``. Labels are -100 up to and
including the response template, found by character offsets (no token-id matching, so no
tokenizer-specific quirk like fms's dropping of the first two template tokens); a record without
the template trains on nothing (all -100), as the reference collator does. Batches are right padded
to the longest sequence of the micro-batch (the SFTTrainer spec "right padded"; the reference's collator pads
to the longest).

Each record also carries its data set tokens, the SFTTrainer spec's note 3 count
``min(len(tokens(entry["output"])), tokenizer.model_max_length, max_seq_length)``: the tokenizer's ids of
the text (special tokens included, as ``tokenizer.encode``), without the EOS the training template
appends, so an untruncated record counts one token less than it trains on.

trl 1.x removed ``response_template``/``DataCollatorForCompletionOnlyLM`` (hf-stack.md §4.3); this
module is the small masking collator that replaces them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100  # labels ignored by the loss (torch CrossEntropyLoss ignore_index)
CHARS_PER_TOKEN_BOUND = 8  # characters per kept token tokenized up front; checked, see tokenize_record


def read_jsonl(path: str | Path, text_field: str) -> list[str]:
    """The text field of every record of a JSONL file."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if text_field not in record:
                raise KeyError(f"{path}:{lineno}: record has no field {text_field!r} (fields: {sorted(record)})")
            texts.append(str(record[text_field]))
    if not texts:
        raise ValueError(f"{path}: no records")
    return texts


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    has_template: bool
    dataset_tokens: int  # min(len(tokens(text)), max_length): the spec's note 3 count (no appended EOS)


def _prefix_chars(max_length: int) -> int:
    return max_length * CHARS_PER_TOKEN_BOUND + 256


def tokenize_record(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    response_template: str,
    max_length: int,
    encoding: Any | None = None,
) -> Example:
    """Token ids (BOS + text + EOS, truncated) and completion-only labels of one record.

    Long records are tokenized on a character prefix of ``8 * max_length + 256`` characters; the
    prefix's ids are kept only when it yields more than ``max_length + 8`` tokens, i.e. when the cut
    lies well past the last kept token (BPE merges stay within pre-tokenized words), so the kept ids
    are those of the whole text; otherwise the whole text is tokenized. ``encoding``: the prefix's
    encoding when already computed in a batch (see build_dataset).
    """
    cut = _prefix_chars(max_length)
    enc = None
    if len(text) > cut:
        enc = encoding if encoding is not None else tokenizer(text[:cut], return_offsets_mapping=True)
        if len(enc["input_ids"]) <= max_length + 8:
            enc = None
    elif encoding is not None:
        enc = encoding
    if enc is None:
        enc = tokenizer(text, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    # A prefix's ids are kept only when it has more than max_length tokens: then the text's count is capped too.
    dataset_tokens = min(len(ids), max_length)
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
        offsets.append((len(text), len(text)))
    ids, offsets = ids[:max_length], offsets[:max_length]
    at = text.find(response_template) if response_template else -1
    if at < 0:
        return Example(ids, [IGNORE_INDEX] * len(ids), False, dataset_tokens)
    end = at + len(response_template)
    # Prompt = tokens starting before the template's end, and special tokens at (0, 0) (BOS).
    labels = [IGNORE_INDEX if s < end else tok for tok, (s, _) in zip(ids, offsets)]
    if eos is not None and ids[-1] == eos and offsets[-1] in ((0, 0), (len(text), len(text))):
        labels[-1] = eos  # EOS is trained on, whichever offset the tokenizer gave it
    return Example(ids, labels, True, dataset_tokens)


class TokenizedDataset(torch.utils.data.Dataset):
    """Pre-tokenized records; item i carries its index so consumed entries can be recorded."""

    def __init__(self, examples: list[Example]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ex = self.examples[i]
        return {"input_ids": ex.input_ids, "labels": ex.labels, "entry_index": i, "dataset_tokens": ex.dataset_tokens}


def build_dataset(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], response_template: str, max_length: int
) -> tuple[TokenizedDataset, dict[str, Any]]:
    """Dataset plus facts for the result: record count, records without the template, token lengths."""
    cut = _prefix_chars(max_length)
    examples = []
    for start in range(0, len(texts), 256):  # batched: the Rust tokenizer encodes a batch in parallel
        chunk = texts[start : start + 256]
        encodings = tokenizer([t[:cut] for t in chunk], return_offsets_mapping=True)
        for j, text in enumerate(chunk):
            enc = {k: encodings[k][j] for k in ("input_ids", "offset_mapping")}
            examples.append(tokenize_record(tokenizer, text, response_template, max_length, enc))
    lengths = [len(e.input_ids) for e in examples]
    info = {
        "records": len(examples),
        "records_without_response_template": sum(not e.has_template for e in examples),
        # records whose every label is -100: no template, or the template cut off by max_length
        "records_without_label_tokens": sum(all(x == IGNORE_INDEX for x in e.labels) for e in examples),
        "max_length": max_length,
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "tokens_mean": sum(lengths) / len(lengths),
        "records_at_max_length": sum(n >= max_length for n in lengths),
    }
    return TokenizedDataset(examples), info


@dataclass
class CompletionCollator:
    """Right-pads a micro-batch to its longest sequence; entry indices and data set token counts stay plain
    lists (not moved to the device; the step meter takes them out before the model's forward)."""

    pad_token_id: int

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(f["input_ids"]) for f in features)
        n = len(features)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        for i, f in enumerate(features):
            k = len(f["input_ids"])
            input_ids[i, :k] = torch.tensor(f["input_ids"], dtype=torch.long)
            labels[i, :k] = torch.tensor(f["labels"], dtype=torch.long)
            attention_mask[i, :k] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "entry_index": [int(f["entry_index"]) for f in features],
            "dataset_tokens": [int(f["dataset_tokens"]) for f in features],
        }


@dataclass
class FlatteningCollator:
    """padding_free: a micro-batch as one row of its samples' tokens, no padding (transformers'
    DataCollatorWithFlattening, what fms-hf-tuning's padding-free plugin swaps in): position ids restart at
    each sample, which the attention reads as sample boundaries (flash-attention's varlen kernel; transformers'
    masking_utils.find_packed_sequence_indices for sdpa and eager), and each sample's first label is -100, so no
    token is predicted across a boundary. Entry indices and data set tokens stay plain lists, as
    CompletionCollator's."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        from transformers import DataCollatorWithFlattening

        batch = DataCollatorWithFlattening(return_tensors="pt")(
            [{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features]
        )
        batch["entry_index"] = [int(f["entry_index"]) for f in features]
        batch["dataset_tokens"] = [int(f["dataset_tokens"]) for f in features]
        return batch
