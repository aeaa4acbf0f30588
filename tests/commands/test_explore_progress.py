"""Progress where no live display can be drawn (logs, pipes, CI), -v/--quiet, --version, explore's exit code."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from layout import SRC

from tunebench import __version__
from tunebench.commands.explore_progress import ProgressLog
from tunebench.commands.main import main
from tunebench.explore.explorer import Progress

SRC = SRC
NOOP = {
    "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
    "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": [1, 2, 3]},
    "actuator": {"name": "noop"},
}
# fails at once, without training: several nodes need the ray executor
FAILING = {
    "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
    "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 2, "batch_size": 2,
                     "gpu_model": "NVIDIA-A100-80GB-PCIe", "number_nodes": 2},
}  # fmt: skip
LINE = re.compile(r"^\d\d:\d\d:\d\d op-[0-9a-f]+: (\d+)/(\d+) done — valid \d+, invalid \d+, failed \d+", re.M)


def tunebench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """tunebench in a fresh process with stdout and stderr pipes (not a terminal)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "tunebench", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.slow
def test_explore_logs_a_line_per_finished_measurement_outside_a_terminal(tmp_path):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(NOOP))
    proc = tunebench(tmp_path, "explore", "space.yaml", "--store", "s.db")
    assert proc.returncode == 0, proc.stderr
    done = [int(m.group(1)) for m in LINE.finditer(proc.stderr)]
    assert {1, 2, 3} <= set(done) and done == sorted(done), proc.stderr
    quiet = tunebench(tmp_path, "--quiet", "explore", "space.yaml", "--store", "q.db")
    assert quiet.returncode == 0 and quiet.stderr == "" and "3/3 done" in quiet.stdout
    verbose = tunebench(tmp_path, "-v", "explore", "space.yaml", "--store", "v.db")
    assert len(LINE.findall(verbose.stderr)) > len(LINE.findall(proc.stderr))


def test_progress_is_logged_at_least_every_interval_while_nothing_finishes():
    log = logging.getLogger("tunebench.test-progress")
    log.setLevel(logging.INFO)
    log.propagate = False
    lines = Lines()
    log.addHandler(lines)
    counts = Progress("op-test", total=4, running=1)
    with ProgressLog(interval=0.3, logger=log) as progress:
        progress.update(counts)  # the first line at once
        time.sleep(1.25)  # a long measurement: heartbeats only
        heartbeats = len(lines.lines) - 1
        progress.update(Progress("op-test", total=4, done=1, valid=1, measured=1))
    assert 2 <= heartbeats <= 5, lines.lines
    assert lines.lines[0].startswith("op-test: 0/4 done") and "running 1" in lines.lines[0]
    assert lines.lines[-1].startswith("op-test: 1/4 done — valid 1")


def test_explore_exits_1_when_measurements_failed(tmp_path):
    (tmp_path / "fail.yaml").write_text(yaml.safe_dump(FAILING))
    proc = tunebench(tmp_path, "explore", "fail.yaml", "--store", "s.db", "--max-retries", "0")
    assert proc.returncode == 1, proc.stderr
    assert "failed 1" in proc.stdout and "1 point(s) failed" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(NOOP))
    assert tunebench(tmp_path, "explore", "ok.yaml", "--store", "s.db", "--quiet").returncode == 0


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tunebench {__version__}"


def test_calibrate_shows_progress(tmp_path, capsys):
    csv = tmp_path / "runs.csv"
    csv.write_text(
        ",identifier,experiment_id,model_name,number_gpus,model_max_length,batch_size,gpu_model,"
        "gpu_memory_utilization_peak,train_runtime,train_samples_per_second,dataset_tokens_per_second,"
        "dataset_tokens_per_second_per_gpu,is_valid\n"
        "0,x,SFTTrainer.finetune_full_benchmark-v1.0.0,smollm2-135m,0,512,1,,0.0,30.4,134.5,2624.0,2624.0,1\n"
        "1,y,SFTTrainer.finetune_lora_benchmark-v1.0.0,llama3.1-8b,1,2048,4,NVIDIA-A100-SXM4-80GB,55.0,100.0,1.0,"
        "4000.0,4000.0,1\n"
    )
    assert main(["calibrate", "--from", str(csv), "--replace", "--no-save", "--json"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"calibrate: fitting on 2 runs \(\d+ s elapsed\)", err), err
    # which model is held out (k/N), the elapsed time and an ETA; the hint that --no-lomo skips that pass
    assert re.search(
        r"calibrate: held out 1/2: .* \(\d+ s elapsed, ETA \d+ s\)\n.*calibrate: held out 2/2: "
        r".* \(\d+ s elapsed, ETA \d+ s\)",
        err,
    ), err
    assert re.search(r"leave-one-model-out refits once per model family \(2 refits.*\): --no-lomo skips it", err)
    assert err.index("--no-lomo skips it") < err.index("fitting on 2 runs"), err  # said at the start
    assert main(["calibrate", "--from", str(csv), "--replace", "--no-save", "--json", "--no-lomo"]) == 0
    err = capsys.readouterr().err
    assert "held out" not in err and "--no-lomo" not in err, err


@pytest.mark.slow
def test_calibrate_eta_counts_down_the_refits_left():
    """The ETA of leave-one-model-out: before the first refit, the full fit's time per refit; then the mean
    refit time so far times the refits left."""
    from tunebench.plan import calibration as cal
    from tunebench.plan.measurements import default_records

    by_family: dict[str, list] = {}
    for r in default_records():
        by_family.setdefault(r.family, []).append(r)
    records = [r for family in sorted(by_family)[:3] for r in by_family[family][:4]]  # small: quick refits
    said: list[tuple[str, float | None]] = []
    cal.leave_one_model_out(records, progress=lambda msg, eta_s=None: said.append((msg, eta_s)), fit_s=100.0)
    assert [m.split(":")[0] for m, _ in said] == ["held out 1/3", "held out 2/3", "held out 3/3"]
    assert said[0][1] == 300.0  # 3 refits at the full fit's 100 s each
    assert all(eta is not None and 0 < eta != 300.0 for _, eta in said[1:])  # from the refits measured


def test_a_cold_plan_says_it_traces_once(tmp_path, capsys, monkeypatch):
    """The first plan of an architecture traces it (tens of seconds on a small CPU): one line on stderr says
    so with an estimate; the next plan reads the cached profile and says nothing."""
    import json

    import tunebench.plan.trace as trace

    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(trace, "NOTICE_AFTER_S", 0.0)  # every trace is announced (the default: 2 s)
    model = tmp_path / "tiny-progress.json"
    model.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 512,
                "max_position_embeddings": 512,
            }
        )
    )
    args = [
        "plan",
        "finetune_full_benchmark-v1.0.0",
        f"model_name={model}",
        "model_max_length=256",
        "number_gpus=1",
        "batch_size=2",
        "gpu_model=NVIDIA-A100-80GB-PCIe",
        "--json",
    ]
    assert main(args) == 0
    err = capsys.readouterr().err
    notices = re.findall(r"tracing (.+) \(first plan of this architecture, ~\d+ s\)", err)
    assert len(notices) == 1 and "tiny-progress" in notices[0], err
    assert main(args) == 0
    assert "tracing" not in capsys.readouterr().err
