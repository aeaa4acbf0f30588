"""TrackedRuns into an Aim repository, through Aim's own SDK (``aim.Run``, ``aim.Repo``).

One Aim run per TrackedRun, in the Aim experiment of its name: ``run.name``; params under ``hparams``
(Aim's convention: the UI's parameter columns); each metric tracked once, each series point at its step;
the status (valid | invalid | failed) as an Aim tag; every tunebench tag, without its ``tunebench.``
prefix, under the run's ``tunebench`` attribute (Aim's tags are labels without values). The worker logs are
artifacts (``file://<REPO>/artifacts``; a remote repository gets them as an Aim ``Text`` named
``worker.log``). ``tunebench.complete`` is set last; a run of the same result without it (an interrupted
write) is resumed and written again: every value goes to its step, so nothing is repeated (Aim's
delete_run would leave the deleted run's tags to the next run it creates). Aim's own system tracking (CPU, memory, terminal logs) is off: the
run is written after the measurement, and the measurement's own series are the ones that count.

A local repository indexes each run as soon as it is written (Aim's RepoIndexManager, what ``aim up``
runs in the background), so that Aim's readers (the UI, ``Repo.query_runs``) see it at once.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tunebench.errors import InputError, one_line
from tunebench.secrets import mask_secrets
from tunebench.track.runs import PREFIX, TrackedRun, series_points
from tunebench.track.targets import Target

ATTRIBUTE = "tunebench"  # the run attribute holding the tags
CONNECT_TIMEOUT_S = 5.0
MAX_TEXT = 1 << 20  # characters of a log sent as an Aim Text (a remote repository)


class AimWriter:
    """Writes TrackedRuns to the Aim repository of a Target."""

    def __init__(self, target: Target, field: str = "--track"):
        self.target, self.location, self.field = target, target.location, field
        self.remote = "://" in self.location
        self._repo: Any = None
        self._indexer: Any = None
        self._runs: dict[str, dict[str, tuple[str, bool]]] = {}  # experiment -> result key -> (run hash, complete)

    def check(self) -> None:
        """Reach the Aim server (aim://host:port) or open (create) the local repository; InputError naming the
        field when it cannot be used."""
        if self.remote:
            parts = urlsplit(self.location)
            if parts.scheme != "aim" or not parts.hostname:
                raise InputError(
                    self.field,
                    f"{mask_secrets(self.location)!r} is not an Aim repository",
                    allowed="a directory, or aim://host:port (an `aim server`)",
                )
            try:
                with socket.create_connection((parts.hostname, parts.port or 53800), timeout=CONNECT_TIMEOUT_S):
                    pass
            except OSError as exc:
                why = str(exc.strerror or exc)
                raise InputError(
                    self.field, f"cannot reach the Aim server {mask_secrets(self.location)}: {why[:1].lower()}{why[1:]}"
                ) from None
        try:
            self.repo()
        except Exception as exc:
            raise InputError(
                self.field,
                f"cannot open the Aim repository {mask_secrets(self.location)}: "
                f"{one_line(str(exc) or type(exc).__name__)}",
            ) from None

    def repo(self) -> Any:
        """The aim.Repo (a local one is created on first use)."""
        if self._repo is None:
            from aim import Repo

            if not self.remote:
                Path(self.location).mkdir(parents=True, exist_ok=True)
            self._repo = Repo(self.location, init=not self.remote)  # not Repo.from_path: its pool outlives close()
        return self._repo

    def has(self, run: TrackedRun) -> bool:
        """Whether the experiment holds a complete run of this result."""
        found = self._known(run.experiment).get(run.key)
        return found is not None and found[1]

    def write(self, run: TrackedRun) -> str:
        """Create the Aim run, or complete the interrupted one of the same result (each value is written at its
        step, so writing again replaces, never repeats); returns its hash."""
        from aim import Run, Text

        repo = self.repo()
        known = self._known(run.experiment)
        interrupted = known.get(run.key, (None, False))[0]
        aim_run = Run(
            interrupted,
            repo=repo,
            experiment=run.experiment,
            force_resume=interrupted is not None,
            system_tracking_interval=None,
            log_system_params=False,
            capture_terminal_logs=False,
        )
        known[run.key] = (aim_run.hash, False)
        try:
            aim_run.name = run.name
            aim_run[ATTRIBUTE] = {**{k.removeprefix(PREFIX): v for k, v in run.tags.items()}, "complete": False}
            aim_run["hparams"] = run.params
            if run.status not in aim_run.props.tags:
                aim_run.add_tag(run.status)
            for name, value in run.metrics.items():
                aim_run.track(value, name=name, step=0)
            for name, step, _t, value in series_points(run.series):
                aim_run.track(value, name=name, step=step)
            if self.remote:
                for name, path in run.logs:
                    aim_run.track(Text(path.read_text(errors="replace")[-MAX_TEXT:]), name=name, step=0)
            else:
                aim_run.set_artifacts_uri((Path(self.location) / "artifacts").absolute().as_uri())
                for name, path in run.logs:
                    aim_run.log_artifact(str(path), name=name, block=True)
            if not run.logs and run.log_tail:
                aim_run.track(Text(run.log_tail[-MAX_TEXT:]), name="worker.log.tail", step=0)
            aim_run[ATTRIBUTE, "complete"] = True
        finally:
            aim_run.close()
        self._index(aim_run.hash)
        known[run.key] = (aim_run.hash, True)
        return aim_run.hash

    def close(self) -> None:
        """Release the repository's files (its run locks and storage handles)."""
        if self._repo is not None:
            self._repo.close()
            self._repo = self._indexer = None

    def _index(self, run_hash: str) -> None:
        """Put a local run into the repository's index (a remote one: its server indexes it)."""
        if self.remote:
            return
        if self._indexer is None:
            from aim.sdk.index_manager import RepoIndexManager

            self._indexer = RepoIndexManager(self.repo())  # its index() alone: no watcher threads are started
        self._indexer.index(run_hash)

    def _known(self, experiment: str) -> dict[str, tuple[str, bool]]:
        """result key -> (run hash, complete) of the experiment's runs written by tunebench (read once)."""
        if experiment not in self._runs:
            from aim import Run

            repo = self.repo()
            if repo.structured_db is not None:  # a local repository: its experiments' runs from its database
                hashes = [r.hash for e in repo.structured_db.experiments() if e.name == experiment for r in e.runs]
            else:  # a remote one: its server's index
                hashes = [r.hash for r in repo.iter_runs() if r.experiment == experiment]
            known: dict[str, tuple[str, bool]] = {}
            for run_hash in hashes:
                tags = _attribute(Run(run_hash, repo=repo, read_only=True))
                if tags is None and not self.remote:  # written, not yet indexed: index it, read again
                    self._index(run_hash)
                    tags = _attribute(Run(run_hash, repo=repo, read_only=True))
                key = (tags or {}).get("result_key")
                if key and not known.get(key, ("", False))[1]:
                    known[key] = (run_hash, bool(tags.get("complete")))
            self._runs[experiment] = known
        return self._runs[experiment]


def _attribute(run: Any) -> dict[str, Any] | None:
    """The run's tunebench attribute; None when it has none (not tunebench's, or not readable yet)."""
    try:
        found = run.get(ATTRIBUTE)
    except Exception:
        return None
    return found if isinstance(found, dict) else None
