"""The types that check input values: numbers, durations, ports, hosts and paths checked where they
are parsed, before anything runs.

A command declares each of its values once with one of these types
(``tunebench.commands.options.option(NonNegative, "--price-per-gpu-hour", ...)``): the value is checked
as the command line is parsed. The Python API and actuator options validate keyword arguments with
``parse(Model, name=value, ...)``, a model whose fields use the same types. Either way a bad value is
an ``InputError`` naming the option (``--timeout``, or ``FILE`` for an argument), what is wrong and
what is allowed. The vocabulary: no NaN or infinity anywhere, durations > 0, ports in [1, 65535],
input files that exist and hold text, output files whose directory exists, nothing that reads as a flag.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from tunebench.errors import InputError, has_control_characters, suggest

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Options(BaseModel):
    """Base of the option models: unknown fields are a bug; ``NAMES`` maps fields to how the CLI spells them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    NAMES: ClassVar[dict[str, str]] = {}

    @classmethod
    def display(cls, field: str) -> str:
        return cls.NAMES.get(field, "--" + field.replace("_", "-"))


OptionsT = TypeVar("OptionsT", bound="Options")


def parse(model: type[OptionsT], **values: Any) -> OptionsT:
    """values validated by model; InputError naming the first bad option, with what the field allows."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = input_error(exc, model.display, indices=False)
        loc = exc.errors()[0]["loc"]
        field = model.model_fields.get(str(loc[0])) if loc else None
        if err.allowed is None and field is not None:
            err = InputError(err.field, err.message, allowed_of(field.annotation, field.metadata))
        raise err from None


def _number(x: float) -> str:
    """A bound for people: 16,384 and 1,000,000,000 rather than 1e+09; 0.5 as it is."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def allowed_of(kind: Any, metadata: list[Any] | None = None) -> str | None:
    """What a number type allows, for an error's "allowed": 'an integer >= 1', 'a number from 0 to 1', 'a
    number > 0' from its bounds (an Annotated type's Field, or a model field's metadata); None for other types."""
    import annotated_types as at

    constraints = list(metadata or [])
    if get_origin(kind) in (Union, UnionType):  # Optional[X]: X's (None means "not given", not a value to allow)
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) != 1:
            return None
        kind = args[0]
    if get_origin(kind) is Annotated:
        kind, *extra = get_args(kind)
        for meta in extra:
            constraints += getattr(meta, "metadata", None) or [meta]
    if kind not in (int, float):
        return None
    noun = "an integer" if kind is int else "a number"
    low = high = None
    for c in constraints:
        if isinstance(c, (at.Ge, at.Gt)):
            low = f">= {_number(c.ge)}" if isinstance(c, at.Ge) else f"> {_number(c.gt)}"
        elif isinstance(c, (at.Le, at.Lt)):
            high = f"<= {_number(c.le)}" if isinstance(c, at.Le) else f"< {_number(c.lt)}"
    if low and high and low.startswith(">=") and high.startswith("<="):
        return f"{noun} from {low[3:]} to {high[3:]}"
    return " ".join(x for x in (noun, low, high and ("and " + high if low else high)) if x)


