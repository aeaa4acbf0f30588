"""How the planner's commands print: numbers for people, strict JSON for programs, the plan tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tunebench.errors import InputError
from tunebench.plan.options import user_lengths
from tunebench.plan.recommend import DEFAULT_MAX_OOM_RISK
from tunebench.spec.results import finite


def echo_json(obj: Any, indent: int | None = 2) -> None:
    """Strict JSON: a metric that could not be computed (NaN, inf) is null."""
    typer.echo(json.dumps(finite(obj), indent=indent, default=str, allow_nan=False))


def planner_options(
    price: float | None,
    calibration: Path | None,
    network: float | None,
    host_memory: float | None = None,
    currency: str = "USD",
    avg_tokens: float | None = None,
    lengths: Path | None = None,
):
    """The planner's settings of a command's (already checked) options."""
    from tunebench.plan.predictor import PlanOptions, load_calibration

    if currency != "USD" and price is None:  # the catalog's prices are USD: nothing converts them
        raise InputError(
            "--currency",
            f"{currency} needs --price-per-gpu-hour in {currency} (the GPU catalog's prices are in USD)",
            allowed="USD, or --price-per-gpu-hour with the currency",
        )
    return PlanOptions(
        calibration=load_calibration(calibration),
        price_per_gpu_hour=price,
        network_gbps=network,
        host_memory_gib=host_memory,
        lengths=user_lengths(avg_tokens, lengths),
    )


HUGE = 1e15  # past this a figure prints in scientific notation (num_train_epochs has no upper bound in the spec)


def fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (int, float)) and abs(v) >= HUGE:
        return f"{v:.3g}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


YEAR_S = 365.25 * 86400


def duration(seconds: float | None) -> str:
    """A planned duration for people: s, min, h (to 2 days), days (to a year), years."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.2f} h"
    if seconds < YEAR_S:
        return f"{seconds / 86400:.1f} days"
    years = seconds / YEAR_S
    return f"{fmt(years, 1) if years < HUGE else f'{years:.3g}'} years"


# The moments a peak can be set at (plan.trace.MOMENTS and the optimizer step), for people.
PEAK_PHASES = {
    "forward": "end of the forward pass",
    "head": "backward of the loss and output layer",
    "last_layer": "backward of the last decoder layer",
    "first_layer": "backward of the first decoder layer",
    "tail": "backward of the embeddings",
    "optimizer_step": "optimizer step",
}


def verdict(out: dict[str, Any], max_oom_risk: float) -> str:
    """plan's one-line verdict (plan_json's): fits (with its out-of-memory probability and headroom), fits but
    above the accepted risk, out of memory, or invalid."""
    p, headroom = out.get("oom_probability"), out.get("headroom_gib")
    room = "" if headroom is None else f", headroom {fmt(headroom, 1)} GiB"  # none on a CPU run
    odds = "" if p is None else f" (out-of-memory probability {risk(p, max_oom_risk)}{room})"
    kind = out["verdict"]
    if kind == "invalid":
        return "[red]invalid[/red]"
    if kind == "OOM":
        return f"[red]out of memory[/red]{odds}"
    if kind == "risky":
        return f"[yellow]risky[/yellow]: fits{odds}, above --max-oom-risk {max_oom_risk:g}"
    return f"[green]fits[/green]{odds}"


def cost_text(cost: float | None, currency: str) -> str:
    """A cost for people: '1,234.50 USD', '-' when there is no price."""
    return "-" if cost is None else f"{fmt(cost, 2)} {currency}"


