"""Tables on an 80-column terminal: no line wider, every name whole or shortened in the middle, --wide
in full; show's hint at the other actuators' rows, and the store's operations."""

from __future__ import annotations

import io
import json
import re

import pytest
import yaml
from rich.console import Console

from tunebench.catalog import list_gpus, list_models
from tunebench.commands.explore_progress import ProgressDisplay
from tunebench.commands.main import describe_dict, main
from tunebench.commands.terminal import middle
from tunebench.datasets.ids import KNOWN_DATASET_IDS
from tunebench.explore.explorer import Progress
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.results import Result
from tunebench.store import Store
from tunebench.store.store import Record

EXP = get_experiment("finetune_full_benchmark-v1.0.0", {"stop_after_seconds": 30})
LONG = "hf-tiny-model-private/tiny-random-BloomForCausalLM"  # the catalog's longest name


@pytest.fixture(autouse=True)
def narrow(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def out(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def fits(text: str, width: int = 80) -> None:
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, long


def readable(name: str, text: str) -> bool:
    """name is printed whole, or with an ellipsis in the middle (its start and its end kept)."""
    if name in text:
        return True
    for token in re.findall(r"\S*…\S*", text):
        start, end = token.split("…", 1)
        if len(start) >= 3 and len(end) >= 3 and name.startswith(start) and name.endswith(end):
            return True
    return False


def first_column(text: str) -> list[str]:
    """The first column's cells, a name wrapped after '_' or '-' joined back."""
    names: list[str] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cell = line.split("│")[1].strip()
        if names and names[-1].endswith(("_", "-")):
            names[-1] += cell
        elif cell:
            names.append(cell)
    return names


def test_middle_keeps_both_ends():
    assert middle(LONG, 20) == LONG[:10] + "…" + LONG[-9:]
    assert len(middle(LONG, 20)) == 20 and middle("short", 20) == "short"


def test_models_fit_80_columns_and_wide_shows_everything(capsys):
    text = out(capsys, "models")
    fits(text)
    for header in ("name", "params", "layers", "hidden"):
        assert re.search(rf"┃ +{re.escape(header)} +┃", text), header
    # a name users type is printed whole, wrapped after '-' where it is long: never shortened in the middle
    assert all(m.name in first_column(text) for m in list_models()) and "…" not in text
    assert LONG in first_column(text) and "not shown:" in text  # the left-out columns named
    wide = out(capsys, "models", "--wide")
    assert all(m.name in wide for m in list_models()) and "confidence" in wide and "FSDP wrap" in wide


def test_gpus_datasets_and_experiments_fit_80_columns(capsys):
    text = out(capsys, "gpus")
    fits(text)
    # two RTX PRO 6000 editions differ only in the middle of their labels: both printed whole
    assert all(g.name in first_column(text) for g in list_gpus()) and "gpu_model" in text and "…" not in text
    assert "not shown: interconnect, aliases (--wide or --json shows them)" in text
    wide = out(capsys, "gpus", "--wide")  # as models --wide: every column
    assert "interconnect" in wide and "aliases" in wide and "A100-80GB" in wide
    text = out(capsys, "datasets", "list")
    fits(text)
    assert all(readable(ds, text) for ds in KNOWN_DATASET_IDS)
    text = out(capsys, "experiments")
    fits(text)
    assert all(e in first_column(text) for e in ("finetune_full_benchmark-v1.0.0", "finetune_lora_benchmark-v1.0.0"))


def test_describe_fits_80_columns_and_never_splits_a_property_name(capsys):
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", {})
    text = out(capsys, "describe", exp.id)
    fits(text)
    info = describe_dict(exp)
    names = first_column(text.split("hardcoded")[0])
    assert [p["name"] for p in info["required"] + info["optional"]] == names
    assert set(info["hardcoded"]) <= set(first_column(text.split("hardcoded")[1]))


def store_of(url: str, actuator: str, n: int, memory: bool = True) -> None:
    """n results of actuator on two models (one with the catalog's longest name)."""
    with Store(url) as store:
        records = []
        for i in range(n):
            entity = make_entity(
                EXP,
                {
                    "model_name": LONG if i % 2 else "smollm2-135m",
                    "number_gpus": 0,
                    "model_max_length": 128,
                    "batch_size": i + 1,
                },
            )
            props = {"dataset_tokens_per_second": 1000.0 + i, "train_runtime": 3.0, "is_valid": 1}
            if memory:
                props["gpu_memory_allocated_peak_gib"] = 0.5 * (i + 1)
            result = Result.valid(EXP.id, entity.id, props, actuator=actuator)
            records.append(Record(EXP, entity, result, actuator=actuator, generator="test"))
        store.record_many(records)


def test_show_fits_80_columns_and_wide_shows_every_column(tmp_path, capsys, monkeypatch):
    url = str(tmp_path / "s.db")
    store_of(url, "measure", 13)
    text = out(capsys, "show", "--store", url)
    fits(text)
    assert readable(LONG, text) and "smollm2-135m" in text and "1012" in text
    assert "number_gpus 0" in text  # a column with one value is named once, above the table
    wide = out(capsys, "show", "--store", url, "--wide")
    assert LONG in wide and "gpu_memory_allocated_peak_gib" in wide and "dataset_tokens_per_second" in wide
    monkeypatch.setenv("COLUMNS", "160")
    text = out(capsys, "show", "--store", url)
    fits(text, 160)
    assert LONG in text and len(text.splitlines()) < 13 + 12  # one line per row


def test_show_names_the_other_actuators_rows_and_the_command(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    store_of(url, "predict", 3)
    assert main(["show", "--store", url, "--actuator", "measure"]) == 0
    text = capsys.readouterr().out
    assert "no results" in text and "3 rows of actuator predict" in text
    assert f"tunebench show --store {url} --actuator predict" in text
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "experiments": [{"id": EXP.base_id, "parameters": {"stop_after_seconds": 30}}],
                "entity_space": {
                    "model_name": "smollm2-135m",
                    "number_gpus": 0,
                    "model_max_length": 128,
                    "batch_size": [1, 3],
                },
            }
        )
    )
    assert main(["show", "--store", url, "--space", str(space), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1  # the header: the space's actuator (measure) has no rows
    assert "2 rows of actuator predict" in captured.err
    assert f"tunebench show --store {url} --space {space} --actuator predict" in captured.err
    assert (
        len(
            json.loads(
                out(capsys, "show", "--store", url, "--space", str(space), "--actuator", "predict", "--format", "json")
            )
        )
        == 2
    )


def test_operations_lists_the_stores_operations(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "experiments": [{"id": "finetune_full_benchmark-v1.0.0"}],
                "actuator": {"name": "noop"},
                "entity_space": {
                    "model_name": "smollm2-135m",
                    "model_max_length": 64,
                    "number_gpus": 0,
                    "batch_size": [1, 2, 3],
                },
            }
        )
    )
    url = str(tmp_path / "s.db")
    assert main(["--quiet", "explore", str(space), "--store", url]) == 0
    capsys.readouterr()
    (op,) = json.loads(out(capsys, "operations", "--store", url, "--json"))
    assert (op["sampler"], op["actuator"], op["points"], op["valid"], op["runs"]) == ("grid", "noop", 3, 3, 1)
    assert op["id"].startswith("op-") and op["created_at"][:2] == "20"
    text = out(capsys, "operations", "--store", url)
    fits(text)
    assert op["id"] in text and "noop" in text and op["created_at"] in text
    assert op["created_by"] in out(capsys, "operations", "--store", url, "--wide")


def test_explore_progress_fits_80_columns():
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    with ProgressDisplay(console) as display:
        display.update(Progress("op-6217c411aab1", total=120, done=9, running=2, failed=1, memoised=3))
    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", buffer.getvalue()).replace("\r", "\n").splitlines()
    assert any("9/120" in line for line in lines)
    assert all(len(line) <= 80 for line in lines) and any("fail 1" in line for line in lines)
    assert not any("…" in line for line in lines)


def test_recommend_per_method_table_on_80_columns(capsys):
    """recommend's per-method table keeps every header whole on 80 columns, and the notes that say why a
    method does not fit; the least important columns are named under it."""
    text = out(
        capsys,
        "recommend",
        "finetune_lora_benchmark-v1.0.0",
        "model_name=mistral-7b-v0.1",
        "model_max_length=4096",
        "batch_size=8",
        "gpu_model=H100",
        "--max-gpus",
        "1",
        "--price-per-gpu-hour",
        "3",
    )
    fits(text)
    table = text[text.index("Per method on") :]
    for header in ("method", "GPUs", "P(OOM)", "tokens/s", "notes"):
        assert header in table
    assert "…" not in table and "does not fit on" in table and "not shown: nodes" in table