def input_error(
    exc: ValidationError,
    display: Any = str,
    prefix: str = "",
    indices: bool = True,
    root: str = "input",
    model: type[BaseModel] | None = None,
) -> InputError:
    """The first error of a ValidationError as an InputError (field, what is wrong with the value).

    The field is the error's location (``entity_space.x.min``, ``experiments[0].id``) under prefix, its
    first part through display (a CLI spelling); indices=False leaves out list positions (a repeated
    option is named once, --from, not --from[2]); an error of the whole model is named prefix, or root.
    model: the model validated; an unknown key's error then lists the keys its mapping allows (the fields of
    the model, or nested model, at that location) and suggests the likeliest.
    """
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    field = prefix or root
    if loc:
        first = display(loc[0])
        field = (f"{prefix}.{first}" if prefix else first) + "".join(
            (f"[{p}]" if indices else "") if p.isdigit() else f".{p}" for p in loc[1:]
        )
    if err["type"] == "extra_forbidden":
        keys = _keys_at(model, err["loc"][:-1]) if model is not None and err["loc"] else None
        if keys is None:
            return InputError(field, "unknown key")
        return InputError(field, "unknown key." + suggest(loc[-1], keys), allowed=", ".join(keys))
    if err["type"] == "missing":
        return InputError(field, "is required")
    value = err.get("input")
    if err["type"] == "literal_error":
        allowed = err["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
        return InputError(field, f"unknown value {value!r}", allowed=allowed)
    bound = _BOUNDS.get(err["type"])
    if bound is not None:
        (limit,) = err["ctx"].values()
        message = f"must be {bound} {limit:g}" if isinstance(limit, float) else f"must be {bound} {limit}"
    elif err["type"] == "finite_number":
        message = "must be a finite number"
    elif err["type"] in _NOT_A:
        message = _NOT_A[err["type"]]
    else:
        message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if not isinstance(value, (dict, list, Path)) and not (isinstance(value, str) and repr(value) in message):
        message += f" (got {value!r})"
    return InputError(field, message)


def _keys_at(model: type[BaseModel], path: tuple) -> list[str] | None:
    """The keys of the mapping at path (a ValidationError's location, list positions included) under
    model: its fields when a model validates it, else None."""
    for part in path:
        if isinstance(part, int):
            continue  # a list's item: the list's annotation already named its model
        field = model.model_fields.get(str(part))
        inner = _model_of(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return list(model.model_fields)


def _model_of(kind: Any) -> type[BaseModel] | None:
    """The model a field's annotation validates with (X, list[X], X | None, Annotated[X, ...]), else None."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind
    models = [m for m in map(_model_of, get_args(kind)) if m is not None]
    return models[0] if len(models) == 1 else None


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
# pydantic's parse errors of numbers, said plainly ("Input should be a valid integer, unable to parse ...")
_NOT_A = {
    "int_parsing": "not an integer",
    "int_type": "not an integer",
    "int_from_float": "not a whole number",
    "float_parsing": "not a number",
    "float_type": "not a number",
}


# ----------------------------------------------------------------------------------------- numbers

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# at most a year: a longer duration is a typo, and timeouts past ~1e11 s overflow time_t (threading, select)
Seconds = Annotated[float, Field(gt=0, le=366 * 86400, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(ge=1, le=65535)]
Weights = Literal["auto", "pretrained", "random"]
Engine = Literal["native", "fms-hf-tuning"]  # tunebench.engines.ENGINES


# ------------------------------------------------------------------------------------------ strings


def _printable(text: str) -> str:
    if has_control_characters(text):
        raise ValueError("contains control characters")
    return text


def _not_flag_like(text: str) -> str:
    _printable(text)
    if text.startswith("-"):
        raise ValueError(f"{text!r} starts with '-' and would read as an option")
    return text


def _host(text: str) -> str:
    _not_flag_like(text)
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if not _HOSTNAME.match(text):
        raise ValueError(f"{text!r} is neither an IP address nor a host name")
    return text


def _env_name(text: str) -> str:
    if not _ENV_NAME.match(text):
        raise ValueError(f"{text!r} is not an environment variable name (letters, digits, _)")
    return text


def _utf8(text: str) -> str:
    """Text a store, a tracker or JSON can hold: bytes of another encoding (in an argument or a YAML escape)
    arrive as lone surrogates, which SQLite, PostgreSQL and UTF-8 writers refuse."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not UTF-8 text (bytes of another encoding)") from None
    return text


Printable = Annotated[str, AfterValidator(_printable), AfterValidator(_utf8)]
Text = Annotated[str, AfterValidator(_not_flag_like)]
Host = Annotated[str, AfterValidator(_host)]
EnvName = Annotated[str, AfterValidator(_env_name)]


# -------------------------------------------------------------------------------------------- paths


def _existing_file(path: Path) -> Path:
    path = path.expanduser()
    if not path.exists():
        raise ValueError(f"no such file: {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{str(path)!r} is not readable")
    return path


# The largest text input (space, CSV, JSON/JSONL, YAML) read whole: parsing holds ~5 copies of the text
# (bytes, str, the parser's buffer and its rows), so 64 MiB stays under ~500 MB; a measurement CSV of
# that size holds ~200,000 rows (split bigger ones).
MAX_TEXT_BYTES = 64 * 2**20


def text_of(path: Path) -> str:
    """The UTF-8 text of a file; ValueError saying why there is none (missing, a directory, binary, larger
    than MAX_TEXT_BYTES)."""
    try:
        size = path.stat().st_size
        if size > MAX_TEXT_BYTES and path.is_file():
            raise ValueError(f"{str(path)!r} is {size / 2**20:,.0f} MiB; at most {MAX_TEXT_BYTES // 2**20} MiB is read")
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"no such file: {str(path)!r}") from None
    except IsADirectoryError:
        raise ValueError(f"{str(path)!r} is a directory, not a file") from None
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r} is not UTF-8 text (a binary file?)") from None
    if "\x00" in text:
        raise ValueError(f"{str(path)!r} holds NUL bytes (a binary file?)")
    return text


def read_text(path: str | os.PathLike, field: str) -> str:
    """text_of(path), with InputError naming field instead of ValueError."""
    try:
        return text_of(Path(path))
    except ValueError as exc:
        raise InputError(field, str(exc)) from None


def _text_file(path: Path) -> Path:
    """An existing file of UTF-8 text (no NUL bytes): what YAML, CSV, JSON and JSONL inputs must be."""
    text_of(_existing_file(path))
    return path


def _writable_dir(directory: Path, of: Path | None = None) -> None:
    where = f" (for {str(of)!r})" if of is not None else ""
    if not directory.exists():
        raise ValueError(f"the directory {str(directory)!r}{where} does not exist")
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r}{where} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"the directory {str(directory)!r}{where} is not writable")


def _output_file(path: Path) -> Path:
    """A file to write: not a directory, in an existing writable directory (overwritten if present)."""
    path = path.expanduser()
    _not_flag_like(str(path))
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{str(path)!r} is not writable")
    _writable_dir(path.absolute().parent, path)
    return path


def _path_given(value: Any) -> Any:
    """A path as typed, before it is a Path: an empty one would be the current directory without a word."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("an empty path (the current directory is '.')")
    return value


def _file_path_given(value: Any) -> Any:
    """A file path as typed: one ending in '/' names a directory, which Path drops (fx/new/ would be written as
    a file named new)."""
    _path_given(value)
    if isinstance(value, str) and value.endswith(("/", os.sep)):
        raise ValueError(f"{value!r} ends with '/', a directory; give a file name")
    return value


def _output_dir(path: Path) -> Path:
    """A directory to write into: an existing writable one, or a new one in an existing directory."""
    path = path.expanduser()
    _not_flag_like(str(path))
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{str(path)!r} is a file, not a directory")
        _writable_dir(path)
        return path
    _writable_dir(path.absolute().parent, path)
    return path


InputFile = Annotated[Path, AfterValidator(_existing_file)]
TextFile = Annotated[Path, AfterValidator(_text_file)]
OutputFile = Annotated[Path, BeforeValidator(_file_path_given), AfterValidator(_output_file)]
OutputDir = Annotated[Path, BeforeValidator(_path_given), AfterValidator(_output_dir)]
