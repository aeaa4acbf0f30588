"""Bad space files through the CLI: ado's resources (space from-ado, explore) and tunebench's own.

Each case is a small YAML file in a fresh directory, run in-process through ``tunebench.commands.main``:
exit code 2, one line ``error: <field>: ...`` on stderr, nothing on stdout and no file created (the
store included). An alarm fails a case that hangs instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest
import yaml

from tunebench.commands.main import main

LORA = "finetune_lora_benchmark-v1.0.0"

# an ado discovery space: its batch_size a discrete range, half-open (1, 2, 3); domains are replaced below
ADO_SPACE = {
    "experiments": [
        {
            "actuatorIdentifier": "SFTTrainer",
            "experimentIdentifier": LORA,
            "parameterization": [{"property": {"identifier": "max_steps"}, "value": 2}],
        }
    ],
    "entitySpace": [
        {"identifier": "model_name", "propertyDomain": {"values": ["smollm2-135m"]}},
        {"identifier": "model_max_length", "propertyDomain": {"values": [256]}},
        {"identifier": "number_gpus", "propertyDomain": {"values": [0]}},
        {"identifier": "batch_size", "propertyDomain": {"domainRange": [1, 4], "interval": 1}},
    ],
}
BATCH = "entitySpace[3].propertyDomain"  # the field of batch_size's domain

NATIVE_SPACE = {
    "experiments": [{"id": LORA, "parameters": {"max_steps": 2}}],
    "entity_space": {"model_name": ["smollm2-135m"], "model_max_length": [256], "batch_size": [1], "number_gpus": [1]},
    "actuator": {"name": "predict"},
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEBENCH_STORE", raising=False)
    monkeypatch.delenv("TUNEBENCH_GPU_CATALOG", raising=False)
    return tmp_path


def write(path: Path, content: object) -> str:
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return str(path)


def ado_space(batch_domain: object) -> dict:
    """ADO_SPACE with batch_size's propertyDomain replaced."""
    dims = [*ADO_SPACE["entitySpace"][:3], {"identifier": "batch_size", "propertyDomain": batch_domain}]
    return {**ADO_SPACE, "entitySpace": dims}


