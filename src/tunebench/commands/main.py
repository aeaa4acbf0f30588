"""tunebench's command line: small focused commands over experiments, catalogs and plans.

Every command that takes an entity reads properties as KEY=VALUE with the spec's names. Input errors
print one line naming the field and the allowed values and exit with code 2 (see ``main``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from pydantic import Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from tunebench import __version__
from tunebench.catalog import list_gpus, list_models
from tunebench.commands.datasets import app as datasets_app
from tunebench.commands.engines import app as engines_app
from tunebench.commands.explore import register as register_explore
from tunebench.commands.options import ExperimentArg, OptionError, Params, Props, option
from tunebench.commands.plan import register as register_plan
from tunebench.commands.report import register as register_report
from tunebench.commands.store import record_run, run_store
from tunebench.commands.store import register as register_store
from tunebench.commands.terminal import Column, fit, print_table
from tunebench.commands.track import TrackOpt, open_for_run, track_run
from tunebench.commands.track import register as register_track
from tunebench.commands.usage import is_help_request, is_usage_error, once_only, to_input_error
from tunebench.engines import NATIVE
from tunebench.errors import InputError, one_line
from tunebench.inputs import Engine, Host, OutputDir, Port, Positive, Seconds, Text, Weights
from tunebench.limits import MAX_CPU_PROCESSES
from tunebench.secrets import mask_secrets
from tunebench.spec.experiments import (
    Experiment,
    effective_values,
    get_experiment,
    list_experiments,
    make_entity,
    parse_assignments,
)
from tunebench.spec.measured import shown_columns
from tunebench.spec.properties import PROPERTIES, REQUIRED, render_value


def bare_flags(command: Any) -> None:
    """Show each boolean flag of command and of its subcommands as the flag alone (``--wide``,
    ``--lomo/--no-lomo``): typer's help prints a ``<bool>`` value type beside flags, which take no value.
    An empty metavar is what its help prints in the place of the type; --help itself is made on demand."""
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    make_help_option = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = make_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        bare_flags(sub)


def joined_paragraphs(command: Any) -> None:
    """Make each paragraph of command's help (and its subcommands') one line, which help then wraps to
    the terminal: typer keeps the line breaks of a docstring's later paragraphs, which on a narrow
    terminal left a short line at every source line end."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        joined_paragraphs(sub)


class FlagGroup(TyperGroup):
    """tunebench's command group: typer builds it with every command and subgroup, then bare_flags,
    joined_paragraphs and once_only (an option given twice is an error, tunebench.commands.usage) run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bare_flags(self)
        joined_paragraphs(self)
        once_only(self)


app = typer.Typer(
    cls=FlagGroup,
    help="Plan, measure and explore fine-tuning jobs: memory, OOM, GPU count, throughput, cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(soft_wrap=True)  # long ids stay on one line (copy-pasteable)

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Wide = Annotated[bool, typer.Option("--wide", help="Every column in full, however wide the lines get.")]
EngineOpt = Annotated[
    str,
    option(
        Engine,
        "--engine",
        help="native (tunebench's worker) | fms-hf-tuning (at the entity's fms_hf_tuning_version).",
        metavar="ENGINE",
    ),
]
# the number of DDP processes of a CPU entity: each is a whole training process (tunebench.limits)
CpuProcesses = Annotated[int, Field(ge=1, le=MAX_CPU_PROCESSES)]


# What each listing shows, most important first (priority 0 always; the highest is left out first on a
# narrow terminal): the name, then what sizes a job, then the rest.
MODEL_COLUMNS = (
    Column("name", breaks=True, min_width=20), Column("params", justify="right"),
    Column("layers", 1, justify="right"), Column("hidden", 2, justify="right"), Column("heads/kv", 2),
    Column("vocab", 3, justify="right"), Column("max context", 1, justify="right"),
    Column("FSDP wrap", 4, shrink=True), Column("confidence", 3),
)  # fmt: skip
GPU_COLUMNS = (
    Column("gpu_model", breaks=True, min_width=16), Column("memory GiB", justify="right"),
    Column("bf16 TFLOP/s", justify="right"), Column("fp32 TFLOP/s", 3, justify="right"),
    Column("HBM GB/s", 2, justify="right"), Column("TDP W", 3, justify="right"),
    Column("interconnect", 4, wrap=True, min_width=16), Column("aliases", 5, wrap=True, min_width=16),
)  # fmt: skip
EXPERIMENT_COLUMNS = (Column("experiment"), Column("method", 1), Column("description", wrap=True, min_width=20))
PROPERTY_COLUMNS = (
    Column("property", breaks=True, min_width=18), Column("default", 1, breaks=True, min_width=10),
    Column("domain", 2, wrap=True),
    Column("description", wrap=True, min_width=20),
)  # fmt: skip
HARDCODED_COLUMNS = (Column("parameter", breaks=True, min_width=18), Column("value", wrap=True, min_width=20))


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _human_count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def resolve(experiment_id: str, params: list[str] | None, props: list[str] | None) -> tuple[Experiment, Any]:
    """Parse EXPERIMENT, --param and KEY=VALUE arguments into (experiment, entity)."""
    experiment = get_experiment(experiment_id, parse_assignments(params or [], "--param"))
    entity = make_entity(experiment, parse_assignments(props or []))
    return experiment, entity


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tunebench {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print tunebench's version and exit."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="More log lines on stderr (every progress step).")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr: no progress lines.")
    ] = False,
) -> None:
    """Options before any command: --version, -v/--verbose, -q/--quiet, --help."""
    from tunebench import logs

    logs.configure(1 if verbose else -1 if quiet else 0)


@app.command()
def version() -> None:
    """Print tunebench's version."""
    typer.echo(__version__)


