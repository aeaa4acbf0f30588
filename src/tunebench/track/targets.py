"""Where measurements are sent: ``mlflow[:URI]`` or ``aim[:REPO]``, as ``--track`` and a space file's ``track:`` say.

- ``mlflow``: the embedded store ``sqlite:///<home>/mlflow/mlflow.db`` (no server; its artifacts beside it
  in ``<home>/mlflow/artifacts``); ``mlflow:URI``: any MLflow tracking URI, an ``http(s)://`` tracking
  server or another ``sqlite:///`` file included (a scheme MLflow keeps no runs in, ``ftp://``, is an
  InputError here, before anything is measured);
- ``aim``: the Aim repository ``<home>/aim``; ``aim:REPO``: a repository directory (made if missing) or
  a remote one (``aim://host:port``, an ``aim server``).

Each kind needs its tracker's own client library, an extra of tunebench (``pip install 'tunebench[mlflow]'``);
``require`` says so in one line. Parsing imports neither library.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from tunebench.errors import InputError, one_of, shown, suggest
from tunebench.paths import home
from tunebench.secrets import mask_secrets

KINDS = ("mlflow", "aim")
ALLOWED = (
    "mlflow, mlflow:URI (http(s)://host:port, sqlite:///file.db, ...), aim, aim:REPO (a directory, aim://host:port)"
)
# The schemes of the tracking URIs MLflow keeps runs in (mlflow.tracking._tracking_service.utils: its tracking
# store registry; a database URL's driver, postgresql+psycopg2://, counts as its database), and how to say them.
MLFLOW_SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
MLFLOW_URIS = "a directory path, file:PATH, sqlite:///FILE.db, http(s)://host:port, postgresql://..., mysql://..."
# the module each kind imports, and the extra of pyproject.toml that installs it
MODULES = {"mlflow": "mlflow", "aim": "aim"}


@dataclass(frozen=True)
class Target:
    """One tracker: its kind and where it is (an MLflow tracking URI; an Aim repository path or aim:// URL)."""

    kind: str
    location: str

    def __str__(self) -> str:
        return f"{self.kind}:{mask_secrets(self.location)}"

    @property
    def remote(self) -> bool:
        """Whether the tracker is a server reached over the network (checked before any training)."""
        return self.location.split("://", 1)[0].lower() in ("http", "https", "aim")


def parse_target(text: str, field: str = "--track") -> Target:
    """``mlflow``, ``mlflow:URI``, ``aim`` or ``aim:REPO`` as a Target; InputError naming field otherwise."""
    if not isinstance(text, str):
        raise InputError(field, f"{shown(text)} is not text", allowed=ALLOWED)
    kind, sep, location = text.strip().partition(":")
    if kind not in KINDS:
        hint = suggest(kind, KINDS)
        raise InputError(field, f"unknown tracker {shown(kind)}.{hint}".rstrip("."), allowed=ALLOWED)
    if sep and not location:
        raise InputError(field, f"{text!r} names no location after '{kind}:'", allowed=ALLOWED)
    return Target(kind, _location(kind, location, field) if location else default_location(kind))


def parse_targets(values: Any, field: str = "--track") -> tuple[Target, ...]:
    """A list of target texts (or one text, or None) as Targets, each kind once."""
    if values is None:
        return ()
    items = [values] if isinstance(values, str) else values
    if not isinstance(items, (list, tuple)):
        raise InputError(field, f"{shown(values)} is neither a tracker nor a list of trackers", allowed=ALLOWED)
    indexed = len(items) > 1 and not field.startswith("--")  # a space file's list: track[1]; an option: --track
    targets = [parse_target(item, f"{field}[{i}]" if indexed else field) for i, item in enumerate(items)]
    kinds = [t.kind for t in targets]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise InputError(field, f"{twice[0]} is given twice (one location per tracker)", allowed=one_of(KINDS))
    return tuple(targets)


def default_location(kind: str) -> str:
    """The tracker of a bare ``mlflow`` or ``aim``: a store under tunebench's home, needing no server."""
    if kind == "mlflow":
        return f"sqlite:///{(home() / 'mlflow' / 'mlflow.db').absolute()}"
    return str((home() / "aim").absolute())


def _location(kind: str, location: str, field: str) -> str:
    """An Aim repository path made absolute (``~`` expanded); an MLflow URI as given (MLflow reads it), once
    its scheme is one MLflow keeps runs in (InputError naming field otherwise). A local repository or
    ``sqlite:///`` file must be in a directory that exists: the trackers would make every missing folder."""
    if kind == "aim" and "://" not in location:
        path = Path(location).expanduser().absolute()
        _in_a_directory(path, f"Aim repository {shown(location)}", field, "a directory, or aim://host:port")
        return str(path)
    if kind == "mlflow":
        try:
            scheme = urlsplit(location).scheme.lower().partition("+")[0]
        except ValueError as exc:  # e.g. an unclosed [ of an IPv6 host
            raise InputError(
                field, f"mlflow tracking URI {shown(mask_secrets(location))} is no URI: {exc}", MLFLOW_URIS
            ) from None
        if scheme and scheme not in MLFLOW_SCHEMES and scheme not in _registered_schemes():
            raise InputError(
                field,
                f"mlflow tracking URI {shown(mask_secrets(location))} has the scheme {scheme!r}, "
                "which MLflow keeps no runs in",
                allowed=MLFLOW_URIS,
            )
        database = sqlite_file(location)
        if database is not None:
            _in_a_directory(database, f"mlflow tracking URI {shown(mask_secrets(location))}", field, MLFLOW_URIS)
    return location


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///")
    return Path("/" + path.lstrip("/")) if uri.startswith("sqlite:////") else Path(path)


def _in_a_directory(path: Path, what: str, field: str, allowed: str) -> None:
    """InputError naming field when the folder path is to be made in does not exist. No '~' is expanded here: an
    Aim path comes expanded, and SQLite opens sqlite:///~/m.db in a folder named '~' (which MLflow would make)."""
    parent = path.absolute().parent
    if not parent.is_dir():
        raise InputError(field, f"{what}: the directory {str(parent)!r} does not exist", allowed)


def _registered_schemes() -> set[str]:
    """The schemes the installed MLflow and its plugins keep runs in (databricks-uc, uc, a plugin's own): its
    tracking store registry, read only for a scheme MLFLOW_SCHEMES lacks (importing mlflow takes seconds)."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:  # not installed, or a release that moved it: the known schemes alone
        return set()
    return {str(k) for k in getattr(_tracking_store_registry, "_registry", {})}


def require(kind: str, field: str = "--track") -> ModuleType:
    """The tracker's client library; InputError naming the extra that installs it when it is missing."""
    try:
        return importlib.import_module(MODULES[kind])
    except ImportError:
        raise InputError(field, f"{kind} is not installed: pip install 'tunebench[{kind}]'") from None
