"""`tunebench demo` (what `make demo` runs): its five steps for real, in a folder of its own."""

from __future__ import annotations

import pytest

from tunebench.commands import demo
from tunebench.commands.main import main
from tunebench.spec.measured import GPU_ONLY
from tunebench.store import Store


@pytest.mark.slow
def test_demo_runs_every_step(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    folder = tmp_path / "demo"
    assert main(["demo", "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    for _, argv in demo.steps(folder):
        assert f"$ tunebench {argv[0]} " in out
    assert "risky" in out or "fits" in out  # step 1's verdict on the GPU job
    assert "Per method on NVIDIA-A100-SXM4-80GB" in out  # step 2
    assert "predicted vs measured" in out and "demo done in" in out  # step 4, the end
    run = out[out.index("3. Measure") : out.index("4. The planner")]
    assert "dataset_tokens_per_second" in run and not [n for n in GPU_ONLY if n in run]  # a CPU run: no GPU zeros
    assert (folder / demo.REPORT).stat().st_size > 100_000 and (folder / demo.RUN).is_dir()
    with Store(f"sqlite:///{folder / demo.STORE}", readonly=True) as store:
        rows = store.rows()
    assert [(r["actuator"], r["status"]) for r in rows] == [("measure", "valid")]


def test_a_demo_run_again_starts_from_a_fresh_store(tmp_path):
    folder = tmp_path / "demo"
    assert demo.fresh_store(folder) == folder and folder.is_dir()
    (folder / demo.STORE).write_text("the previous demo's store")
    (folder / demo.REPORT).write_text("the previous report")
    demo.fresh_store(folder)
    assert not (folder / demo.STORE).exists() and (folder / demo.REPORT).exists()  # the report is rewritten later
