"""The optimize operation: Optuna's TPE chooses which entity to measure next.

Every swept dimension becomes one Optuna parameter: an integer index into the sorted values for
numbers and ranges (so TPE sees their order), a categorical index otherwise; several experiments
add a categorical ``experiment``. Values (ado-sfttrainer.md §12.3, ray_tune's failed_metric_value):

- valid -> the metric (e.g. dataset_tokens_per_second);
- invalid (by rule or out of memory) and failed after its retries -> the worst value (-inf when
  maximising, +inf when minimising), so TPE learns to avoid the region;
- a point already known (memoised, or proposed again) -> its known value, without measuring.

``budget`` counts distinct entities the operation evaluates with the actuator or from memory;
points invalid by rule cost nothing and do not count. The search also stops when the space is
exhausted. Parallel proposals use TPE's constant liar. On a re-run the study is warm-started from
the operation's stored results, so an interrupted search resumes instead of starting over.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tunebench.errors import InputError
from tunebench.explore.search import POLL_S
from tunebench.explore.space import Space, point
from tunebench.spec.experiments import Experiment
from tunebench.store import DONE, FAILED, INVALID, PENDING, RUNNING, VALID, Store

if TYPE_CHECKING:
    from tunebench.explore.explorer import Progress
    from tunebench.store import Claim

MAX_REPEATS = 20  # consecutive proposals of known points before a random unseen point is tried


class OptunaSearch:
    """Proposes points, registers them in the store, and learns from their results (a
    tunebench.explore.search.Search: claim, tell, done, count, best)."""

    def __init__(self, space: Space, store: Store, operation_id: str, *, remeasure: bool = False):
        try:
            import optuna
        except ImportError:
            raise InputError("operation.sampler", "optimize needs Optuna: pip install optuna") from None

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.store, self.operation_id, self.remeasure = space, store, operation_id, remeasure
        op = space.operation
        self.metric, self.maximize = op.metric, op.direction == "maximize"
        self.budget = int(op.budget or 0)
        self.worst = -math.inf if self.maximize else math.inf
        self.rng = random.Random(op.seed)
        # swept dimensions: (name, values in index order); numbers sorted so the index is ordinal
        self.swept: list[tuple[str, list[Any]]] = []
        self.distributions: dict[str, Any] = {}
        for dim in space.dimensions:
            if len(dim.values) < 2:
                continue
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in dim.values)
            values = sorted(dim.values) if numeric else list(dim.values)
            self.swept.append((dim.name, values))
            self.distributions[dim.name] = (
                optuna.distributions.IntDistribution(0, len(values) - 1)
                if numeric
                else optuna.distributions.CategoricalDistribution(list(range(len(values))))
            )
        if len(space.experiments) > 1:
            self.distributions["experiment"] = optuna.distributions.CategoricalDistribution(
                list(range(len(space.experiments)))
            )
        self.fixed = {d.name: d.values[0] for d in space.dimensions if len(d.values) == 1}
        startup = op.startup_trials or max(2, min(10, self.budget // 3))
        self.study = optuna.create_study(
            direction=op.direction,
            sampler=optuna.samplers.TPESampler(seed=op.seed, constant_liar=True, n_startup_trials=startup),
        )
        self.total_points = space.size * len(space.experiments)
        self.values: dict[tuple, float] = {}  # point key -> value told
        self.counted: set[tuple] = set()  # keys that count against the budget
        self.open: dict[int, tuple] = {}  # request id -> key, awaiting a result
        self.trials: dict[int, list[Any]] = {}  # request id -> Optuna trials waiting for it
        self.watched: set[int] = set()  # open requests another explorer is running
        self.memoised = self.rules = 0
        self._warm_start()

    # --------------------------------------------------------------------------------- bookkeeping

    @property
    def evaluated(self) -> int:
        """Entities evaluated or being evaluated that count against the budget."""
        return len(self.counted)

    def finished(self) -> bool:
        return not self.open and not self._may_ask()

    def _may_ask(self) -> bool:
        return self.evaluated < self.budget and len(self.values) + len(self.open) < self.total_points

    def claimable(self, exclude: Iterable[int] = ()) -> list[int]:
        skip = set(exclude) | self.watched
        return [rid for rid in self.open if rid not in skip]

    def key_of(self, params: dict[str, Any]) -> tuple:
        return tuple(params.get(name, 0) for name in (*(n for n, _ in self.swept), "experiment"))

    def values_of(self, params: dict[str, Any]) -> tuple[Experiment, dict[str, Any]]:
        experiment = self.space.experiments[params.get("experiment", 0)]
        values = dict(self.fixed)
        for name, options in self.swept:
            values[name] = options[params[name]]
        return experiment, {d.name: values[d.name] for d in self.space.dimensions}

    def value(self, status: str, properties: dict[str, Any]) -> float:
        if status == VALID:
            v = properties.get(self.metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                return float(v)
        return self.worst

    # ---------------------------------------------------------------------------------- proposing

    def propose(self, capacity: int) -> list[int]:
        """Ask for up to capacity new points to measure; returns their request ids."""
        fresh: list[int] = []
        repeats = 0
        while len(fresh) < capacity and self._may_ask():
            trial = self.study.ask(self.distributions)
            key = self.key_of(trial.params)
            if key in self.values:  # known: tell again without measuring
                self.study.tell(trial, self.values[key])
                repeats += 1
                if repeats >= MAX_REPEATS:
                    unseen = self._random_unseen()
                    if unseen is None:
                        break
                    self.study.enqueue_trial(unseen)
                    repeats = 0
                continue
            open_id = next((rid for rid, k in self.open.items() if k == key), None)
            if open_id is not None:  # being measured: wait for the same result
                self.trials[open_id].append(trial)
                continue
            repeats = 0
            experiment, values = self.values_of(trial.params)
            reg = self.store.register(
                self.operation_id,
                [point(experiment, values)],
                actuator=self.space.actuator,
                generator="optimize",
                remeasure=self.remeasure,
            )[0]
            if reg.origin == "rules":
                self.rules += 1
                self._record(key, trial, self.worst, counts=False)
            elif reg.status in DONE or reg.status == FAILED:
                self.memoised += 1
                status, props = self.store.states([reg.request_id])[reg.request_id]
                self._record(key, trial, self.value(status, props), counts=True)
            else:
                self.open[reg.request_id] = key
                self.trials[reg.request_id] = [trial]
                self.counted.add(key)
                if reg.status == RUNNING:
                    self.watched.add(reg.request_id)
                else:
                    fresh.append(reg.request_id)
        return fresh

    def _random_unseen(self) -> dict[str, int] | None:
        for _ in range(1000):
            params = {name: self.rng.randrange(len(values)) for name, values in self.swept}
            if "experiment" in self.distributions:
                params["experiment"] = self.rng.randrange(len(self.space.experiments))
            if self.key_of(params) not in self.values:
                return params
        return None

    # ------------------------------------------------------------------ what the explorer loop calls

    def claim(self, owner: str, capacity: int, lease_seconds: float, in_flight: Mapping[int, Claim]) -> list[Claim]:
        """Up to capacity of the requests the search proposes, claimed for this explorer."""
        self.check_watched()
        self.propose(capacity - len(self.claimable(exclude=in_flight)))
        wanted = self.claimable(exclude=in_flight)[:capacity]
        claims = self.store.claim(self.operation_id, owner, capacity, lease_seconds, request_ids=wanted)
        self.lost_race(set(wanted) - {c.request_id for c in claims})
        return claims

    def done(self) -> bool:
        if self.finished():
            return True
        if self.watched and not self.claimable():
            time.sleep(POLL_S)  # only other explorers' measurements are left: wait for them
        return False

    def count(self, progress: Progress) -> None:
        progress.total = self.budget
        progress.done = min(self.evaluated - len(self.open), progress.total)
        progress.memoised = self.memoised
        progress.rules = self.rules

    # ---------------------------------------------------------------------------------- learning

    def tell(self, request_id: int, status: str, properties: dict[str, Any]) -> None:
        """A final outcome (valid, invalid, or failed after retries) of an open request; "lost":
        another explorer took it (watched until its result is in the store)."""
        if status == "lost":
            self.lost_race([request_id])
            return
        key = self.open.pop(request_id, None)
        self.watched.discard(request_id)
        if key is None:
            return
        value = self.value(status, properties)
        for trial in self.trials.pop(request_id, []):
            self.study.tell(trial, value)
        self.values[key] = value

    def check_watched(self) -> None:
        """Pick up results of open requests another explorer ran; re-take those it gave back."""
        if not self.watched:
            return
        for rid, (status, props) in self.store.states(self.watched).items():
            if status in (VALID, INVALID, FAILED):
                self.tell(rid, status, props)
            elif status == PENDING:
                self.watched.discard(rid)

    def lost_race(self, request_ids: Iterable[int]) -> None:
        """Requests this explorer asked to claim but another one took: watch them."""
        self.watched.update(rid for rid in request_ids if rid in self.open)

    def _record(self, key: tuple, trial: Any, value: float, *, counts: bool) -> None:
        self.study.tell(trial, value)
        self.values[key] = value
        if counts:
            self.counted.add(key)

    def _warm_start(self) -> None:
        """Add the operation's stored outcomes as completed trials (resume after an interruption)."""
        import optuna

        for row in self.store.rows(operation_id=self.operation_id):
            if row["status"] not in (VALID, INVALID, FAILED):
                continue
            params = self._params_of(row)
            if params is None:
                continue
            key = self.key_of(params)
            if key in self.values:
                continue
            value = self.value(row["status"], row["properties"] or {})
            dists = {k: v for k, v in self.distributions.items() if k in params}
            self.study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
            self.values[key] = value
            if row.get("origin") != "rules":
                self.counted.add(key)
                self.memoised += 1

    def _params_of(self, row: dict[str, Any]) -> dict[str, int] | None:
        ids = [e.id for e in self.space.experiments]
        if row["experiment_id"] not in ids:
            return None
        exp_index = ids.index(row["experiment_id"])
        experiment = self.space.experiments[exp_index]
        params: dict[str, int] = {}
        for name, options in self.swept:
            stored = row["entity"].get(name, experiment.default(name) if name in experiment.optional else None)
            parsed = [experiment.parse(name, v) for v in options]
            stored = experiment.parse(name, stored) if stored is not None else None
            if stored not in parsed:
                return None
            params[name] = parsed.index(stored)
        if "experiment" in self.distributions:
            params["experiment"] = exp_index
        return params

    def best(self) -> dict[str, Any] | None:
        """The best valid point so far: {experiment, entity values, value}."""
        finite = [t for t in self.study.trials if t.value is not None and math.isfinite(t.value)]
        if not finite:
            return None
        top = (max if self.maximize else min)(finite, key=lambda t: t.value)
        experiment, values = self.values_of(top.params)
        return {"experiment": experiment.id, "entity": values, self.metric: top.value}
