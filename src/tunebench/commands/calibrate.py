"""``tunebench calibrate``: refit the planner's coefficients on measurements and report its accuracy."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunebench.commands.options import option
from tunebench.commands.printing import echo_json, fmt
from tunebench.errors import InputError
from tunebench.inputs import OutputFile
from tunebench.paths import check_writable, output_errors
from tunebench.plan.options import MeasurementsFile
from tunebench.secrets import mask_secrets

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def calibrate(
    store: Annotated[
        str | None,
        option(
            str,
            "--store",
            help="Results store URL to refit on (read only: a missing store is an error); default, "
            "without --from: the default store that import, run and explore write to (TUNEBENCH_STORE or "
            "the user's), said on stderr.",
        ),
    ] = None,
    sources: Annotated[
        list[Path] | None,
        option(MeasurementsFile, "--from", help="CSV of measurements (fms-acceleration or measured-property layout)."),
    ] = None,
    output: Annotated[
        Path | None, option(OutputFile, "--output", "-o", help="Where to write the calibration JSON.")
    ] = None,
    save: Annotated[
        bool, typer.Option("--save/--no-save", help="Write the calibration (default: your refit file).")
    ] = True,
    lomo: Annotated[bool, typer.Option("--lomo/--no-lomo", help="Report leave-one-model-out error (slower).")] = True,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Fit on the given measurements alone, without the reference runs the "
            "default calibration is fitted on.",
        ),
    ] = False,
    no_store: Annotated[
        bool,
        typer.Option(
            "--no-store",
            help="Without --store or --from: the reference runs alone, not the default "
            "store (what the shipped calibration is fitted on).",
        ),
    ] = False,
    ship_traces: Annotated[
        bool,
        typer.Option(
            "--ship-traces",
            help="Maintainers, after a change to tracing or to the reference runs: trace the activation profiles "
            "the runs need afresh and write them to the package's shipped set (plan/data/traces.json.gz), "
            "with a fresh TUNEBENCH_HOME, --no-store and --output set to the package's "
            "plan/data/default_calibration.json.",
        ),
    ] = False,
    as_json: Json = False,
) -> None:
    """Refit the planner's coefficients on measurements; report leave-one-model-out error.

    Your measurements are added to the reference runs the default calibration is fitted on, so a few
    local runs (say, four CPU measurements) refine the coefficients they inform instead of replacing
    every GPU coefficient; --replace fits on them alone."""
    from tunebench.plan import calibration as cal
    from tunebench.plan.predictor import user_calibration_path

    if no_store and store:
        raise InputError("--no-store", "give --store URL or --no-store, not both")
    if ship_traces and (store or sources or not no_store):
        raise InputError(
            "--ship-traces", "ships the reference runs' profiles: give --no-store, without --store or --from"
        )
    if ship_traces:
        from tunebench.plan.trace import SHIPPED

        with output_errors("--ship-traces", SHIPPED):
            check_writable(SHIPPED)
    records, label = gather_records(store, sources, replace, default=not no_store)
    target = output or user_calibration_path()
    # the default file lives in TUNEBENCH_HOME when that is set: an error there names the variable
    field = "TUNEBENCH_HOME" if output is None and os.environ.get("TUNEBENCH_HOME") else "--output"
    if save:  # before the fit (minutes): a result that cannot be written is known now
        with output_errors(field, target):
            check_writable(target)
    if ship_traces:  # first: the fit then uses the profiles shipped
        shipped = cal.ship_traces(records)
        typer.echo(f"shipped {shipped} activation profiles", err=True)
    result = _calibrate_with_progress(cal, records, label, lomo)
    if save:
        with output_errors(field, target):
            target.parent.mkdir(parents=True, exist_ok=True)
            result.save(target)
    out = {**result.to_dict(), "saved_to": str(target) if save else None}
    if as_json:
        echo_json(out)
        return
    print_calibration(result, label)
    if save:
        typer.echo(f"saved to {target}")


DEFAULT_SOURCE = (
    "fms-acceleration runs + published runs (litgpt, PEFT, torchtitan, PEFT docs, torchtune, Unsloth, "
    "Liger-Kernel, Qwen) + ado CPU example"
)


def default_store(store: str | None, sources: list[Path] | None, default: bool = True) -> tuple[str | None, str | None]:
    """(the store calibrate reads, a note saying which): --store; with neither --store nor --from (nor
    default False: --no-store), the default store (TUNEBENCH_STORE, else the user's: where `tunebench
    import`, `run` and `explore` write without --store), or None while it does not exist yet."""
    from tunebench.store.db import check_location, sqlite_file, store_url

    if store:
        check_location(store_url(store), create=False)
        return store, None
    if sources or not default:
        return None, None
    url = store_url(None)
    path = sqlite_file(url)
    if path is not None and not path.exists():
        return None, f"no store at {path} yet (tunebench import, run and explore write there): the reference runs alone"
    return url, f"reading the measurements of the default store {mask_secrets(url)} (--store picks another)"


def gather_records(
    store: str | None, sources: list[Path] | None, replace: bool, default: bool = True
) -> tuple[list[Any], str]:
    """The runs to fit and a label of where they come from: the reference runs, plus (or, with
    replace, instead of) the store's measurements and the CSV files given. store None: the default
    store (default_store; default False: none), said on stderr."""
    from tunebench.logs import get
    from tunebench.plan import measurements

    store, note = default_store(store, sources, default)
    log = get(__name__)
    if note:
        log.info(f"calibrate: {note}")
    records: list[Any] = []
    if store:
        try:
            records += measurements.store_records(store)
        except ImportError:
            raise InputError(
                "--store", "the sample store is not available in this installation; use --from CSV"
            ) from None
        except InputError:
            raise
        except Exception as exc:  # a URL SQLAlchemy cannot open, a foreign schema, ...
            raise InputError("--store", f"cannot read {store}: {exc}") from None
    for path in sources or []:
        if not path.is_file():
            raise InputError("--from", f"no file {str(path)!r}")
        try:
            records += measurements.read_csv(path)
        except InputError as exc:  # a row's value ("FILE line N: field"): under the option that named the file
            if exc.field == "--from":
                raise
            raise InputError("--from", f"{exc.field}: {exc.message}", exc.allowed) from None
    if store and note and not records:  # the default store, without a measurement yet
        log.info(f"calibrate: {mask_secrets(store)} holds no measurement: the reference runs alone")
        store = None
    label = DEFAULT_SOURCE
    if not store and not sources:
        records = measurements.default_records()
    else:
        label = ", ".join([*(str(p) for p in sources or []), *([mask_secrets(store)] if store else [])])
        if records and not replace:
            reference = measurements.default_records()
            records = reference + records
            label += f" + {len(reference)} reference runs"
    if not records:
        raise InputError("--store" if store and not sources else "--from", "no measurements to calibrate on")
    return records, label


def print_calibration(result: Any, label: str) -> None:
    """The coefficients and the in-sample and leave-one-model-out accuracy, as tables."""
    console = Console()
    console.print(f"calibrated on {result.records} runs of {len(result.models)} models from {label}")
    table = Table(title="coefficients")
    table.add_column("name")
    table.add_column("value", justify="right")
    for k, v in result.coefficients.to_dict().items():
        table.add_row(k, f"{v:.4g}")
    console.print(table)
    for title, m in (
        ("in-sample", result.metrics.get("in_sample")),
        ("leave-one-model-out", (result.metrics.get("leave_one_model_out") or {}).get("pooled")),
    ):
        if m:
            console.print(
                f"{title}: peak memory MdAPE {fmt(m['peak_mdape_pct'])} % (allocated {fmt(m['allocated_mdape_pct'])}, "
                f"nvidia-smi {fmt(m['smi_mdape_pct'])}), OOM accuracy {fmt(m['oom_accuracy_pct'])} % "
                f"({fmt(m['oom_near_limit_accuracy_pct'])} % near the limit), throughput MdAPE "
                f"{fmt(m['throughput_mdape_pct'])} %"
            )


def _calibrate_with_progress(cal: Any, records: list[Any], label: str, lomo: bool) -> Any:
    """cal.calibrate with its steps as log lines on stderr (which model is held out, k/N, the elapsed time and
    an ETA), and a line at least every 30 s (--quiet: none). Says first that --no-lomo skips the slow pass."""
    from tunebench.logs import duration, get, heartbeat

    log, started = get(__name__), time.monotonic()
    state: dict[str, Any] = {"step": "starting", "until": None}  # until: when the step's ETA runs out (monotonic)

    def when() -> str:
        now = time.monotonic()
        eta = "" if state["until"] is None else f", ETA {duration(max(0.0, state['until'] - now))}"
        return f"({duration(now - started)} elapsed{eta})"

    def say(msg: str, eta_s: float | None = None) -> None:
        state["until"] = None if eta_s is None else time.monotonic() + eta_s
        state["step"] = msg
        log.info(f"calibrate: {msg} {when()}")

    families = len({r.family for r in records})
    if lomo and families > 1:
        log.info(
            f"calibrate: after the fit, leave-one-model-out refits once per model family ({families} "
            "refits, the longest part): --no-lomo skips it"
        )
    with heartbeat(log, lambda: f"calibrate: still {state['step']} {when()}"):
        return cal.calibrate(records, source=label, lomo=lomo, progress=say)
