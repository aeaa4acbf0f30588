"""tunebench's planner as an actuator of IBM ado: an ado discovery space screens its entities with it.

Installed into ado's environment, tunebench registers ``TunebenchPredict`` under the entry-point group
``ado.actuators`` (pyproject.toml), the group ado's ActuatorRegistry loads plugins from
(ado-core ``ado/modules/actuators/registry.py``), as ado-sfttrainer registers its SFTTrainer actuator.
Its actuator id is ``tunebench_predict``; its catalog holds the experiments of the SFTTrainer spec
under their ids (tunebench's, qlora included: tunebench.spec.experiments) with the same required and
optional properties, and the planner's predictions as measured properties (tunebench.plan.PREDICTED
and is_valid). A space names it as ``actuatorIdentifier: tunebench_predict``.

A measurement is ``tunebench.actuators.predict.predict_actuator`` on the entity, handed to ado as
the SFTTrainer actuator hands over a run (ado_actuators/sfttrainer/actuators.py): one
MeasurementRequest per entity; valid -> a ValidMeasurementResult of the predicted properties with
is_valid true; invalid (a validity rule, out of GPU memory) -> is_valid false alone, the reasons in the
result's metadata (SFTTrainer keeps them only in its log); an entity the planner cannot read -> an
InvalidMeasurementResult with the error, the request FAILED (ado retries it).

Only ado imports this module: tunebench itself runs without ado.
"""

from __future__ import annotations

import functools
import math
import uuid
from typing import Any

import pydantic
from ado.core.actuatorconfiguration.config import GenericActuatorParameters
from ado.modules.actuators.base import ActuatorBase
from ado.modules.actuators.catalog import ExperimentCatalog
from ado.schema.domain import PropertyDomain, VariableTypeEnum
from ado.schema.entity import Entity
from ado.schema.experiment import Experiment
from ado.schema.observed_property import ObservedPropertyValue
from ado.schema.property import AbstractPropertyDescriptor, ConstitutiveProperty, ConstitutivePropertyDescriptor
from ado.schema.property_value import ConstitutivePropertyValue, ValueTypeEnum
from ado.schema.reference import ExperimentReference
from ado.schema.request import MeasurementRequest, MeasurementRequestStateEnum
from ado.schema.result import InvalidMeasurementResult, ValidMeasurementResult

from tunebench.errors import InputError
from tunebench.spec.experiments import REQUIRED_PROPERTIES, get_experiment, list_experiments, make_entity
from tunebench.spec.properties import INT_MAX, INT_MIN, PROPERTIES, Property

IDENTIFIER = "tunebench_predict"
# ado checks that a space's domain is a sub-domain of the experiment's by listing a discrete domain's
# values (ado/schema/domain.py is_subdomain_of_discrete_domain): an integer domain wider than this is
# given to ado as a continuous range instead (tunebench opens domains the reference caps: spec/properties.py).
_MAX_LISTED = 2**20


def ado_domain(prop: Property, allowed: tuple | None = None) -> PropertyDomain:
    """The ado PropertyDomain of a tunebench property (allowed: an experiment's narrower values)."""
    if allowed is not None:
        return PropertyDomain(values=list(allowed), variableType=VariableTypeEnum.CATEGORICAL_VARIABLE_TYPE)
    if prop.kind == "bool":  # flash_attn: None = what the stack does by default
        if prop.nullable:
            return PropertyDomain(values=[None, False, True], variableType=VariableTypeEnum.CATEGORICAL_VARIABLE_TYPE)
        return PropertyDomain(variableType=VariableTypeEnum.BINARY_VARIABLE_TYPE)
    if prop.kind == "choice":
        return PropertyDomain(values=list(prop.choices), variableType=VariableTypeEnum.CATEGORICAL_VARIABLE_TYPE)
    if prop.kind == "int":
        low = min((prop.minimum if prop.minimum is not None else INT_MIN, *prop.special))
        high = prop.maximum if prop.maximum is not None else INT_MAX
        if high - low <= _MAX_LISTED:  # ado's discrete ranges are half-open: [low, high + 1)
            return PropertyDomain(
                domainRange=[int(low), int(high) + 1], interval=1, variableType=VariableTypeEnum.DISCRETE_VARIABLE_TYPE
            )
        continuous = VariableTypeEnum.CONTINUOUS_VARIABLE_TYPE
        return PropertyDomain(domainRange=[int(low), int(high) + 1], variableType=continuous)
    if prop.kind == "float":  # a float domain open above: any number (the planner judges the value)
        bounded = prop.minimum is not None and prop.maximum is not None
        low = min((prop.minimum, *prop.special)) if bounded else None
        return PropertyDomain(
            domainRange=[low, prop.maximum] if bounded else None, variableType=VariableTypeEnum.CONTINUOUS_VARIABLE_TYPE
        )
    # model, gpu, dataset, names and lists: any value tunebench's catalogs or forms accept
    return PropertyDomain(variableType=VariableTypeEnum.OPEN_CATEGORICAL_VARIABLE_TYPE)


def _constitutive(name: str, allowed: tuple | None = None) -> ConstitutiveProperty:
    prop = PROPERTIES[name]
    return ConstitutiveProperty(
        identifier=name, propertyDomain=ado_domain(prop, allowed), metadata={"description": prop.description}
    )


