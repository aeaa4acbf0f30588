"""Space files: which experiments, which entities, which actuator, which operation (YAML, pydantic).

In the spirit of ado's discovery space + operation resources (ado-sfttrainer.md §12.5), in one file::

    name: smollm2-cpu                      # optional
    experiments:                           # the measurement space
      - id: finetune_lora_benchmark-v1.0.0
        parameters: {max_steps: 2, dataset_id: news-chars-512-entries-4096}
    entity_space:                          # the grid is the cartesian product, in this order
      model_name: [smollm2-135m]           # a list of values
      model_max_length: {min: 64, max: 256, step: 64}   # a range, both ends included
      batch_size: [1, 2]
      number_gpus: 0                       # a fixed value
    actuator:                              # what measures: measure | predict | noop | a plugin (entry point)
      name: measure
      weights: random                      # auto | pretrained | random
      data_dir: ~/datasets                 # where the data sets are (default: tunebench's)
      model_map: {smollm2-135m: /models/smollm2}
      timeout_seconds: 1800
      host_memory_limit_gib: 16            # any other key goes to the actuator as is (it checks them)
      extra_worker_args: [--seed, 7]       # only flags tunebench never sets: --seed, --tokenizer_name_or_path,
                                           # --tunebench_tiny, --use_cpu (worker/args.py extra_flags)
    operation:
      sampler: grid                        # grid | random | optimize
      n: 10                                # grid: the first n entities; random: n entities (seeded)
      seed: 0
      metric: dataset_tokens_per_second    # optimize: the property to optimise among valid results
      direction: maximize                  # optimize: maximize | minimize
      budget: 20                           # optimize: distinct entities to evaluate
    execution:                             # defaults; the explore command's options override them
      executor: local                      # local | ray
      max_parallel: 1
      max_retries: 2
      ray_address: null                    # auto | ray://host:port | null = a local Ray started on demand
      lease_seconds: 60
    track: mlflow                          # optional: send each measurement to a tracker once stored (a list
                                           # for several): mlflow, mlflow:URI, aim, aim:REPO (docs/tracking.md)

Errors name the field (``entity_space.batch_size[2]: ...``) and raise ``InputError``.

The operation id is a hash of what the operation measures (experiment ids, entity space, actuator
name, operation), so running the same file again resumes the same operation; actuator options,
execution settings and trackers are not part of it (changing a timeout does not start a new operation).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tunebench import yamlfile
from tunebench.errors import InputError
from tunebench.inputs import FiniteFloat, Printable, Seconds, input_error, read_text
from tunebench.spec.experiments import REQUIRED_PROPERTIES, Entity, Experiment, get_experiment, make_entity
from tunebench.spec.properties import render_value
from tunebench.spec.validity import check
from tunebench.track.targets import Target, parse_targets

MAX_GRID_POINTS = 10_000_000  # enumerating more than this many entities is surely a mistake
# Points enumerated up front: an explore registers each in the store (about 10 k/s on SQLite), and show,
# export and report look each up by id; past these the command would run for many minutes.
MAX_EXPLORE_POINTS = 1_000_000
MAX_LOOKUP_POINTS = 200_000

# A point is (experiment, entity, rule violations): every sampled entity is measured under every
# experiment of the space (ado's random_walk: numberEntities x experiments). Points that break a
# validity rule carry the reasons and are recorded invalid without running.
Point = tuple[Experiment, Entity, list[str]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentSpec(_Strict):
    id: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class RangeSpec(_Strict):
    """A discrete range: min, min + step, ... up to max (included when on the grid)."""

    min: FiniteFloat
    max: FiniteFloat
    step: FiniteFloat = 1

    @model_validator(mode="after")
    def _check(self) -> RangeSpec:
        if self.step <= 0:
            raise ValueError("step must be > 0")
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class ActuatorSpec(BaseModel):
    """The actuator and its options; keys not named here go to the actuator as they are (it checks them)."""

    model_config = ConfigDict(extra="allow")
    name: str = "measure"
    weights: Literal["auto", "pretrained", "random"] | None = None
    data_dir: str | None = None
    model_map: dict[str, Any] | None = None
    timeout_seconds: Seconds | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    def to_options(self) -> dict[str, Any]:
        """The actuator's options dict (MeasureOptions keys: weights, data_dir, model_map, timeout_seconds)."""
        out = {**dict(self.model_extra or {}), **self.options}
        for key in ("weights", "data_dir", "model_map", "timeout_seconds"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class OperationSpec(_Strict):
    sampler: Literal["grid", "random", "optimize"] = "grid"
    n: int | None = Field(default=None, gt=0)
    seed: int = 0
    metric: str = "dataset_tokens_per_second"
    direction: Literal["maximize", "minimize"] = "maximize"
    budget: int | None = Field(default=None, gt=0)
    startup_trials: int | None = Field(default=None, ge=1)  # optimize: random trials before TPE

    @model_validator(mode="after")
    def _check(self) -> OperationSpec:
        if self.sampler == "random" and self.n is None:
            raise ValueError("sampler 'random' needs n (how many entities to draw)")
        if self.sampler == "optimize" and self.budget is None:
            raise ValueError("sampler 'optimize' needs budget (how many entities to evaluate)")
        return self


class ExecutionSpec(_Strict):
    executor: Literal["local", "ray"] = "local"
    max_parallel: int = Field(default=1, ge=1)
    max_retries: int = Field(default=2, ge=0)
    ray_address: str | None = None
    lease_seconds: Seconds = 60.0


class SpaceFile(_Strict):
    name: Annotated[Printable, Field(max_length=200)] | None = None  # shown by show, operations and report
    experiments: list[ExperimentSpec] = Field(min_length=1)
    entity_space: dict[str, Any] = Field(min_length=1)
    actuator: ActuatorSpec = Field(default_factory=ActuatorSpec)
    operation: OperationSpec = Field(default_factory=OperationSpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    track: Any = None  # a tracker or a list: tunebench.track.targets.parse_targets (mlflow[:URI], aim[:REPO])


@dataclass(frozen=True)
class Dimension:
    """One property of the entity space and its values, in the file's order."""

    name: str
    values: tuple[Any, ...]
    kind: str  # list | range | fixed


@dataclass
class Space:
    """A validated space file."""

    experiments: list[Experiment]
    dimensions: list[Dimension]
    actuator: str
    options: dict[str, Any]
    operation: OperationSpec
    execution: ExecutionSpec
    name: str | None = None
    source: dict[str, Any] = field(default_factory=dict)  # the file's content, validated
    track: tuple[Target, ...] = ()  # trackers each stored measurement is sent to

    @property
    def size(self) -> int:
        """Entities in the space (the grid's size); points = size x experiments."""
        return math.prod(len(d.values) for d in self.dimensions)

    @property
    def operation_id(self) -> str:
        identity = {
            "experiments": [e.id for e in self.experiments],
            "entity_space": {d.name: [render_value(v) for v in d.values] for d in self.dimensions},
            "actuator": self.actuator,
            "operation": self.operation.model_dump(),
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return "op-" + digest[:12]

    def entity_values(self, index: int) -> dict[str, Any]:
        """The index-th entity of the grid (row-major over the dimensions, last varies fastest)."""
        values: dict[str, Any] = {}
        for dim in reversed(self.dimensions):
            index, i = divmod(index, len(dim.values))
            values[dim.name] = dim.values[i]
        return {d.name: values[d.name] for d in self.dimensions}

    # --- the points an operation visits: grid (all, or the first n), random (n, seeded), optimize (any) ---
    def entity_indices(self) -> Iterable[int]:
        """Grid indices of the entities a grid or random operation samples, in sampling order."""
        op = self.operation
        if op.sampler == "grid":
            return range(min(self.size, op.n or self.size))
        if op.sampler == "random":
            # without replacement over the index space; never materialises the grid
            return random.Random(op.seed).sample(range(self.size), min(op.n or self.size, self.size))
        raise ValueError(f"sampler {op.sampler!r} does not enumerate points (optimize chooses them one by one)")

    def point_count(self) -> int:
        """How many points the operation visits: the first n or n random entities of the grid (all of it for
        optimize, which may visit any) times the experiments; nothing is enumerated."""
        op = self.operation
        entities = self.size if op.sampler == "optimize" else min(self.size, op.n or self.size)
        return entities * len(self.experiments)

    def check_count(self, limit: int, field: str, instead: str) -> None:
        """InputError naming field when the operation visits more than limit points; instead: what to do."""
        n = self.point_count()
        if n > limit:
            raise InputError(
                field, f"the space's operation visits {n:,} points; at most {limit:,} are enumerated: {instead}"
            )

    def check_explorable(self) -> None:
        """InputError before an explore registers more than MAX_EXPLORE_POINTS points (optimize: the search
        chooses its points one by one, up to its budget)."""
        if self.operation.sampler != "optimize":
            self.check_count(
                MAX_EXPLORE_POINTS, "entity_space", "split the space, or sample n of it (sampler random, n)"
            )

    def sample(self) -> list[Point]:
        """Every point of a grid or random operation, in sampling order (what explore registers)."""
        out: list[Point] = []
        for index in self.entity_indices():
            values = self.entity_values(index)
            out.extend(point(experiment, values) for experiment in self.experiments)
        return out

    def points(
        self, limit: int = MAX_LOOKUP_POINTS, *, field: str = "space", instead: str = "split the space"
    ) -> list[Point]:
        """The points to look the operation's results up by (show, export, report, the API): the sampled
        ones, or the whole grid for optimize; InputError naming field when there are more than limit."""
        self.check_count(limit, field, instead)
        if self.operation.sampler == "optimize":
            return [point(e, self.entity_values(i)) for i in range(self.size) for e in self.experiments]
        return self.sample()


def point(experiment: Experiment, values: dict) -> Point:
    """The point of experiment at values, with the validity rules it breaks."""
    entity = make_entity(experiment, values)
    return experiment, entity, list(check(experiment, entity).reasons)


def load_space(path: str | Path) -> Space:
    """Read and validate a space file; InputError (field space) for a file that is not a space's YAML."""
    return parse_space(load_yaml(read_text(path, "space"), str(path)))


def load_yaml(text: str, where: str = "space") -> Any:
    """The content of a space file's YAML text; InputError (field space) if it is not YAML we read
    (tunebench.yamlfile: no aliases, no duplicated keys)."""
    try:
        return yamlfile.load_yaml(text)
    except ValueError as exc:
        what = "is nested too deeply" if str(exc) == "nested too deeply" else f"is not valid YAML: {exc}"
        raise InputError("space", f"{where} {what}") from None


def parse_space(raw: Any) -> Space:
    """Validate a space given as a dict (the YAML's content); an ado discovery space is read as its
    tunebench space file (explore.ado_space: the measure actuator, the whole grid)."""
    from tunebench.explore.ado_space import from_ado, is_ado_space

    if is_ado_space(raw):
        raw = from_ado(raw)
    if not isinstance(raw, dict):
        raise InputError("space", "must be a mapping with experiments, entity_space, actuator and operation")
    try:
        spec = SpaceFile.model_validate(raw)
    except ValidationError as exc:
        raise input_error(exc, root="space", model=SpaceFile) from None
    experiments = []
    for i, e in enumerate(spec.experiments):
        try:
            experiments.append(get_experiment(e.id, e.parameters))
        except InputError as exc:
            raise InputError(f"experiments[{i}].{_field(exc.field, 'id')}", exc.message, exc.allowed) from None
    dimensions = [_dimension(name, value) for name, value in spec.entity_space.items()]
    _check_names(experiments, dimensions)  # before the required ones: a misspelt name is named as such
    missing = [n for n in REQUIRED_PROPERTIES if n not in spec.entity_space]
    if missing:
        raise InputError(f"entity_space.{missing[0]}", "is required (every experiment needs it)")
    space = Space(
        experiments=experiments,
        dimensions=dimensions,
        actuator=spec.actuator.name,
        options=spec.actuator.to_options(),
        operation=spec.operation,
        execution=spec.execution,
        name=spec.name,
        source=spec.model_dump(mode="json", exclude={"track"}),  # a tracker URI may hold a password: not stored
        track=parse_targets(spec.track, "track"),
    )
    if space.size > MAX_GRID_POINTS:
        raise InputError("entity_space", f"has {space.size:,} entities; at most {MAX_GRID_POINTS:,} are supported")
    _check_values(space)
    if spec.operation.sampler == "optimize":
        _check_metric(space)
    return space


def _dimension(name: str, value: Any) -> Dimension:
    where = f"entity_space.{name}"
    if isinstance(value, list):
        if not value:
            raise InputError(where, "is an empty list")
        if len({json.dumps(v, sort_keys=True, default=str) for v in value}) != len(value):
            raise InputError(where, "lists a value twice")
        return Dimension(name, tuple(value), "list")
    if isinstance(value, dict):
        try:
            r = RangeSpec.model_validate(value)
        except ValidationError as exc:
            raise input_error(exc, prefix=where, model=RangeSpec) from None
        integral = all(float(x).is_integer() for x in (r.min, r.max, r.step))
        count = math.floor((r.max - r.min) / r.step + 1e-9) + 1
        if count > MAX_GRID_POINTS:
            shown = f"{count:,}" if count < 1e15 else f"{float(count):.3g}"
            raise InputError(where, f"range has {shown} values", allowed=f"at most {MAX_GRID_POINTS:,}")
        if integral:
            values = tuple(int(r.min) + i * int(r.step) for i in range(count))
        else:
            values = tuple(round(r.min + i * r.step, 12) for i in range(count))
        return Dimension(name, values, "range")
    return Dimension(name, (value,), "fixed")


def _check_names(experiments: list[Experiment], dimensions: list[Dimension]) -> None:
    """Every dimension must be a property each experiment lets an entity set (errors name the field and,
    for a typo, the property meant: batchsize, not 'batch_size is required')."""
    for experiment in experiments:
        for dim in dimensions:
            if dim.name not in REQUIRED_PROPERTIES and dim.name not in experiment.optional:
                try:  # InputError explaining why (hardcoded, not a property, a typo ...)
                    make_entity(experiment, {dim.name: dim.values[0]})
                except InputError as exc:
                    raise InputError(
                        f"entity_space.{dim.name}", f"{exc.message} (experiment {experiment.id})", exc.allowed
                    ) from None


def _check_values(space: Space) -> None:
    """Every value of every dimension must be valid for every experiment (errors name the field); the
    dimensions' names are checked already (_check_names)."""
    first = {d.name: d.values[0] for d in space.dimensions}
    names = {d.name for d in space.dimensions}
    for experiment in space.experiments:
        try:
            make_entity(experiment, first)
        except InputError as exc:
            if exc.field not in names:  # e.g. target_modules, which the space does not set
                raise InputError(
                    f"entity_space ({exc.field})", f"{exc.message} (experiment {experiment.id})", exc.allowed
                ) from None
            # else: the loop below names the dimension and the value
        for dim in space.dimensions:
            for i, value in enumerate(dim.values):
                try:
                    make_entity(experiment, {**first, dim.name: value})
                except InputError as exc:
                    if exc.field != dim.name:
                        continue  # another dimension's first value; reported when that dimension is checked
                    where = f"entity_space.{dim.name}" + (f"[{i}]" if dim.kind != "fixed" else "")
                    raise InputError(where, f"{exc.message} (experiment {experiment.id})", exc.allowed) from None


def _check_metric(space: Space) -> None:
    metric = space.operation.metric
    for experiment in space.experiments:
        if metric not in experiment.measured:
            raise InputError(
                "operation.metric",
                f"{metric!r} is not measured by {experiment.base_id}",
                allowed=", ".join(p for p in experiment.measured if p != "is_valid"),
            )


def _field(inner: str, default: str) -> str:
    return inner if inner and inner != "experiment" else default