def print_plan(
    console: Console, out: dict[str, Any], max_oom_risk: float = DEFAULT_MAX_OOM_RISK, currency: str = "USD"
) -> None:
    from tunebench.commands.terminal import wrap_id

    status = verdict(out, max_oom_risk)
    width = max(console.width, 20)  # ids wrap between their property.value segments, never inside a word
    console.print(f"[bold]{wrap_id(out['experiment_id'], width)}[/bold]", highlight=False)
    console.print(wrap_id(out["entity_id"], width), highlight=False)
    console.print(status)
    for reason in out["reasons"]:
        console.print(f"  - {reason}")
    for note in out.get("platform_notes") or []:
        console.print(f"  [yellow]note:[/yellow] {note}")
    if not out.get("planned", True):
        console.print("not planned: a run that breaks a validity rule cannot start", highlight=False)
        return
    over = (out.get("oom_probability") or 0) > 0.5  # figures above the GPU's: what the run would need, not get
    cpu = out.get("capacity_gib") is None  # number_gpus=0: the host's RAM holds it all, no GPU figures
    title = "Memory of the CPU run (GiB)" if cpu else "GPU memory per GPU (GiB)"
    table = Table(title=title + (", as the run would need it" if over else ""))
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for k, v in out["breakdown"].items():
        if v:
            table.add_row(k.replace("_", " "), fmt(v, 2))
    table.add_row("[bold]allocated peak (torch)[/bold]", fmt(out["gpu_memory_allocated_peak_gib"], 2))
    if cpu:  # the spec's GPU properties carry the CPU run's peak in JSON; for people, its need in the host's RAM
        table.add_row(
            "[bold]predicted need in the host's RAM[/bold] (+ fragmentation)", fmt(out.get("required_gib"), 2)
        )
    else:
        table.add_row("[bold]reserved peak (torch)[/bold]", fmt(out["gpu_memory_reserved_peak_gib"], 2))
        table.add_row("[bold]peak (nvidia-smi)[/bold]", fmt(out["gpu_memory_peak_gib"], 2))
        table.add_row("capacity", fmt(out.get("capacity_gib"), 2))
        table.add_row("usable (CUDA's total - context - NCCL)", fmt(out.get("usable_gib"), 2))
        table.add_row("predicted need (allocated + fragmentation)", fmt(out.get("required_gib"), 2))
        table.add_row("headroom (usable - predicted need)", fmt(out.get("headroom_gib"), 2))
        table.add_row("[bold]probability of running out of memory[/bold]", fmt(out.get("oom_probability"), 3))
        table.add_row("utilization peak (%)", fmt(out["gpu_memory_utilization_peak"], 1))
    if out.get("host_memory_gib"):
        table.add_row("host memory per node (offload)", fmt(out["host_memory_gib"], 2))
    if out.get("nvme_gib"):
        table.add_row("NVMe per node (offload)", fmt(out["nvme_gib"], 2))
    console.print(table)
    speed = Table(title="Throughput and time")
    speed.add_column("property")
    speed.add_column("value", justify="right")
    speed.add_row("peak set by", PEAK_PHASES.get(out.get("peak_phase") or "", "-"))
    if cpu:
        speed.add_row("train tokens/s", fmt(out["train_tokens_per_second"], 0))
    else:
        speed.add_row("train tokens/s (all GPUs)", fmt(out["train_tokens_per_second"], 0))
        speed.add_row("train tokens/s per GPU", fmt(out["train_tokens_per_gpu_per_second"], 0))
    speed.add_row("dataset tokens/s", fmt(out["dataset_tokens_per_second"], 0))
    speed.add_row("step time", duration(out.get("step_seconds")))
    speed.add_row("steps", fmt(out.get("steps"), 0))
    speed.add_row("train runtime", duration(out["train_runtime"]))
    mfu = fmt((out.get("mfu") or 0) * 100, 1) + " %"
    if cpu:  # plan.throughput rates a CPU run against the training rate measured on this host, not a peak
        speed.add_row("MFU (of this host's rate)", mfu)
    else:
        speed.add_row("MFU", mfu)
        speed.add_row("GPU-hours", fmt(out.get("gpu_hours"), 2))
    if out.get("cost") is not None:
        speed.add_row(
            "cost", f"{cost_text(out['cost'], currency)} ({fmt(out.get('price_per_gpu_hour'), 2)} per GPU-hour)"
        )
    elif not cpu:  # a GPU without a catalog price (your own numbers, or a price the catalog lacks)
        speed.add_row("cost", "no price known: --price-per-gpu-hour gives one")
    console.print(speed)
    for note in out.get("notes") or []:
        console.print(f"note: {note}", markup=False)  # notes hold file names and labels: "[offline, exact]"
    if out.get("price_source"):
        console.print(f"[dim]price: {escape(str(out['price_source']))}[/dim]", highlight=False)
    console.print(f"[dim]calibration: {escape(str(out.get('calibration')))}[/dim]")


