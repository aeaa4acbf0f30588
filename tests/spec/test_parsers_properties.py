"""Property-based tests (hypothesis) of the entity and space-file parsers.

Whatever they are given, they either return a value that holds the invariants below or raise
InputError; no other exception (which the CLI would show as an internal error) ever escapes.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunebench.actuators.launch import build_launch_plan
from tunebench.errors import InputError, has_control_characters
from tunebench.explore.space import load_yaml, parse_space
from tunebench.spec.experiments import get_experiment, make_entity, parse_assignments
from tunebench.spec.properties import PROPERTIES
from tunebench.worker.args import parse_args

CHECKS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
LORA = get_experiment("finetune_lora_benchmark-v1.0.0")
BASE = {"model_name": "smollm2-135m", "model_max_length": 256, "number_gpus": 0, "batch_size": 2}
NAMES = sorted(set(LORA.optional) | set(BASE))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "--host_memory_limit_gib 0.01",
            "q_proj v_proj",
            "-1",
            "1e309",
            "nan",
            "inf",
            "None",
            '["q_proj", "--x"]',
            "a\x1bb",
            "FULL_SHARD",
            "3",
            "true",
            "adamw_torch",
            "H100",
        ]
    ),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4))


def _entity_or_input_error(raw: dict):
    try:
        return make_entity(LORA, raw)
    except InputError as exc:
        assert exc.field and "\n" not in exc.field
        return None


@CHECKS
@given(st.sampled_from(NAMES), values)
def test_entity_values_parse_or_are_input_errors(name, value):
    check_entity({**BASE, name: value})


@CHECKS
@given(st.dictionaries(st.sampled_from(NAMES), values, max_size=4))
def test_entities_parse_or_are_input_errors(extra):
    check_entity({**BASE, **extra})


def check_entity(raw: dict) -> None:
    entity = _entity_or_input_error(raw)
    if entity is None:
        return
    assert not has_control_characters(entity.id)
    again = make_entity(LORA, dict(entity.values))  # canonical: parsing the parsed values changes nothing
    assert again.id == entity.id
    for name, value in entity.values.items():
        if isinstance(value, float):
            assert math.isfinite(value), name
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value < 2**63, name


@CHECKS
@given(
    st.dictionaries(
        st.sampled_from(["target_modules", "dataset_text_field", "dataset_image_field"]), values, min_size=1
    )
)
def test_nothing_parsed_becomes_a_worker_flag(extra):
    entity = _entity_or_input_error({**BASE, **extra})
    if entity is None:
        return
    plan = build_launch_plan(LORA, entity, data_directory="/d")
    args, unknown = parse_args([a.replace("{output_dir}", "/out") for a in plan.worker_args])
    assert unknown == [] and args.host_memory_limit_gib == -1.0 and args.weights == "auto"
    if "target_modules" in entity.values:
        assert tuple(args.target_modules) == entity.values["target_modules"]


@CHECKS
@given(st.lists(st.text(max_size=30), max_size=5))
def test_assignments_parse_or_are_input_errors(pairs):
    try:
        out = parse_assignments(pairs)
    except InputError:
        return
    assert len(out) == len(pairs)


def space_dicts():
    experiments = st.lists(
        st.fixed_dictionaries(
            {"id": st.sampled_from([LORA.id, "finetune_full_benchmark-v1.0.0", "nope"])},
            optional={"parameters": st.dictionaries(st.sampled_from(NAMES), scalars, max_size=2)},
        ),
        max_size=2,
    )
    dimension = st.one_of(
        scalars,
        st.lists(scalars, max_size=4),
        st.fixed_dictionaries({"min": scalars, "max": scalars}, optional={"step": scalars}),
    )
    entity_space = st.dictionaries(st.sampled_from([*NAMES, "bogus"]), dimension, max_size=6)
    return st.fixed_dictionaries(
        {"experiments": experiments, "entity_space": entity_space.map(lambda d: {**BASE, **d})},
        optional={
            "actuator": st.fixed_dictionaries(
                {"name": st.sampled_from(["measure", "predict", "os:system", ""])},
                optional={"timeout_seconds": scalars, "weights": scalars},
            ),
            "operation": st.fixed_dictionaries(
                {"sampler": st.sampled_from(["grid", "random", "optimize", "x"])},
                optional={"n": scalars, "budget": scalars, "seed": scalars},
            ),
            "execution": st.fixed_dictionaries({}, optional={"max_parallel": scalars, "lease_seconds": scalars}),
        },
    )


@CHECKS
@given(space_dicts())
def test_space_files_parse_or_are_input_errors(raw):
    try:
        space = parse_space(raw)
    except InputError as exc:
        assert exc.field and "\n" not in exc.field
        return
    assert space.size >= 1 and space.operation_id.startswith("op-")
    assert math.isfinite(space.execution.lease_seconds) and space.execution.max_parallel >= 1


@CHECKS
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_any_text_is_yaml_or_an_input_error(text):
    try:
        raw = load_yaml(text)
    except InputError as exc:
        assert exc.field == "space"
        return
    try:
        parse_space(raw)
    except InputError:
        pass


def test_the_property_table_is_what_the_tests_sample():
    assert set(NAMES) <= set(PROPERTIES)


JOB = {"model_name": "smollm2-135m", "model_max_length": 128, "number_gpus": 0, "batch_size": 1}


def test_a_null_for_a_property_that_needs_a_value_says_so():
    """JSON null / YAML ~ for batch_size, gradient_checkpointing or num_train_epochs: 'a value is required', naming
    the property and its domain, not Python's 'None is not an integer'; nullable properties take it as unset."""
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    for name in ("batch_size", "gradient_checkpointing", "num_train_epochs"):
        try:
            make_entity(exp, {**JOB, name: None})
        except InputError as err:
            assert err.field == name and err.message == "a value is required (got null)" and err.allowed
        else:
            raise AssertionError(f"{name}=null was accepted")
    assert "flash_attn" not in make_entity(exp, {**JOB, "flash_attn": None}).values


def test_a_value_of_the_wrong_kind_or_with_underscores_is_named_as_given():
    """A JSON list where a model name belongs said 'a model name is required'; Python's int() read 1_0 as 10."""
    exp = get_experiment("finetune_full_benchmark-v1.0.0")
    cases = {
        "model_name": (["smollm2-135m"], "['smollm2-135m'] is not a model name (a text)"),
        "batch_size": ("1_0", "'1_0' is not an integer"),
        "num_train_epochs": ("1_0.5", "'1_0.5' is not a number"),
    }
    for name, (value, message) in cases.items():
        try:
            make_entity(exp, {**JOB, name: value})
        except InputError as err:
            assert (err.field, err.message) == (name, message)
        else:
            raise AssertionError(f"{name}={value!r} was accepted")
