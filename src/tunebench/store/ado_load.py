"""Load tunebench's results into an ado discovery space. Runs with ado's own Python, not tunebench's.

    tunebench export --format ado --output DIR        writes DIR/space.yaml and DIR/results.jsonl
    ado create space -f DIR/space.yaml                 prints the new space's identifier
    <ado's python> ado_load.py DIR SPACE_ID           (tunebench export prints this file's path)

Each line of results.jsonl is one result (every repeat its own line): the index of its experiment in
space.yaml, the entity's constitutive values and the measured (target) properties, is_valid
included. They reach ado as its SFTTrainer actuator hands over a measurement
(ado_actuators/sfttrainer/actuators.py): one ValidMeasurementResult of the parameterised
experiment's observed properties (an invalid entity: is_valid False alone), in a MeasurementRequest
that the space stores (DiscoverySpace.addMeasurement). ado names the entities itself (its id:
properties sorted by name) and keeps each experiment's parameterisation. Only the standard library
and ado are imported here: this file is copied or run by path inside ado's environment (its own
folder is taken off sys.path first: tunebench's store modules there, queue.py among them, would
shadow the standard library's).
"""

import json
import sys
from pathlib import Path

OPERATION = "tunebench-import"  # the operation id ado records with the requests


def load(folder: Path, space_id: str) -> int:
    """Add every result of folder/results.jsonl to the space; the number added."""
    from ado.cli.core.config import AdoConfiguration
    from ado.core.discoveryspace.space import DiscoverySpace
    from ado.schema.observed_property import ObservedPropertyValue
    from ado.schema.property_value import ValueTypeEnum
    from ado.schema.request import MeasurementRequest, MeasurementRequestStateEnum
    from ado.schema.result import ValidMeasurementResult

    context = AdoConfiguration.load().project_context
    space = DiscoverySpace.from_stored_configuration(project_context=context, space_identifier=space_id)
    experiments = space.measurementSpace.experiments
    lines = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    for i, item in enumerate(lines):
        experiment = experiments[item.get("experiment", 0)]
        entity = space.entitySpace.entity_for_point(item["entity"])
        by_target = {p.targetProperty.identifier: p for p in experiment.observedProperties}
        unknown = sorted(set(item["properties"]) - set(by_target))
        if unknown:
            raise SystemExit(f"line {i + 1}: {experiment.reference} does not measure {', '.join(unknown)}")
        values = [
            ObservedPropertyValue(valueType=ValueTypeEnum.NUMERIC_VALUE_TYPE, value=v, property=by_target[k])
            for k, v in item["properties"].items()
        ]
        result = ValidMeasurementResult(entityIdentifier=entity.identifier, measurements=values, metadata={})
        space.addMeasurement(
            MeasurementRequest(
                operation_id=item.get("operation", OPERATION),
                requestIndex=i,
                experimentReference=experiment.reference,
                entities=[entity],
                status=MeasurementRequestStateEnum.SUCCESS,
                measurements=[result],
            )
        )
    return len(lines)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    if len(sys.argv) != 3:
        raise SystemExit("usage: python ado_load.py FOLDER SPACE_ID (FOLDER: tunebench export --format ado)")
    print(json.dumps({"space": sys.argv[2], "added": load(Path(sys.argv[1]), sys.argv[2])}))