def _per(c: dict[str, Any]) -> str:
    """The unit of a configuration's peak: per GPU, or the CPU run's whole."""
    return "GiB" if c.get("number_gpus") == 0 else "GiB/GPU"


def need_text(c: dict[str, Any]) -> str:
    """'needs 52.3 GiB, headroom 25.8 GiB': the predicted need (allocated peak + fragmentation) that the
    out-of-memory verdict weighs against usable memory, and what is left; it can be below the nvidia-smi
    peak, whose cached blocks the allocator frees before it fails (plan.memory.predict_memory)."""
    if c.get("headroom_gib") is None:  # a CPU run: its need is weighed against the host's RAM, no GPU headroom
        return f"needs {fmt(c.get('required_gib'), 1)} GiB"
    return f"needs {fmt(c.get('required_gib'), 1)} GiB, headroom {fmt(c.get('headroom_gib'), 1)} GiB"


def _point_cells(c: dict[str, Any], currency: str, cpu: bool = False) -> list[str]:
    """A planned configuration's numbers, for a table row: P(OOM), need (a CPU run: its peak), headroom, speed,
    time, cost (a CPU run: no P(OOM) or headroom, which are the GPU's)."""
    on_cpu = c.get("number_gpus") == 0  # a CPU point among GPU ones: no GPU to run out of
    gpu = [] if cpu else ["-" if on_cpu else fmt(c.get("oom_probability"), 3)]
    # a GPU's need (allocated peak + fragmentation: what the verdict weighs, usable = need + headroom), not its
    # nvidia-smi peak, which the allocator's cache fills up to the GPU's total near the limit (the same at every
    # size there); a CPU run's peak is its RAM
    memory = c.get("gpu_memory_peak_gib") if cpu or on_cpu else c.get("required_gib")
    return [
        *gpu,
        fmt(memory),
        *([] if cpu else [fmt(c.get("headroom_gib"))]),
        fmt(c.get("dataset_tokens_per_second"), 0),
        duration(c.get("train_runtime")),
        cost_text(c.get("cost"), currency),
    ]


def point_columns(cpu: bool = False) -> list[Any]:
    """The columns of _point_cells, most important first (tunebench.commands.terminal: the last go on a narrow
    terminal); cpu: a CPU run's, without the GPU's P(OOM) and headroom."""
    from tunebench.commands.terminal import Column

    gpu = [] if cpu else [Column("P(OOM)", justify="right")]
    return [
        *gpu,
        Column("peak GiB" if cpu else "need GiB/GPU", 1, justify="right", min_width=6),
        *([] if cpu else [Column("headroom GiB", 3, justify="right", min_width=6)]),
        Column("tokens/s", 1, justify="right"),
        Column("data set time", 2, justify="right", min_width=6),
        Column("cost", 2, justify="right"),
    ]


