"""Bad input to every command: one line ``error: <field>: ...``, exit code 2, no traceback, nothing
created or changed on disk.

``CASES`` is the table (command line, field the message must name). Every case runs in-process
through ``tunebench.cli.main`` in a fresh working directory that holds the files the cases refer to
(a good store, a corrupt one, binary YAML and CSV, a directory, ...), with TUNEBENCH_HOME inside it;
the directory is snapshotted (names, sizes, modification times, contents) before and after. A
representative subset (``SUBPROCESS``) runs again as real processes of the console script, to show
that no traceback reaches a real terminal.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunebench.cli import main

LORA = "finetune_lora_benchmark-v1.0.0"
FULL = "finetune_full_benchmark-v1.0.0"
ENTITY = ["model_name=smollm2-135m", "model_max_length=256", "number_gpus=0", "batch_size=2"]
GPU_ENTITY = ["model_name=llama3.1-8b", "model_max_length=2048", "number_gpus=2", "batch_size=8", "gpu_model=H100"]


def c(field: str, *argv: str) -> tuple[str, list[str]]:
    return field, list(argv)


CASES: list[tuple[str, list[str]]] = [
    # --- usage errors: unknown option or command, missing or malformed values (item 1)
    c("--bogus", "plan", "--bogus"),
    c("--bogus", "--bogus"),
    c("--limit", "show", "--limit", "0"),
    c("--limit", "show", "--limit", "abc"),
    c("--limit", "show", "--limit"),
    c("--max-parallel", "explore", "space.yaml", "--max-parallel", "0"),
    c("--max-retries", "explore", "space.yaml", "--max-retries", "-1"),
    c("--lease-seconds", "explore", "space.yaml", "--lease-seconds", "0"),
    c("command", "nosuchcommand"),
    c("command", "datasets", "nope"),
    c("command", "plann"),
    c("EXPERIMENT", "validate"),
    c("EXPERIMENT", "describe"),
    c("EXPERIMENT", "run"),
    c("EXPERIMENT", "launch-plan"),
    c("EXPERIMENT", "recommend"),
    c("FILE", "import"),
    c("SPACE", "explore"),
    c("DATASET_ID", "datasets", "generate"),
    c("--model", "datasets", "stats", "news-chars-512-entries-4096"),
    c("--port", "launch-plan", LORA, *ENTITY, "--port", "abc"),
    c("--timeout", "run", LORA, *ENTITY, "--timeout", "soon"),
    c("--cpu-processes", "run", LORA, *ENTITY, "--cpu-processes", "1.5"),
    c("--adapters", "deploy-spec", "--params-b", "7", "--adapters", "x"),
    c("--quantization", "deploy-spec", "--quantization"),
    c("--price-per-gpu-hour", "plan", LORA, *ENTITY, "--price-per-gpu-hour", "cheap"),
    c("-p", "plan", "-p"),
    c("--format", "show", "--format"),
    c("--gpus-per-node", "recommend", LORA, *ENTITY, "--gpus-per-node", "eight"),
    c("arguments", "show", "extra"),
    c("arguments", "models", "extra"),
    c("arguments", "version", "1"),
    c("--json", "gpus", "--json=yes"),
    c("--bogus", "datasets", "list", "--bogus"),
    c("--max-len", "datasets", "stats", "news-chars-512-entries-4096", "--model", "smollm2-135m", "--max-len", "x"),
    c("--bogus", "experiments", "--bogus"),
    c("--lomo", "calibrate", "--lomo=maybe"),
    c("--bogus", "export", "--bogus"),
    c("arguments", "demo", "now"),
]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its kind, size, modification time and content hash."""
    out: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (path.is_dir(), st.st_size if path.is_file() else None, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with the files the cases name; TUNEBENCH_HOME (not created) inside it."""
    (tmp_path / "space.yaml").write_text(
        "experiments: [{id: finetune_lora_benchmark-v1.0.0}]\n"
        "entity_space: {model_name: smollm2-135m, model_max_length: 64, number_gpus: 0, batch_size: 1}\n"
        "actuator: {name: noop}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEBENCH_STORE", raising=False)
    monkeypatch.delenv("TUNEBENCH_DATA_DIR", raising=False)
    return tmp_path


def check(code: int, out: str, err: str, field: str) -> None:
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {field}"), lines[0]
    assert "Traceback" not in err and out == "", (out, err)


@pytest.mark.parametrize(("field", "argv"), CASES, ids=[" ".join(a)[:80] for _, a in CASES])
def test_bad_input_in_process(workdir, capsys, field, argv):
    before = snapshot(workdir)
    code = main(argv)
    out, err = capsys.readouterr()
    check(code, out, err, field)
    assert snapshot(workdir) == before, "bad input created or changed files"


def test_the_table_covers_every_command():
    from tunebench.cli import _mount_subcommands, app

    _mount_subcommands()
    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    commands |= {f"datasets {c.name or c.callback.__name__.replace('_', '-')}" for g in app.registered_groups
                 for c in g.typer_instance.registered_commands}  # fmt: skip
    commands -= {"version", "demo", "_root"}  # take no input (bad arguments to them are covered as usage errors)
    named = {" ".join(a[:2]) if a[0] == "datasets" else a[0] for _, a in CASES}
    assert commands <= named, commands - named


# A representative subset as real processes of the console script: no traceback reaches a terminal.
SUBPROCESS = [0, 2, 5, 8, 11, 20]


def console_script() -> list[str]:
    script = Path(sys.executable).with_name("tunebench")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tunebench.cli"]


@pytest.mark.parametrize("index", SUBPROCESS, ids=[" ".join(CASES[i][1])[:80] for i in SUBPROCESS])
def test_bad_input_in_a_real_process(workdir, index):
    field, argv = CASES[index]
    src = str(Path(__file__).parent.parent / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    before = snapshot(workdir)
    proc = subprocess.run([*console_script(), *argv], capture_output=True, text=True, timeout=120, env=env)
    check(proc.returncode, proc.stdout, proc.stderr, field)
    assert snapshot(workdir) == before


@pytest.mark.parametrize("argv", [["--version"], ["version"]])
def test_version(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("0.1.0") and (out.startswith("tunebench ") or argv == ["version"])


@pytest.mark.parametrize("argv", [["-h"], ["--help"], [], ["datasets"], ["plan", "-h"], ["datasets", "stats", "--help"]])
def test_help_exits_0(capsys, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Usage: tunebench" in out and err == ""
