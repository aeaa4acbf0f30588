"""What each entry of a data set id holds (the recipes of ado-sfttrainer.md §10, with our prose).

    news-chars-N-entries-M     PROMPT_TEMPLATE with exactly N chars of input and N of response
    news-tokens-Kplus-...      PROMPT_TEMPLATE with a short input and a response of >= K words
    vision-WxH-Kplus-...       a chat: user text (>= 38 words) + image; assistant >= K words

Token bound: every whitespace-separated word is at least one token for any tokenizer whose
pre-tokenization splits at whitespace (GPT-2-style byte-level BPE, tiktoken BPE, SentencePiece
with split_by_whitespace: every family of the catalog), so K words give at least K tokens. Our
prose measures 1.20-1.33 tokens per word with SmolLM2, Mistral v1 and Llama-3 (tests check it),
i.e. at most 5.2 characters per token: a margin of 20 % over K for the densest of them.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator

from tunebench.datasets.ids import DatasetId
from tunebench.datasets.text import Book, book, passage_chars, passage_words

# The SFTTrainer spec's news-chars data sets: "samples of N + 127 (prompt) + N characters", so the fixed text
# around the two fields is 127 characters. It is the layout of the reference's news template
# (ado-sfttrainer.md §10.2: instruction, "### Input:", "### Response:") whose instruction names the
# input "newspaper input text": the reference's own template is 117 characters, 10 short of the spec.
PROMPT_TEMPLATE = (
    "Write a response that appropriately completes the remainder of the following newspaper input text."
    "\n\n### Input:\n{input}\n\n### Response: {output}"
)
RESPONSE_TEMPLATE = "\n### Response:"  # the SFTTrainer spec launch command, --response_template
TEXT_INPUT_WORDS = 8  # ado-sfttrainer.md §10.1: input of 10 tokens -> 8 words
VISION_USER_WORDS = 38  # ado-sfttrainer.md §10.3: user text of 50 tokens -> 38 words
BOOK_SEED = 3  # the prose of every data set comes from this book (any fixed int works)
BOOK_MIN_WORDS = 262_144  # 2**18 words (~1.6 MB): variety; grows to 2x the longest passage


def _book_for(spec: DatasetId) -> Book:
    # words of the longest passage; a chars passage (2 x N chars) needs < N / 2 words of ~6 chars
    longest = (spec.min_tokens or 0) + (spec.chars or 0) // 2 + VISION_USER_WORDS + TEXT_INPUT_WORDS
    return book(BOOK_SEED, max(BOOK_MIN_WORDS, 2 * longest))


def first_sentences(spec: DatasetId, b: Book) -> list[int]:
    """Index of the first book sentence of each entry: seeded by the id, so ids differ."""
    rng = random.Random(zlib.crc32(spec.id.encode()))
    return [rng.randrange(b.sentences) for _ in range(spec.entries)]


def text_entries(spec: DatasetId) -> Iterator[str]:
    """The ``output`` field of each entry of a news-chars or news-tokens id, in order."""
    if spec.kind not in ("chars", "tokens"):
        raise ValueError(f"{spec.id} is not a text data set")
    b = _book_for(spec)
    for first in first_sentences(spec, b):
        if spec.kind == "chars":
            text_in, text_out = passage_chars(b, first, spec.chars)
        else:
            text_in, nxt = passage_words(b, first, TEXT_INPUT_WORDS)
            text_out, _ = passage_words(b, nxt, spec.min_tokens)
        yield PROMPT_TEMPLATE.format(input=text_in, output=text_out)


def chat_entries(spec: DatasetId) -> Iterator[list[dict]]:
    """The ``output`` chat of each row of a vision id (ado-sfttrainer.md §10.3 layout)."""
    if spec.kind != "vision":
        raise ValueError(f"{spec.id} is not a vision data set")
    b = _book_for(spec)
    for first in first_sentences(spec, b):
        user, nxt = passage_words(b, first, VISION_USER_WORDS)
        assistant, _ = passage_words(b, nxt, spec.min_tokens)
        yield [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": user, "index": None},
                    {"type": "image", "text": None, "index": 0},  # the row's image
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": assistant, "index": None}]},
        ]


def chat_text(chat: list[dict]) -> str:
    """The text parts of a chat joined by blank lines (what token accounting counts for vision)."""
    return "\n\n".join(part["text"] for turn in chat for part in turn["content"] if part.get("text"))
