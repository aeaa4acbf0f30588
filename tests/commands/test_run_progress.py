"""`tunebench run` shows the worker's progress: step x/N, tokens/s, loss, ETA (a real tiny CPU run, stderr a pipe)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from layout import SRC
from tiny_models import TINY_LLAMA

from tunebench.worker.progress import StepProgress, parse_step_line, step_line

SRC = SRC
# a log line: HH:MM:SS measuring: training step 2/3, 1,234 tokens/s, loss 6.2, ETA 3 s, 20 s elapsed
STEP = re.compile(r"^\d\d:\d\d:\d\d measuring: (?:training|trained) step (\d+)/3, ([\d,]+) tokens/s, "
                  r"(?:loss [\d.e+-]+, )?ETA (\d+ s|\d+ min \d+ s), .* elapsed$", re.M)  # fmt: skip


@pytest.mark.slow
def test_run_shows_step_rate_and_eta_outside_a_terminal(tmp_path):
    model = tmp_path / "config.json"
    model.write_text(json.dumps(TINY_LLAMA))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "TUNEBENCH_HOME": str(tmp_path / "home"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunebench",
            "run",
            "finetune_full_benchmark-v1.0.0",
            f"model_name={model}",
            "model_max_length=192",
            "number_gpus=0",
            "batch_size=4",
            "-p",
            "max_steps=3",
            "-p",
            "dataset_id=news-chars-256-entries-32",
            "--weights",
            "random",
            "--no-store",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    lines = STEP.findall(proc.stderr)
    assert lines, proc.stderr
    steps = [int(m[0]) for m in lines]
    assert steps[-1] == 3 and steps == sorted(steps), proc.stderr  # the last line is the end of training
    assert all(int(m[1].replace(",", "")) > 0 for m in lines), proc.stderr
    assert re.search(r"measuring: trained step 3/3, .*loss \d", proc.stderr), proc.stderr  # the loss, once logged
    assert "valid" in proc.stdout


def test_step_line_round_trip_and_eta():
    record = {
        "step": 4,
        "max_steps": 10,
        "elapsed_s": 8.0,
        "non_pad_tokens_total": 1000,
        "world_size": 2,
        "loss": 2.5,
        "stop_after_s": -1.0,
    }
    p = parse_step_line(step_line(record))
    assert p == StepProgress(step=4, elapsed_s=8.0, total_steps=10, tokens=2000, loss=2.5)
    assert p.tokens_per_second == 250.0 and p.eta_s == 12.0  # 6 steps left at 2 s each
    assert p.describe(since_s=2.0) == "step 4/10, 250 tokens/s, loss 2.5, ETA 10 s"
    # a time limit that comes first caps the ETA; epochs of unknown length: no N, ETA from the limit only
    assert StepProgress(step=4, elapsed_s=8.0, total_steps=100, stop_after_s=20.0).eta_s == 12.0
    assert StepProgress(step=4, elapsed_s=8.0).describe() == "step 4, 0 tokens/s, ETA ?"
    assert parse_step_line("TUNEBENCH_STEP {broken") is None and parse_step_line("loss 3") is None
