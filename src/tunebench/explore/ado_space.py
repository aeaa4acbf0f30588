"""ado's resource files as a tunebench space file: discovery space, operation, actuator configuration.

ado describes an exploration in three YAML resources (ado-sfttrainer.md §12.5; ado-core 2.3.0's
``DiscoverySpaceConfiguration``, operation and ``actuatorconfiguration``):

- the space: ``experiments`` (a list, or ``{experiments: [...]}``) of ``{actuatorIdentifier:
  SFTTrainer, experimentIdentifier, parameterization: [{property: {identifier}, value}]}`` and an
  ``entitySpace`` of ``{identifier, propertyDomain}``: ``values`` (categorical) or ``domainRange:
  [lo, hi]`` with ``interval`` (discrete, half-open: lo, lo + interval, ... below hi);
- the operation: ``operation.module.operatorName: random_walk`` with ``parameters``:
  ``numberEntities`` (a number or ``all``), ``samplerConfig.mode`` (sequential / random, or the
  grouped variants), ``batchSize`` (measurements in flight), ``maxRetries``;
- the actuator configuration: ``actuatorIdentifier: SFTTrainer`` with ``parameters``:
  ``data_directory``, ``model_map`` ({model: {Vanilla: path-or-id}}).

``from_ado`` maps them onto a space file's dict (experiments, entity_space, actuator measure,
operation grid or random, execution). Anything tunebench cannot run the same way is an InputError
naming the field: another actuator, a continuous dimension, another operator; so is a value of the wrong
type (``parameters: 5``, ``interval: abc``), naming its path in the file and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any

from tunebench.errors import InputError, shown
from tunebench.explore.space import MAX_GRID_POINTS

ADO_ACTUATOR = "SFTTrainer"
OPERATORS = ("random_walk",)
MODES = {"sequential": "grid", "sequentialgrouped": "grid", "random": "random", "randomgrouped": "random"}


def is_ado_space(raw: Any) -> bool:
    """Whether a YAML document is an ado discovery space rather than a tunebench space file."""
    if not isinstance(raw, dict):
        return False
    experiments = raw.get("experiments")
    if isinstance(experiments, dict):
        experiments = experiments.get("experiments")
    first = experiments[0] if isinstance(experiments, list) and experiments else None
    return "entitySpace" in raw or (isinstance(first, dict) and "experimentIdentifier" in first)


def from_ado(space: dict, operation: dict | None = None, actuator: dict | None = None) -> dict[str, Any]:
    """A tunebench space file's dict from ado's space (and operation, actuator configuration) resources."""
    out: dict[str, Any] = {"experiments": _experiments(space), "entity_space": _entity_space(space)}
    name = _mapping(space, "metadata", "metadata", "name, description").get("name")
    if name:
        out["name"] = str(name)
    out["actuator"] = _actuator(actuator or {})
    if operation:
        out["operation"], out["execution"] = _operation(operation)
    return out


def _mapping(parent: dict, key: str, field: str, allowed: str) -> dict:
    """parent[key] if it is a mapping ({} when absent or empty); InputError naming field otherwise."""
    value = parent.get(key)
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict):
        raise InputError(field, f"{shown(value)} is not a mapping", allowed=f"a mapping of {allowed}")
    return value


def _number(value: Any, field: str) -> int | float:
    """value if it is a finite number (an int or a float, not a bool); InputError naming field otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, f"{shown(value)} is not a number", allowed="a finite number")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past a float's range
        finite = False
    if not finite:
        raise InputError(field, f"{shown(value)} is not a finite number", allowed="a finite number")
    return value


def _integer(params: dict, key: str, field: str, least: int) -> int | None:
    """params[key] as an integer >= least (None when absent); InputError naming field otherwise."""
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise InputError(field, f"{shown(value)} is not {what}", allowed=what)
    return value


def _experiments(space: dict) -> list[dict[str, Any]]:
    experiments = space.get("experiments")
    if isinstance(experiments, dict):
        experiments = experiments.get("experiments")
    if not isinstance(experiments, list) or not experiments:
        raise InputError("experiments", "an ado space needs a list of experiments")
    out = []
    for i, e in enumerate(experiments):
        where = f"experiments[{i}]"
        if not isinstance(e, dict) or "experimentIdentifier" not in e:
            raise InputError(f"{where}.experimentIdentifier", "is required")
        if not isinstance(e["experimentIdentifier"], str):
            raise InputError(f"{where}.experimentIdentifier", f"{shown(e['experimentIdentifier'])} is not an id")
        if e.get("actuatorIdentifier", ADO_ACTUATOR) != ADO_ACTUATOR:
            raise InputError(
                f"{where}.actuatorIdentifier",
                f"{shown(e['actuatorIdentifier'])} is not an actuator tunebench runs",
                allowed=ADO_ACTUATOR,
            )
        parameterization = e.get("parameterization") or []
        if not isinstance(parameterization, list):
            raise InputError(
                f"{where}.parameterization",
                f"{shown(parameterization)} is not a list",
                allowed="a list of {property: {identifier}, value}",
            )
        params = {}
        for j, p in enumerate(parameterization):
            try:
                name, value = p["property"]["identifier"], p["value"]
            except (KeyError, TypeError):
                raise InputError(f"{where}.parameterization[{j}]", "needs property.identifier and value") from None
            if not isinstance(name, str):
                raise InputError(f"{where}.parameterization[{j}].property.identifier", f"{shown(name)} is not a name")
            params[name] = value
        out.append({"id": e["experimentIdentifier"].removeprefix(ADO_ACTUATOR + "."), "parameters": params})
    return out


