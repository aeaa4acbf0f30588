"""Space files: the issue's minimal file, domains, samplers, and errors that name the field."""

from __future__ import annotations

import pytest
import yaml
from layout import REPO

from tunebench.errors import InputError
from tunebench.explore.space import load_space, parse_space

EXAMPLES = REPO / "examples"
MINIMAL = yaml.safe_load((EXAMPLES / "minimal-cpu-lora.yaml").read_text())


def space(**changes):
    return parse_space({**MINIMAL, **changes})


def test_minimal_file_as_written():
    spec = load_space(EXAMPLES / "minimal-cpu-lora.yaml")
    assert [e.id for e in spec.experiments] == [
        "finetune_lora_benchmark-v1.0.0-dataset_id.news-chars-1024-entries-4096-gradient_accumulation_steps.1-max_steps.2"
    ]
    assert spec.actuator == "measure" and spec.options == {"weights": "random"}
    assert spec.operation.sampler == "grid" and spec.size == 4
    points = spec.sample()
    assert [p[1].id for p in points] == [
        "model_name.smollm2-135m-number_gpus.0-model_max_length.320-batch_size.1",
        "model_name.smollm2-135m-number_gpus.0-model_max_length.320-batch_size.2",
        "model_name.smollm2-135m-number_gpus.0-model_max_length.384-batch_size.1",
        "model_name.smollm2-135m-number_gpus.0-model_max_length.384-batch_size.2",
    ]
    assert all(reasons == [] for _, _, reasons in points)


# Sizes counted from the files by hand: 3 models x lengths 128, 320, 512 x 3 batch sizes; 2 x 2; 3 x 4 x 5.
EXAMPLE_SIZES = {"grid-cpu-noop.yaml": 27, "minimal-cpu-lora.yaml": 4, "optimize-throughput-ray.yaml": 60}


def test_every_example_parses():
    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert set(EXAMPLE_SIZES) <= {p.name for p in paths}
    for path in paths:
        spec = load_space(path)
        assert spec.size == EXAMPLE_SIZES.get(path.name, spec.size) and spec.size >= 1, path.name
        assert len(spec.experiments) == 1, path.name


def test_ranges_fixed_values_and_operation_id():
    spec = space(
        entity_space={
            "model_name": "smollm2-135m",
            "number_gpus": 0,
            "batch_size": [1, 2],
            "model_max_length": {"min": 64, "max": 300, "step": 64},
        }
    )
    dims = {d.name: d.values for d in spec.dimensions}
    assert dims["model_max_length"] == (64, 128, 192, 256) and dims["number_gpus"] == (0,)
    assert spec.size == 8
    same = space(
        entity_space={
            "model_name": "smollm2-135m",
            "number_gpus": 0,
            "batch_size": [1, 2],
            "model_max_length": [64, 128, 192, 256],
        }
    )
    assert same.operation_id == spec.operation_id  # the range and the list are the same points
    assert space(actuator={"weights": "pretrained"}).operation_id == space().operation_id  # options are not identity
    assert space(operation={"sampler": "random", "n": 2}).operation_id != space().operation_id


def test_random_and_grid_samples():
    grid = space(operation={"sampler": "grid", "n": 3})
    assert len(grid.sample()) == 3
    one = [p[1].id for p in space(operation={"sampler": "random", "n": 3, "seed": 1}).sample()]
    two = [p[1].id for p in space(operation={"sampler": "random", "n": 3, "seed": 1}).sample()]
    assert one == two and len(set(one)) == 3
    assert len(space(operation={"sampler": "random", "n": 99}).sample()) == 4


def test_invalid_by_rule_points_carry_reasons():
    spec = space(entity_space={**MINIMAL["entity_space"], "batch_size": [0, 1]})
    reasons = [r for _, _, r in spec.sample()]
    assert any("rule 4" in " ".join(r) for r in reasons) and [] in reasons


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"entity_space": {**MINIMAL["entity_space"], "batch_size": [1, "two"]}}, "entity_space.batch_size[1]"),
        (
            {"entity_space": {**MINIMAL["entity_space"], "model_name": ["smollm2-135m", "no-such-model"]}},
            "entity_space.model_name[1]",
        ),
        ({"entity_space": {**MINIMAL["entity_space"], "lora_rank": [4]}}, "entity_space.lora_rank"),
        (
            {"entity_space": {k: v for k, v in MINIMAL["entity_space"].items() if k != "batch_size"}},
            "entity_space.batch_size",
        ),
        ({"entity_space": {**MINIMAL["entity_space"], "batch_size": {"min": 4, "max": 1}}}, "entity_space.batch_size"),
        ({"entity_space": {**MINIMAL["entity_space"], "batch_size": []}}, "entity_space.batch_size"),
        ({"experiments": [{"id": "finetune_nope"}]}, "experiments[0].id"),
        (
            {"experiments": [{"id": "finetune_lora_benchmark-v1.0.0", "parameters": {"max_steps": "x"}}]},
            "experiments[0].max_steps",
        ),
        ({"operation": {"sampler": "bayes"}}, "operation.sampler"),
        ({"operation": {"sampler": "optimize"}}, "operation"),
        ({"operation": {"sampler": "optimize", "budget": 3, "metric": "speed"}}, "operation.metric"),
        ({"actuator": {"weights": "fancy"}}, "actuator.weights"),
        ({"execution": {"max_parallel": 0}}, "execution.max_parallel"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_errors_name_the_field(change, field):
    with pytest.raises(InputError) as info:
        space(**change)
    assert info.value.field == field, str(info.value)
