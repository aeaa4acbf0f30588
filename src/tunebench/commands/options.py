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
from pathlib import Path
from typing import Annotated, Any

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


class Check:
    """The parser of one command-line value: kind's validation (its pydantic adapter built on first use, so
    `tunebench --help` builds none), OptionError naming name on a bad value."""

    def __init__(self, kind: Any, name: str):
        self.kind, self.name = kind, name

    @functools.cached_property
    def adapter(self) -> Any:
        from pydantic import TypeAdapter

        return TypeAdapter(self.kind)

    def __call__(self, value: Any) -> Any:
        from pydantic import ValidationError

        from tunebench.inputs import allowed_of, input_error

        if value is None:
            return None
        allowed = allowed_of(self.kind)
        if allowed and isinstance(value, str) and "_" in value:  # pydantic, as int(), reads 1_6 as 16: a typo
            noun = "an integer" if allowed.startswith("an integer") else "a number"
            raise OptionError(InputError(self.name, f"not {noun} (got {value!r})", allowed))
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            err = input_error(exc, root=self.name)
            if err.allowed is None:  # a number's bounds, from its type (an integer >= 1, a number from 0 to 1)
                err = InputError(err.field, err.message, allowed)
            raise OptionError(err) from None


def metavar(kind: Any) -> str:
    """How help shows the value: the choices of a Literal, else NUMBER, INTEGER, PATH or TEXT."""
    base = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
    if typing.get_origin(base) is typing.Literal:
        return "[" + "|".join(str(v) for v in typing.get_args(base)) + "]"
    return {float: "NUMBER", int: "INTEGER", Path: "PATH"}.get(base, "TEXT")


def option(kind: Any, *flags: str, help: str, **kwargs: Any) -> Any:
    """A typer option whose value kind checks (see the module docstring)."""
    kwargs.setdefault("metavar", metavar(kind))
    return typer.Option(*flags, help=help, parser=Check(kind, flags[0]), **kwargs)


def argument(kind: Any, name: str, *, help: str, **kwargs: Any) -> Any:
    """A typer argument (named name in errors and help) whose value kind checks."""
    return typer.Argument(help=help, metavar=name, parser=Check(kind, name), **kwargs)


# What every command about an entity takes: the experiment, its parameters and the entity's properties
# (parsed and checked by tunebench.spec.experiments.parse_assignments / get_experiment / make_entity).
ExperimentArg = Annotated[str, argument(str, "EXPERIMENT", help="Experiment id.")]
Params = Annotated[
    list[str] | None,
    option(str, "--param", "-p", help="Parameterise the experiment: KEY=VALUE (repeatable).", metavar="KEY=VALUE"),
]
Props = Annotated[
    list[str] | None, argument(str, "KEY=VALUE...", help="Entity properties as KEY=VALUE.", show_default=False)
]
