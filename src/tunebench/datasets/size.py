"""What a data set costs before it exists: bytes on disk, bytes of memory while it is generated.

A data set id is a few numbers anyone can type (``news-chars-512-entries-999999999999``); generating
it blindly grew the file by 60 MB/s until the process was killed. ``check_room`` estimates both
costs from the id and refuses (InputError naming dataset_id, nothing written) when this machine
does not have them.

The estimates follow the generator (generate.py, entries.py, vision.py) with constants measured on
its output (tunebench 0.1, generator version 2; tests/datasets/test_size.py checks them against real
files):

- a news-chars entry is 2 N characters plus ~170 bytes of template and JSON;
- a news-tokens entry is ~6.3 bytes per word of its K-word response plus ~200 bytes;
- a vision row holds the same K-word chat, compressed by parquet to about a third, and each row
  group (128 rows) stores the JPEG once (dictionary encoding); the JPEG of the test image is below
  0.1 byte per pixel;
- generation keeps the prose "book" (~48 bytes per word, twice the longest passage), one int per
  entry (the first sentences, ~36 bytes each), one chunk of entries, and for vision the RGB canvas
  (3 bytes per pixel) and a row group's image column.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tunebench.datasets.entries import BOOK_MIN_WORDS, TEXT_INPUT_WORDS, VISION_USER_WORDS
from tunebench.datasets.generate import WRITE_CHUNK
from tunebench.datasets.ids import DatasetId
from tunebench.limits import check_disk, check_memory

CHARS_ENTRY_OVERHEAD = 170  # template, JSON quoting and escapes of a news-chars entry (measured 147-173)
BYTES_PER_WORD = 6.5  # response prose incl. the space (measured 6.24 at 4096 words)
TOKENS_ENTRY_OVERHEAD = 200  # template, input words and JSON of a news-tokens entry
JPEG_BYTES_PER_PIXEL = 0.1  # the test image (two circles) compresses to 0.02-0.07 byte per pixel
BOOK_BYTES_PER_WORD = 48  # peak while the book is built (measured with tracemalloc: 45.3, plus a fixed ~0.1 MB)
PARQUET_TEXT_RATIO = 0.35  # a vision row's chat in snappy parquet vs its text (measured 0.32)
ENTRY_INDEX_BYTES = 36  # a Python int in a list, per entry
CHUNK_COPIES = 3  # a chunk lives as strings, the joined text and its encoded bytes at once


@dataclass(frozen=True)
class Cost:
    """Estimated bytes of a data set: its file, and the peak memory of generating it."""

    disk: float
    memory: float


def entry_bytes(spec: DatasetId) -> float:
    """Bytes of one entry (a JSON line, or a vision row's text) in the file."""
    if spec.kind == "chars":
        return 2 * spec.chars + CHARS_ENTRY_OVERHEAD
    words = spec.min_tokens + (VISION_USER_WORDS if spec.is_vision else TEXT_INPUT_WORDS)
    return words * BYTES_PER_WORD + TOKENS_ENTRY_OVERHEAD


def cost(spec: DatasetId) -> Cost:
    """What generating spec needs (see the module docstring for where the numbers come from)."""
    entry = entry_bytes(spec)
    longest = (spec.min_tokens or 0) + (spec.chars or 0) // 2 + VISION_USER_WORDS + TEXT_INPUT_WORDS
    memory = max(BOOK_MIN_WORDS, 2 * longest) * BOOK_BYTES_PER_WORD + spec.entries * ENTRY_INDEX_BYTES
    disk = spec.entries * entry
    if spec.is_vision:
        from tunebench.datasets.vision import ROWS_PER_GROUP

        pixels = spec.width * spec.height
        image = pixels * JPEG_BYTES_PER_PIXEL
        groups = -(-spec.entries // ROWS_PER_GROUP)
        disk = disk * PARQUET_TEXT_RATIO + groups * image
        memory += 3 * pixels + image + ROWS_PER_GROUP * (image + CHUNK_COPIES * entry)
    else:
        memory += WRITE_CHUNK * CHUNK_COPIES * entry
    return Cost(disk=disk, memory=memory)


def check_room(spec: DatasetId, directory: str | os.PathLike) -> None:
    """InputError (dataset_id) unless this machine has the disk and memory to generate spec."""
    need = cost(spec)
    check_memory("dataset_id", need.memory, f"generating {spec.id}")
    check_disk("dataset_id", need.disk, directory, f"{spec.id} ({spec.entries:,} entries)")
