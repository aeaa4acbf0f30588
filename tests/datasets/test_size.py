"""The cost estimates of data sets (datasets.size) against real generated files and measured memory."""

from __future__ import annotations

import tracemalloc

import pytest

from tunebench.datasets import text
from tunebench.datasets.generate import generate_dataset
from tunebench.datasets.ids import parse_dataset_id
from tunebench.datasets.size import check_room, cost
from tunebench.errors import InputError
from tunebench.limits import free_disk


@pytest.mark.parametrize(
    "dataset_id",
    [
        "news-chars-64-entries-300",
        "news-chars-2048-entries-100",
        "news-tokens-100plus-entries-200",
        "news-tokens-4096plus-entries-40",
        "vision-384x384-200plus-entries-300",
    ],
)
def test_estimates_follow_the_generator(tmp_path, dataset_id):
    spec = parse_dataset_id(dataset_id)
    if spec.is_vision:
        from tunebench.datasets.vision import schema

        schema()  # imports `datasets` (tens of MB of modules): loaded code, not what the data set costs
    text.book.cache_clear()  # the book is part of what generation costs
    tracemalloc.start()
    try:
        manifest = generate_dataset(spec, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = cost(spec)
    assert 0.75 * manifest.size_bytes <= estimate.disk <= 1.6 * manifest.size_bytes, (estimate, manifest.size_bytes)
    assert peak <= estimate.memory, (peak, estimate.memory)  # an upper bound: the check never lets too much through


def test_a_data_set_this_machine_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    for dataset_id in (
        "news-chars-512-entries-999999999999",
        "news-tokens-99999999999plus-entries-1",
        "vision-999999x999999-16plus-entries-1",
    ):
        with pytest.raises(InputError) as caught:
            check_room(parse_dataset_id(dataset_id), tmp_path / "data")
        assert caught.value.field == "dataset_id" and "needs about" in caught.value.message
    entries = 2 * free_disk(tmp_path) // 2_000_000 + 1  # entries of 2 MB: twice the free disk, little memory
    with pytest.raises(InputError, match="of disk"):
        generate_dataset(f"news-chars-1000000-entries-{entries}", tmp_path / "data")
    assert list(tmp_path.iterdir()) == []


def test_the_measuring_actuator_fails_the_point_instead_of_growing(tmp_path):
    """A space point with such a data set is a failed measurement with the reason; nothing is generated."""
    from tunebench.actuators.measure import measure
    from tunebench.spec.experiments import get_experiment, make_entity

    exp = get_experiment("finetune_lora_benchmark-v1.0.0", {"dataset_id": "news-chars-512-entries-999999999999"})
    entity = make_entity(exp, {"model_name": "smollm2-135m", "model_max_length": 64, "number_gpus": 0, "batch_size": 1})
    result = measure(exp, entity, {"data_dir": str(tmp_path / "data"), "output_dir": str(tmp_path / "run")})
    assert result.status == "failed" and "needs about" in result.error
    assert not (tmp_path / "data").exists()
