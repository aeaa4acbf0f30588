"""Which points an operation measures: grid (all, or the first n) and random (n, seeded).

A point is (experiment, entity, rule violations): every sampled entity is measured under every
experiment of the space (ado's random_walk: numberEntities x experiments). Points that break a
validity rule carry the reasons and are recorded invalid without running. ``optimize`` chooses
points one by one instead (tunebench.explore.optimize).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from tunebench.errors import InputError
from tunebench.explore.space import Space
from tunebench.spec.experiments import Entity, Experiment, make_entity
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


# Points enumerated up front: an explore registers each in the store (about 10 k/s on SQLite), and show,
# export and report look each up by id; past these the command would run for many minutes.
MAX_EXPLORE_POINTS = 1_000_000
MAX_LOOKUP_POINTS = 200_000


def point_count(space: Space) -> int:
    """How many points the operation visits: the first n or n random entities of the grid (all of it for
    optimize, which may visit any) times the experiments; nothing is enumerated."""
    op = space.operation
    entities = space.size if op.sampler == "optimize" else min(space.size, op.n or space.size)
    return entities * len(space.experiments)


def check_count(space: Space, limit: int, field: str, instead: str) -> None:
    """InputError naming field when the operation visits more than limit points; instead: what to do."""
    n = point_count(space)
    if n > limit:
        raise InputError(
            field, f"the space's operation visits {n:,} points; at most {limit:,} are enumerated: {instead}"
        )


def check_points(space: Space) -> None:
    """InputError before an explore registers more than MAX_EXPLORE_POINTS points (optimize: the search
    chooses its points one by one, up to its budget)."""
    if space.operation.sampler != "optimize":
        check_count(space, MAX_EXPLORE_POINTS, "entity_space", "split the space, or sample n of it (sampler random, n)")


def lookup_points(space: Space, field: str, instead: str) -> list[Point]:
    """The points to look a space's results up by: the sampled ones, or the whole grid for optimize
    (at most MAX_LOOKUP_POINTS)."""
    check_count(space, MAX_LOOKUP_POINTS, field, instead)
    if space.operation.sampler == "optimize":
        return [point(e, space.entity_values(i)) for i in range(space.size) for e in space.experiments]
    return sample(space)


def sample(space: Space) -> list[Point]:
    """Every point of a grid or random operation, in sampling order."""
    out: list[Point] = []
    for index in entity_indices(space):
        values = space.entity_values(index)
        out.extend(point(experiment, values) for experiment in space.experiments)
    return out
