"""Token accounting of data set entries (the SFTTrainer spec note 3; ado-sfttrainer.md §7.3).

Per entry: ``min(len(tokens(entry["output"])), tokenizer.model_max_length, max_seq_length)``,
where tokens() is the tokenizer's encode with its special tokens (as ``tokenizer.encode`` in
transformers). A run's dataset tokens are the sum over the entries it processed, in order,
wrapping around the data set, without the warm-up entries when asked (processed_tokens).

Counting is batched (``tokenizers`` encode_batch_fast, all cores), overlapped with reading,
and identical entries are tokenised once. So are identical sentences (SentenceCounter): an entry's
count is the sum of its sentences' counts, each distinct sentence tokenised once, which is exact when
no token spans ". " (pre-tokenizers split before the blank: byte-level BPE, tiktoken, SentencePiece's
Metaspace) and is checked against whole-entry counts on the first texts; a tokenizer that fails the
check counts whole entries. Passages of one book share most sentences, so news-tokens-16384plus-entries-4096
(86 M tokens) tokenises ~2 M. An entry longer than the cap
is not tokenised whole: a prefix of PREFIX_CHARS_PER_TOKEN x cap characters, cut at a blank, is
tokenised first, and if it already has >= cap tokens the entry counts cap. This relies on a
prefix cut at whitespace never having more tokens than the whole text, true for tokenizers whose
pieces do not cross whitespace (byte-level BPE, tiktoken, SentencePiece; tests check it).

Counts are cached in ``<data_dir>/cache/tokens/<id>/<dataset sha256[:16]>-<tokenizer
fingerprint[:16]>.json``: per entry a count and whether it is complete (whole entry) or a lower
bound (a prefix), so one cache serves every max length.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebench import paths
from tunebench.datasets.entries import chat_text
from tunebench.datasets.generate import ensure_dataset, read_manifest, write_atomic
from tunebench.datasets.ids import DatasetId, parse_dataset_id
from tunebench.datasets.resolve import FALLBACK_CHARS_PER_TOKEN, ResolvedTokenizer, resolve_tokenizer
from tunebench.errors import InputError

# Our prose has at most 5.12 chars per token (Llama-3, the densest offline tokenizer); 5.4 makes
# the first prefix hold ~1.05-1.15 x cap tokens, so a second pass is rare (entries.py docstring).
PREFIX_CHARS_PER_TOKEN = 5.4
BATCH = 256  # entries per encode_batch_fast call: enough to keep both cores busy
# Where a text is cut into sentences: before the blank that follows sentence punctuation (not before a line
# break: Llama-3's pre-tokenizer keeps ".\n\n" in one piece).
SENTENCE_END = re.compile(r"(?<=[.!?])(?= )")
VERIFY_TEXTS = 4  # texts counted both whole and by sentences before the sentences are trusted
CACHE_VERSION = "1"


@dataclass(frozen=True)
class TokenCounts:
    """Per-entry token counts of one data set for one tokenizer, capped at max_length.

    max_length: min(tokenizer.model_max_length, max_seq_length) in tokens, None = no cap.
    seconds: wall time of the call; from_cache: no tokenisation was needed. exact: the counts
    are the model's own (not a stand-in or the fallback, and not a vision id, whose image and
    chat-template tokens are not counted).
    """

    dataset_id: str
    tokenizer: str
    source: str
    exact: bool
    max_length: int | None
    counts: tuple[int, ...]
    from_cache: bool
    seconds: float

    # Statistics of the capped counts: how many entries, and tokens in all, least, most and on average.
    entries = property(lambda self: len(self.counts))
    total = property(lambda self: sum(self.counts))
    min = property(lambda self: min(self.counts))
    max = property(lambda self: max(self.counts))
    mean = property(lambda self: self.total / len(self.counts))

    def processed(
        self, entries_per_step: int, training_steps: int, warmup_steps: int = 0, exclude_warmup: bool = True
    ) -> int:
        """Dataset tokens of a run; see processed_tokens."""
        return processed_tokens(self.counts, entries_per_step, training_steps, warmup_steps, exclude_warmup)

    def summary(self) -> dict[str, Any]:
        return {
            "dataset_id": self.dataset_id,
            "entries": self.entries,
            "min_tokens": self.min,
            "avg_tokens": round(self.mean, 3),
            "max_tokens": self.max,
            "total_tokens": self.total,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer,
            "tokenizer_source": self.source,
            "exact": self.exact,
            "from_cache": self.from_cache,
            "seconds": round(self.seconds, 3),
        }


def entries_per_step(per_device_batch_size: int, world_size: int, gradient_accumulation_steps: int) -> int:
    """Entries consumed per optimizer step (ado-sfttrainer.md §7.3 step 1; 0 GPUs = 1 device)."""
    return per_device_batch_size * max(1, world_size) * max(1, gradient_accumulation_steps)


def processed_tokens(
    counts: Sequence[int],
    entries_per_step: int,
    training_steps: int,
    warmup_steps: int = 0,
    exclude_warmup: bool = True,
) -> int:
    """Sum of per-entry counts over the entries a run processed (ado-sfttrainer.md §7.3).

    The run consumes entries 0, 1, ... in order, wrapping around the data set, entries_per_step
    per step: first warmup_steps steps of warm-up, then training_steps steps. With exclude_warmup
    only the training steps' entries count; otherwise the warm-up's count as well.
    """
    if entries_per_step < 0 or training_steps < 0 or warmup_steps < 0:
        raise InputError("steps", "entries_per_step, training_steps and warmup_steps must be >= 0")
    if not counts:
        raise InputError("counts", "no entries to count")
    skipped = entries_per_step * warmup_steps if exclude_warmup else 0
    stop = entries_per_step * (warmup_steps + training_steps)
    return _cyclic_sum(counts, stop) - _cyclic_sum(counts, skipped)


def _cyclic_sum(counts: Sequence[int], n: int) -> int:
    """Sum of the first n entries of counts repeated forever."""
    laps, rest = divmod(n, len(counts))
    return laps * sum(counts) + sum(counts[:rest])


def token_counts(
    dataset_id: str | DatasetId,
    model: str | os.PathLike | None = None,
    *,
    tokenizer: Any = None,
    max_seq_length: int | None = None,
    data_dir: str | os.PathLike | None = None,
    model_map: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    use_cache: bool = True,
) -> TokenCounts:
    """Per-entry token counts of a data set for a model's tokenizer (resolve.py order).

    max_seq_length: the run's limit in tokens (None = only the tokenizer's own limit). Generates
    the data set first if needed. Validates the id and the model before writing anything.
    """
    t0 = time.perf_counter()
    spec = dataset_id if isinstance(dataset_id, DatasetId) else parse_dataset_id(dataset_id)
    if max_seq_length is not None and max_seq_length < 1:
        raise InputError("max_seq_length", f"must be a positive number of tokens, got {max_seq_length}")
    resolved = resolve_tokenizer(model, tokenizer=tokenizer, model_map=model_map)
    caps = [c for c in (resolved.model_max_length, max_seq_length) if c is not None]
    cap = min(caps) if caps else None

    manifest = read_manifest(spec, data_dir)
    counts = complete = None
    if use_cache and manifest is not None:  # counts describe the bytes the manifest names
        cache = _cache_path(spec, manifest.sha256, resolved, data_dir)
        counts, complete = _read_cache(cache, manifest.entries, manifest.sha256, resolved.fingerprint)
        if counts is not None and _enough(counts, complete, cap):
            return _result(spec, resolved, cap, counts, True, t0)

    path = ensure_dataset(spec, data_dir)  # verifies sha256; regenerates a corrupt file
    fresh = read_manifest(spec, data_dir)
    if counts is None or manifest is None or fresh.sha256 != manifest.sha256:
        counts, complete = [0] * fresh.entries, [False] * fresh.entries
    cache = _cache_path(spec, fresh.sha256, resolved, data_dir)
    tok = SentenceCounter(_prepared(resolved.load())) if not resolved.is_fallback else None
    _count_file(path, spec, tok, cap, counts, complete, progress)
    if use_cache:  # atomic replace: concurrent writers leave one complete, valid cache file
        write_atomic(
            cache,
            json.dumps(
                {
                    "version": CACHE_VERSION,
                    "dataset_id": spec.id,
                    "dataset_sha256": fresh.sha256,
                    "tokenizer": resolved.name,
                    "tokenizer_fingerprint": resolved.fingerprint,
                    "counts": counts,
                    "complete": [int(c) for c in complete],
                }
            ).encode(),
        )
    return _result(spec, resolved, cap, counts, False, t0)


def _count_file(
    path: Path,
    spec: DatasetId,
    tok: Any,
    cap: int | None,
    counts: list[int],
    complete: list[bool],
    progress: Callable[[int, int], None] | None,
) -> None:
    """Fill counts/complete for the entries not yet known at cap, in place.

    Identical entries are tokenised once (keyed by length and hash), and the next batch is read
    and parsed while a worker thread tokenises the current one (tokenizers releases the GIL).
    """
    memo: dict[tuple[int, int], tuple[int, bool]] = {}
    waiting: dict[tuple[int, int], list[int]] = {}  # submitted text -> entries that need it

    def finish(job) -> None:
        future, keys = job
        for key, result in zip(keys, future.result(), strict=True):
            memo[key] = result
            for i in waiting.pop(key):
                counts[i], complete[i] = result

    done, job = 0, None
    with ThreadPoolExecutor(max_workers=1) as pool:
        for start, texts in _batches(path, spec, BATCH):
            keys, todo = [], []
            for i, text in enumerate(texts, start):
                if _known(counts, complete, i, cap):
                    continue
                key = (len(text), hash(text))
                if key in memo:
                    counts[i], complete[i] = memo[key]
                elif key in waiting:
                    waiting[key].append(i)
                else:
                    waiting[key] = [i]
                    keys.append(key)
                    todo.append(text)
            if job:
                finish(job)
            job = (pool.submit(count_texts, todo, tok, cap), keys) if todo else None
            done += len(texts)
            if progress:
                progress(done, len(counts))
        if job:
            finish(job)


def count_texts(texts: Sequence[str], tok: Any, cap: int | None) -> list[tuple[int, bool]]:
    """(tokens, whole) per text: exact count if whole, else a lower bound >= cap from a prefix.

    tok: a ``tokenizers.Tokenizer`` (specials added as by transformers' encode), an object with
    ``count_batch`` (offline.TiktokenCounter), or None for the fallback rule
    ceil(chars / FALLBACK_CHARS_PER_TOKEN).
    """
    if tok is None:
        return [(math.ceil(len(t) / FALLBACK_CHARS_PER_TOKEN), True) for t in texts]
    out: list[tuple[int, bool] | None] = [None] * len(texts)
    pending = list(range(len(texts)))
    limit = None if cap is None else int(cap * PREFIX_CHARS_PER_TOKEN)
    while pending:
        pieces, wholes = [], []
        for i in pending:
            t = texts[i]
            cut = -1 if limit is None or len(t) <= limit else t.rfind(" ", 0, limit)
            pieces.append(t if cut <= 0 else t[:cut])
            wholes.append(cut <= 0)
        lengths = _lengths(tok, pieces)
        retry = []
        for i, n, whole in zip(pending, lengths, wholes, strict=True):
            if whole or n >= cap:
                out[i] = (n, whole)
            else:
                retry.append(i)  # the prefix was too short to prove the cap: take a longer one
        pending = retry
        limit = None if limit is None else limit * 2
    return out  # type: ignore[return-value]


class SentenceCounter:
    """Token counts of texts as the sum of their sentences' counts, each distinct sentence tokenised once.

    A text's tokens = the tokenizer's specials (its count of "") + each sentence's tokens without them, when
    the pre-tokenizer splits before the blank after a sentence (checked on the first VERIFY_TEXTS texts counted
    whole; if any differs, every text is counted whole). Used from one thread at a time (_count_file's worker).
    """

    def __init__(self, tok: Any):
        self.tok = tok
        self.specials = _lengths(tok, [""])[0]
        self.memo: dict[str, int] = {}  # sentence -> tokens without specials
        self.additive: bool | None = None  # None: not checked yet

    def count_batch(self, texts: list[str]) -> list[int]:
        if self.additive is None and texts:
            sample = texts[:VERIFY_TEXTS]
            self.additive = self._by_sentences(sample) == _lengths(self.tok, sample)
        return self._by_sentences(texts) if self.additive else _lengths(self.tok, texts)

    def _by_sentences(self, texts: list[str]) -> list[int]:
        split = [SENTENCE_END.split(t) for t in texts]
        new = list({s: None for parts in split for s in parts if s not in self.memo})
        for sentence, n in zip(new, _lengths(self.tok, new), strict=True):
            self.memo[sentence] = n - self.specials
        return [self.specials + sum(self.memo[s] for s in parts) for parts in split]


def iter_texts(path: Path, spec: DatasetId) -> Iterator[str]:
    """The text of each entry of a data set file: ``output`` (text ids) or the chat's texts."""
    if spec.is_vision:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(str(path)).iter_batches(batch_size=BATCH, columns=["output"]):
            for chat in batch.column(0).to_pylist():
                yield chat_text(chat)
    else:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["output"]


def _batches(path: Path, spec: DatasetId, size: int) -> Iterator[tuple[int, list[str]]]:
    batch: list[str] = []
    start = 0
    for text in iter_texts(path, spec):
        batch.append(text)
        if len(batch) == size:
            yield start, batch
            start += size
            batch = []
    if batch:
        yield start, batch


def _lengths(tok: Any, texts: list[str]) -> list[int]:
    """Token counts of texts with specials; tok is a tokenizers.Tokenizer or has count_batch."""
    if not texts:
        return []
    if hasattr(tok, "count_batch"):  # offline.TiktokenCounter, SentenceCounter
        return tok.count_batch(texts)
    fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.20: no offsets, faster
    return [len(e.ids) for e in (fast(texts) if fast else tok.encode_batch(texts))]


def _prepared(tok: Any) -> Any:
    """The tokenizer without truncation or padding (a copy when the given one has them)."""
    if getattr(tok, "truncation", None) is None and getattr(tok, "padding", None) is None:
        return tok
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tok.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _known(counts: list[int], complete: list[bool], i: int, cap: int | None) -> bool:
    return complete[i] or (cap is not None and counts[i] >= cap)


def _enough(counts: list[int], complete: list[bool], cap: int | None) -> bool:
    return all(_known(counts, complete, i, cap) for i in range(len(counts)))


def _result(
    spec: DatasetId, r: ResolvedTokenizer, cap: int | None, counts: list[int], cached: bool, t0: float
) -> TokenCounts:
    capped = tuple(counts) if cap is None else tuple(min(n, cap) for n in counts)
    exact = r.exact and not spec.is_vision  # vision: the chat's text only, no image/template tokens
    return TokenCounts(spec.id, r.name, r.source, exact, cap, capped, cached, time.perf_counter() - t0)


def _cache_path(spec: DatasetId, sha: str, r: ResolvedTokenizer, data_dir) -> Path:
    return paths.data_dir(data_dir) / "cache" / "tokens" / spec.id / f"{sha[:16]}-{r.fingerprint[:16]}.json"


def _read_cache(path: Path, entries: int, sha: str, fingerprint: str) -> tuple[list[int] | None, list[bool] | None]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(raw, dict):
        return None, None
    counts, complete = raw.get("counts"), raw.get("complete")
    valid = (
        raw.get("version") == CACHE_VERSION
        and raw.get("dataset_sha256") == sha
        and raw.get("tokenizer_fingerprint") == fingerprint
        and isinstance(counts, list)
        and len(counts) == entries
        and isinstance(complete, list)
        and len(complete) == entries
    )
    if not valid:
        return None, None
    return [int(n) for n in counts], [bool(c) for c in complete]
