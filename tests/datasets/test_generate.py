"""Data set generation: determinism, sizes of every spec id, storage, corruption, concurrency."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tunebench
from tunebench.datasets import (
    KNOWN_DATASET_IDS,
    PROMPT_TEMPLATE,
    RESPONSE_TEMPLATE,
    dataset_path,
    ensure_dataset,
    generate_dataset,
    parse_dataset_id,
    read_manifest,
    verify,
)
from tunebench.datasets import generate as gen
from tunebench.datasets.entries import VISION_USER_WORDS, chat_entries, text_entries
from tunebench.errors import InputError

SMALL = "news-chars-64-entries-16"
PROMPT_CHARS = 127  # the SFTTrainer spec: "samples of 512 + 127 (prompt) + 512 characters"
HEAD, _, _ = PROMPT_TEMPLATE.partition("{input}")


def _words(text: str) -> int:
    """Whitespace-separated words; the prose separates words by ' ' and paragraphs by blank lines."""
    return text.count(" ") + text.count("\n\n") + 1


def _split(output: str) -> tuple[str, str]:
    """(input, response) of a text entry."""
    assert output.startswith(HEAD)
    body = output[len(HEAD) :]
    text_in, sep, text_out = body.partition("\n\n### Response: ")
    assert sep
    return text_in, text_out


def test_prompt_template_is_the_specs_127_characters():
    assert len(PROMPT_TEMPLATE.format(input="", output="")) == PROMPT_CHARS
    assert PROMPT_TEMPLATE.count(RESPONSE_TEMPLATE) == 1


@pytest.mark.parametrize("n", [512, 1024, 2048])
def test_news_chars_entries_are_n_plus_127_plus_n_characters(n):
    """The spec's news-chars-N-entries-4096: "samples of N + 127 (prompt) + N characters"."""
    outputs = list(text_entries(parse_dataset_id(f"news-chars-{n}-entries-4096")))
    assert len(outputs) == 4096
    assert {len(o) for o in outputs} == {n + 127 + n}


def test_same_id_same_bytes(tmp_path):
    for ds in (SMALL, "news-tokens-300plus-entries-8", "vision-64x48-200plus-entries-3"):
        a = generate_dataset(ds, tmp_path / "a")
        b = generate_dataset(ds, tmp_path / "b")
        assert a.sha256 == b.sha256 and a.size_bytes == b.size_bytes
        assert dataset_path(ds, tmp_path / "a").read_bytes() == dataset_path(ds, tmp_path / "b").read_bytes()
    # pinned: the prose must not drift across Python versions (bump GENERATOR_VERSION if it must)
    assert read_manifest(SMALL, tmp_path / "a").sha256 == (
        "486742ccd91dab2073f733b0f298c2319f691afe1f112b922aee8dc5e1e50dac"
    )


def test_different_ids_differ():
    a = next(text_entries(parse_dataset_id("news-chars-64-entries-16")))
    b = next(text_entries(parse_dataset_id("news-chars-64-entries-17")))
    assert a != b


@pytest.mark.parametrize("ds", [d for d in KNOWN_DATASET_IDS if "-chars-" in d])
def test_chars_ids_written_in_full(tmp_path, ds):
    """Every spec chars id: 4096 lines, N chars of input and N of response plus the prompt."""
    spec = parse_dataset_id(ds)
    path = ensure_dataset(ds, tmp_path)
    lines = path.read_text().splitlines()
    assert len(lines) == spec.entries == read_manifest(ds, tmp_path).entries == 4096
    for line in lines:
        output = json.loads(line)["output"]
        assert len(output) == 2 * spec.chars + PROMPT_CHARS
        text_in, text_out = _split(output)
        assert len(text_in) == len(text_out) == spec.chars
        assert output.count(RESPONSE_TEMPLATE) == 1 and not text_out[0].isspace()


@pytest.mark.parametrize("ds", [d for d in KNOWN_DATASET_IDS if "-chars-" not in d])
def test_large_ids_entry_counts_and_sizes(ds):
    """Every other spec id, without writing it: M entries, each >= K words of response."""
    spec = parse_dataset_id(ds)
    n = 0
    if spec.is_vision:
        for chat in chat_entries(spec):
            user, assistant = chat
            assert [p["type"] for p in user["content"]] == ["text", "image"]
            assert _words(user["content"][0]["text"]) >= VISION_USER_WORDS
            assert _words(assistant["content"][0]["text"]) >= spec.min_tokens
            n += 1
    else:
        for output in text_entries(spec):
            assert _words(_split(output)[1]) >= spec.min_tokens
            n += 1
        response = _split(output)[1]
        assert len(response.split()) == _words(response)  # the cheap word count above is exact
    assert n == spec.entries


