"""Command-line usage errors (unknown option or command, missing or malformed value) as InputError.

Typer parses the command line with click (typer >= 0.29: its own bundled copy, whose exceptions are
not click's). Whichever copy raised, a usage error becomes an ``InputError`` naming the option,
argument or command and what is allowed, so ``tunebench.commands.main.main`` ends every bad input the same
way: one line on stderr, exit code 2. The exceptions are recognised by their class names, which
both copies share, so this works with either.
"""

from __future__ import annotations

import typing
from typing import Any

from tunebench.errors import InputError, one_of, suggest

USAGE_ERRORS = frozenset(
    {"UsageError", "BadParameter", "MissingParameter", "NoSuchOption", "BadOptionUsage", "BadArgumentUsage"}
)


def is_usage_error(exc: BaseException) -> bool:
    """Whether exc is one of click's (or typer's bundled click's) usage errors."""
    return any(cls.__name__ in USAGE_ERRORS for cls in type(exc).__mro__)


def is_help_request(exc: BaseException) -> bool:
    """A group or command run without arguments where it shows its help instead (no_args_is_help)."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def to_input_error(exc: Any, root: Any = None, argv: list[str] | None = None) -> InputError:
    """The InputError of a usage error: field, what is wrong, what is allowed. root and argv (the click command
    of the app and the command line) find the command an error raised without its context belongs to."""
    kind = type(exc).__name__
    ctx = getattr(exc, "ctx", None)
    message = _message(exc)
    if kind == "NoSuchOption":
        options = _options(ctx)
        name = exc.option_name
        return InputError(name, "unknown option." + suggest(name, options), allowed=one_of(options, limit=30) or None)
    if kind == "BadOptionUsage":  # e.g. "requires an argument": the option's own type says what it takes
        param = _option_param(ctx.command if ctx is not None else _command_of(root, argv), exc.option_name)
        if message == f"Option '{exc.option_name}' requires an argument":  # the field already names the option
            message = "requires a value"
        return InputError(exc.option_name, message, allowed=None if param is None else _describe_type(param))
    param = getattr(exc, "param", None)
    if param is not None:
        field = _param_name(param)
        if kind == "MissingParameter":
            return InputError(field, "is required", allowed=_describe_type(param))
        return InputError(field, message, allowed=_describe_type(param))
    if kind == "MissingParameter":  # a missing value without a param object
        return InputError(_hint(exc) or "argument", "is required")
    if message.startswith("No such command"):
        name = message.split("'")[1] if message.count("'") >= 2 else message
        commands = _commands(ctx)
        return InputError(
            "command", f"unknown command {name!r}." + suggest(name, commands), allowed=one_of(commands, 40)
        )
    if message.startswith("Missing command"):
        return InputError("command", "missing", allowed=one_of(_commands(ctx), 40))
    if kind == "BadArgumentUsage" or "unexpected extra argument" in message:
        return InputError("arguments", message)
    return InputError(_hint(exc) or (ctx.command_path if ctx is not None else "command line"), message)


def _message(exc: Any) -> str:
    text = str(getattr(exc, "message", "") or exc)
    return text.rstrip(".") if text.count(".") == 1 and text.endswith(".") else text


def _param_name(param: Any) -> str:
    """--long-option for an option, the metavar (EXPERIMENT) for an argument."""
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")] or list(getattr(param, "opts", []))
    if getattr(param, "param_type_name", "") == "option" and opts:
        return opts[0]
    name = getattr(param, "metavar", None) or getattr(param, "name", None) or "argument"
    return str(name).upper()


def _command_of(root: Any, argv: list[str] | None) -> Any:
    """The (sub)command argv runs: root's subcommands followed word by word, past the group's own options
    (``tunebench -v plan ...``), up to the first command that has none; None without root."""
    command = root
    for word in argv or []:
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            break
        command = subcommands.get(word, command)
    return command


def _option_param(command: Any, name: str) -> Any:
    """The option of command that name spells, or None."""
    for param in getattr(command, "params", None) or []:
        if name in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())):
            return param
    return None


def _describe_type(param: Any) -> str | None:
    """What the parameter takes, from its click type (choices, ranges) or its parser (commands.options.Check's
    declared type), when that says more than its name."""
    # typer keeps an option's parser= (a commands.options.Check) in its type descriptor
    info = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
    declared = getattr(getattr(info, "parser", None), "kind", None)
    if declared is not None:
        from tunebench.inputs import allowed_of

        literal = typing.get_args(declared) if typing.get_origin(declared) is typing.Literal else ()
        return one_of(literal) if literal else allowed_of(declared)
    kind = getattr(param, "type", None)
    if kind is None:
        return None
    choices = getattr(kind, "choices", None)
    if choices:
        return one_of(choices)
    describe = getattr(kind, "_describe_range", None)
    name = getattr(kind, "name", "")
    if callable(describe):
        return f"{name} {describe()}"
    return name if name in ("integer", "float", "boolean") else None


def _hint(exc: Any) -> str | None:
    hint = getattr(exc, "param_hint", None)
    if isinstance(hint, (list, tuple)):
        return " / ".join(hint)
    return hint


def _options(ctx: Any) -> list[str]:
    if ctx is None:
        return []
    names: list[str] = []
    for param in ctx.command.get_params(ctx):
        names += [o for o in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())) if o.startswith("-")]
    return names


def _commands(ctx: Any) -> list[str]:
    if ctx is None or not hasattr(ctx.command, "list_commands"):
        return []
    return list(ctx.command.list_commands(ctx))


def once_only(command: Any) -> None:
    """Refuse an option of command (and of its subcommands) given more than once unless it is declared
    repeatable (click's ``multiple``, a list in typer, or a ``count``): click keeps the last value, so
    ``--gpu-model L40S --gpu-model H100`` would plan for the H100 without a word. Every spelling counts
    (``--opt v``, ``--opt=v``, a short alias, a flag's ``--no-`` form); a command line that asks for
    --help gets its help. Raises InputError ``--opt: given twice (allowed: once)``."""
    make_parser = command.make_parser

    def make_checking_parser(ctx: Any) -> Any:
        parser = make_parser(ctx)
        parse_args = parser.parse_args

        def parse_checked(args: list[str]) -> Any:
            opts, rest, order = parse_args(args=args)
            if not getattr(ctx, "resilient_parsing", False):  # shell completion parses whatever is typed
                _refuse_repeats(command, ctx, order)
            return opts, rest, order

        parser.parse_args = parse_checked
        return parser

    command.make_parser = make_checking_parser
    for sub in getattr(command, "commands", {}).values():
        once_only(sub)


def _refuse_repeats(command: Any, ctx: Any, order: list[Any]) -> None:
    """InputError for the first option in order (the parameters as the command line gave them, one entry
    per occurrence) that is given twice but may be given once only."""
    help_option = command.get_help_option(ctx)
    if help_option is not None and any(getattr(p, "name", None) == help_option.name for p in order):
        return  # --help shows the help, whatever else is on the line
    seen: dict[int, int] = {}
    for param in order:
        if getattr(param, "param_type_name", "") != "option" or _repeatable(param):
            continue
        seen[id(param)] = seen.get(id(param), 0) + 1
        if seen[id(param)] == 2:
            count = sum(p is param for p in order)
            given = "twice" if count == 2 else f"{count} times"
            both = getattr(param, "secondary_opts", None)  # a --x/--no-x flag: either spelling is the option
            why = f"given {given}" + (f" ({' and '.join([*param.opts, *both])} are one option)" if both else "")
            raise InputError(_param_name(param), why, allowed="once")


def _repeatable(param: Any) -> bool:
    return bool(getattr(param, "multiple", False) or getattr(param, "count", False))
