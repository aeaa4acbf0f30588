"""Data set files: generation, atomic writes, manifest, verification and locking.

    <data_dir>/<id>.jsonl | <id>.parquet    the data set
    <data_dir>/<id>.manifest.json           sha256, size, entries, generator version, created
    <data_dir>/.<id>.lock                    cross-process lock (filelock)

A file is used only when its manifest matches it (generator version, size and sha256); otherwise
it is regenerated, but only where tunebench wrote it: a data set file beside which no manifest lies
(another tool's, e.g. ado's sfttrainer_generate_dataset_text output in a shared data folder) is never
overwritten nor used: an InputError names it (its bytes may differ from tunebench's recipe, so the
measured tokens would not be tunebench's). Writes go to a temporary file in the same directory, are
fsynced, then renamed over the target (tunebench.paths.atomic_path), so readers never see a partial
file. Two processes asking for the same id serialise on the lock: the second waits, then finds a valid
file and reuses it. A generation first removes the temporary files of killed processes
(tunebench.paths.remove_stale_temporaries).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock

from tunebench import paths
from tunebench.datasets.entries import text_entries
from tunebench.datasets.ids import DatasetId, parse_dataset_id

# Bump when the bytes of any data set change (prose, recipe or layout): old files then fail
# verification and are regenerated, and token caches (keyed by sha256) no longer match.
GENERATOR_VERSION = "2"  # 2: the news template of 127 characters (the SFTTrainer spec's news-chars sizes)
WRITE_CHUNK = 64  # entries per write() call: ~6.5 MB for the 16384plus id

Progress = Callable[[int, int], None]  # (entries done, entries in all)


@dataclass(frozen=True)
class Manifest:
    """What a data set file must be. size_bytes in bytes; created is ISO 8601 UTC."""

    dataset_id: str
    file: str
    format: str
    entries: int
    size_bytes: int
    sha256: str
    generator_version: str
    created: str


def dataset_path(dataset_id: str | DatasetId, data_dir: str | os.PathLike | None = None) -> Path:
    """Where the file of dataset_id lives (it may not exist)."""
    spec = _spec(dataset_id)
    return paths.data_dir(data_dir) / f"{spec.id}{spec.suffix}"


def manifest_path(dataset_id: str | DatasetId, data_dir: str | os.PathLike | None = None) -> Path:
    spec = _spec(dataset_id)
    return paths.data_dir(data_dir) / f"{spec.id}.manifest.json"


def read_manifest(dataset_id: str | DatasetId, data_dir: str | os.PathLike | None = None) -> Manifest | None:
    """The manifest of dataset_id if present, readable and of this generator version, else None."""
    try:
        raw = json.loads(manifest_path(dataset_id, data_dir).read_text())
        m = Manifest(**raw)
    except (OSError, ValueError, TypeError):
        return None
    if m.generator_version != GENERATOR_VERSION or m.dataset_id != _spec(dataset_id).id:
        return None
    return m


def verify(dataset_id: str | DatasetId, data_dir: str | os.PathLike | None = None) -> Manifest | None:
    """The manifest if the file matches it (size, then sha256 of every byte), else None."""
    m = read_manifest(dataset_id, data_dir)
    path = dataset_path(dataset_id, data_dir)
    if m is None:
        return None
    try:
        if path.stat().st_size != m.size_bytes:
            return None
        return m if sha256_file(path) == m.sha256 else None
    except OSError:
        return None


def ensure_dataset(
    dataset_id: str | DatasetId,
    data_dir: str | os.PathLike | None = None,
    progress: Progress | None = None,
) -> Path:
    """Path of a verified file of dataset_id, generating it first if missing, stale or corrupt.

    Raises InputError (field dataset_id) for an id of no known form, or one this machine has not the
    disk or memory to generate (datasets.size), before touching the disk.
    """
    spec = _spec(dataset_id)
    if verify(spec, data_dir) is None:
        generate_dataset(spec, data_dir, progress, keep_valid=True)
    return dataset_path(spec, data_dir)


def generate_dataset(
    dataset_id: str | DatasetId,
    data_dir: str | os.PathLike | None = None,
    progress: Progress | None = None,
    *,
    keep_valid: bool = False,
) -> Manifest:
    """(Re)write the file of dataset_id and its manifest, under the id's lock (InputError as ensure_dataset).

    keep_valid: keep a file that verifies once the lock is held (another process may have written it).
    """
    spec = _spec(dataset_id)
    directory = paths.data_dir(data_dir)
    _check_room(spec, directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths.remove_stale_temporaries(directory)
    with lock(spec, data_dir):
        valid = verify(spec, data_dir) if keep_valid else None
        if valid is None:
            _check_ours(spec, data_dir)
        return valid or _generate(spec, data_dir, progress)


def _check_ours(spec: DatasetId, data_dir: str | os.PathLike | None) -> None:
    """InputError if the data set file exists without a manifest: tunebench did not write it."""
    path = dataset_path(spec, data_dir)
    if path.exists() and not manifest_path(spec, data_dir).exists():
        from tunebench.errors import InputError

        raise InputError(
            "dataset_id",
            f"{path} exists but tunebench did not write it (no {path.stem}.manifest.json "
            "beside it): tunebench never overwrites it; move it away, or use another data directory "
            "(TUNEBENCH_DATA_DIR, --data-dir)",
        )


def _generate(spec: DatasetId, data_dir: str | os.PathLike | None, progress: Progress | None) -> Manifest:
    """Write the file and then the manifest (the caller holds the lock)."""
    path = dataset_path(spec, data_dir)
    with paths.atomic_path(path) as tmp:
        if spec.is_vision:
            from tunebench.datasets.vision import write_parquet

            rows = write_parquet(tmp, spec, progress)
        else:
            rows = _write_jsonl(tmp, spec, progress)
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
    m = Manifest(
        dataset_id=spec.id,
        file=path.name,
        format=spec.suffix.lstrip("."),
        entries=rows,
        size_bytes=size,
        sha256=digest,
        generator_version=GENERATOR_VERSION,
        created=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )
    paths.write_atomic(manifest_path(spec, data_dir), json.dumps(asdict(m), indent=1) + "\n")
    return m


def _check_room(spec: DatasetId, directory: Path) -> None:
    from tunebench.datasets.size import check_room

    check_room(spec, directory)


def lock(dataset_id: str | DatasetId, data_dir: str | os.PathLike | None = None) -> FileLock:
    """The cross-process lock of one data set id (a hidden file beside the data)."""
    return FileLock(str(paths.data_dir(data_dir) / f".{_spec(dataset_id).id}.lock"))


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to path (its directory created) through tunebench.paths.write_atomic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(path, data)


def _write_jsonl(path: Path, spec: DatasetId, progress: Progress | None) -> int:
    rows = 0
    lines: list[str] = []
    with open(path, "wb", buffering=0) as f:
        for text in text_entries(spec):
            lines.append(json.dumps({"output": text}))
            rows += 1
            if len(lines) == WRITE_CHUNK:
                f.write(("\n".join(lines) + "\n").encode())
                lines = []
                if progress:
                    progress(rows, spec.entries)
        if lines:
            f.write(("\n".join(lines) + "\n").encode())
            if progress:
                progress(rows, spec.entries)
    return rows


def _spec(dataset_id: str | DatasetId) -> DatasetId:
    return dataset_id if isinstance(dataset_id, DatasetId) else parse_dataset_id(dataset_id)
