"""The planner's commands: plan, recommend, deploy-spec, calibrate.

``register(app)`` adds them to tunebench's Typer app. Bad input raises ``InputError`` (tunebench's
``main`` prints ``error: <field>: ...`` and exits 2); nothing here calls sys.exit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunebench.commands.gpu_options import GPUOptions, with_gpu_options
from tunebench.commands.options import ExperimentArg, Params, Props, argument, option
from tunebench.commands.printing import (
    cost_text,
    duration,
    echo_json,
    finite,
    fmt,
    need_text,
    planner_options,
    print_plan,
    risk,
)
from tunebench.commands.terminal import Column, print_table
from tunebench.errors import InputError, parse_json
from tunebench.inputs import EnvName, NonNegative, Positive, Seconds, Text, TextFile
from tunebench.plan.options import AvgTokens as AvgTokenCount
from tunebench.plan.options import CalibrationFile, GpuCount, PostUrl, Probability, check_recommend
from tunebench.plan.options import Currency as CurrencyCode
from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK
from tunebench.spec.experiments import effective_values, get_experiment, make_entity, parse_assignments
from tunebench.spec.properties import NODE_GPUS

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
Price = Annotated[
    float | None,
    option(
        NonNegative,
        "--price-per-gpu-hour",
        help="Price of one GPU-hour, for cost (default: "
        "the GPU catalog's on-demand list price in USD, where it has one).",
    ),
]
Currency = Annotated[
    str,
    option(
        CurrencyCode,
        "--currency",
        help="Currency of --price-per-gpu-hour, printed with cost "
        "(ISO 4217 code; nothing is converted; not USD: give --price-per-gpu-hour).",
    ),
]
MaxOomRisk = Annotated[
    float,
    option(
        Probability,
        "--max-oom-risk",
        help="Largest out-of-memory probability accepted as fitting (0 to 1; the planner's own 'fits' is <= 0.5).",
    ),
]
CalibrationPath = Annotated[
    Path | None,
    option(CalibrationFile, "--calibration", help="Calibration JSON (default: your refit, else the shipped one)."),
]
Network = Annotated[
    float | None,
    option(Positive, "--network-gbps", help="Inter-node bandwidth per node, GB/s (default by enable_roce)."),
]
HostMemory = Annotated[
    float | None,
    option(
        Positive,
        "--host-memory-gib",
        help="Host RAM per node, GiB: checked against what offload keeps there, and against a CPU run's memory "
        "(default for a CPU run: this machine's RAM).",
    ),
]
AvgTokens = Annotated[
    float | None,
    option(
        AvgTokenCount,
        "--avg-tokens",
        help="Mean tokens per sample of your data: time, throughput and cost use it (capped "
        "at model_max_length); peak memory still sizes model_max_length.",
    ),
]
Lengths = Annotated[
    Path | None,
    option(
        TextFile,
        "--lengths",
        help='JSON lines of your samples ("output", "text" or chat "messages"), '
        "counted with the model's tokenizer: time and cost use their mean, memory their longest.",
    ),
]
Compare = Annotated[
    bool,
    typer.Option(
        "--compare",
        help="Show the prediction beside the stored measurement of the entity; without "
        "an entity, of every measured entity in the store (or in --space's exploration).",
    ),
]


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
    if not out:  # "0 plans" and exit 0 would read as success
        raise InputError("--batch", f"{str(path)!r} has no JSON lines", allowed=BATCH_LINE)
    return out


BATCH_LINE = '{"experiment": ID, "entity": {...}} per line'


def _batch_item(line: str) -> tuple[Any, Any] | InputError:
    try:
        req = parse_json(line, unique_keys=True)
    except ValueError as exc:
        return InputError("--batch", f"not JSON: {getattr(exc, 'msg', exc)}")
    if not isinstance(req, dict) or "experiment" not in req or not isinstance(req.get("entity"), dict):
        return InputError("--batch", 'expected {"experiment": ID, "entity": {...}} (the entity an object)')
    unknown = sorted(set(req) - {"experiment", "entity", "parameters"})
    if unknown:  # a misplaced key (a property beside "entity", "params") would be dropped without a word
        return InputError("--batch", f"unknown key {unknown[0]!r}", allowed='"experiment", "entity", "parameters"')
    if not isinstance(req.get("parameters") or {}, dict):  # a list here stopped the whole batch (a TypeError)
        return InputError("--batch", '"parameters" must be an object of the experiment\'s parameters')
    if not isinstance(req["experiment"], str):
        return InputError("--batch", '"experiment" must be an experiment id (a text)')
    try:
        exp = get_experiment(req["experiment"], req.get("parameters") or None)
        return exp, make_entity(exp, req.get("entity") or {})
    except InputError as err:
        return err


def plan_batch(path: Path, kw: dict[str, Any], as_json: bool, max_oom_risk: float) -> int:
    """Plan every line of a JSONL file; a bad line becomes {"verdict": "failed", "fits": false, "error": ...} in place.
    Returns the exit code."""
    from tunebench.plan.predictor import plan_json, predict_many

    if not path.is_file():
        raise InputError("--batch", f"no file {str(path)!r}")
    lines = _batch_lines(path)
    good = [item for _, item in lines if not isinstance(item, InputError)]
    results = iter(predict_many(good, **kw))
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, item in lines:
        if isinstance(item, InputError):
            rows.append((n, {"line": n, "verdict": "failed", "fits": False, "error": str(item)}))
            continue
        r = next(results)
        failed_line = {"line": n, "verdict": "failed", "fits": False, "error": r.error}  # as api.plan's rows
        rows.append((n, failed_line if r.status == "failed" else {"line": n, **plan_json(r, max_oom_risk)}))
    failed = sum("error" in o for _, o in rows)
    if as_json:
        for _, o in rows:
            typer.echo(json.dumps(finite(o), default=str, allow_nan=False))
    else:
        _print_batch(rows)
    return 1 if failed else 0


BATCH_COLUMNS = (
    Column("line", justify="right"), Column("verdict"), Column("P(OOM)", 1, justify="right"),
    Column("peak GiB", 1, justify="right", min_width=5), Column("tokens/s", 2, justify="right"),
    Column("runtime", 2, justify="right", min_width=6), Column("util %", 4, justify="right"),
    Column("experiment", 3, shrink=True, min_width=14), Column("reason or error", wrap=True, min_width=20),
)  # fmt: skip


def _print_batch(rows: list[tuple[int, dict[str, Any]]]) -> None:
    """--batch's table at the terminal's width: one row per line, its verdict and why where it has one."""
    cells = []
    for n, o in rows:
        if "error" in o:
            cells.append([str(n), o["verdict"], *["-"] * 6, o["error"]])
            continue
        cells.append(
            [
                str(n),
                o["verdict"],
                fmt(o.get("oom_probability"), 2),
                fmt(o["gpu_memory_peak_gib"]),
                fmt(o["train_tokens_per_second"], 0),
                duration(o["train_runtime"]) if o["train_runtime"] is not None else "-",
                fmt(o["gpu_memory_utilization_peak"]) if o.get("capacity_gib") is not None else "-",  # a CPU run
                o["experiment_id"],
                "; ".join(o["reasons"]),
            ]
        )
    print_table(Console(), BATCH_COLUMNS, cells, title=f"{len(rows)} plans", more="--json shows them")


def _gpu_alias_notes(values: dict[str, Any]) -> list[str]:
    """A note when the gpu_model given is a short alias that also names parts of another memory size."""
    from tunebench.catalog.gpus import alias_note

    raw = values.get("gpu_model")
    note = alias_note(raw) if isinstance(raw, str) else None
    return [note] if note else []


def _require_gpu_model(values: dict[str, Any]) -> None:
    """Validity rule 5 (number_gpus > 0 needs a gpu_model) as an input error: without a GPU there is
    nothing to plan (a table of dashes and MFU 0 % otherwise)."""
    gpus = values.get("number_gpus") or 0
    if gpus > 0 and not values.get("gpu_model"):
        from tunebench.catalog import list_gpus

        names = [g.name for g in list_gpus()]
        raise InputError(
            "gpu_model",
            f"missing: number_gpus is {gpus} and validity rule 5 needs a gpu_model",
            allowed=f"{', '.join(names[:6])}, ... ({len(names)} in `tunebench gpus`)",
        )


@with_gpu_options
def plan(  # over 60 lines: 16 lines are Typer's option declarations
    experiment: Annotated[
        str | None, argument(str, "EXPERIMENT", help="Experiment id (omit with --batch).", show_default=False)
    ] = None,
    props: Props = None,
    params: Params = None,
    batch: Annotated[Path | None, option(TextFile, "--batch", help='JSON lines of {"experiment", "entity"}.')] = None,
    as_json: Json = False,
    price: Price = None,
    calibration: CalibrationPath = None,
    network: Network = None,
    host_memory: HostMemory = None,
    compare: Compare = False,
    store: Annotated[
        str | None,
        option(
            str,
            "--store",
            help="Store URL or SQLite file for --compare (default: the user's); read only: a "
            "missing store is an error.",
        ),
    ] = None,
    space: Annotated[
        Path | None, option(Path, "--space", help="With --compare: only the entities this space file explored.")
    ] = None,
    max_oom_risk: MaxOomRisk = DEFAULT_MAX_OOM_RISK,
    currency: Currency = "USD",
    avg_tokens: AvgTokens = None,
    lengths: Lengths = None,
    grid: Annotated[
        list[str] | None,
        option(
            str,
            "--grid",
            help="KEY=V1,V2,... or KEY=LOW..HIGH (the powers of two between): plan every point "
            "of the grid, one row each (repeatable; a KEY=LOW..HIGH argument is a dimension too).",
        ),
    ] = None,
    wide: Annotated[bool, typer.Option("--wide", help="--grid: every column in full.")] = False,
    gpu: GPUOptions = GPUOptions(),
) -> None:
    """Predict memory, out-of-memory (with its probability), throughput, runtime and cost of an entity,
    of every line of a JSONL batch (a bad line gets {"verdict": "failed", "error": ...}; exit 1 if any line
    failed), or of every point of a --grid. The verdict says 'risky' where the job fits but its out-of-memory
    probability exceeds --max-oom-risk."""
    from tunebench.plan.predictor import plan_json, predict
    from tunebench.plan.sweep import is_range

    opts = planner_options(price, calibration, network, host_memory, currency, avg_tokens, lengths)
    kw = {
        "calibration": opts.calibration,
        "price_per_gpu_hour": opts.price_per_gpu_hour,
        "network_gbps": opts.network_gbps,
        "host_memory_gib": opts.host_memory_gib,
        "lengths": opts.lengths,
    }
    values = parse_assignments(props or [])
    gpu.register(values.get("gpu_model"))
    count_lengths(opts.lengths, values.get("model_name"))
    ranges = [f"{k}={v}" for k, v in values.items() if is_range(v)]
    if grid or ranges:
        if batch is not None or compare:
            raise InputError(
                "--grid", "plans a grid alone: not with --batch or --compare", allowed="--grid without them"
            )
        if experiment is None:
            raise InputError("experiment", "missing: give an experiment id before the KEY=VALUE properties")
        exp = get_experiment(experiment, parse_assignments(params or [], "--param"))
        fixed = {k: v for k, v in values.items() if not is_range(v)}
        plan_grid_command(exp, fixed, [*(grid or []), *ranges], opts, max_oom_risk, currency, as_json, wide)
        return
    if batch is not None:
        if experiment is not None:
            raise InputError(
                "--batch",
                "give either EXPERIMENT KEY=VALUE ... or --batch FILE, not both",
                allowed="--batch FILE alone",
            )
        if compare or store is not None or space is not None:  # each line is planned only: nothing is compared
            flag = "--compare" if compare else ("--store" if store is not None else "--space")
            raise InputError(flag, "not with --batch, which plans each line", allowed="--batch FILE without it")
        code = plan_batch(batch, kw, as_json, max_oom_risk)
        if code:
            raise typer.Exit(code=code)
        return
    if compare and experiment is None:
        compare_store(store, space, kw, as_json)
        return
    if space is not None:
        raise InputError("--space", "only with --compare and no entity: compares every entity the space explored")
    if experiment is None:
        raise InputError("experiment", "missing: give an experiment id and KEY=VALUE properties, or --batch FILE")
    exp = get_experiment(experiment, parse_assignments(params or [], "--param"))
    entity = make_entity(exp, values)
    _require_gpu_model(effective_values(exp, entity))
    if compare:  # the store first: one that cannot be read fails before the planner runs (and caches)
        from tunebench.commands.compare import print_comparison
        from tunebench.plan.compare import compare_rows, measured_result

        measured = measured_result(store, exp.id, entity.id)
    result = predict(exp, entity, **kw)
    out = plan_json(result, max_oom_risk)
    from tunebench.spec.validity import platform_notes

    out["platform_notes"] = _gpu_alias_notes(values) + platform_notes(exp.method, effective_values(exp, entity))
    if out.get("cost") is not None:
        out["currency"] = currency
    if compare:
        rows = compare_rows(out, measured)
        if as_json:
            echo_json({"predicted": out, "measured": measured, "comparison": rows})
            return
        print_comparison(Console(), out, measured, rows)
        return
    if as_json:
        echo_json(out)
        return
    print_plan(Console(), out, max_oom_risk, currency)


def count_lengths(lengths: Any, model: Any) -> None:
    """Count the --lengths file's tokens for the entity's model now, with a progress bar (the planner would
    count them silently); nothing to do for --avg-tokens or a missing model (its own error comes later)."""
    if lengths is None or lengths.texts is None or not model:
        return
    from tunebench.commands.datasets import ProgressBar

    with ProgressBar(f"counting tokens of {lengths.path}") as update:
        lengths.for_model(str(model), update)


def plan_grid_command(
    exp: Any,
    fixed: dict[str, str],
    items: list[str],
    opts: Any,
    max_oom_risk: float,
    currency: str,
    as_json: bool,
    wide: bool,
) -> None:
    """plan --grid: every point of the grid (tunebench.plan.sweep), as JSON lines or one table row each."""
    from tunebench.commands.printing import print_grid
    from tunebench.plan.sweep import parse_grid, plan_grid

    dims = parse_grid(exp, items)
    for name in dims:
        if name in fixed:
            raise InputError(name, "given both as a value and as a --grid dimension")
    points = [p.to_dict() for p in plan_grid(exp, fixed, dims, opts, max_oom_risk)]
    notes = _gpu_alias_notes(fixed)
    if as_json:
        echo_json(
            {
                "experiment_id": exp.id,
                "fixed": fixed,
                "swept": list(dims),
                "max_oom_risk": max_oom_risk,
                "points": points,
                "notes": notes,
            }
        )
        return
    console = Console()
    print_grid(console, exp.id, fixed, list(dims), points, max_oom_risk, currency, wide=wide)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def compare_store(store: str | None, space: Path | None, kw: dict[str, Any], as_json: bool) -> None:
    """plan --compare over every measured entity of the store, or of one space's exploration."""
    from tunebench.commands.compare import print_summary
    from tunebench.plan.compare import compare_many, measured_rows, summarise

    filters = {}
    if space is not None:
        from tunebench.explore.space import load_space

        filters["operation_id"] = load_space(space).operation_id
    items = compare_many(measured_rows(store, **filters), kw)
    summary = summarise(items)
    if as_json:
        echo_json({"summary": summary, "entities": items})
        return
    print_summary(Console(), summary, items)


