"""The user's own sample lengths: what time, throughput and cost assume instead of the data set's entries.

Without them the planner's samples are the experiment's data set's (``dataset_id``; the default
``news-tokens-16384plus-entries-4096`` has entries of 16,384+ tokens, so every sample is cut at
model_max_length). With them (``plan``/``recommend``/``max-batch`` ``--avg-tokens N`` or ``--lengths FILE.jsonl``,
``api.plan(avg_tokens=, lengths=)``):

- a sample's tokens are its own count capped at model_max_length (and the tokenizer's limit): the
  real tokens per sample are the mean of min(count, limit) (what dataset_tokens_per_second counts);
- the GPU processes each micro-batch padded to its longest sample (the Trainer's right padding), so
  the padded tokens per sample are the expected longest of per_device_batch samples drawn from the
  counts (exact for the counts' empirical distribution, ``padded``); with only a mean (--avg-tokens)
  every sample is that long and nothing is padded;
- peak memory still sizes the longest sample: the longest count capped at model_max_length, or
  model_max_length itself with only a mean (a batch of long samples must fit, whatever the mean); a
  padding-free run (one row of a micro-batch's samples) sizes the expected largest of its rows (largest_row).

The number of samples stays the data set's (its entries, with max_steps and num_train_epochs): only
their lengths change. Counting a file (``from_file``): each line is a JSON object whose text is its
``output`` (the field the SFTTrainer spec trains on: ``dataset_text_field``'s default), else ``text``,
else the contents of a chat ``messages`` list, tokenised with the model's tokenizer when one is found
without downloading (tunebench.datasets.resolve: a local path, the Hugging Face cache, an offline
tokenizer package; exact or a stand-in), else ``ceil(characters / 4.5)`` (resolve.FALLBACK_CHARS_PER_TOKEN,
measured on tunebench's prose: 4.68-5.12 characters per token, so 4.5 errs towards more tokens).
Counts include the tokenizer's special tokens (spec note 3: ``len(tokenizer.encode(text))``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy loads when lengths are used: `tunebench --help` imports this module's constant only
    import numpy as np

from tunebench.errors import InputError

ROW_GRID_POINTS = 2**20  # a row's token sums on about this many points: 1-token steps up to b x limit = 1 Mi tokens
MAX_EXACT_ROW = 2**20  # samples a row at most for the exact distribution; more (a batch no GPU holds): normal
TEXT_FIELDS = ("output", "text")  # a line's text: the first of these it has, else its chat "messages"
MAX_AVG_TOKENS = 10**9  # beyond any model_max_length (the spec's domains stop at 2^31 - 1)


@dataclass(frozen=True)
class SampleLengths:
    """Tokens per sample of the user's data for one tokenizer (see the module docstring).

    counts: tokens per sample (one count: --avg-tokens, every sample that long); longest_known:
    whether the longest sample is known (a file) or not (a mean only: memory sizes model_max_length).
    """

    counts: tuple[int | float, ...]
    source: str
    longest_known: bool

    def real(self, limit: np.ndarray) -> np.ndarray:
        """Mean tokens per sample after each is cut at limit (one value per entity; computed once per limit)."""
        import numpy as np

        counts = np.asarray(self.counts, dtype=float)
        caps, where = np.unique(np.asarray(limit, dtype=float), return_inverse=True)
        return np.array([np.minimum(counts, cap).mean() for cap in caps])[where.reshape(-1)]

    def padded(self, limit: np.ndarray, per_device_batch: np.ndarray) -> np.ndarray:
        """Expected tokens of a micro-batch's longest sample (what each sample is padded to), per entity.

        For b samples drawn from the capped counts, P(longest <= v) = F(v)^b, so E[longest] =
        sum over the distinct values v_k of v_k (F(v_k)^b - F(v_(k-1))^b), F the counts' distribution.
        Computed once per (limit, b) pair: a space of 100,000 entities has a few dozen.
        """
        import numpy as np

        counts = np.asarray(self.counts, dtype=float)
        pairs = np.stack(
            [np.asarray(limit, dtype=float), np.maximum(np.asarray(per_device_batch, dtype=float), 1.0)], axis=1
        )
        distinct, where = np.unique(pairs, axis=0, return_inverse=True)
        out = []
        for cap, b in distinct:
            values, seen = np.unique(np.minimum(counts, cap), return_counts=True)
            cdf = np.cumsum(seen) / len(counts)
            below = np.concatenate(([0.0], cdf[:-1]))
            out.append(float(np.sum(values * (cdf**b - below**b))))
        return np.array(out)[where.reshape(-1)]

    def attended(self, limit: np.ndarray) -> np.ndarray:
        """Tokens a token attends over when each sample attends to itself alone (padding-free flash-attention),
        averaged over the tokens: E[s^2] / E[s] of the capped counts (a sample of s tokens has s tokens, each
        with a causal context ~ s), per entity."""
        import numpy as np

        counts = np.asarray(self.counts, dtype=float)
        caps, where = np.unique(np.asarray(limit, dtype=float), return_inverse=True)
        out = []
        for cap in caps:
            capped = np.minimum(counts, cap)
            out.append(float(np.mean(capped**2) / np.mean(capped)))
        return np.array(out)[where.reshape(-1)]

    def largest_row(self, limit: np.ndarray, per_device_batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Expected tokens of the largest of a run's ``rows`` padding-free rows (per_device_batch samples flattened
        into one), per entity. The Trainer's sampler shuffles, so a row is b samples drawn at random (with
        replacement from your capped counts: the run's data set has as many entries as the experiment's, of your
        lengths), and the row that sets peak memory is the largest such sum, not b x the longest sample (which
        few rows hold). Exact, not sampled, so a plan repeats and a larger batch never sizes less: a row's sum
        has the counts' distribution convolved b times (``_row_sum_cdf``, F), and the largest of R rows E[max] =
        sum over sums x of x (F(x)^R - F(x-)^R); at least the longest sample. Unknown without a file (a mean
        only): b x limit."""
        import numpy as np

        limit, b, rows = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (limit, per_device_batch, rows))
        b = np.maximum(b, 1.0)
        if not self.longest_known:
            return np.broadcast_to(b * limit, np.broadcast_shapes(limit.shape, b.shape, rows.shape)).copy()
        counts = np.asarray(self.counts, dtype=float)
        triples = np.stack(np.broadcast_arrays(limit, b, np.maximum(rows, 1.0)), axis=1)
        distinct, where = np.unique(triples, axis=0, return_inverse=True)
        out = []
        for cap, n, r in distinct:
            capped = np.minimum(counts, cap)
            if n > MAX_EXACT_ROW:  # the sum of a million samples is normal: its mean + the largest of R normals' spread
                spread = float(np.std(capped)) * math.sqrt(n) * statistics.NormalDist().inv_cdf(1 - 1 / (r + 1))
                out.append(float(n * capped.mean() + max(spread, 0.0)))
                continue
            sums, cdf = _row_sum_cdf(capped, int(n))
            below = np.concatenate(([0.0], cdf[:-1]))
            # F^R as exp(R ln F): R reaches millions of rows; F = 0 below the shortest row gives 0
            with np.errstate(divide="ignore"):
                top = np.exp(r * np.log(cdf)) - np.exp(r * np.log(below))
            out.append(float(max(np.sum(sums * top), capped.max())))
        return np.array(out)[where.reshape(-1)]

    def longest(self, limit: np.ndarray) -> np.ndarray:
        """Tokens of the longest sample after the cut (memory's length): limit when only a mean is known."""
        import numpy as np

        limit = np.asarray(limit, dtype=float)
        return np.minimum(limit, max(self.counts)) if self.longest_known else limit

    def summary(self) -> dict[str, Any]:
        import numpy as np

        return {
            "samples": len(self.counts),
            "mean_tokens": round(float(np.mean(self.counts)), 3),
            "max_tokens": max(self.counts) if self.longest_known else None,
            "source": self.source,
        }