@app.command()
def models(as_json: Json = False, wide: Wide = False) -> None:
    """List the model catalog."""
    specs = list_models()
    if as_json:
        _print_json(
            [
                {
                    k: getattr(m, k)
                    for k in (
                        "name",
                        "hf_id",
                        "model_type",
                        "total_params",
                        "num_hidden_layers",
                        "hidden_size",
                        "num_attention_heads",
                        "num_key_value_heads",
                        "vocab_size",
                        "max_position_embeddings",
                        "num_local_experts",
                        "decoder_layer_class",
                        "confidence",
                    )
                }
                for m in specs
            ]
        )
        return
    rows = [
        (
            m.name,
            _human_count(m.total_params) + (f" ({m.num_local_experts} experts)" if m.num_local_experts else ""),
            str(m.num_hidden_layers or "?"),
            str(m.hidden_size or "?"),
            f"{m.num_attention_heads or '?'}/{m.num_key_value_heads or '?'}",
            str(m.vocab_size or "?"),
            str(m.max_position_embeddings or "?"),
            m.wrap_classes or "?",
            m.confidence,
        )
        for m in specs
    ]
    print_table(
        console,
        MODEL_COLUMNS,
        rows,
        title=f"tunebench models ({len(specs)})",
        wide=wide,
        more="--wide or --json shows them",
    )


@app.command()
def gpus(as_json: Json = False, wide: Wide = False) -> None:
    """List the GPU catalog (keyed by the Kubernetes gpu.product label)."""
    specs = list_gpus()
    if as_json:
        _print_json([{k: v for k, v in vars(g).items()} for g in specs])
        return
    rows = [
        (
            g.name,
            f"{g.memory_gib:g}",
            str(g.bf16_tflops if g.bf16_tflops is not None else f"fp16 {g.fp16_tflops}"),
            f"{g.fp32_tflops:g}",
            f"{g.memory_bandwidth_gbps:g}",
            f"{g.tdp_watts:g}",
            g.interconnect,
            ", ".join(g.aliases[:4]),
        )
        for g in specs
    ]
    print_table(
        console,
        GPU_COLUMNS,
        rows,
        title=f"tunebench gpus ({len(specs)})",
        wide=wide,
        more="--wide or --json shows them",
    )


@app.command()
def experiments(as_json: Json = False) -> None:
    """List the experiments."""
    exps = list_experiments()
    if as_json:
        _print_json([{"id": e.id, "method": e.method, "description": e.description} for e in exps])
        return
    rows = [(e.id, e.method, e.description) for e in exps]
    print_table(console, EXPERIMENT_COLUMNS, rows, title="tunebench experiments", more="--json shows them")