@with_gpu_options
def recommend(
    experiment: ExperimentArg,
    props: Props = None,
    params: Params = None,
    gpus_per_node: Annotated[int, option(GpuCount, "--gpus-per-node", help="GPUs per node.")] = NODE_GPUS,
    max_gpus: Annotated[int, option(GpuCount, "--max-gpus", help="Largest GPU count to consider.")] = 64,
    as_json: Json = False,
    price: Price = None,
    calibration: CalibrationPath = None,
    network: Network = None,
    host_memory: HostMemory = None,
    max_oom_risk: MaxOomRisk = DEFAULT_MAX_OOM_RISK,
    currency: Currency = "USD",
    avg_tokens: AvgTokens = None,
    lengths: Lengths = None,
    gpu: GPUOptions = GPUOptions(),
) -> None:
    """Fewest GPUs (and nodes) that fit, fastest and cheapest (batch, GPUs), and a table per method; a
    configuration fits when its out-of-memory probability is at most --max-oom-risk. Where nothing fits:
    why, and the nearest change that fits as a command."""
    from tunebench.plan.recommend import recommend as run

    check_recommend(gpus_per_node, max_gpus)
    opts = planner_options(price, calibration, network, host_memory, currency, avg_tokens, lengths)
    values = parse_assignments(props or [])
    gpu.register(values.get("gpu_model"))
    exp = get_experiment(experiment, parse_assignments(params or [], "--param"))
    count_lengths(opts.lengths, values.get("model_name"))
    repeat = {
        "--gpus-per-node": gpus_per_node,
        "--max-gpus": max_gpus,
        "--max-oom-risk": max_oom_risk,
        "--price-per-gpu-hour": price,
        "--currency": currency,
        "--avg-tokens": avg_tokens,
        "--lengths": lengths,
        "--host-memory-gib": host_memory,
    }
    defaults = {
        "--gpus-per-node": NODE_GPUS,
        "--max-gpus": 64,
        "--max-oom-risk": DEFAULT_MAX_OOM_RISK,
        "--price-per-gpu-hour": None,
        "--currency": "USD",
        "--avg-tokens": None,
        "--lengths": None,
        "--host-memory-gib": None,
    }
    cli_options = {k: v for k, v in repeat.items() if v != defaults[k]}
    out = run(
        exp,
        values,
        opts,
        gpus_per_node=gpus_per_node,
        max_gpus=max_gpus,
        max_oom_risk=max_oom_risk,
        cli_options=cli_options,
    )
    if out.get("price_per_gpu_hour") is not None:
        out["currency"] = currency
    if as_json:
        echo_json(out)
        return
    print_recommendation(Console(), out, currency)


