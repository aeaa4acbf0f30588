"""Actuators named in space files come from a registry (tunebench's own and plugins' entry points);
an arbitrary module:function needs an explicit opt-in (issue 11, item 8)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from layout import SRC

from tunebench.actuators.registry import _plugins, registered_actuators, resolve_actuator
from tunebench.errors import InputError
from tunebench.executors.local import LocalExecutor
from tunebench.explore import Settings, explore, parse_space
from tunebench.store import Store

SPACE = {
    "experiments": [{"id": "finetune_lora_benchmark-v1.0.0"}],
    "entity_space": {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": [1, 2]},
}


def test_builtin_names_resolve_without_an_opt_in():
    assert {"measure", "predict", "noop"} <= set(registered_actuators())
    assert resolve_actuator("noop").name == "noop"


def test_each_builtin_actuator_declares_what_executors_need():
    """One Actuator per name: its option check, whether it needs hardware, its multi-node steps."""
    from tunebench.actuators.registry import BUILTIN, HARDWARE_FREE, Actuator, needs_hardware

    for name in BUILTIN:
        actuator = resolve_actuator(name)
        assert isinstance(actuator, Actuator) and actuator.name == name
        assert actuator.needs_hardware == (name not in HARDWARE_FREE) == needs_hardware(name)
        assert (actuator.multinode is not None) == (name in ("measure", "fms-hf-tuning")), name
    assert resolve_actuator("measure").check_options is not None and resolve_actuator("predict").check_options


def test_a_plain_function_is_a_one_node_actuator_that_needs_the_hardware():
    actuator = resolve_actuator("fake_actuators:sleepy", allow_import=True)
    assert actuator.needs_hardware and actuator.multinode is None and actuator.check_options is None
    assert resolve_actuator("fake_actuators:GLOO_ALLREDUCE", allow_import=True).multinode is not None


def test_ray_refuses_a_multi_node_entity_of_a_one_node_actuator_before_placing_nodes():
    """No silent fallback to another actuator's steps: a failed result that names the actuator."""
    from tunebench.executors.ray import RayExecutor
    from tunebench.executors.task import Task

    values = {"model_name": "smollm2-135m", "number_gpus": 2, "number_nodes": 2, "gpu_model": "NVIDIA-A100-80GB-PCIe"}
    task = Task(
        request_id=1,
        attempt=1,
        actuator="fake_actuators:sleepy",
        base_id="finetune_full_benchmark-v1.0.0",
        parameters={},
        experiment_id="finetune_full_benchmark-v1.0.0",
        entity_id="e",
        entity_values=values,
        number_gpus=2,
        number_nodes=2,
        gpu_model=values["gpu_model"],
        allow_import=True,
    )
    executor = object.__new__(RayExecutor)  # no Ray: refused before any call to it
    executor.ray = None
    result = executor._run_multinode(task)
    assert result.status == "failed" and "runs entities on one node only" in result.error


@pytest.mark.parametrize("name", ["os:system", "subprocess:call", "builtins:exec", "fake_actuators:sleepy"])
def test_module_function_paths_need_the_opt_in(name):
    with pytest.raises(InputError, match="--allow-actuator-import") as caught:
        resolve_actuator(name)
    assert caught.value.field == "actuator.name"


@pytest.mark.parametrize("name", ["os.system", "os:system; rm -rf /", "../x:y", "measur"])
def test_names_that_are_neither_registered_nor_a_path_are_unknown(name):
    with pytest.raises(InputError, match="unknown actuator"):
        resolve_actuator(name, allow_import=True)


def test_a_space_file_naming_os_system_runs_nothing_and_stores_nothing(tmp_path):
    space = {**SPACE, "actuator": {"name": "os:system"}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "tunebench", "explore", "space.yaml", "--store", "s.db", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: actuator.name: 'os:system' is not a registered")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]  # no store, no operation, no run


def test_the_library_refuses_it_too_unless_settings_opt_in(tmp_path):
    space = parse_space({**SPACE, "actuator": {"name": "fake_actuators:sleepy"}})
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(InputError, match="actuator.name"):
            explore(space, store, LocalExecutor(1), Settings())
        assert store.operations() == []
        summary = explore(space, store, LocalExecutor(1), Settings(allow_actuator_import=True))
    assert summary.valid == 2


def test_plugins_register_actuators_as_entry_points(tmp_path, monkeypatch):
    """A package that declares an entry point of group tunebench.actuators is usable by name."""
    site = tmp_path / "site"
    (site / "tb_plugin_demo").mkdir(parents=True)
    (site / "tb_plugin_demo" / "__init__.py").write_text(
        textwrap.dedent("""
        from tunebench.spec.results import Result

        def measure_nothing(experiment, entity, options):
            return Result.valid(experiment.id, entity.id, {"train_runtime": 1.0}, actuator="demo")
    """)
    )
    info = site / "tb_plugin_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-plugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tunebench.actuators]\ndemo = tb_plugin_demo:measure_nothing\n")
    monkeypatch.syspath_prepend(str(site))
    _plugins.cache_clear()
    try:
        assert registered_actuators()["demo"] == "tb_plugin_demo:measure_nothing"
        space = parse_space({**SPACE, "actuator": {"name": "demo"}})
        with Store(tmp_path / "s.db") as store:
            summary = explore(space, store, LocalExecutor(1), Settings())  # no opt-in needed
        assert summary.valid == 2
    finally:
        _plugins.cache_clear()
