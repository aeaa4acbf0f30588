"""Vision data sets: one JPEG repeated in every row plus a chat column, written as parquet.

Layout of ado-sfttrainer.md §10.3: column ``images`` holds ``{"bytes": <jpeg>, "path": None}``
(the same image in every row), column ``output`` the chat messages (see entries.chat_entries).
The schema carries the ``datasets`` feature metadata, so ``load_dataset("parquet", ...)`` decodes
``images`` to PIL images.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tunebench.datasets.entries import chat_entries
from tunebench.datasets.ids import DatasetId

# ado-sfttrainer.md §10.3: white canvas, centred filled circles, red r=200 px and blue r=100 px
# (on a 384-px canvas the red circle overflows the edges, as in the reference).
RED_RADIUS = 200
BLUE_RADIUS = 100
JPEG_QUALITY = 75  # PIL's default, fixed here so the bytes do not depend on it
ROWS_PER_GROUP = 128  # parquet row group: ~13 MB of text for the 16384plus ids


def jpeg(width: int, height: int) -> bytes:
    """The data set image as JPEG bytes (deterministic for a given Pillow/libjpeg)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    x, y = width // 2, height // 2
    for radius, colour in ((RED_RADIUS, "red"), (BLUE_RADIUS, "blue")):
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def schema() -> pa.Schema:
    """Arrow schema with the ``datasets`` features metadata (Image + chat list)."""
    from datasets import Features, Image, List, Value

    part = {"type": Value("string"), "text": Value("string"), "index": Value("int64")}
    features = Features({"images": Image(), "output": List({"role": Value("string"), "content": List(part)})})
    return features.arrow_schema


def write_parquet(path: Path, spec: DatasetId, progress: Callable[[int, int], None] | None = None) -> int:
    """Write the rows of a vision id to path; returns the number of rows."""
    sch = schema()
    image = {"bytes": jpeg(spec.width, spec.height), "path": None}
    chat_type = sch.field("output").type
    rows = 0
    with pq.ParquetWriter(str(path), sch, compression="snappy") as writer:
        chats: list[list[dict]] = []
        for chat in chat_entries(spec):
            chats.append(chat)
            if len(chats) == ROWS_PER_GROUP:
                rows += _write_group(writer, sch, image, chats, chat_type)
                chats = []
                if progress:
                    progress(rows, spec.entries)
        if chats:
            rows += _write_group(writer, sch, image, chats, chat_type)
            if progress:
                progress(rows, spec.entries)
    return rows


def _write_group(writer, sch: pa.Schema, image: dict, chats: list[list[dict]], chat_type) -> int:
    images = pa.array([image] * len(chats), type=sch.field("images").type)
    output = pa.array(chats, type=chat_type)
    writer.write_table(pa.Table.from_arrays([images, output], schema=sch))
    return len(chats)