Model = Annotated[
    str,
    argument(
        str,
        "MODEL",
        help="The model: a catalog name, a short name (mistral-7b), a Hugging Face id in the "
        "local cache, or a config.json path.",
        show_default=False,
    ),
]
# entity values: checked with the entity (its properties' domains and validity rules), named by property
GPUModel = Annotated[
    str | None,
    option(str, "--gpu-model", help="The GPU (a name from `tunebench gpus`; or gpu_model=NAME).", show_default=False),
]
Method = Annotated[str, option(str, "--method", help="full | lora | qlora (the benchmark experiment of the method).")]
GPUs = Annotated[
    int | None,
    option(int, "--number-gpus", help="GPUs the job runs on (default 1; or number_gpus=N).", show_default=False),
]


@with_gpu_options
def max_batch(
    model: Model,
    props: Props = None,
    gpu_model: GPUModel = None,
    method: Method = "lora",
    number_gpus: GPUs = None,
    model_max_length: Annotated[
        int | None,
        option(
            int,
            "--model-max-length",
            help="Tokens per sequence (default 4096; or model_max_length=N).",
            show_default=False,
        ),
    ] = None,
    max_oom_risk: MaxOomRisk = DEFAULT_MAX_OOM_RISK,
    price: Price = None,
    currency: Currency = "USD",
    calibration: CalibrationPath = None,
    host_memory: HostMemory = None,
    avg_tokens: AvgTokens = None,
    lengths: Lengths = None,
    as_json: Json = False,
    gpu: GPUOptions = GPUOptions(),
) -> None:
    """The largest batch_size that fits (out-of-memory probability at most --max-oom-risk), a multiple of
    --number-gpus (of its data-parallel ranks with tensor/sequence parallelism); with its memory, speed and time, and why the next batch up does not fit. More
    properties as KEY=VALUE (gradient_checkpointing=false, ...). With --lengths, for your samples: a padded
    micro-batch holds b x your longest sample, a padding-free one (padding_free=1) its largest row."""
    largest_command(
        "batch_size",
        model,
        props,
        gpu_model,
        method,
        number_gpus,
        {"model_max_length": model_max_length},
        {"model_max_length": 4096},
        max_oom_risk,
        price,
        currency,
        calibration,
        as_json,
        gpu,
        host_memory,
        avg_tokens,
        lengths,
    )


