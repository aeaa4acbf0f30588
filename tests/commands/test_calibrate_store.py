"""`tunebench calibrate` without --store reads the default store (where import, run and explore write
without --store) and says so; with no store yet, the reference runs alone."""

from __future__ import annotations

import json

import pytest

from tunebench import logs
from tunebench.commands.calibrate import DEFAULT_SOURCE, gather_records
from tunebench.commands.main import main
from tunebench.plan.measurements import CPU_EXAMPLE, default_records


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A tunebench home of its own: its store.db is the default store; log lines on stderr as the CLI's."""
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path))
    monkeypatch.delenv("TUNEBENCH_STORE", raising=False)
    logs.configure(0)
    return tmp_path


def test_no_default_store_yet_fits_the_reference_runs_and_says_so(home, capsys):
    capsys.readouterr()
    records, label = gather_records(None, None, replace=False)
    assert label == DEFAULT_SOURCE and len(records) == len(default_records())
    assert f"no store at {home / 'store.db'} yet" in capsys.readouterr().err


def test_calibrate_after_import_reads_the_default_store(home, capsys):
    assert main(["import", str(CPU_EXAMPLE)]) == 0  # no --store: the default store
    assert (home / "store.db").is_file()
    capsys.readouterr()
    records, label = gather_records(None, None, replace=False)
    reference = len(default_records())
    assert len(records) == reference + 4
    assert label == f"sqlite:///{home / 'store.db'} + {reference} reference runs"
    assert f"reading the measurements of the default store sqlite:///{home / 'store.db'}" in capsys.readouterr().err
    # the command: fitted on the 4 imported CPU runs alone (--replace), the store named as the source
    assert main(["calibrate", "--replace", "--no-lomo", "--no-save", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 4 and out["models"] == ["smollm2-135m"]
    assert str(home / "store.db") in out["source"]


def test_from_csv_alone_does_not_read_the_default_store(home, capsys):
    assert main(["import", str(CPU_EXAMPLE)]) == 0
    records, label = gather_records(None, [CPU_EXAMPLE], replace=True)
    assert len(records) == 4 and label == str(CPU_EXAMPLE)


def test_a_default_store_without_measurements_fits_the_reference_runs(home, capsys):
    from tunebench.store import Store

    Store(f"sqlite:///{home / 'store.db'}").close()  # a store, empty
    capsys.readouterr()
    records, label = gather_records(None, None, replace=False)
    assert label == DEFAULT_SOURCE and len(records) == len(default_records())
    assert "holds no measurement: the reference runs alone" in capsys.readouterr().err


def test_no_store_fits_the_reference_runs_alone(home, capsys):
    """What refitting the shipped calibration needs: the reference runs, whatever the default store holds."""
    assert main(["import", str(CPU_EXAMPLE)]) == 0
    capsys.readouterr()
    records, label = gather_records(None, None, replace=False, default=False)
    assert label == DEFAULT_SOURCE and len(records) == len(default_records())
    assert "default store" not in capsys.readouterr().err
    assert main(["calibrate", "--no-store", "--store", str(home / "store.db")]) == 2
    assert "error: --no-store:" in capsys.readouterr().err
