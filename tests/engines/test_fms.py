"""The fms-hf-tuning engine for real: environments built with uv from the package index, tiny models trained
on the CPU by fms-hf-tuning's own tuning.sft_trainer, every measured property through tunebench's callback.

The environments are built once per test session (TUNEBENCH_ENGINES_DIR in a temporary folder): the
newest release and the spec's default, 2.1.2. uv's cache makes a rebuild take seconds.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tunebench.actuators.measure import measure
from tunebench.commands.main import main
from tunebench.engines import FMS, NATIVE, envs
from tunebench.engines.versions import NEWEST
from tunebench.spec.experiments import get_experiment, make_entity
from tunebench.spec.measured import BENCHMARK_MEASURED

pytestmark = pytest.mark.engines  # builds environments from the package index with uv

DATASET = "news-chars-512-entries-4096"  # records of 390+ tiny-tokenizer tokens, response within the first 384
LENGTH = 384
BATCH, STEPS = 2, 2
DEFAULT_VERSION = "2.1.2"  # the SFTTrainer spec's default fms_hf_tuning_version


@pytest.fixture(scope="session")
def engines_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("engines")
    old = os.environ.get("TUNEBENCH_ENGINES_DIR")
    os.environ["TUNEBENCH_ENGINES_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TUNEBENCH_ENGINES_DIR", None)
    else:
        os.environ["TUNEBENCH_ENGINES_DIR"] = old


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Where this module's measurements go: each distinct one is run once and shared (_measure)."""
    return tmp_path_factory.mktemp("fms-runs")


_MEASURED: dict[tuple, object] = {}


def _measure(runs, method="lora", version=NEWEST, engine=FMS, **params):
    """The measurement of smollm2-135m (random weights) by engine at version, run once per module and
    argument set: three tests compare the newest release's LoRA run with others."""
    key = (str(runs), method, version, engine, tuple(sorted(params.items())))
    if key not in _MEASURED:
        _MEASURED[key] = _run(runs, method, version, engine, **params)
    return _MEASURED[key]


def _run(tmp_path, method, version, engine, **params):
    experiment_id = {"lora": "finetune_lora_benchmark-v1.0.0", "full": "finetune_full_benchmark-v1.0.0"}[method]
    exp = get_experiment(
        experiment_id,
        {
            "max_steps": STEPS,
            "dataset_id": DATASET,
            "gradient_accumulation_steps": 1,
            "fms_hf_tuning_version": version,
            **params,
        },
    )
    entity = make_entity(
        exp, {"model_name": "smollm2-135m", "model_max_length": LENGTH, "number_gpus": 0, "batch_size": BATCH}
    )
    return measure(
        exp,
        entity,
        {
            "weights": "random",
            "output_dir": str(tmp_path / f"{engine}-{method}-{version}"),
            "data_dir": str(tmp_path / "data"),
            "timeout_seconds": 600,
            "extra_worker_args": ("--tunebench_tiny", "True"),
        },
        engine=engine,
    )


@pytest.mark.parametrize("method", ["lora", "full"])
def test_fms_hf_tuning_trains_and_returns_every_measured_property(engines_dir, runs, method):
    result = _measure(runs, method)
    assert result.status == "valid", (result.error, result.reasons, result.log_tail)
    assert result.actuator == FMS
    props = result.properties
    assert set(BENCHMARK_MEASURED) <= set(props) and props["is_valid"] == 1
    # every record is cut to LENGTH tokens (no padding): the counted tokens are exactly steps x batch x LENGTH
    assert props["dataset_tokens_per_second"] * props["train_runtime"] == pytest.approx(STEPS * BATCH * LENGTH)
    meta = result.metadata
    assert meta["steps"] == STEPS and meta["trained_tokens"] > 0
    # fms-hf-tuning's own code trained: its environment's versions ran, and its main() logged the run
    assert meta["engine"]["version"] == NEWEST and meta["engine"]["packages"]["fms-hf-tuning"] == NEWEST
    assert meta["versions"]["transformers"] == meta["engine"]["packages"]["transformers"] != _project("transformers")
    log = (runs / f"{FMS}-{method}-{NEWEST}" / "worker.log").read_text()
    assert "fms-hf-tuning execution start" in log
    peft = meta.get("peft")
    assert (peft is not None) == (method == "lora"), peft


