"""Each command-line value is declared once: where the command declares it, with the type that checks it
(tunebench.commands.options); no command keeps a second model of its options to validate them again."""

from __future__ import annotations

import inspect
import typing

import click
import pytest
import typer

import tunebench.commands
from tunebench.commands.main import app
from tunebench.commands.options import Check, OptionError
from tunebench.inputs import Options, Seconds


def commands(group: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    out = []
    for name, command in getattr(group, "commands", {}).items():
        out += (
            commands(command, (*path, name)) if hasattr(command, "commands") else [(" ".join((*path, name)), command)]
        )
    return out


COMMANDS = commands(typer.main.get_command(app))


def test_the_commands_are_all_found():
    names = {name for name, _ in COMMANDS}
    assert {
        "plan",
        "recommend",
        "run",
        "show",
        "export",
        "import",
        "explore",
        "report",
        "calibrate",
        "datasets generate",
        "engines install",
        "launch-plan",
        "deploy-spec",
    } <= names, sorted(names)


def declarations(command: click.Command) -> dict[str, object]:
    """Parameter name -> its annotation, as the command's function declares it (typer reads the same)."""
    signature = inspect.signature(command.callback, eval_str=True)
    return {name: parameter.annotation for name, parameter in signature.parameters.items()}


def is_flag(annotation: object) -> bool:
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation
    return base is bool


@pytest.mark.parametrize("name, command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_value_is_checked_where_it_is_declared(name, command):
    """Every option or argument that takes a value is declared by option()/argument() (its parser carries
    the type that checks it); flags need none."""
    unchecked = []
    for param, annotation in declarations(command).items():
        if is_flag(annotation):
            continue
        infos = [m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, typer.models.ParameterInfo)]
        if not infos or getattr(infos[0].parser, "kind", None) is None:
            unchecked.append(param)
    assert unchecked == [], f"{name}: declare {unchecked} with tunebench.commands.options.option/argument"


def test_the_check_reads_what_typer_reads():
    """The parameters found are the command's own: plan's include its --gpu-* options and --price-per-gpu-hour."""
    plan = dict(COMMANDS)["plan"]
    assert {"price", "gpu_memory", "gpu_catalog", "experiment", "as_json"} <= set(declarations(plan))
    assert {p.name for p in plan.params} >= {"price", "gpu_memory", "experiment"}


def test_no_command_module_keeps_a_second_model_of_its_options():
    import importlib
    import pkgutil

    models = []
    for info in pkgutil.iter_modules(tunebench.commands.__path__):
        module = importlib.import_module(f"tunebench.commands.{info.name}")
        models += [
            f"{info.name}.{n}"
            for n, v in vars(module).items()
            if inspect.isclass(v) and issubclass(v, Options) and v.__module__ == module.__name__
        ]
    assert models == []


def test_a_bad_value_is_refused_with_its_flag_and_the_type_message():
    parse = Check(Seconds, "--timeout")
    assert parse("2.5") == 2.5
    with pytest.raises(OptionError) as caught:
        parse("0")
    assert caught.value.error.field == "--timeout" and "must be > 0" in str(caught.value.error)


def test_a_bad_number_says_what_its_type_allows(capsys):
    """The one-line error names the field and the allowed values: a number's bounds come from its declared type
    (pydantic's "Input should be a valid integer, unable to parse ..." said plainly)."""
    from tunebench.commands.main import main
    from tunebench.inputs import allowed_of
    from tunebench.plan.options import AvgTokens, GpuCount, Probability

    assert allowed_of(GpuCount) == "an integer from 1 to 16,384"
    assert allowed_of(Probability) == "a number from 0 to 1" and allowed_of(AvgTokens).endswith("to 1,000,000,000")
    assert allowed_of(Seconds) == "a number > 0 and <= 31,622,400" and allowed_of(str) is None
    assert allowed_of(typing.Optional[int], []) == "an integer"  # noqa: UP045 - the spelling a model field has

    job = ["recommend", "finetune_lora_benchmark-v1.0.0", "model_name=llama3.2-1b", "model_max_length=512"]
    gpus = "(allowed: an integer from 1 to 16,384)"
    cases = {
        ("--max-gpus", "0"): f"--max-gpus: must be >= 1 (got '0') {gpus}",
        ("--max-gpus", "abc"): f"--max-gpus: not an integer (got 'abc') {gpus}",
        ("--max-gpus", "1_6"): f"--max-gpus: not an integer (got '1_6') {gpus}",  # pydantic read it as 16
        (
            "--max-oom-risk",
            "nan",
        ): "--max-oom-risk: must be a finite number (got 'nan') (allowed: a number from 0 to 1)",
    }
    for (flag, value), line in cases.items():
        assert main([*job, "batch_size=8", "gpu_model=A100-80GB", flag, value]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"error: {line}\n" and captured.out == ""
    assert main([*job, "batch_size=1_6", "gpu_model=A100-80GB"]) == 2  # int() reads 1_6 as 16
    assert capsys.readouterr().err.startswith("error: batch_size: '1_6' is not an integer")


def test_an_option_given_without_its_value_says_what_it_takes(capsys):
    """click raises "requires an argument" without the command's context; the option is found from the command
    line, and its declared type gives the allowed values, as for a bad value."""
    from tunebench.commands.main import main

    cases = {
        ("plan", "finetune_lora_benchmark-v1.0.0", "--avg-tokens"): "--avg-tokens: requires a value (allowed: a "
        "number from 1 to 1,000,000,000)",
        (
            "recommend",
            "llama3.1-8b",
            "--max-gpus",
        ): "--max-gpus: requires a value (allowed: an integer from 1 to 16,384)",
        ("plan", "finetune_lora_benchmark-v1.0.0", "--grid"): "--grid: requires a value",  # a text: no bounds to say
        ("-v", "plan", "finetune_lora_benchmark-v1.0.0", "--max-oom-risk"): "--max-oom-risk: requires a value "
        "(allowed: a number from 0 to 1)",  # past the group's own option
    }
    for argv, line in cases.items():
        assert main(list(argv)) == 2
        captured = capsys.readouterr()
        assert captured.err == f"error: {line}\n" and captured.out == "", argv