def describe_dict(experiment: Experiment) -> dict[str, Any]:
    """Everything `describe` prints, as data."""

    def prop(name: str, default: Any = REQUIRED) -> dict[str, Any]:
        p = PROPERTIES[name]
        allowed = experiment.restricted.get(name)
        out = {"name": name, "domain": ", ".join(map(str, allowed)) if allowed else p.domain()}
        if default is not REQUIRED:
            out["default"] = list(default) if isinstance(default, tuple) else default
        out["description"] = p.description
        return out

    return {
        "id": experiment.id,
        "method": experiment.method,
        "description": experiment.description,
        "required": [prop(n) for n in experiment.required],
        "optional": [prop(n, experiment.default(n)) for n in experiment.optional],
        "hardcoded": {k: list(v) if isinstance(v, tuple) else v for k, v in experiment.hardcoded.items()},
        "measured": list(experiment.measured),
    }


@app.command()
def describe(
    experiment: ExperimentArg,
    params: Params = None,
    as_json: Json = False,
) -> None:
    """Required and optional properties (defaults, domains), hardcoded values, measured properties."""
    exp = get_experiment(experiment, parse_assignments(params or [], "--param"))
    info = describe_dict(exp)
    if as_json:
        _print_json(info)
        return
    # descriptions and domains are plain text: "[fast_loss, ...]" must print, not read as rich markup
    console.print(
        f"[bold]{escape(info['id'])}[/bold] ({info['method']})\n{escape(info['description'])}\n", soft_wrap=False
    )  # wrapped at spaces on a narrow terminal
    rows = [(p["name"], "required", p["domain"], p["description"]) for p in info["required"]]
    rows += [
        (p["name"], render_value(p["default"]) if p["default"] is not None else "None", p["domain"], p["description"])
        for p in info["optional"]
    ]
    columns = PROPERTY_COLUMNS
    if 2 not in fit(columns, rows, console.width)[0]:  # too narrow for a domain column: under the description
        columns = tuple(c for c in columns if c.header != "domain")
        rows = [(name, default, f"{description}\nallowed: {domain}") for name, default, domain, description in rows]
    print_table(console, columns, rows, title="entity properties", more="--json shows them")
    hard = [(k, repr(v) if isinstance(v, str) else json.dumps(v)) for k, v in info["hardcoded"].items()]
    print_table(console, HARDCODED_COLUMNS, hard, title="hardcoded")
    console.print("measured: " + ", ".join(info["measured"]), soft_wrap=False, highlight=False)


@app.command()
def validate(
    experiment: ExperimentArg,
    props: Props = None,
    params: Params = None,
    as_json: Json = False,
) -> None:
    """Check an entity against the validity rules: prints is_valid and the reasons."""
    from tunebench.spec.validity import check

    exp, entity = resolve(experiment, params, props)
    result = check(exp, entity)
    if as_json:
        _print_json(result.to_dict())
        return
    mark = "[green]valid[/green]" if result.is_valid else "[red]invalid[/red]"
    console.print(f"{escape(entity.id)}: {mark}")
    for reason in result.reasons:
        console.print(f"  - {escape(reason)}")
    for note in result.notes:
        console.print(f"  [yellow]note:[/yellow] {escape(note)}")


@app.command("launch-plan")
def launch_plan(
    experiment: ExperimentArg,
    props: Props = None,
    params: Params = None,
    data_dir: Annotated[
        str | None,
        option(
            Text,
            "--data-dir",
            help="Data-set directory (default: TUNEBENCH_DATA_DIR; printed only: it need not exist here).",
        ),
    ] = None,
    weights: Annotated[str, option(Weights, "--weights", help="auto | pretrained | random", metavar="MODE")] = "auto",
    main_process_ip: Annotated[
        str | None, option(Host, "--main-process-ip", help="Rendezvous host of multi-node runs.")
    ] = None,
    port: Annotated[int, option(Port, "--port", help="Rendezvous port.")] = 29500,
    nccl_env: Annotated[
        list[str] | None,
        option(str, "--nccl-env", help="NAME=VALUE: an NCCL variable of GPU runs (RoCE: NCCL_IB_HCA, ...)."),
    ] = None,
    engine: EngineOpt = NATIVE,
    as_json: Json = False,
) -> None:
    """Dry run: the accelerate config, command line and environment a measurement would execute."""
    from tunebench.actuators.launch import build_launch_plan
    from tunebench.actuators.network import check_nccl_env

    exp, entity = resolve(experiment, params, props)
    plan = build_launch_plan(
        exp,
        entity,
        data_directory=data_dir,
        weights=weights,
        main_process_ip=main_process_ip,
        main_process_port=port,
        nccl_env=check_nccl_env(_pairs(nccl_env or [], "--nccl-env"), "--nccl-env"),
        engine=engine,
    )
    if as_json:
        _print_json(plan.to_dict())
        return
    console.print(f"[bold]{plan.experiment_id}[/bold]\n{plan.entity_id}")
    console.print(
        f"mode {plan.mode}, {plan.number_nodes} node(s) x {plan.processes_per_node} process(es), "
        f"per-device batch {plan.per_device_train_batch_size}\n"
    )
    for node in plan.nodes:
        console.rule(f"node {node.machine_rank}")
        if node.accelerate_config is not None:
            console.print("[bold]accelerate_config.yaml[/bold]")
            typer.echo(node.accelerate_config_yaml())
        console.print("[bold]environment[/bold] " + " ".join(f"{k}={v!r}" for k, v in node.env.items()))
        console.print("[bold]command[/bold]")
        typer.echo(node.command_line)


