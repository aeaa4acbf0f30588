"""``tunebench datasets``: list, generate, stats; bad input exits 2 with one line and no files."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tunebench.commands.main import main

SMALL = "news-chars-64-entries-16"


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def run(capsys):
    """`tunebench datasets ARGS` through tunebench's main (its one error path), output captured."""

    def invoke(*args: str) -> Ran:
        code = main(["datasets", *args])
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return invoke


@pytest.mark.parametrize(
    "args",
    [
        ("generate", "news-chars-64", "--dir", "{d}"),
        ("generate", "vision-384-16384plus-entries-4", "--dir", "{d}"),
        ("stats", "nonsense", "--model", "smollm2-135m", "--dir", "{d}"),
        ("stats", SMALL, "--model", "no-such-model-7b", "--dir", "{d}"),
        ("stats", SMALL, "--model", "smollm2-135m", "--max-len", "0", "--dir", "{d}"),
    ],
)
def test_bad_input_exit_2_one_line_nothing_written(run, tmp_path, args):
    d = tmp_path / "data"
    result = run(*[a.format(d=d) for a in args])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "allowed" in err[0] or "must be" in err[0]
    assert "Traceback" not in result.output
    assert not d.exists()


def test_unknown_id_names_field_and_allowed(run, tmp_path):
    result = run("generate", "news-tokens-16384plus-entries", "--dir", str(tmp_path))
    assert "dataset_id" in result.stderr and "news-tokens-16384plus-entries-4096" in result.stderr


def test_generate_then_list_and_stats(run, tmp_path):
    result = run("generate", SMALL, "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"{SMALL}.jsonl").is_file() and "sha256" in result.stdout
    listed = json.loads(run("list", "--json", "--dir", str(tmp_path)).stdout)
    assert [r["id"] for r in listed][:3] == [
        "news-chars-512-entries-4096",
        "news-chars-1024-entries-4096",
        "news-chars-2048-entries-4096",
    ]
    assert all(r["file"] is None for r in listed)  # only spec ids are listed; none generated here
    table = run("list", "--dir", str(tmp_path))
    assert table.exit_code == 0 and "news-tokens-16384plus" in table.stdout

    result = run("stats", SMALL, "--model", "smollm2-135m", "--max-len", "40", "--dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["entries"] == 16 and s["max_tokens"] == 40 and s["min_tokens"] <= 40 and s["exact"] is True
    assert s["tokenizer_source"] == "offline" and s["tokenizer"].startswith("smollm2")
    text = run("stats", SMALL, "--model", "granite-3.1-2b", "--max-len", "40", "--dir", str(tmp_path))
    assert text.exit_code == 0 and "not exact" in text.stdout and "from cache" in text.stdout