def test_words_counted_exactly_in_a_sample():
    spec = parse_dataset_id("news-tokens-2000plus-entries-4")
    for output in text_entries(spec):
        response = _split(output)[1]
        assert len(response.split()) == _words(response) >= 2000
        assert "  " not in output and "#" not in response and '"' not in output


def test_manifest_and_storage(tmp_path):
    path = ensure_dataset(SMALL, tmp_path)
    assert path == tmp_path / f"{SMALL}.jsonl"
    m = json.loads((tmp_path / f"{SMALL}.manifest.json").read_text())
    assert m["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert m["size_bytes"] == path.stat().st_size and m["entries"] == 16
    assert m["generator_version"] == gen.GENERATOR_VERSION and m["created"].endswith("+00:00")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary leftovers
    mtime = path.stat().st_mtime_ns
    assert ensure_dataset(SMALL, tmp_path) == path and path.stat().st_mtime_ns == mtime  # reused


def test_default_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_DATA_DIR", str(tmp_path / "env"))
    assert ensure_dataset(SMALL) == tmp_path / "env" / f"{SMALL}.jsonl"


def test_bad_id_writes_nothing(tmp_path):
    with pytest.raises(InputError) as e:
        ensure_dataset("news-chars-64", tmp_path / "d")
    assert e.value.field == "dataset_id"
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "old-version", "bad-manifest"])
def test_corruption_detected_and_repaired(tmp_path, damage):
    path = ensure_dataset(SMALL, tmp_path)
    good = path.read_bytes()
    mpath = tmp_path / f"{SMALL}.manifest.json"
    if damage == "truncate":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "flip":
        path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # same size
    elif damage == "old-version":
        m = json.loads(mpath.read_text())
        mpath.write_text(json.dumps({**m, "generator_version": "0"}))
    else:
        mpath.write_text("{not json")
    assert verify(SMALL, tmp_path) is None  # never used as is
    assert ensure_dataset(SMALL, tmp_path) == path
    assert path.read_bytes() == good and verify(SMALL, tmp_path) is not None


