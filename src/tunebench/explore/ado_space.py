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
naming the field: another actuator, a continuous dimension, another operator.
"""

from __future__ import annotations

from typing import Any

from tunebench.errors import InputError

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
    name = (space.get("metadata") or {}).get("name")
    if name:
        out["name"] = str(name)
    out["actuator"] = _actuator(actuator or {})
    if operation:
        out["operation"], out["execution"] = _operation(operation)
    return out


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
        if e.get("actuatorIdentifier", ADO_ACTUATOR) != ADO_ACTUATOR:
            raise InputError(
                f"{where}.actuatorIdentifier",
                f"{e['actuatorIdentifier']!r} is not an actuator tunebench runs",
                allowed=ADO_ACTUATOR,
            )
        params = {}
        for j, p in enumerate(e.get("parameterization") or []):
            try:
                params[p["property"]["identifier"]] = p["value"]
            except (KeyError, TypeError):
                raise InputError(f"{where}.parameterization[{j}]", "needs property.identifier and value") from None
        out.append({"id": str(e["experimentIdentifier"]).removeprefix(ADO_ACTUATOR + "."), "parameters": params})
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
        domain = d.get("propertyDomain") or {}
        if domain.get("values") is not None:
            out[d["identifier"]] = list(domain["values"])
        elif domain.get("domainRange") is not None and domain.get("interval") is not None:
            lo, hi = domain["domainRange"]
            step = domain["interval"]
            values, k = [], 0
            while lo + k * step < hi:  # ado's discrete ranges are half-open (ado/schema/domain.py)
                values.append(lo + k * step)
                k += 1
            out[d["identifier"]] = values
        else:
            raise InputError(
                f"{where}.propertyDomain",
                "tunebench explores categorical values or a discrete "
                "range (domainRange with interval); a continuous or open domain has no grid",
            )
    return out


def _actuator(config: dict) -> dict[str, Any]:
    if config.get("actuatorIdentifier", ADO_ACTUATOR) != ADO_ACTUATOR:
        raise InputError(
            "actuatorIdentifier",
            f"{config['actuatorIdentifier']!r} is not an actuator tunebench runs",
            allowed=ADO_ACTUATOR,
        )
    params = config.get("parameters") or {}
    out: dict[str, Any] = {"name": "measure"}
    if params.get("data_directory"):
        out["data_dir"] = str(params["data_directory"])
    models = {}
    for model, where in (params.get("model_map") or {}).items():
        path = where.get("Vanilla") if isinstance(where, dict) else where
        if path:
            models[model] = str(path)
    if models:
        out["model_map"] = models
    return out


def _operation(config: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    op = config.get("operation") or {}
    operator = (op.get("module") or {}).get("operatorName", "random_walk")
    if operator not in OPERATORS:
        raise InputError(
            "operation.module.operatorName",
            f"{operator!r} is not an operator tunebench runs (its samplers: grid, random, optimize)",
            allowed=", ".join(OPERATORS),
        )
    params = op.get("parameters") or {}
    mode = (params.get("samplerConfig") or {}).get("mode", "random")
    if mode not in MODES:
        raise InputError("operation.parameters.samplerConfig.mode", f"unknown mode {mode!r}", allowed=", ".join(MODES))
    operation: dict[str, Any] = {"sampler": MODES[mode]}
    number = params.get("numberEntities", "all")
    if number != "all":
        if not isinstance(number, int) or number <= 0:
            raise InputError("operation.parameters.numberEntities", f"{number!r} is neither a positive integer nor all")
        operation["n"] = number
    elif operation["sampler"] == "random":
        operation["sampler"] = "grid"  # every entity, in any order, is the whole grid
    execution: dict[str, Any] = {}
    if params.get("batchSize"):
        execution["max_parallel"] = int(params["batchSize"])
    if params.get("maxRetries") is not None:
        execution["max_retries"] = int(params["maxRetries"])
    return operation, execution