def _project(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def test_a_version_switch_changes_the_library_that_ran(engines_dir, runs):
    newest = _measure(runs, version=NEWEST)
    default = _measure(runs, version=DEFAULT_VERSION)
    assert newest.status == default.status == "valid", (default.error, default.log_tail)
    assert default.metadata["engine"]["packages"]["fms-hf-tuning"] == DEFAULT_VERSION
    assert newest.metadata["engine"]["packages"]["fms-hf-tuning"] == NEWEST
    # each release runs its own pinned stack: 2.1.2 pins transformers 4.45, 3.2.2 transformers 4.55
    assert default.metadata["versions"]["transformers"].startswith("4.45.")
    assert newest.metadata["versions"]["transformers"].startswith("4.55.")
    assert default.experiment_id != newest.experiment_id  # the version parameterises the experiment id


def test_the_same_entity_through_both_engines_counts_the_same_tokens(engines_dir, runs):
    native, fms = _measure(runs, engine=NATIVE), _measure(runs, engine=FMS)
    assert native.status == fms.status == "valid", (fms.error, fms.log_tail)
    assert native.actuator == "measure" and fms.actuator == FMS  # the store keeps them apart
    tokens = [r.properties["dataset_tokens_per_second"] * r.properties["train_runtime"] for r in (native, fms)]
    assert tokens[0] == pytest.approx(tokens[1])


def test_a_plugin_the_version_does_not_drive_is_invalid(engines_dir, tmp_path):
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", {"fms_hf_tuning_version": "2.1.2", "fast_moe": 1})
    entity = make_entity(
        exp, {"model_name": "granite-3.0-1b-a400m-base", "model_max_length": 128, "number_gpus": 0, "batch_size": 2}
    )
    result = measure(exp, entity, {"output_dir": str(tmp_path / "moe")}, engine=FMS)
    assert result.status == "invalid" and result.actuator == FMS
    assert any("2.4.0" in r for r in result.reasons), result.reasons
    # fast_kernels on 3.2.2 is driven (fms-acceleration-foak), but its Triton kernels need a GPU
    result = _measure(tmp_path, fast_kernels="True,True,True")
    assert result.status == "invalid", (result.error, result.reasons)
    assert any("fast_kernels" in r and "run on a GPU only" in r for r in result.reasons), result.reasons
    assert not list(engines_dir.glob("*-plugins")), "an invalid entity built an environment"


def test_a_version_never_published_is_invalid_not_attempted(engines_dir, tmp_path):
    result = _measure(tmp_path, version="3.0.0.1")
    assert result.status == "invalid"
    assert any("3.0.0.1 was never published" in r for r in result.reasons), result.reasons


def test_a_broken_environment_is_detected_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_ENGINES_DIR", str(tmp_path / "engines"))
    first = envs.ensure(DEFAULT_VERSION)
    assert envs.status(DEFAULT_VERSION) == ("ready", None)
    site = next(first.path.glob("lib/python3*/site-packages"))
    shutil.rmtree(site / "transformers")  # a package gone: installed metadata, nothing to import
    state, why = envs.status(DEFAULT_VERSION)
    assert state == "broken" and "cannot import" in why, why
    messages = []
    again = envs.ensure(DEFAULT_VERSION, progress=messages.append)
    assert any("broken" in m and "rebuilding" in m for m in messages), messages
    assert envs.status(DEFAULT_VERSION) == ("ready", None)
    assert (next(again.path.glob("lib/python3*/site-packages")) / "transformers").is_dir()
    # built for other requirements (a plugins environment from before a plugin was added to it): rebuilt
    manifest = json.loads((again.path / envs.MANIFEST).read_text())
    (again.path / envs.MANIFEST).write_text(json.dumps({**manifest, "requirements": manifest["requirements"][:-1]}))
    state, why = envs.status(DEFAULT_VERSION)
    assert state == "broken" and why == "built for other requirements (now also pyyaml)", why
    # a build that never finished (no manifest) is never used either
    (again.path / envs.MANIFEST).unlink()
    assert envs.status(DEFAULT_VERSION)[0] == "broken"
    assert envs.ensure(DEFAULT_VERSION).manifest["version"] == DEFAULT_VERSION


def invoke(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_engines_commands(engines_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNEBENCH_ENGINES_DIR", str(tmp_path / "cli-engines"))
    code, out, _err = invoke(["engines", "install", DEFAULT_VERSION], capsys)
    assert code == 0 and f"fms-hf-tuning {DEFAULT_VERSION}: ready" in out
    code, out, _err = invoke(["engines", "list", "--json"], capsys)
    listed = json.loads(out)["environments"]
    assert [(e["version"], e["state"]) for e in listed] == [(DEFAULT_VERSION, "ready")]
    assert listed[0]["packages"]["fms-hf-tuning"] == DEFAULT_VERSION and listed[0]["torch_mode"] == "host"
    code, out, _err = invoke(["engines", "remove", DEFAULT_VERSION], capsys)
    assert (
        code == 0 and "removed" in out and not (tmp_path / "cli-engines" / f"fms-hf-tuning-{DEFAULT_VERSION}").exists()
    )


def test_the_launch_plan_runs_fms_hf_tuning_where_the_spec_runs_tuning_sft_trainer():
    from tunebench.actuators.launch import build_launch_plan

    exp = get_experiment("finetune_lora_benchmark-v1.0.0")
    one = make_entity(
        exp,
        {
            "model_name": "llama3-8b",
            "model_max_length": 1024,
            "number_gpus": 1,
            "gpu_model": "NVIDIA-A100-SXM4-80GB",
            "batch_size": 4,
        },
    )
    four = make_entity(
        exp,
        {
            "model_name": "llama3-8b",
            "model_max_length": 1024,
            "number_gpus": 4,
            "gpu_model": "NVIDIA-A100-SXM4-80GB",
            "batch_size": 4,
        },
    )
    single = build_launch_plan(exp, one, engine=FMS).nodes[0].command
    assert single[:3] == ["python", "-m", "tunebench.engines.fms_worker"]  # spec: python -m tuning.sft_trainer
    fsdp = build_launch_plan(exp, four, engine=FMS).nodes[0].command
    assert fsdp[:2] == ["accelerate", "launch"] and fsdp[fsdp.index("-m") + 1] == "tunebench.engines.fms_worker"
    native = build_launch_plan(exp, four).nodes[0].command
    assert native[native.index("-m") + 1] == "tunebench.worker"
    # the flags are the same: only the module that reads them differs
    assert fsdp[fsdp.index("-m") + 2 :] == native[native.index("-m") + 2 :]


def test_the_store_keeps_each_engines_results_apart(tmp_path, capsys):
    """`tunebench run` stores a result under its actuator's name: the same entity measured by both engines
    is two rows, and the engine's actuator resolves by name (as a space file names it)."""
    from tunebench.actuators.measure import measure_fms
    from tunebench.actuators.registry import resolve_actuator
    from tunebench.commands.store import record_run
    from tunebench.spec.results import Result
    from tunebench.store.open import open_store

    assert resolve_actuator(FMS).run is measure_fms
    exp = get_experiment("finetune_lora_benchmark-v1.0.0", {"fms_hf_tuning_version": "3.2.2"})
    entity = make_entity(
        exp, {"model_name": "smollm2-135m", "model_max_length": 384, "number_gpus": 0, "batch_size": 2}
    )
    url = str(tmp_path / "s.db")
    for actuator, rate in (("measure", 100.0), (FMS, 110.0)):
        result = Result.valid(exp.id, entity.id, {"dataset_tokens_per_second": rate}, actuator=actuator)
        record_run(url, exp, entity, result)
    with open_store(url) as store:
        rows = {r["actuator"]: r["properties"]["dataset_tokens_per_second"] for r in store.rows()}
    assert rows == {"measure": 100.0, FMS: 110.0}


def test_the_cli_offers_exactly_the_engines():
    from typing import get_args

    from tunebench.engines import ENGINES
    from tunebench.inputs import Engine

    assert get_args(Engine) == ENGINES