def _pairs(items: list[str], field: str) -> dict[str, str]:
    """NAME=VALUE items as a dict (InputError naming the field for an item without '=')."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(field, f"{item!r} is not NAME=VALUE", allowed="NAME=VALUE, e.g. NCCL_IB_GID_INDEX=3")
        out[name] = value
    return out


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def print_result(result: Any, number_gpus: int | None = None) -> None:
    """A Result as a readable table (properties, then why it is invalid or failed); a run on the CPU
    (number_gpus 0) without the GPUs' properties (spec.measured.shown_columns)."""
    colour = {"valid": "green", "invalid": "yellow", "failed": "red"}[result.status]
    console.print(f"[bold]{result.experiment_id}[/bold]\n{result.entity_id}: [{colour}]{result.status}[/{colour}]")
    for reason in result.reasons:
        console.print(f"  - {reason}")
    for note in result.metadata.get("notes") or []:
        console.print(f"  note: {note}", highlight=False, markup=False)
    if result.error:
        console.print(f"[red]error[/red] {result.error}")
        if result.log_tail:
            console.print("[dim]" + result.log_tail.replace("[", "\\[") + "[/dim]")
    if result.properties:
        table = Table(show_header=True)
        table.add_column("property")
        table.add_column("value", justify="right")
        for name in shown_columns(list(result.properties), [number_gpus] if number_gpus is not None else []):
            value = result.properties[name]
            table.add_row(name, f"{value:,.4g}" if isinstance(value, float) else str(value))
        console.print(table)


def _measure_with_progress(exp: Experiment, entity: Any, options: dict[str, Any], engine: str = NATIVE) -> Any:
    """measure() showing its phase and the worker's step x/N, tokens/s, loss, elapsed and ETA on stderr
    (tunebench.commands.runprogress: a live line in a terminal, log lines elsewhere)."""
    from tunebench.actuators.measure import measure
    from tunebench.commands.runprogress import RunProgress

    with RunProgress("measuring") as shown:
        return measure(exp, entity, options, engine=engine, progress=shown.phase, on_step=shown.step)


@app.command()
def run(
    experiment: ExperimentArg,
    props: Props = None,
    params: Params = None,
    weights: Annotated[
        str, option(Weights, "--weights", help="auto | pretrained | random (random: no download).", metavar="MODE")
    ] = "auto",
    data_dir: Annotated[Path | None, option(OutputDir, "--data-dir", help="Data-set directory.")] = None,
    output_dir: Annotated[
        Path | None, option(OutputDir, "--output-dir", help="Where the run's logs and result files go.")
    ] = None,
    timeout: Annotated[float, option(Seconds, "--timeout", help="Wall-clock limit of the run in seconds.")] = 3600.0,
    cpu_processes: Annotated[
        int, option(CpuProcesses, "--cpu-processes", help="DDP processes for a CPU entity (gloo).")
    ] = 1,
    host_memory_limit_gib: Annotated[
        float | None,
        option(Positive, "--host-memory-limit-gib", help="CPU runs: exceeding this host memory is out of memory."),
    ] = None,
    store: Annotated[
        str | None, option(Text, "--store", help="Store URL or SQLite file the result is kept in.")
    ] = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not keep the result in the store.")] = False,
    engine: EngineOpt = NATIVE,
    track: TrackOpt = None,
    as_json: Json = False,
) -> int:
    """Measure an entity for real: train and report every measured property of the experiment (kept in the store)."""
    from tunebench.actuators.launch import check_cpu_processes

    exp, entity = resolve(experiment, params, props)
    check_cpu_processes(effective_values(exp, entity), cpu_processes, "--cpu-processes")
    options = {
        "weights": weights,
        "data_dir": _text(data_dir),
        "output_dir": _text(output_dir),
        "timeout_seconds": timeout,
        "cpu_processes": cpu_processes,
        "host_memory_limit_gib": host_memory_limit_gib,
    }
    target = run_store(store, no_store)
    trackers = open_for_run(track, target)  # a missing extra, a tracker out of reach: an error before training
    result = _measure_with_progress(exp, entity, options, engine)
    if target:
        record_run(target, exp, entity, result)
    if trackers:
        track_run(trackers, target, exp, entity, result.actuator)
    if as_json:
        typer.echo(result.to_json())
    else:
        print_result(result, effective_values(exp, entity).get("number_gpus"))
    return 1 if result.status == "failed" else 0