def _row_sum_cdf(capped: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of the sum of b samples drawn at random from capped token counts: (sums in tokens, their
    cumulative probabilities). One sample's counts on a grid of 1 token, coarser (a power of two: the grids of
    larger batches nest in those of smaller) where b x the longest passes ROW_GRID_POINTS; a count between two
    grid points is split between them in proportion (its mean kept exactly, a step's variance at most added),
    not rounded (rounding put every short sample a half step low or high alike). Convolved b times at once as
    the b-th power of its Fourier transform (a zero-padded FFT as long as the largest sum: a linear, not
    circular, convolution)."""
    import numpy as np

    step = 2.0 ** max(0, math.ceil(math.log2(b * float(capped.max()) / ROW_GRID_POINTS)))
    position = capped / step
    low = np.floor(position).astype(np.int64)
    share = position - low  # of the count's probability on the grid point above
    points = int(low.max()) + 2
    pmf = (np.bincount(low, 1.0 - share, points) + np.bincount(low + 1, share, points)) / len(capped)
    size = b * (points - 1) + 1
    fft_size = 1 << (size - 1).bit_length()
    row = np.fft.irfft(np.fft.rfft(pmf, fft_size) ** b, fft_size)[:size]
    cdf = np.cumsum(np.clip(row, 0.0, None))  # rounding noise below 0 is no probability
    return np.arange(size) * step, np.minimum(cdf / cdf[-1], 1.0)


@dataclass(eq=False)  # hashed by identity: PlanOptions holds it
class UserLengths:
    """--avg-tokens N, or the texts of --lengths FILE counted once per model's tokenizer (for_model)."""

    avg_tokens: float | None = None
    texts: list[str] | None = None
    path: str = ""
    _counted: dict[str, SampleLengths] = field(default_factory=dict, repr=False)

    def for_model(self, model: str, progress: Callable[[int, int], None] | None = None) -> SampleLengths:
        """The sample lengths for the tokenizer of model (a catalog name or a local path)."""
        if self.avg_tokens is not None:
            return SampleLengths((self.avg_tokens,), f"--avg-tokens {self.avg_tokens:g}", longest_known=False)
        if model not in self._counted:
            self._counted[model] = _count(self.texts or [], model, self.path, progress)
        return self._counted[model]


def from_mean(value: float, field: str = "--avg-tokens") -> UserLengths:
    """UserLengths of a mean; InputError naming field unless it is a finite number >= 1."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 1 <= value <= MAX_AVG_TOKENS
    ):
        raise InputError(field, f"{value!r} is not a number of tokens", allowed=f"1 to {MAX_AVG_TOKENS:,}")
    return UserLengths(avg_tokens=float(value))


def from_file(path: str | Path, field: str = "--lengths") -> UserLengths:
    """The texts of a JSONL file of samples (see the module docstring), to count per model; InputError naming
    field and the line for a file that cannot be read, a line that is not a JSON object with text, no line."""
    from tunebench.inputs import text_of

    file = Path(path).expanduser()
    try:
        text = text_of(file)
    except ValueError as exc:
        raise InputError(field, str(exc), allowed="a JSON-lines file of samples") from None
    texts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            texts.append(_line_text(line, f"{field} {file.name} line {number}"))
    if not texts:
        raise InputError(field, f"{str(file)!r} holds no sample", allowed="a JSON-lines file of samples")
    return UserLengths(texts=texts, path=file.name)


def _line_text(line: str, where: str) -> str:
    from tunebench.errors import parse_json

    allowed = 'a JSON object with "output" or "text" (a string), or "messages" (a chat)'
    try:
        row = parse_json(line)
    except ValueError as exc:
        raise InputError(where, f"not JSON: {getattr(exc, 'msg', exc)}", allowed=allowed) from None
    if isinstance(row, dict):
        for name in TEXT_FIELDS:
            if isinstance(row.get(name), str):
                return _non_empty(row[name], where, allowed)
        messages = row.get("messages")
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
            return _non_empty("\n\n".join(_content(m.get("content")) for m in messages), where, allowed)
    raise InputError(where, "has no text", allowed=allowed)


def _non_empty(text: str, where: str, allowed: str) -> str:
    """A sample's text; InputError for one with nothing in it (0 tokens: no sample to train on or to size)."""
    if not text.strip():
        raise InputError(where, "has an empty text (0 tokens)", allowed=allowed)
    return text


def _content(content: Any) -> str:
    """A chat message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return json.dumps(content) if content is not None else ""


def _count(texts: list[str], model: str, name: str, progress: Callable[[int, int], None] | None) -> SampleLengths:
    """Token counts of texts with model's tokenizer (tunebench.datasets.tokens.count_texts), in batches."""
    from tunebench.datasets.resolve import resolve_tokenizer
    from tunebench.datasets.tokens import BATCH, SentenceCounter, _prepared, count_texts

    resolved = resolve_tokenizer(model)
    tok = None if resolved.is_fallback else SentenceCounter(_prepared(resolved.load()))
    counts: list[int] = []
    for start in range(0, len(texts), BATCH):
        counts.extend(n for n, _ in count_texts(texts[start : start + BATCH], tok, None))
        if progress:
            progress(len(counts), len(texts))
    how = "exact" if resolved.exact else ("ceil(characters / 4.5)" if resolved.is_fallback else "a stand-in")
    source = f"{name}: {len(counts):,} samples, tokens by {resolved.name} [{resolved.source}, {how}]"
    return SampleLengths(tuple(counts), source, longest_known=True)
