"""Quick sweeps without a space file: a grid of a few properties, planned point by point, and the largest
batch_size or model_max_length that fits (``tunebench plan --grid``, ``max-batch``, ``max-length``).

A grid dimension is ``KEY=V1,V2,...`` (the values) or ``KEY=LOW..HIGH`` (the powers of two from LOW to
HIGH, both included: ``512..8192`` is 512, 1024, 2048, 4096, 8192); KEY is a property of the experiment,
by the spec's name. Every point is judged as ``recommend`` judges a configuration
(tunebench.plan.recommend.evaluate): it fits when the planner says it fits and its out-of-memory
probability is at most ``max_oom_risk`` (DEFAULT_MAX_OOM_RISK, recommend's --max-oom-risk).

The largest fitting value of batch_size or model_max_length is found by doubling from the smallest value
until a value does not fit, then bisecting between the last that fits and the first that does not (the
planner's memory grows with both). batch_size moves in multiples of the data-parallel ranks (validity rule 1:
the batch is spread evenly over the GPUs, or over number_gpus / (tp x sp) with tensor or sequence parallelism); model_max_length goes up to the model's context at most. The
planner pads a batch to its longest sample, so past the data set's longest samples a longer
model_max_length needs no more memory: the data set (dataset_id) decides how long sequences really are.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tunebench.errors import InputError, one_of, suggest
from tunebench.plan.predictor import PlanOptions, predict_values
from tunebench.plan.recommend import (
    DEFAULT_MAX_OOM_RISK,
    Candidate,
    evaluate,
    method_values,
    verdict_of,
)
from tunebench.spec.experiments import (
    Experiment,
    effective_values,
    get_experiment,
    make_entity,
    parse_value,
)
from tunebench.spec.validity import data_parallel_ranks

RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")
MAX_POINTS = 10_000  # a grid larger than this is a space file's job (tunebench explore --actuator predict)
# Where the doubling of the search stops: 2^16 samples per batch, 2^21 (2 M) tokens per sequence.
SEARCH_LIMITS = {"batch_size": 2**16, "model_max_length": 2**21}
SEARCHED = tuple(SEARCH_LIMITS)


def is_range(text: str) -> bool:
    """Whether a KEY=VALUE value is a LOW..HIGH range (no property takes such a value)."""
    return RANGE.match(text) is not None


def grid_values(name: str, text: str) -> list[str]:
    """The values of one dimension: LOW..HIGH as its powers of two, else the comma-separated values."""
    match = RANGE.match(text)
    if match is None:
        values = [v.strip() for v in text.split(",")]
        if not all(values):
            raise InputError(name, f"empty value in {text!r}", allowed="V1,V2,... or LOW..HIGH (powers of two)")
        return values
    for bound in (match[1], match[2]):  # each end in the property's domain, as typed (not a power of two of it)
        parse_value(name, bound)
    low, high = int(match[1]), int(match[2])
    if low > high:
        raise InputError(name, f"range {text!r} runs backwards", allowed="LOW..HIGH with LOW <= HIGH")
    powers = [2**k for k in range(max(0, math.ceil(math.log2(max(low, 1)))), high.bit_length()) if low <= 2**k <= high]
    if not powers:
        raise InputError(
            name, f"no power of two in {text!r}", allowed="LOW..HIGH holding a power of two, e.g. 512..8192"
        )
    return [str(p) for p in powers]


def parse_grid(experiment: Experiment, items: Sequence[str]) -> dict[str, list[str]]:
    """--grid KEY=VALUES items -> {property: values}; InputError naming the key that is no property of the
    experiment (with the spec's names allowed), given twice, or too many points in all."""
    dims: dict[str, list[str]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError("--grid", f"cannot read {item!r}", allowed="KEY=V1,V2,... or KEY=LOW..HIGH")
        check_property(experiment, name)
        if name in dims:
            raise InputError(name, "given more than once", allowed="each property once, its values in one KEY=V1,V2")
        dims[name] = grid_values(name, text)
    points = math.prod(len(v) for v in dims.values())
    if points > MAX_POINTS:
        raise InputError("--grid", f"{points:,} points", allowed=f"at most {MAX_POINTS:,} (a space file for more)")
    return dims


@dataclass
class Point:
    """One planned point: the swept values and how it fares."""

    values: dict[str, Any]  # the swept properties at this point
    verdict: str  # fits | risky (fits, above max_oom_risk) | OOM | invalid (a validity rule, or out of host memory)
    candidate: Candidate

    def to_dict(self) -> dict[str, Any]:
        return {**self.values, "verdict": self.verdict, **self.candidate.to_dict()}


def verdict(candidate: Candidate, max_oom_risk: float) -> str:
    """recommend.verdict_of a candidate: its notes are the rules it breaks and the host's RAM it exceeds."""
    return verdict_of(candidate.oom_probability, bool(candidate.notes), max_oom_risk)


def plan_grid(
    experiment: Experiment,
    base: Mapping[str, Any],
    dims: Mapping[str, Sequence[str]],
    options: PlanOptions,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
) -> list[Point]:
    """Every point of the grid (base values with each combination of dims), in the grid's order, planned in
    one vectorised pass. InputError (naming the field) for a point whose values the experiment refuses."""
    names = list(dims)
    combos = [dict(zip(names, combo)) for combo in itertools.product(*(dims[n] for n in names))]
    entities = [make_entity(experiment, {**base, **combo}) for combo in combos]
    variants = [effective_values(experiment, entity) for entity in entities]
    cands = evaluate(experiment, variants, options, max_oom_risk)
    return [Point({n: v[n] for n in names}, verdict(c, max_oom_risk), c) for v, c in zip(variants, cands)]


@dataclass
class Largest:
    """The largest value of a property at which the job fits, and the next value up, which does not."""

    name: str
    value: int | None  # None: not even the smallest value fits
    fit: Candidate | None
    next_value: int | None  # None: the search stopped at SEARCH_LIMITS with everything fitting
    next_fit: Candidate | None
    experiment_id: str
    values: dict[str, Any]  # the job's other values (effective)
    limited_by: str | None = None  # where everything up to the search's limit fits: what set the limit

    def to_dict(self, max_oom_risk: float) -> dict[str, Any]:
        return {
            "experiment_id": self.experiment_id,
            "property": self.name,
            "largest": self.value,
            "max_oom_risk": max_oom_risk,
            "at_largest": self.fit.to_dict() if self.fit else None,
            "next": self.next_value,
            "at_next": self.next_fit.to_dict() if self.next_fit else None,
            "next_verdict": verdict(self.next_fit, max_oom_risk) if self.next_fit else None,
            "limited_by": self.limited_by,
        }


def largest(
    experiment: Experiment,
    values: Mapping[str, Any],
    name: str,
    options: PlanOptions,
    max_oom_risk: float = DEFAULT_MAX_OOM_RISK,
) -> Largest:
    """The largest batch_size or model_max_length (name) at which the job of values (effective, as
    method_job gives) fits; see the module for the search."""
    if name not in SEARCH_LIMITS:
        raise InputError("property", f"cannot search {name!r}", allowed=", ".join(SEARCHED))
    step = data_parallel_ranks(values) if name == "batch_size" else 1
    limit, limited_by = search_limit(name, values)
    # A CPU run's verdict does not depend on its speed: the search does not time this host at every shape it
    # tries (seconds each), only at the answer (timed below).
    cpu = not int(values.get("number_gpus") or 0) and options.probe_host
    search = replace(options, probe_host=False) if cpu else options
    memo: dict[int, Candidate] = {}

    def probe(ns: Sequence[int]) -> list[Candidate]:
        todo = [n for n in dict.fromkeys(ns) if n not in memo]
        if todo:
            for n, c in zip(todo, evaluate(experiment, [{**values, name: n} for n in todo], search, max_oom_risk)):
                memo[n] = c
        return [memo[n] for n in ns]

    def timed(good: int | None, bad: int | None, why: str | None = None) -> Largest:
        if cpu:
            answer = [n for n in (good, bad) if n is not None]
            memo.update(zip(answer, evaluate(experiment, [{**values, name: n} for n in answer], options, max_oom_risk)))
        return Largest(
            name,
            good,
            None if good is None else memo[good],
            bad,
            None if bad is None else memo[bad],
            experiment.id,
            dict(values),
            why,
        )

    doubling = [step * 2**k for k in range(limit.bit_length()) if step * 2**k <= limit]
    doubling += [] if doubling[-1] == limit // step * step else [limit // step * step]
    fits = [c.fits for c in probe(doubling)]
    if not fits[0]:
        return timed(None, doubling[0])
    if all(fits):
        return timed(doubling[-1], None, limited_by)
    first_bad = fits.index(False)
    good, bad = doubling[first_bad - 1], doubling[first_bad]  # in multiples of step: good fits, bad does not
    while bad - good > step:
        mid = good + (bad - good) // (2 * step) * step
        if probe([mid])[0].fits:
            good = mid
        else:
            bad = mid
    return timed(good, bad)


def plan_notes(experiment: Experiment, values: Mapping[str, Any], options: PlanOptions) -> list[str]:
    """The planner's notes on the job of values (effective): what `plan` prints under its table."""
    cols = predict_values([(experiment.method, values)], options, single_node_only=experiment.single_node_only)
    return list(cols["notes"][0])


def padded_tokens(experiment: Experiment, values: Mapping[str, Any], options: PlanOptions) -> float:
    """The tokens a sample of the job's data set takes once padded (the planner's reading of dataset_id at
    the job's model_max_length): below model_max_length where the data set's samples are shorter."""
    cols = predict_values([(experiment.method, values)], options)
    return float(cols["padded_tokens_per_sample"][0])


def search_limit(name: str, values: Mapping[str, Any]) -> tuple[int, str]:
    """(the largest value the search tries, what sets it): SEARCH_LIMITS, and for model_max_length the
    model's context (max_position_embeddings), beyond which it was not trained."""
    limit, why = SEARCH_LIMITS[name], f"the search's limit ({SEARCH_LIMITS[name]:,})"
    if name == "model_max_length":
        from tunebench.catalog import get_model

        context = get_model(str(values["model_name"])).max_position_embeddings
        if isinstance(context, int) and 1 <= context < limit:
            limit, why = context, f"the model's context (max_position_embeddings {context:,})"
    return limit, why


def method_job(method: str, raw: Mapping[str, Any]) -> tuple[Experiment, dict[str, Any], list[str]]:
    """The experiment of a method (full, lora, qlora) and the job's effective values (recommend's
    method_values: LoRA on a model without reference target modules uses q_proj, v_proj, with a note)."""
    from tunebench.plan.recommend import METHOD_EXPERIMENTS

    if method not in METHOD_EXPERIMENTS:
        raise InputError(
            "--method",
            f"unknown method {method!r}." + suggest(method, METHOD_EXPERIMENTS),
            allowed=", ".join(METHOD_EXPERIMENTS),
        )
    experiment = get_experiment(METHOD_EXPERIMENTS[method])
    for name in raw:  # method_values keeps only the experiment's properties: a typo would vanish silently
        check_property(experiment, name)
    return method_values(method, raw)


def check_property(experiment: Experiment, name: str) -> None:
    """InputError naming name unless it is a property the experiment takes (the spec's names, suggested)."""
    settable = [*experiment.required, *experiment.optional]
    if name not in settable:
        hint = suggest(name, settable)  # an alias (lora_r, max_seq_length) first: errors.ALIASES
        raise InputError(name, f"not a property of {experiment.base_id}." + hint, allowed=one_of(settable, 30))