@app.command()
def demo(
    folder: Annotated[Path, option(OutputDir, "--dir", help="Where the demo's store, run files and report go.")] = Path(
        "demo"
    ),
) -> int:
    """The product in five commands: plan a GPU job, recommend GPUs, measure a tiny job on this CPU,
    compare the prediction with the measurement, write the HTML report (tunebench.commands.demo)."""
    import shlex
    import time

    from tunebench.commands import demo as script

    script.fresh_store(folder)
    started = time.monotonic()
    for n, (what, argv) in enumerate(script.steps(folder), start=1):
        console.rule(f"{n}. {what}", align="left")
        console.print("$ tunebench " + shlex.join(argv), highlight=False, markup=False)
        code = main(argv)
        if code:
            return code
    console.rule()
    console.print(
        f"demo done in {time.monotonic() - started:.0f} s: its store, run and report are in "
        f"{folder}/ (open {folder / script.REPORT})",
        highlight=False,
        markup=False,
    )
    return 0


# Commands whose modules own them, each group registered once: datasets; plan, recommend, deploy-spec,
# calibrate; explore; show, import, export; report; track.
app.add_typer(datasets_app, name="datasets", help="Generate and inspect the artificial data sets.")
app.add_typer(engines_app, name="engines", help="fms-hf-tuning environments: list, install, remove.")
register_plan(app)
register_explore(app)
register_store(app)
register_report(app)
register_track(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script: sys.exit(main())); every way a command can end, as an exit code.

    Bad input of any kind (a usage error, an InputError, a file that cannot be read or written)
    prints one line ``error: <field>: <what is wrong> (allowed: ...)`` on stderr and returns 2.
    A bug prints one line and returns 1 (TUNEBENCH_DEBUG=1 re-raises it with its traceback);
    Ctrl-C returns 130. Passwords in URLs are masked in every message.
    """
    try:
        result = app(args=argv, standalone_mode=False, prog_name="tunebench")
    except InputError as exc:
        return _fail(str(exc), 2)
    except OptionError as exc:  # a command-line value its declared type refused (tunebench.commands.options)
        return _fail(str(exc.error), 2)
    except BrokenPipeError:  # the reader of the output went away (`| head`): nothing to report
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except OSError as exc:  # a file the command's checks did not foresee (a race, a full disk)
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", 2)
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        return _fail("aborted", 130, prefix="")
    except (typer.Exit, click.exceptions.Exit) as exc:
        return exc.exit_code
    except Exception as exc:
        if is_help_request(exc):
            typer.echo(exc.ctx.get_help())
            return 0
        if is_usage_error(exc):
            argv = list(sys.argv[1:] if argv is None else argv)
            return _fail(str(to_input_error(exc, typer.main.get_command(app), argv)), 2)
        if isinstance(exc, (typer.TyperException, click.ClickException)):
            return _fail(exc.format_message(), exc.exit_code)
        if os.environ.get("TUNEBENCH_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (TUNEBENCH_DEBUG=1 shows the traceback)", 1)
    return result if isinstance(result, int) else 0


def _fail(message: str, code: int, prefix: str = "error: ") -> int:
    typer.echo(prefix + one_line(mask_secrets(message)), err=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