@contextlib.contextmanager
def within(seconds: int):
    """Fail (TimeoutError) rather than hang when the body runs longer than seconds."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(workdir: Path, capsys, argv: list[str], field: str) -> str:
    """Run argv; check the bad-input contract (exit 2, one line naming field, nothing written); the line."""
    before = sorted(p.name for p in workdir.iterdir())
    with within(15):
        code = main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), err
    assert out == "" and "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == before, "bad input created a file"
    return lines[0]


# --- 1. ado ranges that never end, or end after a trillion values: refused before listing a value
@pytest.mark.parametrize(
    ("domain", "field", "says"),
    [
        ({"domainRange": [1, 4], "interval": 0}, f"{BATCH}.interval", "must be > 0"),
        ({"domainRange": [1, 4], "interval": -1}, f"{BATCH}.interval", "must be > 0"),
        ({"domainRange": [1, 1_000_000_000_000], "interval": 1}, BATCH, "999,999,999,999 values"),
        ({"domainRange": [1, 1e300], "interval": 1e-300}, BATCH, "at most 10,000,000"),
        ({"domainRange": [-(10**308), 10**308], "interval": 1}, BATCH, "over 1e+308 values"),
        ({"domainRange": [4, 1], "interval": 1}, f"{BATCH}.domainRange", "holds no value"),
        ({"domainRange": [1, float("inf")], "interval": 1}, f"{BATCH}.domainRange[1]", "not a finite number"),
    ],
)
@pytest.mark.parametrize("command", ["from-ado", "explore"])
def test_ado_ranges_that_would_not_end_are_refused(workdir, capsys, domain, field, says, command):
    space = write(workdir / "space.yaml", ado_space(domain))
    argv = ["space", "from-ado", space] if command == "from-ado" else ["explore", space, "--store", "s.db", "-q"]
    assert says in refused(workdir, capsys, argv, field)


def test_ado_discrete_range_is_still_half_open(workdir, capsys):
    space = write(workdir / "space.yaml", ado_space({"domainRange": [1, 7], "interval": 3}))
    assert main(["space", "from-ado", space]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["entity_space"]["batch_size"] == [1, 4]  # 7 is left out


# --- 2. ado resources of the wrong shape: the field's path, not an AttributeError
@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"parameters": 5}, "parameters"),
        ({"parameters": {"model_map": "nope"}}, "parameters.model_map"),
        ({"parameters": {"model_map": ["smollm2-135m"]}}, "parameters.model_map"),
        (
            {"parameters": {"model_map": {"smollm2-135m": {"Vanilla": [1]}}}},
            "parameters.model_map.smollm2-135m.Vanilla",
        ),
        ({"parameters": {"data_directory": [1]}}, "parameters.data_directory"),
    ],
)
def test_malformed_actuator_configurations_name_the_field(workdir, capsys, content, field):
    space, config = write(workdir / "space.yaml", ADO_SPACE), write(workdir / "ac.yaml", content)
    refused(workdir, capsys, ["space", "from-ado", space, "--actuator-config", config], field)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"operation": 5}, "operation"),
        ({"operation": {"module": 5}}, "operation.module"),
        ({"operation": {"parameters": [1]}}, "operation.parameters"),
        ({"operation": {"parameters": {"batchSize": "abc"}}}, "operation.parameters.batchSize"),
        ({"operation": {"parameters": {"maxRetries": -1}}}, "operation.parameters.maxRetries"),
        ({"operation": {"parameters": {"numberEntities": True}}}, "operation.parameters.numberEntities"),
        ({"operation": {"parameters": {"samplerConfig": {"mode": [1]}}}}, "operation.parameters.samplerConfig.mode"),
    ],
)
def test_malformed_operations_name_the_field(workdir, capsys, content, field):
    space, operation = write(workdir / "space.yaml", ADO_SPACE), write(workdir / "op.yaml", content)
    refused(workdir, capsys, ["space", "from-ado", space, "--operation", operation], field)


@pytest.mark.parametrize(
    ("space", "field"),
    [
        (ado_space(5), BATCH),
        (ado_space({"domainRange": [1, "abc"], "interval": 1}), f"{BATCH}.domainRange[1]"),
        (ado_space({"domainRange": 4, "interval": 1}), f"{BATCH}.domainRange"),
        (ado_space({"values": "abc"}), f"{BATCH}.values"),
        (
            {
                **ADO_SPACE,
                "entitySpace": [
                    *ADO_SPACE["entitySpace"],
                    {"identifier": "model_name", "propertyDomain": {"values": ["x"]}},
                ],
            },
            "entitySpace[4].identifier",
        ),
        ({**ADO_SPACE, "metadata": "x"}, "metadata"),
        (
            {**ADO_SPACE, "experiments": [{**ADO_SPACE["experiments"][0], "parameterization": 5}]},
            "experiments[0].parameterization",
        ),
    ],
)
def test_malformed_ado_spaces_name_the_field_in_explore(workdir, capsys, space, field):
    refused(workdir, capsys, ["explore", write(workdir / "space.yaml", space), "--store", "s.db", "-q"], field)


# --- 3. a misspelt property is named, with the one meant (not "batch_size: is required")
def test_a_misspelt_ado_property_is_named_with_a_suggestion(workdir, capsys):
    space = ado_space({"values": [1, 2]})
    space["entitySpace"][3]["identifier"] = "batchsize"
    line = refused(
        workdir, capsys, ["space", "from-ado", write(workdir / "space.yaml", space)], "entity_space.batchsize"
    )
    assert "Did you mean 'batch_size'?" in line


# --- 4. an unknown key of a tunebench space file: the keys allowed there, and the likeliest
@pytest.mark.parametrize(
    ("change", "field", "allowed"),
    [
        ({"operatoin": {"sampler": "grid"}}, "operatoin", "'operation'? (allowed: name, experiments, entity_space,"),
        ({"operation": {"samples": 3}}, "operation.samples", "'sampler'? (allowed: sampler, n, seed,"),
        (
            {"experiments": [{"id": LORA, "params": {}}]},
            "experiments[0].params",
            "'parameters'? (allowed: id, parameters)",
        ),
        (
            {"execution": {"max_paralel": 2}},
            "execution.max_paralel",
            "'max_parallel'? (allowed: executor, max_parallel,",
        ),
    ],
)
def test_unknown_keys_list_the_allowed_ones(workdir, capsys, change, field, allowed):
    space = write(workdir / "space.yaml", {**NATIVE_SPACE, **change})
    line = refused(workdir, capsys, ["explore", space, "--store", "s.db", "-q"], field)
    assert f"unknown key. Did you mean {allowed}" in line


def test_an_unknown_range_key_lists_the_allowed_ones(workdir, capsys):
    space = {
        **NATIVE_SPACE,
        "entity_space": {**NATIVE_SPACE["entity_space"], "batch_size": {"min": 1, "max": 2, "stpe": 1}},
    }
    line = refused(workdir, capsys, ["explore", write(workdir / "space.yaml", space)], "entity_space.batch_size.stpe")
    assert line.endswith("Did you mean 'step'? (allowed: min, max, step)")


# --- 5. a GPU the planner has no numbers for: refused before the store exists, not failed 3 times per point
@pytest.mark.parametrize(
    ("gpu", "argv", "field"),
    [
        ({"gpu_model": ["H100", "FOO"]}, [], "entity_space.gpu_model[1]"),
        ({"gpu_model": "FOO"}, [], "entity_space.gpu_model"),
        ({"gpu_model": ["FOO"], "number_gpus": [0]}, [], "entity_space.gpu_model[0]"),  # the planner still asks
        ({"gpu_model": ["FOO"]}, ["--actuator", "noop", "--skip-predicted-oom"], "entity_space.gpu_model[0]"),
    ],
)
def test_unknown_gpus_are_refused_before_the_store_is_created(workdir, capsys, gpu, argv, field):
    space = write(workdir / "space.yaml", {**NATIVE_SPACE, "entity_space": {**NATIVE_SPACE["entity_space"], **gpu}})
    line = refused(workdir, capsys, ["explore", space, "--store", "s.db", "-q", *argv], field)
    assert "unknown GPU 'FOO'" in line and "TUNEBENCH_GPU_CATALOG" in line and "(allowed: " in line


def test_an_experiments_unknown_gpu_is_refused(workdir, capsys):
    experiments = [{"id": LORA, "parameters": {"max_steps": 2, "gpu_model": "FOO"}}]
    space = write(workdir / "space.yaml", {**NATIVE_SPACE, "experiments": experiments})
    refused(workdir, capsys, ["explore", space, "--store", "s.db", "-q"], "experiments[0].gpu_model")


def test_gpus_in_a_user_catalog_are_known_and_other_actuators_take_any_label(workdir, capsys, monkeypatch):
    catalog = {"gpus": [{"name": "FOO", "memory_gib": 80, "bf16_tflops": 300, "interconnect_gbps": 300}]}
    monkeypatch.setenv("TUNEBENCH_GPU_CATALOG", write(workdir / "gpus.yaml", catalog))
    space = write(
        workdir / "space.yaml", {**NATIVE_SPACE, "entity_space": {**NATIVE_SPACE["entity_space"], "gpu_model": ["FOO"]}}
    )
    assert main(["explore", space, "--store", "s.db", "-q"]) == 0, capsys.readouterr().err
    monkeypatch.delenv("TUNEBENCH_GPU_CATALOG")
    assert main(["explore", space, "--store", "s.db", "-q", "--actuator", "noop"]) == 0, capsys.readouterr().err