@functools.cache
def build_catalog() -> ExperimentCatalog:
    """tunebench's experiments as ado Experiments of actuator tunebench_predict."""
    from tunebench.plan import PREDICTED

    catalog = ExperimentCatalog(catalogIdentifier=IDENTIFIER)
    for experiment in list_experiments():
        optional = sorted(experiment.optional)
        catalog.addExperiment(
            Experiment(
                identifier=experiment.base_id,
                actuatorIdentifier=IDENTIFIER,
                metadata={
                    "description": experiment.description,
                    "method": experiment.method,
                    "predicted_by": "tunebench planner (tunebench.plan)",
                },
                targetProperties=[AbstractPropertyDescriptor(identifier=p) for p in ("is_valid", *PREDICTED)],
                requiredProperties=[_constitutive(name) for name in REQUIRED_PROPERTIES],
                optionalProperties=[_constitutive(name, experiment.restricted.get(name)) for name in optional],
                defaultParameterization=[
                    ConstitutivePropertyValue(
                        property=ConstitutivePropertyDescriptor(identifier=name),
                        value=_ado_value(experiment.optional[name]),
                    )
                    for name in optional
                ],
            )
        )
    return catalog


def _ado_value(value: Any) -> Any:
    """A default as ado holds values (int, float, str, list, bytes, None): tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


class TunebenchPredictParameters(GenericActuatorParameters):
    """The predict actuator's options (tunebench.actuators.predict), as an ado actuator configuration."""

    model_config = pydantic.ConfigDict(extra="forbid")

    calibration: str | None = pydantic.Field(
        None, description="A calibration JSON (tunebench calibrate); default: the user's refit, else the shipped one"
    )
    price_per_gpu_hour: float | None = pydantic.Field(None, description="Price of one GPU-hour, for cost")
    network_gbps: float | None = pydantic.Field(None, description="Inter-node bandwidth per node, GB/s")
    host_memory_gib: float | None = pydantic.Field(None, description="Host RAM per node, GiB")

    @pydantic.model_validator(mode="after")
    def _planner_accepts(self) -> TunebenchPredictParameters:
        from tunebench.actuators.predict import check_options

        try:
            check_options(self.options())
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return self

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


def predict_request(request: MeasurementRequest, experiment: Experiment, options: dict[str, Any]) -> None:
    """Fill request (one entity) with the planner's result: measurements and status."""
    from tunebench.actuators.predict import predict_actuator

    (entity,) = request.entities
    try:
        result = predict_actuator(*tunebench_pair(experiment, entity), options)
    except InputError as exc:  # a value the planner cannot read: failed, as SFTTrainer fails what it cannot run
        result, error = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one entity's error fails its request, not ado's operation
        result, error = None, f"{type(exc).__name__}: {exc}"
    if result is None or result.status == "failed":
        request.status = MeasurementRequestStateEnum.FAILED
        reason = error if result is None else result.error or "the planner failed"
        request.measurements = [
            InvalidMeasurementResult(
                entityIdentifier=entity.identifier, reason=reason, experimentReference=request.experimentReference
            )
        ]
        return
    numeric = ValueTypeEnum.NUMERIC_VALUE_TYPE
    values = [
        ObservedPropertyValue(valueType=numeric, property=prop, value=bool(value) if name == "is_valid" else value)
        for prop in experiment.observedProperties
        if (name := prop.targetProperty.identifier) in result.properties
        and (value := result.properties[name]) is not None
        and math.isfinite(value)
    ]
    metadata = {"actuator": "tunebench predict", "reasons": list(result.reasons)} if result.reasons else {}
    request.measurements = [
        ValidMeasurementResult(entityIdentifier=entity.identifier, measurements=values, metadata=metadata)
    ]
    request.status = MeasurementRequestStateEnum.SUCCESS


def tunebench_pair(experiment: Experiment, entity: Entity) -> tuple:
    """(tunebench Experiment, Entity) for an ado (parameterised) experiment and entity; InputError if unreadable."""
    parameters = {v.property.identifier: v.value for v in getattr(experiment, "parameterization", None) or ()}
    tb_experiment = get_experiment(experiment.identifier, parameters)
    values = {v.property.identifier: v.value for v in entity.constitutive_property_values}
    return tb_experiment, make_entity(tb_experiment, values)


class TunebenchPredict(ActuatorBase):
    """tunebench's planner: predicted memory, out-of-memory, throughput and runtime of fine-tuning jobs."""

    identifier = IDENTIFIER
    parameters_class = TunebenchPredictParameters

    def __init__(self, queue: Any, params: Any = None) -> None:
        super().__init__(queue, params)
        parameters = self.parameters_class.model_validate(params or {}, from_attributes=True)
        self._options = parameters.options()

    def submit(
        self, entities: list[Entity], experimentReference: ExperimentReference, requesterid: str, requestIndex: int
    ) -> list[str]:
        """Predict each entity at once and queue one request per entity (as SFTTrainer does); their ids."""
        experiment = build_catalog().experimentForReference(experimentReference, resolve=True)
        ids = []
        for entity in entities:
            request = MeasurementRequest(
                operation_id=requesterid,
                requestIndex=requestIndex,
                experimentReference=experimentReference,
                entities=[entity],
                requestid=str(uuid.uuid4())[:8],
            )
            predict_request(request, experiment, self._options)
            self._stateUpdateQueue.put_nowait(request)
            ids.append(request.requestid)
        return ids

    @classmethod
    def catalog(cls, actuator_configuration: GenericActuatorParameters | None = None) -> ExperimentCatalog:
        return build_catalog()
