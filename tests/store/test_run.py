"""`tunebench run` keeps its result in the store (a measurement, memoised for explore); --no-store opts out."""

from __future__ import annotations

import json

from tunebench.commands.main import main
from tunebench.store import Store

FULL = "finetune_full_benchmark-v1.0.0"
# invalid by rule (batch size 3 over 2 GPUs, no gpu_model): measured at once, without training
INVALID = ["model_name=smollm2-135m", "model_max_length=64", "number_gpus=2", "batch_size=3"]
# a failed run, also without training: several nodes need the ray executor
FAILED = ["model_name=smollm2-135m", "model_max_length=64", "number_gpus=2", "batch_size=2",
          "gpu_model=NVIDIA-A100-80GB-PCIe", "number_nodes=2"]  # fmt: skip


def test_run_stores_its_result(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    assert main(["run", FULL, *INVALID, "--store", url, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "invalid" and "stored in sqlite:///" in captured.err
    with Store(url) as store:
        (row,) = store.rows()
    assert (row["actuator"], row["status"], row["generator"]) == ("measure", "invalid", "run")
    assert row["entity"]["batch_size"] == 3 and "rule 1" in " ".join(row["reasons"])
    assert main(["run", FULL, *FAILED, "--store", url]) == 1
    with Store(url) as store:
        assert sorted(r["status"] for r in store.rows(actuator="measure")) == ["failed", "invalid"]
    assert main(["show", "--store", url, "--format", "json", "--where", "status=failed"]) == 0


def test_run_goes_to_the_default_store(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_STORE", str(tmp_path / "env.db"))
    assert main(["run", FULL, *INVALID]) == 0
    with Store(tmp_path / "env.db") as store:
        assert len(store.rows()) == 1


def test_no_store_keeps_nothing(tmp_path, capsys, monkeypatch):
    url = tmp_path / "s.db"
    monkeypatch.setenv("TUNEBENCH_STORE", str(url))  # the store run would keep the result in
    assert main(["run", FULL, *INVALID, "--no-store"]) == 0
    assert "stored in" not in capsys.readouterr().err and not url.exists()


def test_store_and_no_store_together_are_refused_as_calibrate_does(tmp_path, capsys):
    url = tmp_path / "s.db"
    assert main(["run", FULL, *INVALID, "--store", str(url), "--no-store"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: --no-store: give --store URL or --no-store, not both\n" and captured.out == ""
    assert main(["calibrate", "--store", str(url), "--no-store"]) == 2
    assert capsys.readouterr().err == captured.err
    assert not url.exists()


def test_a_bad_store_is_refused_before_measuring(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    assert main(["run", FULL, *FAILED, "--store", str(tmp_path / "adir")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --store") and "measuring" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
