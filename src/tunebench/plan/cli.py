"""The planner's commands: plan, recommend, deploy-spec, calibrate.

``register(app)`` adds them to tunebench's Typer app. Bad input raises ``InputError`` (tunebench's
``main`` prints ``error: <field>: ...`` and exits 2); nothing here calls sys.exit.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunebench.errors import InputError
from tunebench.spec.experiments import get_experiment, make_entity, parse_assignments
from tunebench.inputs import parse
from tunebench.plan.options import CalibrateOptions, DeployOptions, PlannerOptions, check_recommend
from tunebench.secrets import mask_secrets

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
Params = Annotated[
    list[str] | None, typer.Option("--param", "-p", help="Parameterise the experiment: KEY=VALUE (repeatable).")
]
Props = Annotated[list[str] | None, typer.Argument(help="Entity properties as KEY=VALUE.", show_default=False)]
Price = Annotated[float | None, typer.Option("--price-per-gpu-hour", help="Price of one GPU-hour, for cost.")]
CalibrationPath = Annotated[
    Path | None, typer.Option("--calibration", help="Calibration JSON (default: your refit, else the shipped one).")
]
Network = Annotated[
    float | None, typer.Option("--network-gbps", help="Inter-node bandwidth per node, GB/s (default by enable_roce).")
]


def _echo_json(obj: Any, indent: int | None = 2) -> None:
    """Strict JSON: a metric that could not be computed (NaN, inf) is null."""
    typer.echo(json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _options(price: float | None, calibration: Path | None, network: float | None, batch: Path | None = None):
    from tunebench.plan.predictor import PlanOptions, load_calibration

    parse(PlannerOptions, price=price, calibration=calibration, network=network, batch=batch)
    return PlanOptions(calibration=load_calibration(calibration), price_per_gpu_hour=price, network_gbps=network)


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


# The moments a peak can be set at (plan.trace.MOMENTS and the optimizer step), for people.
PEAK_PHASES = {
    "forward": "end of the forward pass",
    "head": "backward of the loss and output layer",
    "last_layer": "backward of the last decoder layer",
    "first_layer": "backward of the first decoder layer",
    "tail": "backward of the embeddings",
    "optimizer_step": "optimizer step",
}


def _print_plan(console: Console, out: dict[str, Any]) -> None:
    status = "[green]fits[/green]" if out["is_valid"] else "[red]invalid[/red]"
    console.print(f"[bold]{out['experiment_id']}[/bold]\n{out['entity_id']}\n{status}")
    for reason in out["reasons"]:
        console.print(f"  - {reason}")
    table = Table(title="GPU memory per GPU (GiB)")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for k, v in out["breakdown"].items():
        if v:
            table.add_row(k.replace("_", " "), _fmt(v, 2))
    table.add_row("[bold]allocated peak (torch)[/bold]", _fmt(out["gpu_memory_allocated_peak_gib"], 2))
    table.add_row("[bold]reserved peak (torch)[/bold]", _fmt(out["gpu_memory_reserved_peak_gib"], 2))
    table.add_row("[bold]peak (nvidia-smi)[/bold]", _fmt(out["gpu_memory_peak_gib"], 2))
    table.add_row("capacity", _fmt(out.get("capacity_gib"), 2))
    table.add_row("usable (capacity - CUDA context - NCCL)", _fmt(out.get("usable_gib"), 2))
    table.add_row("headroom (usable - predicted need)", _fmt(out.get("headroom_gib"), 2))
    table.add_row("[bold]probability of running out of memory[/bold]", _fmt(out.get("oom_probability"), 3))
    table.add_row("utilization peak (%)", _fmt(out["gpu_memory_utilization_peak"], 1))
    console.print(table)
    speed = Table(title="Throughput and time")
    speed.add_column("property")
    speed.add_column("value", justify="right")
    speed.add_row("peak set by", PEAK_PHASES.get(out.get("peak_phase") or "", "-"))
    speed.add_row("train tokens/s (all GPUs)", _fmt(out["train_tokens_per_second"], 0))
    speed.add_row("train tokens/s per GPU", _fmt(out["train_tokens_per_gpu_per_second"], 0))
    speed.add_row("dataset tokens/s", _fmt(out["dataset_tokens_per_second"], 0))
    speed.add_row("step time", _duration(out.get("step_seconds")))
    speed.add_row("steps", _fmt(out.get("steps"), 0))
    speed.add_row("train runtime", _duration(out["train_runtime"]))
    speed.add_row("MFU", _fmt((out.get("mfu") or 0) * 100, 1) + " %")
    speed.add_row("GPU-hours", _fmt(out.get("gpu_hours"), 2))
    if out.get("cost") is not None:
        speed.add_row("cost", _fmt(out["cost"], 2))
    console.print(speed)
    for note in out.get("notes") or []:
        console.print(f"note: {note}")
    console.print(f"[dim]calibration: {out.get('calibration')}[/dim]")


def _batch_lines(path: Path) -> list[tuple[int, tuple[Any, Any] | InputError]]:
    """(line number, (experiment, entity) or the InputError of that line) per non-empty JSONL line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("--batch", f"cannot read {str(path)!r}: {exc}", allowed="a JSON-lines file") from None
    out: list[tuple[int, tuple[Any, Any] | InputError]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            out.append((n, _batch_item(line)))
    return out


def _batch_item(line: str) -> tuple[Any, Any] | InputError:
    try:
        req = json.loads(line)
    except json.JSONDecodeError as exc:
        return InputError("--batch", f"not JSON: {exc.msg}")
    if not isinstance(req, dict) or "experiment" not in req or not isinstance(req.get("entity", {}), dict):
        return InputError("--batch", 'expected {"experiment": ID, "entity": {...}}')
    try:
        exp = get_experiment(req["experiment"], req.get("parameters") or None)
        return exp, make_entity(exp, req.get("entity") or {})
    except InputError as err:
        return err


def plan_batch(path: Path, kw: dict[str, Any], as_json: bool) -> int:
    """Plan every line of a JSONL file; a bad line becomes {"error": ...} at its place. Returns the exit code."""
    from tunebench.plan.predictor import plan_json, predict_many

    if not path.is_file():
        raise InputError("--batch", f"no file {str(path)!r}")
    lines = _batch_lines(path)
    good = [item for _, item in lines if not isinstance(item, InputError)]
    results = iter(predict_many(good, **kw))
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, item in lines:
        if isinstance(item, InputError):
            rows.append((n, {"line": n, "error": str(item)}))
            continue
        r = next(results)
        rows.append((n, {"line": n, "error": r.error} if r.status == "failed" else plan_json(r)))
    failed = sum("error" in o for _, o in rows)
    if as_json:
        for _, o in rows:
            typer.echo(json.dumps(_finite(o), default=str, allow_nan=False))
    else:
        _print_batch(rows)
    return 1 if failed else 0


def _print_batch(rows: list[tuple[int, dict[str, Any]]]) -> None:
    console = Console()
    table = Table(title=f"{len(rows)} plans")
    for col in ("line", "experiment", "fits", "P(OOM)", "peak GiB", "util %", "tokens/s", "runtime"):
        table.add_column(col)
    for n, o in rows:
        if "error" in o:
            table.add_row(str(n), f"[red]error[/red]: {o['error']}", "-", "-", "-", "-", "-", "-")
            continue
        table.add_row(str(n), o["experiment_id"], "yes" if o["is_valid"] else "no", _fmt(o.get("oom_probability"), 2),
                      _fmt(o["gpu_memory_peak_gib"]), _fmt(o["gpu_memory_utilization_peak"]),
                      _fmt(o["train_tokens_per_second"], 0), _duration(o["train_runtime"]))  # fmt: skip
    console.print(table)


GPUCatalog = Annotated[
    Path | None, typer.Option("--gpu-catalog", help="JSON/YAML file of GPUs outside the catalog (name, memory_gib, "
                              "bf16_tflops, interconnect_gbps[, memory_bandwidth_gbps]).")  # fmt: skip
]
GPUMemory = Annotated[float | None, typer.Option("--gpu-memory-gib", help="Memory of a GPU outside the catalog, GiB.")]
GPUTflops = Annotated[float | None, typer.Option("--gpu-bf16-tflops", help="Its dense bf16 peak, TFLOP/s.")]
GPULink = Annotated[
    float | None, typer.Option("--gpu-interconnect-gbps", help="Its GPU-to-GPU bandwidth within a node, GB/s.")
]
GPUBandwidth = Annotated[
    float | None, typer.Option("--gpu-memory-bandwidth-gbps", help="Its memory bandwidth, GB/s (optional).")
]
GPUName = Annotated[str | None, typer.Option("--gpu-name", help="Label the --gpu-* numbers describe (default: gpu_model).")]


def use_gpu_options(label: str | None, catalog: Path | None, memory: float | None, tflops: float | None,
                    link: float | None, bandwidth: float | None) -> None:  # fmt: skip
    """Make the GPUs of --gpu-catalog and of the --gpu-* numbers known to this process's planner."""
    from tunebench.catalog.gpus import custom_gpu, register_gpu
    from tunebench.catalog.user_gpus import read_catalog

    for spec in read_catalog(str(catalog)) if catalog is not None else ():
        register_gpu(spec)
    given = {"--gpu-memory-gib": memory, "--gpu-bf16-tflops": tflops, "--gpu-interconnect-gbps": link}
    if all(v is None for v in (*given.values(), bandwidth)):
        return
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise InputError(missing[0], "missing: a GPU given by its numbers needs all of " + ", ".join(given))
    if not label:
        raise InputError("--gpu-name", "which GPU do the --gpu-* numbers describe? give gpu_model=LABEL or --gpu-name")
    register_gpu(custom_gpu(label, memory, tflops, link, bandwidth, field="--gpu-*"))  # type: ignore[arg-type]


def plan(
    experiment: Annotated[str | None, typer.Argument(help="Experiment id (omit with --batch).", show_default=False)] = None,
    props: Props = None,
    params: Params = None,
    batch: Annotated[Path | None, typer.Option("--batch", help="JSON lines of {\"experiment\", \"entity\"}.")] = None,
    as_json: Json = False,
    price: Price = None,
    calibration: CalibrationPath = None,
    network: Network = None,
    compare: Annotated[
        bool, typer.Option("--compare", help="Show the prediction beside the stored measurement of the entity.")
    ] = False,
    store: Annotated[
        str | None, typer.Option("--store", help="Store URL or SQLite file for --compare (default: the user's).")
    ] = None,
    gpu_catalog: GPUCatalog = None,
    gpu_memory: GPUMemory = None,
    gpu_tflops: GPUTflops = None,
    gpu_link: GPULink = None,
    gpu_bandwidth: GPUBandwidth = None,
    gpu_name: GPUName = None,
) -> None:
    """Predict memory, out-of-memory (with its probability), throughput, runtime and cost of an entity,
    or of every line of a JSONL batch (a bad line gets {"error": ...}; exit 1 if any line failed)."""
    from tunebench.plan.predictor import plan_json, predict

    opts = _options(price, calibration, network, batch)
    kw = {
        "calibration": opts.calibration,
        "price_per_gpu_hour": opts.price_per_gpu_hour,
        "network_gbps": opts.network_gbps,
    }
    values = parse_assignments(props or [])
    use_gpu_options(gpu_name or values.get("gpu_model"), gpu_catalog, gpu_memory, gpu_tflops, gpu_link, gpu_bandwidth)
    if batch is not None:
        if experiment is not None:
            raise InputError("--batch", "give either EXPERIMENT KEY=VALUE ... or --batch FILE, not both")
        code = plan_batch(batch, kw, as_json)
        if code:
            raise typer.Exit(code=code)
        return
    if experiment is None:
        raise InputError("experiment", "missing: give an experiment id and KEY=VALUE properties, or --batch FILE")
    exp = get_experiment(experiment, parse_assignments(params or []))
    entity = make_entity(exp, values)
    result = predict(exp, entity, **kw)
    out = plan_json(result)
    if compare:
        measured = measured_result(store, exp.id, entity.id)
        rows = compare_rows(out, measured)
        if as_json:
            _echo_json({"predicted": out, "measured": measured, "comparison": rows})
            return
        print_comparison(Console(), out, measured, rows)
        return
    if as_json:
        _echo_json(out)
        return
    _print_plan(Console(), out)


# Properties both actuators produce, compared line by line by `plan --compare`.


# Properties both actuators produce, compared line by line by `plan --compare`.
COMPARED = (
    "is_valid", "gpu_memory_allocated_peak_gib", "gpu_memory_reserved_peak_gib", "gpu_memory_utilization_peak",
    "train_runtime", "train_tokens_per_second", "train_tokens_per_gpu_per_second", "dataset_tokens_per_second",
    "dataset_tokens_per_second_per_gpu", "train_samples_per_second", "train_steps_per_second",
)  # fmt: skip


def measured_result(store_url: str | None, experiment_id: str, entity_id: str) -> dict | None:
    """The latest measured (not predicted) valid or invalid outcome of (experiment, entity) in the store."""
    from tunebench.store.cli import open_store
    from tunebench.store import DONE

    with open_store(store_url) as sample_store:
        ids = sample_store.request_ids([(experiment_id, entity_id)], actuator="measure")
        if not ids:
            return None
        rows = sample_store.rows(request_ids=list(ids.values()), statuses=DONE)
    return rows[-1] if rows else None


def compare_rows(predicted: dict, measured: dict | None) -> list[dict]:
    """[{property, predicted, measured, error_percent}] for the properties both sides have."""
    props = (measured or {}).get("properties") or {}
    out = []
    for name in COMPARED:
        p = predicted.get(name)
        m = props.get(name)
        if isinstance(p, bool):
            p = int(p)
        err = None
        if isinstance(p, (int, float)) and isinstance(m, (int, float)) and m and name != "is_valid":
            err = 100.0 * (p - m) / m
        out.append({"property": name, "predicted": p, "measured": m, "error_percent": err})
    return out


def print_comparison(console: Console, predicted: dict, measured: dict | None, rows: list[dict]) -> None:
    console.print(f"[bold]{predicted.get('experiment_id', '')}[/bold]\n{predicted.get('entity_id', '')}")
    if measured is None:
        console.print("[yellow]no measurement of this entity in the store[/yellow]: run `tunebench explore` or "
                      "`tunebench import` first; the prediction alone:")  # fmt: skip
        _print_plan(console, predicted)
        return
    table = Table(title="predicted vs measured")
    for col in ("property", "predicted", "measured", "error %"):
        table.add_column(col, justify="left" if col == "property" else "right")
    for r in rows:
        table.add_row(r["property"], _fmt(r["predicted"]), _fmt(r["measured"]),
                      "" if r["error_percent"] is None else f"{r['error_percent']:+.1f}")  # fmt: skip
    console.print(table)


def recommend(
    experiment: Annotated[str, typer.Argument(help="Experiment id.")],
    props: Props = None,
    params: Params = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")] = 8,
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="Largest GPU count to consider.")] = 64,
    as_json: Json = False,
    price: Price = None,
    calibration: CalibrationPath = None,
    network: Network = None,
    gpu_catalog: GPUCatalog = None,
    gpu_memory: GPUMemory = None,
    gpu_tflops: GPUTflops = None,
    gpu_link: GPULink = None,
    gpu_bandwidth: GPUBandwidth = None,
) -> None:
    """Fewest GPUs (and nodes) that fit, fastest and cheapest (batch, GPUs), and a table per method."""
    from tunebench.plan.recommend import recommend as run

    check_recommend(gpus_per_node, max_gpus)
    opts = _options(price, calibration, network)
    values = parse_assignments(props or [])
    use_gpu_options(values.get("gpu_model"), gpu_catalog, gpu_memory, gpu_tflops, gpu_link, gpu_bandwidth)
    exp = get_experiment(experiment, parse_assignments(params or []))
    out = run(exp, values, opts, gpus_per_node=gpus_per_node, max_gpus=max_gpus)
    if as_json:
        _echo_json(out)
        return
    console = Console()
    console.print(f"[bold]{out['experiment_id']}[/bold]\n{out['entity_id']}")

    def line(title: str, c: dict | None) -> None:
        if c is None:
            console.print(f"{title}: [red]nothing fits[/red] up to {max_gpus} GPUs")
            return
        cost = f", cost {c['cost']:,.2f}" if c.get("cost") is not None else ""
        console.print(
            f"{title}: {c['number_gpus']} GPU(s) on {c['number_nodes']} node(s), batch_size {c['batch_size']}, "
            f"peak {c['gpu_memory_peak_gib']:.1f} GiB/GPU, {c['dataset_tokens_per_second']:,.0f} tokens/s, "
            f"data set in {_duration(c['train_runtime'])} ({c['gpu_hours']:.2f} GPU-h{cost})"
        )
        for note in c.get("notes") or []:
            console.print(f"  note: {note}")

    line("minimum", out["minimum"])
    line("fastest", out["fastest"])
    line("cheapest", out["cheapest"])
    table = Table(title=f"Per method on {out['gpu_model']} (seed 000 style)")
    for col in ("method", "GPUs", "nodes", "peak GiB/GPU", "tokens/s", "data set time", "GPU-hours", "cost", "notes"):
        table.add_column(col)
    for row in out["methods"]:
        if not row.get("fits", True) or "number_gpus" not in row:
            table.add_row(row["method"], "-", "-", "-", "-", "-", "-", "-", "; ".join(row.get("notes", [])))
            continue
        table.add_row(row["method"], str(row["number_gpus"]), str(row["number_nodes"]), _fmt(row["gpu_memory_peak_gib"]),
                      _fmt(row["dataset_tokens_per_second"], 0), _duration(row["train_runtime"]), _fmt(row["gpu_hours"], 2),
                      _fmt(row.get("cost"), 2), "; ".join(row.get("notes", [])))  # fmt: skip
    console.print(table)