@with_gpu_options
def max_length(
    model: Model,
    props: Props = None,
    gpu_model: GPUModel = None,
    method: Method = "lora",
    number_gpus: GPUs = None,
    batch_size: Annotated[
        int | None, option(int, "--batch-size", help="Sequences per step (default: one per GPU; or batch_size=N).")
    ] = None,
    max_oom_risk: MaxOomRisk = DEFAULT_MAX_OOM_RISK,
    price: Price = None,
    currency: Currency = "USD",
    calibration: CalibrationPath = None,
    host_memory: HostMemory = None,
    as_json: Json = False,
    gpu: GPUOptions = GPUOptions(),
) -> None:
    """The largest model_max_length (tokens per sequence) that fits (out-of-memory probability at most
    --max-oom-risk); with its memory, speed and time, and why one token more does not fit. More
    properties as KEY=VALUE (gradient_checkpointing=false, ...)."""
    largest_command(
        "model_max_length",
        model,
        props,
        gpu_model,
        method,
        number_gpus,
        {"batch_size": batch_size},
        {},
        max_oom_risk,
        price,
        currency,
        calibration,
        as_json,
        gpu,
        host_memory,
    )


def _refuse_broken_rules(values: dict[str, Any], single_node_only: bool, searched: str) -> None:
    """A job that breaks a validity rule whatever the searched property (batch_size=0, 8 samples over 3 GPUs for
    max-length) is bad input: one line naming the rule's property, exit 2, before the search."""
    import re

    from tunebench.spec.validity import cannot_run_reasons, check_values

    reasons = check_values(values, single_node_only=single_node_only).reasons
    if reasons:
        named = re.match(r"rule \d+: (\w+)", reasons[0])
        field = named.group(1) if named and named.group(1) in values else "KEY=VALUE"
        raise InputError(
            field,
            f"{reasons[0]}; {searched} is searched with the rest as given",
            allowed="a job that keeps the spec's validity rules, as `tunebench validate` checks",
        )
    reasons = cannot_run_reasons(values)  # nothing can run these at any batch or length (spec.validity)
    if reasons:
        named = re.match(r"(\w+)", reasons[0])
        field = named.group(1) if named and named.group(1) in values else "KEY=VALUE"
        raise InputError(field, reasons[0], allowed="a job that can run, as `tunebench validate` notes")