def _entity_space(space: dict) -> dict[str, Any]:
    dims = space.get("entitySpace")
    if not isinstance(dims, list) or not dims:
        raise InputError("entitySpace", "an ado space needs an entitySpace (a list of properties with domains)")
    out: dict[str, Any] = {}
    for i, d in enumerate(dims):
        where = f"entitySpace[{i}]"
        if not isinstance(d, dict) or "identifier" not in d:
            raise InputError(f"{where}.identifier", "is required")
        name = d["identifier"]
        if not isinstance(name, str) or not name:
            raise InputError(f"{where}.identifier", f"{shown(name)} is not a property name")
        if name in out:  # a second domain would silently replace the first
            raise InputError(f"{where}.identifier", f"{name!r} is listed twice", allowed="each property once")
        domain = _mapping(d, "propertyDomain", f"{where}.propertyDomain", "values, or domainRange and interval")
        out[name] = _domain_values(domain, f"{where}.propertyDomain")
    return out


def _domain_values(domain: dict, where: str) -> list[Any]:
    """The values of an ado property domain: its categorical values, or its discrete range's."""
    if domain.get("values") is not None:
        values = domain["values"]
        if not isinstance(values, list) or not values:
            raise InputError(f"{where}.values", f"{shown(values)} is not a list of values", allowed="a non-empty list")
        return list(values)
    if domain.get("domainRange") is None or domain.get("interval") is None:
        raise InputError(
            where,
            "tunebench explores categorical values or a discrete "
            "range (domainRange with interval); a continuous or open domain has no grid",
        )
    bounds = domain["domainRange"]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise InputError(f"{where}.domainRange", f"{shown(bounds)} is not [low, high]", allowed="two numbers")
    lo = _number(bounds[0], f"{where}.domainRange[0]")
    hi = _number(bounds[1], f"{where}.domainRange[1]")
    step = _number(domain["interval"], f"{where}.interval")
    if step <= 0:  # the range would never reach hi
        raise InputError(f"{where}.interval", f"must be > 0 (got {shown(step)})", allowed="a positive number")
    if hi <= lo:
        raise InputError(
            f"{where}.domainRange",
            f"{shown([lo, hi])} holds no value (half-open: low, low + interval, ... below high)",
            allowed="high > low",
        )
    span = (float(hi) - float(lo)) / step  # values, give or take one, checked before any is listed (as floats:
    # an int quotient past a float's range raises OverflowError, a float one is inf)
    if span > MAX_GRID_POINTS:  # the native space's limit (space._dimension), in its words
        count = f"{math.ceil(span):,}" if span < 1e15 else f"{span:.3g}" if math.isfinite(span) else "over 1e+308"
        raise InputError(where, f"range has {count} values", allowed=f"at most {MAX_GRID_POINTS:,}")
    values, k = [], 0
    while lo + k * step < hi:  # ado's discrete ranges are half-open (ado/schema/domain.py)
        values.append(lo + k * step)
        k += 1
    return values


def _actuator(config: dict) -> dict[str, Any]:
    if config.get("actuatorIdentifier", ADO_ACTUATOR) != ADO_ACTUATOR:
        raise InputError(
            "actuatorIdentifier",
            f"{shown(config['actuatorIdentifier'])} is not an actuator tunebench runs",
            allowed=ADO_ACTUATOR,
        )
    params = _mapping(config, "parameters", "parameters", "data_directory, model_map")
    out: dict[str, Any] = {"name": "measure"}
    data_dir = params.get("data_directory")
    if data_dir is not None and not isinstance(data_dir, str):
        raise InputError("parameters.data_directory", f"{shown(data_dir)} is not a path", allowed="a directory path")
    if data_dir:
        out["data_dir"] = data_dir
    models = {}
    for model, where in _mapping(params, "model_map", "parameters.model_map", "model: {Vanilla: path}").items():
        field = f"parameters.model_map.{model}"
        path = where.get("Vanilla") if isinstance(where, dict) else where
        if isinstance(where, dict):
            field += ".Vanilla"
        if path is not None and not isinstance(path, str):
            raise InputError(field, f"{shown(path)} is not a path", allowed="a model path or id, or {Vanilla: path}")
        if path:
            models[str(model)] = path
    if models:
        out["model_map"] = models
    return out


def _operation(config: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    op = _mapping(config, "operation", "operation", "module, parameters")
    module = _mapping(op, "module", "operation.module", "operatorName")
    operator = module.get("operatorName", "random_walk")
    if operator not in OPERATORS:
        raise InputError(
            "operation.module.operatorName",
            f"{shown(operator)} is not an operator tunebench runs (its samplers: grid, random, optimize)",
            allowed=", ".join(OPERATORS),
        )
    where = "operation.parameters"
    params = _mapping(op, "parameters", where, "numberEntities, samplerConfig, batchSize, maxRetries")
    mode = _mapping(params, "samplerConfig", f"{where}.samplerConfig", "mode").get("mode", "random")
    if not isinstance(mode, str) or mode not in MODES:
        raise InputError(f"{where}.samplerConfig.mode", f"unknown mode {shown(mode)}", allowed=", ".join(MODES))
    operation: dict[str, Any] = {"sampler": MODES[mode]}
    number = params.get("numberEntities", "all")
    if number != "all":
        if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
            raise InputError(
                f"{where}.numberEntities",
                f"{shown(number)} is neither a positive integer nor all",
                allowed="1, 2, ..., all",
            )
        operation["n"] = number
    elif operation["sampler"] == "random":
        operation["sampler"] = "grid"  # every entity, in any order, is the whole grid
    execution: dict[str, Any] = {}
    batch = _integer(params, "batchSize", f"{where}.batchSize", least=1)
    if batch is not None:
        execution["max_parallel"] = batch
    retries = _integer(params, "maxRetries", f"{where}.maxRetries", least=0)
    if retries is not None:
        execution["max_retries"] = retries
    return operation, execution