def deploy_spec(
    model: Annotated[str | None, typer.Option("--model", help="Catalog model or config.json path.")] = None,
    params_b: Annotated[float | None, typer.Option("--params-b", help="Parameters in billions.")] = None,
    quantization: Annotated[str, typer.Option("--quantization", help="none | 4bit | 8bit")] = "none",
    adapters: Annotated[int, typer.Option("--adapters", help="Number of LoRA adapters served.")] = 1,
    adapter_size_gb: Annotated[float, typer.Option("--adapter-size-gb", help="Size of one adapter, GB.")] = 0.125,
    gpu_memory_gb: Annotated[float, typer.Option("--gpu-memory-gb", help="Memory of one GPU, GB.")] = 80.0,
    name: Annotated[str | None, typer.Option("--name", help="Hardware specification name.")] = None,
    description: Annotated[str | None, typer.Option("--description", help="Hardware specification description.")] = None,
    post: Annotated[str | None, typer.Option("--post", help="POST the spec to this URL (watsonx /v2/hardware_specifications).")] = None,
    token_env: Annotated[str, typer.Option("--token-env", help="Environment variable holding the bearer token.")] = "TOKEN",
    as_json: Json = False,
) -> None:
    """Size a LoRA/QLoRA deployment by seed 002's formula and print (or POST) its hardware spec."""
    from tunebench.plan.deploy import deploy_spec as size
    from tunebench.plan.deploy import post_hardware_spec

    parse(DeployOptions, post=post, token_env=token_env)
    if (model is None) == (params_b is None):
        raise InputError("--model", "give exactly one of --model NAME_OR_CONFIG or --params-b B")
    if model is not None:
        from tunebench.catalog import get_model
        from tunebench.plan.structure import structure_of

        params_b = structure_of(get_model(model)).total_params / 1e9
    spec = size(params_b, quantization, adapters, adapter_size_gb, gpu_memory_gb, name, description)  # type: ignore[arg-type]
    out = spec.to_dict()
    if model is not None:
        out["model"] = model
    if post:
        out["post"] = {"url": post, **post_hardware_spec(post, spec.hardware_spec, token_env)}
    if as_json:
        _echo_json(out)
    else:
        console = Console()
        table = Table(title="Deployment (seed 002)")
        table.add_column("resource")
        table.add_column("value", justify="right")
        table.add_row("parameters (B)", f"{spec.params_b:g}")
        table.add_row("GPU memory (GB)", f"{spec.gpu_memory_gb:g} ~ {spec.cpu_memory_gb}")
        table.add_row("GPUs", str(spec.num_gpus))
        table.add_row("CPUs", str(spec.num_cpus))
        table.add_row("CPU memory (GB)", str(spec.cpu_memory_gb))
        console.print(table)
        typer.echo(json.dumps(spec.hardware_spec, indent=2))
        if post:
            typer.echo(f"POST {post}: HTTP {out['post']['status']}")
            typer.echo(json.dumps(out["post"]["body"], indent=2, default=str))
    if post and not out["post"]["ok"]:
        raise typer.Exit(code=1)