def largest_command(
    name: str,
    model: str,
    props: list[str] | None,
    gpu_model: str | None,
    method: str,
    number_gpus: int | None,
    fixed: dict[str, Any],
    defaults: dict[str, Any],
    max_oom_risk: float,
    price: float | None,
    currency: str,
    calibration: Path | None,
    as_json: bool,
    gpu: GPUOptions,
    host_memory: float | None = None,
    avg_tokens: float | None = None,
    lengths: Path | None = None,
) -> None:
    """max-batch and max-length: the job's values, the search (tunebench.plan.sweep.largest), its output. An
    option (None: not given) and its property as KEY=VALUE are one setting: either, not both; neither, its
    default (defaults, number_gpus 1; max-length's batch_size one per GPU)."""
    from tunebench.commands.printing import print_largest
    from tunebench.plan.sweep import largest, method_job, padded_tokens, plan_notes
    from tunebench.spec.experiments import parse_value

    opts = planner_options(price, calibration, None, host_memory, currency, avg_tokens, lengths)
    raw = parse_assignments(props or [])
    options = {"model_name": model, "gpu_model": gpu_model, "number_gpus": number_gpus, **fixed}
    for key, value in options.items():
        if value is not None and key in raw:
            if key == "model_name":  # the MODEL argument, not an option
                raise InputError(
                    key, "given twice: as the MODEL argument and as KEY=VALUE", allowed="the MODEL argument alone"
                )
            flag = "--" + key.replace("_", "-")
            raise InputError(key, "given twice: as an option and as KEY=VALUE", allowed=f"{flag} or {key}=, not both")
    if name in raw:
        raise InputError(
            name, "is what this command searches for: leave it out", allowed=f"the job's properties but {name}"
        )
    given = {**{"number_gpus": 1, **defaults}, **raw, **{k: v for k, v in options.items() if v is not None}}
    number_gpus = parse_value("number_gpus", given["number_gpus"])
    given["number_gpus"] = number_gpus
    if number_gpus > 0 and not given.get("gpu_model"):  # a CPU run (number_gpus=0) is sized against the host
        raise InputError(
            "--gpu-model", "is required: the GPU to size the job for", allowed="--gpu-model NAME or gpu_model=NAME"
        )
    if given.get("gpu_model"):
        gpu.register(str(given["gpu_model"]))
    if name == "model_max_length" and given.get("batch_size") is None:
        given["batch_size"] = max(1, number_gpus)  # one sample per GPU
    start = {"batch_size": max(1, number_gpus), "model_max_length": 1}  # replaced by the search
    exp, values, notes = method_job(method, {**given, name: start[name]})
    notes[:0] = _gpu_alias_notes(given)
    _refuse_broken_rules(values, exp.single_node_only, name)
    count_lengths(opts.lengths, values.get("model_name"))  # with a progress bar, before the search
    found = largest(exp, values, name, opts, max_oom_risk)
    out = found.to_dict(max_oom_risk)
    if name == "batch_size" and found.value:  # the plan's notes at the largest batch: lengths, accumulation, ...
        notes.extend(n for n in plan_notes(exp, {**values, name: found.value}, opts) if n not in notes)
    elif not found.value and found.next_value:  # nothing fits: the notes at the smallest value say what else to change
        notes.extend(n for n in plan_notes(exp, {**values, name: found.next_value}, opts) if n not in notes)
    if name == "model_max_length" and found.value:
        padded = padded_tokens(exp, {**values, name: found.value}, opts)
        if padded < found.value:
            notes.append(
                f"the samples of {values['dataset_id']} are about {padded:,.0f} tokens once padded: past "
                "that a longer model_max_length takes no more memory; dataset_id=news-tokens-128kplus-"
                "entries-320 (131,072+ tokens a sample) plans longer sequences"
            )
    out["job"] = {
        "model_name": values["model_name"],
        "method": method,
        "gpu_model": values.get("gpu_model"),
        "number_gpus": number_gpus,
        **{k: values[k] for k in fixed},
        **{k: v for k, v in raw.items() if k not in ("model_name", "gpu_model", "number_gpus", *fixed)},
    }
    out["notes"] = notes
    if price is not None:
        out["currency"] = currency
    if as_json:
        echo_json(out)
        return
    console = Console()
    print_largest(console, out, currency)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def gpu_count(n: int) -> str:
    """'1 GPU', '4 GPUs'."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _config(c: dict[str, Any], currency: str) -> str:
    """One recommended configuration on one line: GPUs, batch, memory and its risk, speed, time, cost."""
    cost = f", cost {cost_text(c['cost'], currency)}" if c.get("cost") is not None else ""
    host = f"; offload keeps {c['host_memory_gib']:,.1f} GiB of host RAM per node" if c.get("host_memory_gib") else ""
    return (
        f"{c['number_gpus']} GPU(s) on {c['number_nodes']} node(s), batch_size {c['batch_size']}, "
        f"peak {c['gpu_memory_peak_gib']:.1f} GiB/GPU ({need_text(c)}, "
        f"out-of-memory probability {c['oom_probability']:.3f}), {c['dataset_tokens_per_second']:,.0f} tokens/s, "
        f"data set in {duration(c['train_runtime'])} ({c['gpu_hours']:.2f} GPU-h{cost}){host}"
    )


def print_recommendation(console: Console, out: dict[str, Any], currency: str = "USD") -> None:
    """recommend's text: the three picks, what the largest GPU count buys, why nothing fits, the table."""
    job = ", ".join(f"{k} {v}" for k, v in out["job"].items())  # not the entity id: its number_gpus is a stand-in
    console.print(f"[bold]{out['experiment_id']}[/bold]\n{job}", highlight=False)
    console.print(f"[dim]fits: out-of-memory probability at most {out['max_oom_risk']:g} (--max-oom-risk)[/dim]")
    for note in out.get("notes") or []:
        console.print(f"note: {note}", highlight=False, markup=False)
    bound = {"minimum": out["max_gpus_tried"], "fastest": out["max_gpus"], "cheapest": out["max_gpus"]}
    for title in ("minimum", "fastest", "cheapest"):
        c = out[title]
        if c is None:
            why = (
                ""
                if out["max_gpus_tried"] == out["max_gpus"] or title != "minimum"
                else (
                    f" (batch_size {out['batch_size']} spreads over at most {gpu_count(out['max_gpus_tried'])}: validity rule 1)"
                )
            )
            console.print(f"{title}: [red]nothing fits[/red] on up to {gpu_count(bound[title])}{why}")
            continue
        console.print(f"{title}: {_config(c, currency)}")
        for note in c.get("notes") or []:
            console.print(f"  note: {note}", markup=False)
    largest, cheapest = out.get("largest"), out.get("cheapest")
    if largest and cheapest and largest["number_gpus"] > cheapest["number_gpus"]:
        speedup = largest["dataset_tokens_per_second"] / cheapest["dataset_tokens_per_second"]
        what = "the fastest above" if largest == out.get("fastest") else _config(largest, currency)
        console.print(
            f"with all {largest['number_gpus']} GPUs: {speedup:.2f}x the cheapest's tokens/s, data set in "
            f"{duration(largest['train_runtime'])} instead of {duration(cheapest['train_runtime'])} ({what})"
        )
    diagnosis = out.get("diagnosis")
    if diagnosis:
        _print_diagnosis(console, diagnosis, out.get("nearest"), out["max_oom_risk"])
    rows = []
    for row in out["methods"]:
        if not row.get("fits", True) or "number_gpus" not in row:
            rows.append([row["method"], *["-"] * 8, "; ".join(row.get("notes", []))])
            continue
        rows.append(
            [
                row["method"],
                str(row["number_gpus"]),
                str(row["number_nodes"]),
                fmt(row.get("required_gib")),  # the need the verdict weighs, as plan --grid shows (not smi's cap)
                fmt(row["oom_probability"], 3),
                fmt(row["dataset_tokens_per_second"], 0),
                duration(row["train_runtime"]),
                fmt(row["gpu_hours"], 2),
                fmt(row.get("cost"), 2),
                "; ".join(row.get("notes", [])),
            ]
        )
    print_table(
        console, method_columns(currency), rows, title=f"Per method on {out['gpu_model']}", more="--json shows them"
    )


