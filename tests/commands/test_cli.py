"""The tunebench command line, run as a real subprocess where the exit code matters."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tunebench.commands.main import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunebench", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("models", "gpus", "experiments", "describe", "validate", "launch-plan", "datasets", "demo"):
        assert command in out.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (
            [
                "validate",
                "finetune_lora_benchmark-v1.0.0",
                "model_name=smollm2-135m",
                "model_max_length=512",
                "number_gpus=0",
                "batch_size=two",
            ],
            "batch_size",
        ),
        (["validate", "finetune_lora_bench-v1.0.0"], "experiment"),
        (
            [
                "launch-plan",
                "finetune_full_benchmark-v1.0.0",
                "model_name=nope",
                "model_max_length=1",
                "number_gpus=0",
                "batch_size=1",
            ],
            "model_name",
        ),
        (["describe", "finetune_full_benchmark-v1.0.0", "-p", "optim=adam"], "optim"),
        (["validate", "finetune_full_benchmark-v1.0.0", "model_name"], "KEY=VALUE"),
    ],
)
def test_input_errors_exit_2_with_one_line(args, field):
    out = run(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_validate_json(capsys):
    code = main(
        [
            "validate",
            "finetune_lora_benchmark-v1.0.0",
            "model_name=smollm2-135m",
            "model_max_length=512",
            "number_gpus=4",
            "batch_size=6",
            "gpu_model=H100",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result == {"is_valid": False, "reasons": ["rule 1: batch_size 6 is not divisible by number_gpus 4"]}


def test_launch_plan_json(capsys):
    code = main(
        [
            "launch-plan",
            "finetune_full_benchmark-v1.0.0",
            "model_name=llama3.1-8b",
            "model_max_length=2048",
            "number_gpus=4",
            "batch_size=8",
            "gpu_model=A100-80GB",
            "--json",
            "--data-dir",
            "/d",
        ]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mode"] == "FSDP" and plan["nodes"][0]["accelerate_config"]["num_processes"] == 4


def test_describe_and_listings(capsys):
    assert main(["describe", "finetune_gptq-lora_benchmark-v1.0.0", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    dtype = next(p for p in info["optional"] if p["name"] == "torch_dtype")
    assert dtype == {**dtype, "default": "float16", "domain": "float16"}
    assert info["measured"][-1] == "is_valid"
    assert main(["models", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) >= 41
    assert main(["gpus", "--json"]) == 0
    assert any(g["name"] == "NVIDIA-H100-PCIe" for g in json.loads(capsys.readouterr().out))
    assert main(["models"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["import", "{tmp}/missing.csv", "--store", "{tmp}/s.db"],
        ["explore", "{tmp}/missing.yaml", "--store", "{tmp}/s.db"],
        ["show", "--format", "xml", "--store", "{tmp}/s.db"],
        ["datasets", "generate", "news-chars-x", "--dir", "{tmp}/data"],
        [
            "run",
            "finetune_full_benchmark-v1.0.0",
            "model_name=smollm2-135m",
            "model_max_length=64",
            "number_gpus=0",
            "batch_size=1",
            "optim=adam",
            "--output-dir",
            "{tmp}/run",
        ],
    ],
)
def test_bad_input_writes_nothing(tmp_path, args):
    home = tmp_path / "home"
    out = subprocess.run(
        [sys.executable, "-m", "tunebench", *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TUNEBENCH_HOME": str(home)},
    )
    assert out.returncode == 2 and out.stderr.startswith("error: "), out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "bad input left files behind"


def test_python_dash_m_tunebench_exits_with_the_commands_code():
    """`python -m tunebench` (the package's __main__) ends with main()'s exit code, as the console script does."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunebench",
            "validate",
            "finetune_lora_benchmark-v1.0.0",
            "model_name=smollm2-135m",
            "model_max_length=512",
            "number_gpus=0",
            "batch_size=two",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.startswith("error: batch_size:"), out.stderr


def test_describe_prints_bracketed_text_verbatim():
    """Descriptions are plain text, not rich markup: "[fast_loss, fast_rms_layernorm, ...]" must survive."""
    out = subprocess.run(
        [sys.executable, "-m", "tunebench", "describe", "finetune_lora_benchmark-v1.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stderr
    assert "Fast kernels [fast_loss, fast_rms_layernorm, fast_rope_embeddings]." in out.stdout
    assert "a list of 3 booleans [fast_loss, fast_rms_layernorm, fast_rope_embeddings]" in out.stdout