def calibrate(
    store: Annotated[str | None, typer.Option("--store", help="Results store URL (issue 5) to refit on.")] = None,
    sources: Annotated[
        list[Path] | None, typer.Option("--from", help="CSV of measurements (fms-acceleration or measured-property layout).")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write the calibration JSON.")] = None,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Write the calibration (default: your refit file).")] = True,
    lomo: Annotated[bool, typer.Option("--lomo/--no-lomo", help="Report leave-one-model-out error (slower).")] = True,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Fit on the given measurements alone, without the reference runs the "
                     "default calibration is fitted on."),
    ] = False,
    as_json: Json = False,
) -> None:
    """Refit the planner's coefficients on measurements; report leave-one-model-out error.

    Your measurements are added to the reference runs the default calibration is fitted on, so a few
    local runs (say, four CPU measurements) refine the coefficients they inform instead of replacing
    every GPU coefficient; --replace fits on them alone."""
    from tunebench.plan import calibration as cal
    from tunebench.plan import measurements
    from tunebench.plan.predictor import user_calibration_path

    parse(CalibrateOptions, sources=sources, output=output)
    if store:
        from tunebench.store.db import check_location, store_url

        check_location(store_url(store), create=False)
    records: list[Any] = []
    if store:
        try:
            records += measurements.store_records(store)
        except ImportError:
            raise InputError("--store", "the sample store is not available in this installation; use --from CSV") from None
        except InputError:
            raise
        except Exception as exc:  # a URL SQLAlchemy cannot open, a foreign schema, ...
            raise InputError("--store", f"cannot read {store}: {exc}") from None
    for path in sources or []:
        if not path.is_file():
            raise InputError("--from", f"no file {str(path)!r}")
        records += measurements.read_csv(path)
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
    result = _calibrate_with_progress(cal, records, label, lomo)
    target = output or user_calibration_path()
    if save:
        target.parent.mkdir(parents=True, exist_ok=True)
        result.save(target)
    out = {**result.to_dict(), "saved_to": str(target) if save else None}
    if as_json:
        _echo_json(out)
        return
    console = Console()
    console.print(f"calibrated on {result.records} runs of {len(result.models)} models from {label}")
    table = Table(title="coefficients")
    table.add_column("name")
    table.add_column("value", justify="right")
    for k, v in result.coefficients.to_dict().items():
        table.add_row(k, f"{v:.4g}")
    console.print(table)
    for title, m in (("in-sample", result.metrics.get("in_sample")),
                     ("leave-one-model-out", (result.metrics.get("leave_one_model_out") or {}).get("pooled"))):  # fmt: skip
        if m:
            console.print(
                f"{title}: peak memory MdAPE {_fmt(m['peak_mdape_pct'])} % (allocated {_fmt(m['allocated_mdape_pct'])}, "
                f"nvidia-smi {_fmt(m['smi_mdape_pct'])}), OOM accuracy {_fmt(m['oom_accuracy_pct'])} % "
                f"({_fmt(m['oom_near_limit_accuracy_pct'])} % near the limit), throughput MdAPE "
                f"{_fmt(m['throughput_mdape_pct'])} %"
            )
    if save:
        console.print(f"saved to {target}")


def _calibrate_with_progress(cal: Any, records: list[Any], label: str, lomo: bool) -> Any:
    """cal.calibrate with its steps as log lines on stderr, and a line at least every 30 s (--quiet: none)."""
    from tunebench.logs import get, heartbeat

    log, started, step = get(__name__), time.monotonic(), ["starting"]

    def say(msg: str) -> None:
        step[0] = msg
        log.info(f"calibrate: {msg} ({time.monotonic() - started:.0f} s)")

    with heartbeat(log, lambda: f"calibrate: still {step[0]} ({time.monotonic() - started:.0f} s)"):
        return cal.calibrate(records, source=label, lomo=lomo, progress=say)


DEFAULT_SOURCE = "fms-acceleration runs + published runs (litgpt, PEFT, torchtitan) + ado CPU example"


def register(app: typer.Typer) -> None:
    """Add plan, recommend, deploy-spec and calibrate to a Typer app."""
    app.command("plan")(plan)
    app.command("recommend")(recommend)
    app.command("deploy-spec")(deploy_spec)
    app.command("calibrate")(calibrate)