def method_columns(currency: str) -> list[Column]:
    """recommend's per-method table, the columns left out first on a narrow terminal last."""
    return [
        Column("method"),
        Column("GPUs", justify="right"),
        Column("nodes", 4, justify="right"),
        Column("need GiB/GPU", justify="right", min_width=6),
        Column("P(OOM)", justify="right"),
        Column("tokens/s", 2, justify="right"),
        Column("data set time", 1, justify="right", min_width=6),
        Column("GPU-hours", 3, justify="right", min_width=6),
        Column(f"cost ({currency})", 2, justify="right"),
        Column("notes", 1, wrap=True, min_width=16),
    ]


def _print_diagnosis(
    console: Console, d: dict[str, Any], nearest: dict[str, Any] | None, max_oom_risk: float = DEFAULT_MAX_OOM_RISK
) -> None:
    """Why nothing fits (at the largest GPU count tried): the validity rules it breaks, else its memory and its
    out-of-memory probability against --max-oom-risk (with the digits that tell them apart); and the nearest
    change that fits."""
    if d.get("rules"):
        console.print(f"why: on {gpu_count(d['number_gpus'])} the job breaks a validity rule: {'; '.join(d['rules'])}")
    else:
        p = d["oom_probability"]
        above = f", above --max-oom-risk {max_oom_risk:g}" if p is not None and p > max_oom_risk else ""
        console.print(
            f"why: on {gpu_count(d['number_gpus'])} the job needs {fmt(d['required_gib'], 1)} GiB per GPU of "
            f"{fmt(d['usable_gib'], 1)} usable (out-of-memory probability {risk(p, max_oom_risk)}{above}); "
            f"the largest part is {(d['largest_component'] or '-').replace('_', ' ')} "
            f"({fmt(d['largest_component_gib'], 1)} GiB)"
        )
    for note in d["notes"]:
        console.print(f"  note: {note}", markup=False)
    if nearest is None:
        console.print("nearest fit: none (tried gradient_accumulation_steps=1, smaller batches, LoRA, QLoRA)")
        return
    c = nearest["candidate"]
    console.print(
        f"nearest fit: {nearest['change']} fits on {c['number_gpus']} GPU(s) (peak "
        f"{c['gpu_memory_peak_gib']:.1f} GiB/GPU, out-of-memory probability {risk(c['oom_probability'], max_oom_risk)}):"
    )
    console.print(f"  {nearest['command']}", soft_wrap=True, markup=False, highlight=False)