def print_grid(
    console: Console,
    experiment_id: str,
    fixed: dict[str, Any],
    swept: list[str],
    points: list[dict[str, Any]],
    max_oom_risk: float,
    currency: str = "USD",
    wide: bool = False,
) -> None:
    """plan --grid: one row per point (the swept values, the verdict, the numbers), fitted to the terminal;
    fixed: the values given once (named in the title)."""
    from tunebench.commands.terminal import Column, print_table

    cpu = all(p.get("number_gpus") == 0 for p in points)  # every point a CPU run: no GPU columns
    columns = [*(Column(n, breaks=True, min_width=6) for n in swept), Column("verdict"), *point_columns(cpu)]
    has_cost = any(p.get("cost") is not None for p in points)
    if not has_cost:
        columns = columns[:-1]
    rows = [
        [str(p[n]) for n in swept] + [p["verdict"]] + _point_cells(p, currency, cpu)[: len(columns) - len(swept) - 1]
        for p in points
    ]
    if any(p.get("notes") for p in points):  # why a point is invalid (a rule, the host's RAM), as --batch's table
        columns.append(Column("reason", 1, wrap=True, min_width=16))
        for row, p in zip(rows, points, strict=True):
            row.append("; ".join(p.get("notes") or []))
    given = ", ".join(f"{k} {v}" for k, v in fixed.items())
    fits = sum(p["verdict"] == "fits" for p in points)
    judged = "in the host's RAM" if cpu else f"out-of-memory probability <= {max_oom_risk:g}, --max-oom-risk"
    title = f"{experiment_id}: {given} — {fits} of {len(points)} points fit ({judged})"
    print_table(console, columns, rows, title=title, wide=wide, more="--wide or --json shows them")


def print_largest(console: Console, out: dict[str, Any], currency: str = "USD") -> None:
    """max-batch / max-length: the largest value that fits, its numbers, and why the next one up does not."""
    name, value = out["property"], out["largest"]
    console.print(f"[bold]{out['experiment_id']}[/bold]", highlight=False)
    console.print(", ".join(f"{k} {v}" for k, v in out["job"].items() if v is not None), highlight=False)
    if value is None:
        console.print(f"nothing fits: at {name} {out['next']:,}, {_why_not(out)}", highlight=False)
        return
    at = out["at_largest"]
    cost = f", {cost_text(at['cost'], currency)}" if at.get("cost") is not None else ""
    cpu = at.get("number_gpus") == 0  # weighed against the host's RAM: no out-of-memory probability
    judged = "in the host's RAM" if cpu else f"out-of-memory probability <= {out['max_oom_risk']:g}"
    console.print(f"largest {name} that fits: [bold]{value:,}[/bold] ({judged})", highlight=False)
    parts = [f"peak {fmt(at['gpu_memory_peak_gib'])} {_per(at)}"]
    if at.get("required_gib") is not None:
        parts.append(need_text(at))  # a CPU run's need is weighed against the host's RAM
    if not cpu:
        parts.append(f"out-of-memory probability {risk(at['oom_probability'], out['max_oom_risk'])}")
    console.print(
        f"  at {value:,}: {', '.join(parts)}; "
        f"{fmt(at['dataset_tokens_per_second'], 0)} tokens/s, data set in {duration(at['train_runtime'])}{cost}",
        highlight=False,
    )
    if out["next"] is None:
        console.print(f"  larger values were not tried: {out['limited_by']}", highlight=False)
    else:
        console.print(f"  at {out['next']:,}: {_why_not(out)}", highlight=False)


def _why_not(out: dict[str, Any]) -> str:
    """Why the next value up does not fit: the validity rule, or its out-of-memory probability."""
    nxt = out["at_next"]
    if nxt["notes"]:
        return f"{out['next_verdict']}: " + "; ".join(nxt["notes"])
    return (
        f"{out['next_verdict']}, out-of-memory probability {risk(nxt['oom_probability'], out['max_oom_risk'])} "
        f"(peak {fmt(nxt['gpu_memory_peak_gib'])} {_per(nxt)}, {need_text(nxt)})"
    )


def risk(p: float | None, threshold: float) -> str:
    """An out-of-memory probability to 3 decimals, to 5 where 3 would print it equal to the threshold it is
    judged against (0.10003 above 0.1 is not '0.100'), to 2 significant digits where 5 would too."""
    text = fmt(p, 3)
    if p is None or p == threshold or text != fmt(threshold, 3):
        return text
    finer = fmt(p, 5)
    return finer if finer != fmt(threshold, 5) else f"{p:.2g}"  # 3e-09 above a threshold of 0
