"""`tunebench demo` (what `make demo` runs): its five steps for real, in a folder of its own."""

from __future__ import annotations

import pytest

from tunebench.commands import demo
from tunebench.commands.main import main
from tunebench.errors import InputError
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


def test_the_demo_starts_afresh_in_its_own_folder_only(tmp_path):
    """A re-run goes into the demo's own folder (marked, or from before the marker: its outputs alone) or an
    empty one; a folder holding anything else is refused naming --dir, left as it was (`demo --dir /` wrote
    /runs.db and /run)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / demo.STORE).write_text("someone's store")
    (mine / demo.REPORT).write_text("someone's report")
    with pytest.raises(InputError) as caught:
        demo.fresh_store(mine)
    assert caught.value.field == "--dir"
    assert sorted(p.name for p in mine.iterdir()) == [demo.REPORT, demo.STORE]
    assert (mine / demo.STORE).read_text() == "someone's store"

    made = demo.fresh_store(tmp_path / "new")  # a new folder, marked as the demo's
    (made / demo.STORE).write_text("the previous demo's store")
    (made / demo.RUN).mkdir()
    (made / "notes.txt").write_text("any file: the folder is the demo's")
    assert demo.fresh_store(made) == made and not (made / demo.STORE).exists()

    old = tmp_path / "old"  # a demo's folder from before the marker
    (old / demo.RUN).mkdir(parents=True)
    (old / demo.STORE).write_text("store")
    (old / demo.REPORT).write_text("report")
    demo.fresh_store(old)
    assert (old / demo.MARKER).is_file() and not (old / demo.STORE).exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert demo.fresh_store(empty) == empty and (empty / demo.MARKER).is_file()


@pytest.mark.parametrize("where", ["", " ", ".", "the working directory's absolute path"])
def test_the_demo_refuses_an_empty_path_or_a_folder_it_did_not_make(tmp_path, monkeypatch, capsys, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's")
    assert main(["demo", "--dir", str(tmp_path) if where.startswith("the ") else where]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --dir: ") and len(err.splitlines()) == 1, err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