def deploy_spec(
    # the sizing inputs are checked together by plan.deploy.deploy_spec (its Sizing model)
    model: Annotated[str | None, option(Text, "--model", help="Catalog model or config.json path.")] = None,
    params_b: Annotated[float | None, option(float, "--params-b", help="Parameters in billions.")] = None,
    quantization: Annotated[str, option(str, "--quantization", help="none | 4bit | 8bit")] = "none",
    adapters: Annotated[int, option(int, "--adapters", help="Number of LoRA adapters served.")] = 1,
    adapter_size_gb: Annotated[float, option(float, "--adapter-size-gb", help="Size of one adapter, GB.")] = 0.125,
    gpu_memory_gb: Annotated[float, option(float, "--gpu-memory-gb", help="Memory of one GPU, GB.")] = 80.0,
    name: Annotated[str | None, option(str, "--name", help="Hardware specification name.")] = None,
    description: Annotated[str | None, option(str, "--description", help="Hardware specification description.")] = None,
    post: Annotated[
        str | None, option(PostUrl, "--post", help="POST the spec to this URL (watsonx /v2/hardware_specifications).")
    ] = None,
    token_env: Annotated[
        str, option(EnvName, "--token-env", help="Environment variable holding the bearer token.")
    ] = "TOKEN",
    timeout: Annotated[float, option(Seconds, "--timeout", help="Seconds for the whole POST, reply included.")] = 30.0,
    as_json: Json = False,
) -> None:
    """Size a LoRA/QLoRA deployment by the watsonx.ai hardware-specification guide's formula and print (or POST) its hardware spec."""
    from tunebench.plan.deploy import deploy_spec as size
    from tunebench.plan.deploy import post_hardware_spec

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
        out["post"] = {"url": post, **post_hardware_spec(post, spec.hardware_spec, token_env, timeout_s=timeout)}
    if as_json:
        echo_json(out)
    else:
        console = Console()
        table = Table(title="Deployment (watsonx.ai custom hardware specification)")
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


def register(app: typer.Typer) -> None:
    from tunebench.commands.calibrate import calibrate

    """Add plan, recommend, deploy-spec, max-batch, max-length and calibrate to a Typer app."""
    app.command("plan")(plan)
    app.command("recommend")(recommend)
    app.command("deploy-spec")(deploy_spec)
    app.command("max-batch")(max_batch)
    app.command("max-length")(max_length)
    app.command("calibrate")(calibrate)
