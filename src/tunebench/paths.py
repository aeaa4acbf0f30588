"""Where tunebench keeps its files, and how it writes them.

TUNEBENCH_HOME overrides the root (default: the user's cache directory, via platformdirs);
data sets live in ``<home>/data`` unless TUNEBENCH_DATA_DIR or a CLI option says otherwise.

Every file tunebench writes (an output the user asked for, a data set, a manifest, a cache) goes to a
temporary file in the same directory that is renamed over the target once complete (``atomic_path``):
a failed or interrupted write leaves the target as it was, never half a file or no file.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import platformdirs

TEMP_SUFFIX = ".tmp"


def home() -> Path:
    """Root of tunebench's files."""
    env = env_dir("TUNEBENCH_HOME")
    return env if env else Path(platformdirs.user_cache_dir("tunebench"))


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """Directory of generated data sets, absolute (it is passed to the worker, which may run elsewhere)."""
    if override:
        return Path(override).expanduser().absolute()
    env = env_dir("TUNEBENCH_DATA_DIR")
    return env.absolute() if env else home().absolute() / "data"


def env_dir(name: str) -> Path | None:
    """The directory the environment variable name sets (None when unset); InputError naming the variable
    when it cannot be one (a file is in the way), so that no later write fails with a bare OSError."""
    value = os.environ.get(name)
    if not value:
        return None
    path = Path(value).expanduser()
    _check_dir(name, str(path))
    return path


@functools.lru_cache(maxsize=16)
def _check_dir(name: str, text: str) -> None:
    """Raises (uncached) unless text is a directory or can become one; cached once it can."""
    from tunebench.errors import InputError, one_line

    path = Path(text)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == path else f" ({str(existing)!r} is in the way)"
        raise InputError(name, f"{one_line(text)!r} is not a directory{where}", allowed="a directory, made if missing")


def data_dir_source(override: str | os.PathLike | None = None) -> str:
    """What chose data_dir(override), for messages: the option (--dir), TUNEBENCH_DATA_DIR or TUNEBENCH_HOME."""
    if override:
        return "--dir"
    if os.environ.get("TUNEBENCH_DATA_DIR"):
        return "TUNEBENCH_DATA_DIR"
    return "TUNEBENCH_HOME" if os.environ.get("TUNEBENCH_HOME") else "--dir"


# ---------------------------------------------------------------------------------------- writing files


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside path to write; fsynced and renamed over path when the block ends without
    an error, removed otherwise (path is then as it was).

    The temporary is ``.<name>.<pid>@<host>.<random>.tmp`` (remove_stale_temporaries tells one a killed
    process left behind from one being written). The new file keeps the mode of the file it replaces
    (else the umask's). A path that is not a regular file (/dev/stdout, a FIFO) is written in place; a
    symbolic link keeps pointing where it did, and the file it points at is replaced.
    """
    target = Path(path)
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file():
        yield target
        return
    fd, name = _temporary(target.parent, target)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666 & ~_umask())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write data (text as UTF-8) to path through atomic_path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def output_errors(field: str, path: str | os.PathLike) -> Iterator[None]:
    """An OSError while writing the file of option field becomes an InputError naming the option
    (``--output: no space left on device writing 'out.parquet'``); a broken pipe stays what it is."""
    from tunebench.errors import InputError

    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        # pyarrow's errors carry the errno only in their text: "... Detail: [errno 28] No space left on device"
        found = re.search(r"\[errno (\d+)\]", str(exc))
        code = exc.errno or (int(found.group(1)) if found else None)
        reason = os.strerror(code) if code else exc.strerror or str(exc)
        raise InputError(field, f"{reason[:1].lower()}{reason[1:]} writing {str(path)!r}") from None


def check_writable(path: str | os.PathLike, probe_bytes: int = 1 << 16) -> None:
    """OSError unless probe_bytes can be written and synced beside path (or in the first of its missing
    parent directories' ancestors that exists): checked before minutes of work whose result goes there.
    Leaves nothing behind."""
    target = Path(path)
    directory = target.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    fd, name = _temporary(directory, target)
    try:
        with open(fd, "wb") as f:  # a buffered write retries short writes until one fails
            f.write(bytes(probe_bytes))
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.unlink(name)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of atomic_path in directory that a process of this host left when it was
    killed (its pid no longer runs); returns them. Another host's, a live process's and any other file
    are left alone."""
    removed = []
    with contextlib.suppress(OSError):
        for path in Path(directory).glob(f".*{TEMP_SUFFIX}"):
            owner = _owner(path.name)
            if owner is None or owner[1] != _host() or _alive(owner[0]):
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def _temporary(directory: Path, target: Path) -> tuple[int, str]:
    """mkstemp's (fd, name) of a temporary for target in directory, named after who writes it."""
    return tempfile.mkstemp(dir=directory, prefix=f".{target.name}.{os.getpid()}@{_host()}.", suffix=TEMP_SUFFIX)


def _owner(name: str) -> tuple[int, str] | None:
    """(pid, host) of an atomic_path temporary's name, None for another name."""
    stem, _, _random = name.removesuffix(TEMP_SUFFIX).rpartition(".")
    left, at, host = stem.rpartition("@")
    pid = left.rpartition(".")[2]
    return (int(pid), host) if at and pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError as exc:
        return exc.errno != errno.ESRCH
    return True


def _host() -> str:
    return socket.gethostname().replace("@", "_").replace("/", "_")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
