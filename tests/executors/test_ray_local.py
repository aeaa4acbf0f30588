"""`--executor ray` without an address: a local Ray is started for the run and shut down after it."""

from __future__ import annotations

import pytest
import ray

from tunebench.commands.main import main

pytestmark = pytest.mark.ray

SPACE = """
experiments: [{id: finetune_full_benchmark-v1.0.0}]
entity_space: {model_name: smollm2-135m, number_gpus: 0, model_max_length: [64, 128], batch_size: 1}
actuator: {name: "fake_actuators:where"}
operation: {sampler: grid}
"""


def test_local_ray_on_demand(tmp_path, capsys):
    assert not ray.is_initialized()
    (tmp_path / "space.yaml").write_text(SPACE)
    args = [
        "explore",
        str(tmp_path / "space.yaml"),
        "--executor",
        "ray",
        "--store",
        str(tmp_path / "s.db"),
        "--quiet",
        "--allow-actuator-import",
    ]
    assert main(args) == 0
    assert "2/2 done — valid 2" in capsys.readouterr().out
    assert not ray.is_initialized()  # shut down again
