"""Run by ado's own Python: record measurements in an ado discovery space as ado's SFTTrainer actuator does.

The actuator's last step (ado_actuators/sfttrainer/actuators.py) turns the trainer's scalar observations
into one ValidMeasurementResult of the experiment's observed properties (an invalid entity: is_valid
False alone) and hands ado a MeasurementRequest; the space stores it (DiscoverySpace.addMeasurement).
Training itself is left out: the values come from the plan file.

    python record.py SPACE_ID PLAN.json     PLAN: [{"experiment": 0, "entity": {...}, "properties": {...}}]
"""

import json
import sys
from pathlib import Path

from ado.cli.core.config import AdoConfiguration
from ado.core.discoveryspace.space import DiscoverySpace
from ado.schema.observed_property import ObservedPropertyValue
from ado.schema.property_value import ValueTypeEnum
from ado.schema.request import MeasurementRequest, MeasurementRequestStateEnum
from ado.schema.result import ValidMeasurementResult

space_id, plan = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
context = AdoConfiguration.load().project_context
space = DiscoverySpace.from_stored_configuration(project_context=context, space_identifier=space_id)
experiments = space.measurementSpace.experiments
for i, item in enumerate(plan):
    experiment = experiments[item.get("experiment", 0)]
    entity = space.entitySpace.entity_for_point(item["entity"])
    by_target = {p.targetProperty.identifier: p for p in experiment.observedProperties}
    values = [ObservedPropertyValue(valueType=ValueTypeEnum.NUMERIC_VALUE_TYPE, value=v, property=by_target[k])
              for k, v in item["properties"].items()]
    result = ValidMeasurementResult(entityIdentifier=entity.identifier, measurements=values, metadata={})
    space.addMeasurement(MeasurementRequest(
        operation_id="tunebench-test", requestIndex=i, experimentReference=experiment.reference, entities=[entity],
        status=MeasurementRequestStateEnum.SUCCESS, measurements=[result]))
print(json.dumps({"recorded": len(plan), "experiments": [str(e.reference) for e in experiments]}))
