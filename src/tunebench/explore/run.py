"""``run_space``: a space's operation with its execution settings, the one entry that ``tunebench explore``
and ``tunebench.api.explore`` share.

    summary = run_space(load_space("space.yaml"), "results.db", max_parallel=2)

The order is the bad-input contract's: the actuator's options, the space's GPUs where the planner predicts
(the predict actuator, skip_predicted_oom) and the number of points are checked, then the trackers are opened
(an unreachable one is an error here), and only then is the store opened (created) and anything written.
Arguments left None take the space file's ``execution:`` section.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunebench.actuators import check_options
from tunebench.errors import InputError
from tunebench.explore.explorer import Progress, Settings, Summary, explore
from tunebench.explore.space import Space
from tunebench.store import Store
from tunebench.store.open import open_store

if TYPE_CHECKING:
    from tunebench.track import Trackers


def run_space(
    space: Space,
    store: str | Store | None = None,
    *,
    executor: str | None = None,
    ray_address: str | None = None,
    max_parallel: int | None = None,
    max_retries: int | None = None,
    lease_seconds: float | None = None,
    remeasure: bool = False,
    skip_predicted_oom: bool = False,
    allow_actuator_import: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    trackers: Trackers | None = None,
    track_field: str = "track",
) -> Summary:
    """Run (or resume) space's operation on store (a URL, an SQLite path, an open Store; None: the user's).

    executor: local | ray; trackers: already opened ones (None: the space's ``track:``, opened and checked
    here, errors naming track_field)."""
    execution = space.execution
    settings = Settings(
        max_parallel=max_parallel or execution.max_parallel,
        max_retries=execution.max_retries if max_retries is None else max_retries,
        remeasure=remeasure,
        lease_seconds=lease_seconds or execution.lease_seconds,
        skip_predicted_oom=skip_predicted_oom,
        allow_actuator_import=allow_actuator_import,
    )
    check_options(space.actuator, space.options, allow_import=allow_actuator_import)
    # the local executor connects nowhere: a Ray address beside it would be ignored without a word (a file's
    # address under --executor local is not: the command line chose the executor)
    kind = executor or execution.executor
    given = ray_address or (None if executor else execution.ray_address)
    if given and kind != "ray":
        raise InputError(
            "--ray-address" if ray_address else "execution.ray_address",
            f"{given!r} is a Ray cluster's address, and the executor is {kind}",
            allowed="--executor ray (execution.executor: ray in the space file), or no Ray address",
        )
    address = (ray_address or execution.ray_address) if kind == "ray" else None
    if space.actuator == "predict":
        check_planner_gpus(space, "the predict actuator")
    elif skip_predicted_oom:
        check_planner_gpus(space, "--skip-predicted-oom")
    space.check_explorable()
    if trackers is None and space.track:
        from tunebench.track import open_trackers

        tracking: Any = open_trackers(space.track, kind_field=track_field, location_field=track_field)
    else:
        tracking = contextlib.nullcontext(trackers)
    with tracking as opened:
        runner = _executor(kind, address, settings.max_parallel)
        opened_store = store if isinstance(store, Store) else open_store(store, create=True)
        try:
            return explore(space, opened_store, runner, settings, on_progress=on_progress, trackers=opened)
        finally:
            if opened_store is not store:
                opened_store.close()


def check_planner_gpus(space: Space, who: str) -> None:
    """InputError naming the space's first gpu_model the planner has no numbers for (neither the catalog's nor
    TUNEBENCH_GPU_CATALOG's), before anything starts: each of its points would fail, after its retries.

    Only where the planner predicts (who: what asks it): the measuring actuators take any node label (the
    spec's), a GPU outside the catalog included (docs/planner.md §6)."""
    from tunebench.catalog.gpus import catalog_file_gpus, is_known_gpu, list_gpus
    from tunebench.errors import one_of, suggest

    catalog_file_gpus()  # a malformed TUNEBENCH_GPU_CATALOG is refused as such, not as unknown GPUs
    given: list[tuple[str, object]] = []  # (field, value)
    for dim in space.dimensions:
        if dim.name == "gpu_model":
            many = dim.kind != "fixed"
            given += [("entity_space.gpu_model" + (f"[{i}]" if many else ""), v) for i, v in enumerate(dim.values)]
    if not given:  # the experiments' own gpu_model (a parameter), each entity's
        for i, experiment in enumerate(space.experiments):
            if "gpu_model" in experiment.optional:
                given.append((f"experiments[{i}].gpu_model", experiment.default("gpu_model")))
    for field, value in given:
        label = str(value or "").strip()
        if label and not is_known_gpu(label):
            gpus = list_gpus()
            raise InputError(
                field,
                f"unknown GPU {label!r}: {who} plans with the GPU's numbers; give them in a GPU catalog file "
                "(TUNEBENCH_GPU_CATALOG)." + suggest(label, [t for g in gpus for t in (g.name, *g.aliases)]),
                allowed=one_of(g.name for g in gpus),
            )


def _executor(kind: str, ray_address: str | None, max_parallel: int) -> Any:
    """The executor of kind (local | ray): a Ray one connects to ray_address (None: a local Ray on demand)."""
    if kind == "ray":
        from tunebench.executors.ray import RayExecutor

        return RayExecutor(ray_address)
    from tunebench.executors.local import LocalExecutor

    return LocalExecutor(max_parallel)
