"""English-like news prose of tunebench's own, deterministic from a seed.

A small grammar (sentence templates over built-in word lists) writes a *book*: a few hundred
thousand words of sentences, grouped in paragraphs. Data set entries are slices of the book that
start at a sentence chosen by a seeded RNG and wrap around its end, so a 67 M-word data set costs
one book (about 0.2 s) plus string slicing. Same seed, same book, byte for byte: only
``random.Random`` seeded with an int is used, whose sequence Python keeps stable across versions.

The text is plain ASCII: no quotes, backslashes or ``#``, single spaces between words, and the
response template ``"\\n### Response:"`` never occurs in it.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from functools import lru_cache

# -- vocabulary -----------------------------------------------------------------------------------
# Built-in word lists; common English words, so that every word is one or a few tokens with any
# tokenizer (docs/datasets.md, "Token bound and margin").
_NOUNS = (
    "council",
    "market",
    "company",
    "report",
    "river",
    "school",
    "hospital",
    "bridge",
    "budget",
    "election",
    "harbour",
    "museum",
    "railway",
    "festival",
    "factory",
    "library",
    "court",
    "farm",
    "union",
    "committee",
    "airport",
    "station",
    "park",
    "study",
    "survey",
    "project",
    "plan",
    "program",
    "network",
    "team",
    "club",
    "village",
    "district",
    "region",
    "agency",
    "bank",
    "board",
    "road",
    "tunnel",
    "garden",
    "orchestra",
    "newspaper",
    "college",
    "clinic",
    "market square",
    "water supply",
    "power plant",
    "housing estate",
    "city hall",
    "police force",
    "fire service",
    "trade fair",
    "science centre",
    "ferry service",
    "bus route",
    "food bank",
)
_PEOPLE = (
    "officials",
    "residents",
    "engineers",
    "teachers",
    "farmers",
    "doctors",
    "workers",
    "analysts",
    "voters",
    "students",
    "researchers",
    "volunteers",
    "nurses",
    "drivers",
    "shop owners",
    "local leaders",
    "city planners",
    "economists",
    "visitors",
    "parents",
)
_ADJECTIVES = (
    "new",
    "old",
    "large",
    "small",
    "local",
    "regional",
    "national",
    "public",
    "private",
    "busy",
    "quiet",
    "modern",
    "historic",
    "popular",
    "major",
    "minor",
    "early",
    "late",
    "annual",
    "final",
    "careful",
    "detailed",
    "surprising",
    "steady",
    "strong",
    "weak",
    "rapid",
    "slow",
    "costly",
    "cheap",
    "green",
    "bright",
    "crowded",
    "remote",
    "coastal",
    "northern",
    "southern",
    "eastern",
    "western",
    "central",
    "independent",
    "official",
    "temporary",
    "permanent",
    "ambitious",
)
_VERBS_PAST = (
    "approved",
    "rejected",
    "opened",
    "closed",
    "announced",
    "delayed",
    "reviewed",
    "expanded",
    "reduced",
    "funded",
    "launched",
    "finished",
    "started",
    "planned",
    "discussed",
    "reported",
    "welcomed",
    "criticised",
    "supported",
    "questioned",
    "completed",
    "replaced",
    "repaired",
    "visited",
    "published",
    "confirmed",
    "praised",
    "examined",
    "measured",
    "recorded",
)
_VERBS_BASE = (
    "approve",
    "reject",
    "open",
    "close",
    "announce",
    "delay",
    "review",
    "expand",
    "reduce",
    "fund",
    "launch",
    "finish",
    "start",
    "plan",
    "discuss",
    "report",
    "support",
    "replace",
    "repair",
    "visit",
    "publish",
    "confirm",
    "examine",
    "measure",
    "improve",
    "protect",
    "build",
)
_ADVERBS = (
    "quickly",
    "slowly",
    "carefully",
    "quietly",
    "clearly",
    "openly",
    "firmly",
    "briefly",
    "largely",
    "mostly",
    "partly",
    "widely",
    "strongly",
    "steadily",
    "finally",
    "recently",
)
_PLACES = (
    "Harlow",
    "Eastbridge",
    "Millford",
    "Ashdale",
    "Kingsport",
    "Riverton",
    "Westmoor",
    "Lakeview",
    "Northfield",
    "Stonehaven",
    "Greenwich Point",
    "Oakridge",
    "Fairhaven",
    "Brookside",
    "Elmstead",
    "Marlow",
    "Dunmore",
    "Redcliff",
    "Silverton",
    "Clearwater",
    "Highgate",
    "Bramley",
)
_FIRST = (
    "Maria",
    "James",
    "Aisha",
    "Daniel",
    "Sofia",
    "Thomas",
    "Priya",
    "Samuel",
    "Elena",
    "David",
    "Grace",
    "Omar",
    "Hannah",
    "Lucas",
    "Mei",
    "Peter",
    "Laura",
    "Ahmed",
    "Clara",
    "Martin",
)
_LAST = (
    "Okafor",
    "Bennett",
    "Larsen",
    "Moreau",
    "Tanaka",
    "Ramirez",
    "Fischer",
    "Walsh",
    "Novak",
    "Hughes",
    "Costa",
    "Lindqvist",
    "Patel",
    "Brennan",
    "Kowalski",
    "Duarte",
    "Holm",
    "Sato",
)
_ROLES = (
    "a spokesperson",
    "the director",
    "a senior analyst",
    "the chair",
    "a local councillor",
    "the head of planning",
    "a project manager",
    "a researcher",
    "the treasurer",
    "an engineer",
)
_ORGS = (
    "the city council",
    "the regional authority",
    "the transport board",
    "the health service",
    "the chamber of commerce",
    "the university",
    "the water company",
    "the planning office",
    "the national statistics office",
    "the port authority",
    "the tourism board",
)
_TIMES = (
    "on Monday",
    "on Tuesday",
    "on Wednesday",
    "on Thursday",
    "on Friday",
    "on Saturday",
    "on Sunday",
    "last week",
    "this week",
    "last month",
    "earlier this year",
    "in the spring",
    "in the autumn",
    "over the summer",
    "during the winter",
    "after a long debate",
    "before the holidays",
    "at the weekend",
    "in March",
    "in June",
    "in September",
    "in December",
)
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_PREPS = ("near", "beside", "across from", "outside", "inside", "behind", "along", "around")
_DETS = ("the", "a", "one", "another", "each", "every", "that", "this")
_LINKS = ("However", "Meanwhile", "In addition", "As a result", "At the same time", "Later")

# Sentence templates. Slots: {N} noun, {N2} second noun, {P} people, {A} adjective, {A2},
# {V} past verb, {VB} base verb, {ADV} adverb, {PL} place, {NAME} person, {ROLE}, {ORG}, {T} time,
# {PR} preposition, {D} determiner, {NUM} small number, {PCT} percentage, {LINK} connective,
# {YEAR} a year, {MONTH} a month.
_TEMPLATES = (
    "The {A} {N} in {PL} {V} the {A2} {N2} {T}.",
    "{P} in {PL} said the {N} would {VB} a {A} {N2} {PR} the {N3}.",
    "According to {ORG}, the {N} {V} by {PCT} percent {T}.",
    "{NAME}, {ROLE} at {ORG}, said the {N} was {A} and {ADV} {A2}.",
    "In {PL}, {D} {A} {N} {V} the {N2} after {P} {V2} the {N3}.",
    "{ORG} {V} the {N} {T}, and {P} {ADV} {V2} the decision.",
    "{LINK}, {P} {V} {NUM} {A} plans for the {N} {PR} the {N2}.",
    "The {N} had been {V} {NUM} times since {YEAR}, {NAME} said.",
    "{P} {ADV} {V} the {A} {N}, which {ORG} {V2} {T}.",
    "A {A} {N} {PR} the {N2} in {PL} was {V} {T}.",
    "{NAME} told reporters that the {N} will {VB} the {A} {N2} by the end of the year.",
    "{LINK}, the {A} {N} {V} about {NUM} {P} from {PL} and {PL2}.",
    "The cost of the {N} rose to {NUM} million, {ROLE} at {ORG} said.",
    "{P} asked {ORG} to {VB} the {N} before the end of {MONTH}.",
)
_SMALL_NUMBERS = tuple(str(n) for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50, 120))


def _sentence(rng: random.Random) -> str:
    c = rng.choice
    slots = {
        "N": c(_NOUNS),
        "N2": c(_NOUNS),
        "N3": c(_NOUNS),
        "P": c(_PEOPLE),
        "A": c(_ADJECTIVES),
        "A2": c(_ADJECTIVES),
        "V": c(_VERBS_PAST),
        "V2": c(_VERBS_PAST),
        "VB": c(_VERBS_BASE),
        "ADV": c(_ADVERBS),
        "PL": c(_PLACES),
        "PL2": c(_PLACES),
        "NAME": f"{c(_FIRST)} {c(_LAST)}",
        "ROLE": c(_ROLES),
        "ORG": c(_ORGS),
        "T": c(_TIMES),
        "PR": c(_PREPS),
        "D": c(_DETS),
        "NUM": c(_SMALL_NUMBERS),
        "LINK": c(_LINKS),
        "MONTH": c(_MONTHS),
        "YEAR": str(rng.randrange(1990, 2024)),
        "PCT": f"{rng.randrange(1, 40)}.{rng.randrange(10)}",
    }
    text = c(_TEMPLATES).format(**slots)
    return text[0].upper() + text[1:]


@dataclass(frozen=True)
class Book:
    """Sentences laid out twice in a row, so any passage shorter than the book is one slice.

    text: the doubled text. starts/ends: char offsets of each sentence (2*S of them).
    words: cumulative word count before each sentence, length 2*S + 1.
    """

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    words: tuple[int, ...]

    @property
    def sentences(self) -> int:
        """Sentences in one copy of the book."""
        return len(self.starts) // 2

    @property
    def total_words(self) -> int:
        """Words in one copy of the book."""
        return self.words[self.sentences]


@lru_cache(maxsize=4)
def book(seed: int, min_words: int) -> Book:
    """The book of at least min_words words for seed (cached per process)."""
    rng = random.Random(seed)
    sentences: list[str] = []
    n_words = 0
    while n_words < min_words:
        s = _sentence(rng)
        sentences.append(s)
        n_words += s.count(" ") + 1
    # Paragraphs of 3 to 7 sentences; the separator follows each sentence (a news article layout).
    seps = []
    left = rng.randint(3, 7)
    for _ in sentences:
        left -= 1
        if left == 0:
            seps.append("\n\n")
            left = rng.randint(3, 7)
        else:
            seps.append(" ")
    parts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    words = [0]
    pos = 0
    for _copy in range(2):
        for s, sep in zip(sentences, seps, strict=True):
            starts.append(pos)
            pos += len(s)
            ends.append(pos)
            pos += len(sep)
            parts.append(s)
            parts.append(sep)
            words.append(words[-1] + s.count(" ") + 1)
    return Book("".join(parts), tuple(starts), tuple(ends), tuple(words))


def passage_words(b: Book, first: int, n_words: int) -> tuple[str, int]:
    """(text, next): whole sentences from sentence first (wrapping) until >= n_words words.

    next is the index of the sentence that follows the passage (to continue from there).
    """
    first %= b.sentences
    need = b.words[first] + n_words
    last = bisect.bisect_left(b.words, need)  # words[last] >= need: sentences first..last-1
    if last > len(b.starts):
        raise ValueError(f"passage of {n_words} words does not fit a book of {b.total_words} words")
    return b.text[b.starts[first] : b.ends[last - 1]], last % b.sentences


def passage_chars(b: Book, first: int, n_chars: int) -> tuple[str, str]:
    """(input, remainder): n_chars characters from sentence first, then the next n_chars.

    The remainder starts at the next non-blank character, so no double blank appears when it is
    placed after ``"### Response: "``.
    """
    first %= b.sentences
    start = b.starts[first]
    cut = start + n_chars
    while b.text[cut].isspace():
        cut += 1
    if cut + n_chars > len(b.text):
        raise ValueError(f"passage of 2 x {n_chars} chars does not fit the book")
    return b.text[start : start + n_chars], b.text[cut : cut + n_chars]
