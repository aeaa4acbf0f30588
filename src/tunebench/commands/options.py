"""Each command-line value declared once: its flags, its help and the type that checks it.

    price: Annotated[float | None, option(NonNegative, "--price-per-gpu-hour", help="...")] = None

``option`` (and ``argument``) is a ``typer.Option`` whose value typer hands to a parser built from
the type (a tunebench.inputs type, a Literal, any pydantic type): the value is checked while the
command line is parsed, before the command runs, and a bad one raises ``OptionError``, which
tunebench's ``main`` prints as the one-line error naming the flag (field, what is wrong, what is
allowed; exit code 2). Flags (booleans) need no check. ``tests/commands/test_options.py`` walks every
command and fails on a value that is not declared this way.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from tunebench.errors import InputError


class OptionError(Exception):
    """A bad command-line value. Not a ValueError: the pydantic validation inside typer passes it on
    untouched, so the message stays tunebench's own (``error`` is the InputError)."""

    def __init__(self, error: InputError):
        super().__init__(str(error))
        self.error = error

    @property
    def field(self) -> str:
        return self.error.field


def checked(kind: Any, name: str) -> Callable[[Any], Any]:
    """A parser of one command-line value: kind's validation, OptionError naming name on a bad value."""

    @functools.cache
    def adapter() -> Any:  # built on first use: `tunebench --help` builds none
        from pydantic import TypeAdapter

        return TypeAdapter(kind)

    def parse(value: Any) -> Any:
        from pydantic import ValidationError

        from tunebench.inputs import input_error

        if value is None:
            return None
        try:
            return adapter().validate_python(value)
        except ValidationError as exc:
            raise OptionError(input_error(exc, root=name)) from None

    parse.kind = kind  # type: ignore[attr-defined]  # what tests/commands/test_options.py reads back
    return parse


def metavar(kind: Any) -> str:
    """How help shows the value: the choices of a Literal, else NUMBER, INTEGER, PATH or TEXT."""
    base = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
    if typing.get_origin(base) is typing.Literal:
        return "[" + "|".join(str(v) for v in typing.get_args(base)) + "]"
    return {float: "NUMBER", int: "INTEGER", Path: "PATH"}.get(base, "TEXT")


def option(kind: Any, *flags: str, help: str, **kwargs: Any) -> Any:
    """A typer option whose value kind checks (see the module docstring)."""
    kwargs.setdefault("metavar", metavar(kind))
    return typer.Option(*flags, help=help, parser=checked(kind, flags[0]), **kwargs)


def argument(kind: Any, name: str, *, help: str, **kwargs: Any) -> Any:
    """A typer argument (named name in errors and help) whose value kind checks."""
    return typer.Argument(help=help, metavar=name, parser=checked(kind, name), **kwargs)
