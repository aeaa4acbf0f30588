"""Which points an operation measures: grid (all, or the first n) and random (n, seeded).

A point is (experiment, entity, rule violations): every sampled entity is measured under every
experiment of the space (ado's random_walk: numberEntities x experiments). Points that break a
validity rule carry the reasons and are recorded invalid without running. ``optimize`` chooses
points one by one instead (tunebench.explore.optimize).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from tunebench.spec.experiments import Entity, Experiment, make_entity
from tunebench.explore.space import Space
from tunebench.spec.validity import check

Point = tuple[Experiment, Entity, list[str]]


def entity_indices(space: Space) -> Iterable[int]:
    """Grid indices of the entities the operation samples, in sampling order."""
    size = space.size
    op = space.operation
    if op.sampler == "grid":
        return range(min(size, op.n or size))
    if op.sampler == "random":
        # without replacement over the index space; never materialises the grid
        return random.Random(op.seed).sample(range(size), min(op.n or size, size))
    raise ValueError(f"sampler {op.sampler!r} does not enumerate points")


def point(experiment: Experiment, values: dict) -> Point:
    """The point of experiment at values, with the validity rules it breaks."""
    entity = make_entity(experiment, values)
    return experiment, entity, list(check(experiment, entity).reasons)


def sample(space: Space) -> list[Point]:
    """Every point of a grid or random operation, in sampling order."""
    out: list[Point] = []
    for index in entity_indices(space):
        values = space.entity_values(index)
        out.extend(point(experiment, values) for experiment in space.experiments)
    return out
