"""tunebench's results as an ado discovery space and its measurements (``export --format ado``).

Writes a folder that ado loads with every experiment's parameters and every repeat intact:

- ``space.yaml``: an ado discovery space (DiscoverySpaceConfiguration): one SFTTrainer experiment
  per tunebench experiment, its parameters as ado's ``parameterization``, and an ``entitySpace`` of
  each constitutive property with the values the results have (a property some entities leave at
  the experiment's default gets that default);
- ``results.jsonl``: one line per valid or invalid result (repeats each their own), oldest first:
  the experiment's index in space.yaml, the entity's values, the measured properties (is_valid
  as ado's actuator records it: true, or false alone for an invalid entity).

ado's CSV sample store cannot carry a parameterised experiment (its experiment descriptions name
an experiment without parameters), so the folder is loaded through ado's own API by
``ado_load.py`` run with ado's Python (docs/ado.md has the commands).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tunebench.spec.measured import BENCHMARK_MEASURED, STABILITY_MEASURED
from tunebench.store.rows import Selection
from tunebench.store.schema import INVALID, VALID
from tunebench.store.tables import build

if TYPE_CHECKING:
    from tunebench.store.store import Store

ACTUATOR = "SFTTrainer"  # ado's SFTTrainer actuator (ado-sfttrainer's entry point `sfttrainer`)
LOADER = Path(__file__).with_name("ado_load.py")
MEASURED = (set(BENCHMARK_MEASURED) | set(STABILITY_MEASURED)) - {"is_valid"}


def export_ado(
    store: Store,
    folder: Path,
    *,
    request_ids: list[int] | None = None,
    operation_id: str | None = None,
    actuator: str | None = "measure",
) -> tuple[int, int]:
    """Write space.yaml and results.jsonl into folder; (experiments, results) written."""
    from tunebench.store.csvio import parse_experiment_id

    outcomes = store.table(Selection(operation_id, request_ids, actuator, statuses=[VALID, INVALID], every_result=True))
    table = build(outcomes)
    rows = table.records()
    names = [table.columns[i] for i in table.text_columns]  # the constitutive columns
    experiments: dict[str, int] = {}
    entries: list[dict[str, Any]] = []
    lines = []
    for row in rows:
        eid = row["experiment_id"]
        if eid not in experiments:
            experiment = parse_experiment_id(eid)
            experiments[eid] = len(entries)
            entries.append(
                {
                    "actuatorIdentifier": ACTUATOR,
                    "experimentIdentifier": experiment.base_id,
                    "parameterization": [
                        {"property": {"identifier": k}, "value": _plain(v)}
                        for k, v in sorted(experiment.parameters.items())
                    ],
                }
            )
        valid = row["status"] == VALID
        props: dict[str, Any] = {"is_valid": valid}
        if valid:
            props.update({k: v for k, v in row.items() if k in MEASURED and v is not None})
        entity = {k: _plain(row[k]) for k in names}
        lines.append(json.dumps({"experiment": experiments[eid], "entity": entity, "properties": props}))
    domains = {k: sorted({json.dumps(json.loads(line)["entity"][k]) for line in lines}) for k in names}
    space = {
        "metadata": {"name": "tunebench export", "description": "tunebench's results (tunebench export --format ado)"},
        "experiments": entries,
        "entitySpace": [
            {"identifier": k, "propertyDomain": {"values": [json.loads(v) for v in values]}}
            for k, values in domains.items()
        ],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    (folder / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return len(entries), len(lines)


def _plain(value: Any) -> Any:
    """A value as YAML/JSON writes it for ado: tuples as lists, whole floats of integer properties kept."""
    return list(value) if isinstance(value, tuple) else value