def test_a_file_tunebench_did_not_write_is_never_overwritten(tmp_path, capsys):
    """Another tool's file of the same name (no manifest beside it: ado's generator writes none) stays as it is."""
    path = dataset_path(SMALL, tmp_path)
    path.write_text('{"output": "written by ado"}\n')
    for generate in (ensure_dataset, generate_dataset):
        with pytest.raises(InputError, match="tunebench did not write it") as e:
            generate(SMALL, tmp_path)
        assert e.value.field == "dataset_id"
    assert path.read_text() == '{"output": "written by ado"}\n'
    from tunebench.commands.main import main

    assert main(["datasets", "generate", SMALL, "--dir", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert path.read_text() == '{"output": "written by ado"}\n'


def test_a_stale_file_of_the_117_character_template_is_regenerated(tmp_path):
    """A file cached by generator version 1 (the reference's 117-character template), intact and manifested, is
    not used: it is regenerated with the spec's N + 127 + N characters."""
    path = ensure_dataset(SMALL, tmp_path)
    old_head = "Write a response that appropriately completes the remainder of the following input text."
    lines = [
        json.loads(line)["output"].replace(HEAD.split("\n")[0], old_head) for line in path.read_text().splitlines()
    ]
    assert {len(o) for o in lines} == {64 + 117 + 64}
    stale = "".join(json.dumps({"output": o}) + "\n" for o in lines).encode()
    path.write_bytes(stale)
    mpath = tmp_path / f"{SMALL}.manifest.json"
    m = json.loads(mpath.read_text())
    mpath.write_text(
        json.dumps(
            {**m, "generator_version": "1", "size_bytes": len(stale), "sha256": hashlib.sha256(stale).hexdigest()}
        )
    )
    assert ensure_dataset(SMALL, tmp_path) == path
    assert {len(json.loads(line)["output"]) for line in path.read_text().splitlines()} == {64 + 127 + 64}


def test_failed_generation_leaves_no_partial_file(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gen, "_write_jsonl", boom)
    with pytest.raises(RuntimeError):
        ensure_dataset(SMALL, tmp_path)
    assert not dataset_path(SMALL, tmp_path).exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


_WORKER = """
import sys, time
from pathlib import Path
from tunebench.datasets import ensure_dataset, read_manifest, verify
ds, d, me = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
(d / f"ready-{me}").touch()
while not (d / "go").exists():
    time.sleep(0.005)
existed = verify(ds, d) is not None
ensure_dataset(ds, d)
print(existed, read_manifest(ds, d).created)
"""


@pytest.mark.slow
def test_concurrent_generation_is_safe(tmp_path):
    """Two processes ask for the same id at once: one generates, the other waits and reuses."""
    ds = "news-tokens-16384plus-entries-512"  # ~52 MB, ~0.5 s: long enough to overlap
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(tunebench.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, ds, str(tmp_path), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    results = [o[0].split() for o in outs]
    assert [r[0] for r in results] == ["False", "False"]  # both asked before the file existed
    assert results[0][1] == results[1][1]  # and both got the same manifest: generated once
    assert verify(ds, tmp_path) is not None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _bounded() -> None:
    """preexec_fn: the generating process gets bounded memory and CPU time."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (120, 120))


def test_temporaries_of_a_killed_generation_are_removed_by_the_next(tmp_path):
    """kill -9 in the middle of `datasets generate` leaves its hidden temporary file; the next generation
    in that directory removes it (its process is dead), and leaves a live process's and another host's."""
    import signal
    import socket

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(tunebench.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    big = "news-chars-512-entries-100000"  # ~100 MB: still being written when killed
    command = [sys.executable, "-m", "tunebench", "datasets", "generate", big, "--dir", str(tmp_path)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_bounded)
    deadline = time.monotonic() + 120
    try:
        while not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and p.stat().st_size > 0]:
            assert proc.poll() is None and time.monotonic() < deadline, "the generation ended before it was killed"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    live = tmp_path / f".x.jsonl.{os.getpid()}@{socket.gethostname()}.abc.tmp"  # this test's process: alive
    elsewhere = tmp_path / f".x.jsonl.{proc.pid}@another-host.example.abc.tmp"
    live.touch()
    elsewhere.touch()
    generate_dataset(SMALL, tmp_path)
    assert not left.exists()
    assert live.exists() and elsewhere.exists()
    assert verify(SMALL, tmp_path) is not None and not dataset_path(big, tmp_path).exists()


def _near(pixel, colour) -> bool:
    """JPEG-lossy colour match."""
    return all(abs(a - b) < 40 for a, b in zip(pixel, colour, strict=True))


def test_vision_rows_load_and_decode(tmp_path):
    from datasets import Dataset

    ds = "vision-384x768-300plus-entries-3"
    path = ensure_dataset(ds, tmp_path)
    assert path.suffix == ".parquet"
    table = Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf"))
    assert table.num_rows == 3 and set(table.column_names) == {"images", "output"}
    for row in table:
        image = row["images"]
        assert image.format == "JPEG" and image.size == (384, 768)  # width x height
        rgb = image.convert("RGB")
        cx, cy = 192, 384
        assert _near(rgb.getpixel((cx, cy)), (0, 0, 255))  # blue disc, r = 100
        assert _near(rgb.getpixel((cx, cy - 150)), (255, 0, 0))  # red ring between r = 100 and 200
        assert _near(rgb.getpixel((cx, cy - 250)), (255, 255, 255))  # white outside r = 200
        user, assistant = row["output"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert [c["type"] for c in user["content"]] == ["text", "image"]
        assert _words(assistant["content"][0]["text"]) >= 300
    raw = table.with_format("arrow")[:1]["images"].to_pylist()[0]
    assert raw["bytes"][:2] == b"\xff\xd8" and raw["path"] is None  # one JPEG, as bytes


def test_vision_load_dataset_parquet(tmp_path):
    from datasets import load_dataset

    path = ensure_dataset("vision-384x384-100plus-entries-2", tmp_path)
    loaded = load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded[1]["images"].size == (384, 384)
