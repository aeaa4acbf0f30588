"""Every shipped example space trains on real tokens: the response marker survives truncation.

Cheap check, no training: the first records of each measured entity's data set are tokenized with
the model's counting tokenizer (tunebench.datasets.resolve, offline) and the marker must end before
the entity's model_max_length, leaving label tokens to train on (a run that trains on none is
invalid: tests/actuators/test_measure.py::test_run_that_trains_no_label_token_is_invalid).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tunebench.datasets.entries import text_entries
from tunebench.datasets.ids import parse_dataset_id
from tunebench.datasets.resolve import resolve_tokenizer
from tunebench.datasets.tokens import count_texts
from tunebench.explore.space import load_space
from tunebench.spec.experiments import effective_values, make_entity

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))
RECORDS = 16  # first records of each data set checked


def marker_end_tokens(model: str, dataset_id: str, template: str) -> int:
    """The most tokens any of the first RECORDS records needs up to the end of its response marker (+1: BOS)."""
    texts = list(itertools.islice(text_entries(parse_dataset_id(dataset_id)), RECORDS))
    prefixes = [t[: t.index(template) + len(template)] for t in texts]
    tokenizer = resolve_tokenizer(model)
    assert not tokenizer.is_fallback, f"{model}: no offline tokenizer to check with"
    return max(n for n, _ in count_texts(prefixes, tokenizer.load(), None)) + 1


def measured_points(path: Path) -> set[tuple[str, str, str, str, int]]:
    """(experiment, model, data set, template, shortest model_max_length) of every entity measured for real."""
    space = load_space(path)
    if space.actuator != "measure":
        return set()
    shortest: dict[tuple[str, str, str, str], int] = {}
    for exp, i in itertools.product(space.experiments, range(space.size)):
        values = effective_values(exp, make_entity(exp, space.entity_values(i)))
        key = (exp.id, values["model_name"], values["dataset_id"], values["response_template"])
        shortest[key] = min(shortest.get(key, 1 << 30), values["model_max_length"])
    return {(*k, n) for k, n in shortest.items()}


def test_there_are_measured_examples():
    assert sum(bool(measured_points(p)) for p in EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_entities_train_on_label_tokens(path):
    for experiment, model, dataset_id, template, length in measured_points(path):
        needed = marker_end_tokens(model, dataset_id, template)
        assert needed < length, (
            f"{path.name}: {experiment} {model} at model_max_length {length} on {dataset_id}: the response "
            f"marker ends at token {needed}, so nothing would be trained on"
        )
