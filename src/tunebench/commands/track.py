"""The command line of the experiment trackers (tunebench.track): ``--track`` of ``run`` and ``explore``, and
``tunebench track export``. ``register(app)`` adds the ``track`` group to tunebench's CLI.

Input errors raise ``InputError`` (tunebench's main prints one line and exits with code 2).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from tunebench.commands.options import option
from tunebench.commands.store import StoreOpt
from tunebench.errors import InputError
from tunebench.inputs import Text
from tunebench.store.open import open_store

if TYPE_CHECKING:
    from tunebench.spec.experiments import Entity, Experiment
    from tunebench.track import Trackers

TrackOpt = Annotated[
    list[str] | None,
    option(
        str,
        "--track",
        help="Send each measurement to a tracker after it is stored: mlflow (a local store "
        "under tunebench's home, no server), mlflow:URI (http(s)://host:port, sqlite:///file.db), aim "
        "(a local repository), aim:REPO; repeatable. Checked before any training.",
    ),
]
PROGRESS_S = 5.0  # export: a progress line at most this often


def open_for_run(track: list[str] | None, store_url: str | None) -> Trackers | None:
    """The trackers of `run --track`, checked before measuring; None without --track. The tracker is fed from
    the store, so --no-store with --track is an error."""
    from tunebench.track import open_trackers, parse_targets

    targets = parse_targets(track)
    if not targets:
        return None
    if store_url is None:
        raise InputError("--track", "sends what the store keeps: drop --no-store (the store is written first)")
    return open_trackers(targets)


def track_run(trackers: Trackers, store_url: str, experiment: Experiment, entity: Entity, actuator: str) -> None:
    """Send the result `run` just stored; a tracker that fails is a warning (the result stays stored)."""
    with open_store(store_url) as store, trackers:
        request_id = store.request_ids([(experiment.id, entity.id)], actuator=actuator)[(experiment.id, entity.id)]
        sent = trackers.send_requests(store, [request_id])
    if sent.created or sent.present:
        typer.echo(f"tracked in {trackers.names()} (experiment 'tunebench run')", err=True)


track_app = typer.Typer(help="Experiment trackers (MLflow, Aim): send stored measurements.", no_args_is_help=True)


@track_app.command("export")
def export(
    # not required by click, which would report a missing --to before an unexpected argument (`track export
    # mlflow`): checked below instead
    to: Annotated[str | None, option(Literal["mlflow", "aim"], "--to", help="mlflow | aim (required)")] = None,
    uri: Annotated[
        str | None,
        option(
            Text,
            "--uri",
            help="MLflow tracking URI (http(s)://host:port, sqlite:///file.db) or Aim repository "
            "(a directory, aim://host:port); default: the local one under tunebench's home.",
        ),
    ] = None,
    store: StoreOpt = None,
    predicted: Annotated[
        bool,
        typer.Option(
            "--predicted", help="Add the planner's prediction of each entity as predicted_<property> metrics."
        ),
    ] = False,
) -> int:
    """Send every measurement in the store to a tracker, one tracker run per result; results already there
    (found by their result id) are not sent again, so running it twice creates no duplicates."""
    from tunebench.logs import duration, get
    from tunebench.track import Target
    from tunebench.track import export as send
    from tunebench.track.targets import default_location, parse_target

    if to is None:
        raise InputError("--to", "is required", allowed="mlflow, aim")
    target = parse_target(f"{to}:{uri}", "--uri") if uri else Target(to, default_location(to))
    log, started, last = get(__name__), time.monotonic(), [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < PROGRESS_S:
            return
        last[0] = now
        rate = done / max(now - started, 1e-9)
        eta = f", ETA {duration((total - done) / rate)}" if done < total else ""
        log.info(f"track export: {done}/{total} results, {rate:.1f}/s, {duration(now - started)} elapsed{eta}")

    sample_store = open_store(store, create=False)
    try:
        sent = send(sample_store, target, predicted=predicted, progress=progress)
    finally:
        sample_store.close()
    typer.echo(
        f"{target}: {sent.created} runs created, {sent.present} already there"
        + (f", {len(sent.warnings)} failed" if sent.warnings else "")
    )
    return 1 if sent.warnings else 0


def register(app: typer.Typer) -> None:
    """Add the track group to a Typer app."""
    app.add_typer(track_app, name="track")
