"""How `plan --compare` prints: one entity's prediction beside its measurement, or the summary of many
(the numbers come from tunebench.plan.compare)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tunebench.commands.printing import fmt, print_plan
from tunebench.spec.measured import shown_columns


def print_comparison(console: Console, predicted: dict, measured: dict | None, rows: list[dict]) -> None:
    """One entity: the prediction beside its measurement (or the prediction alone when there is none)."""
    console.print(f"[bold]{predicted.get('experiment_id', '')}[/bold]\n{predicted.get('entity_id', '')}")
    if measured is None:
        console.print(
            "[yellow]no measurement of this entity in the store[/yellow]: run `tunebench explore` or "
            "`tunebench import` first; the prediction alone:"
        )
        print_plan(console, predicted)
        return
    table = Table(title="predicted vs measured")
    for col in ("property", "predicted", "measured", "error %"):
        table.add_column(col, justify="left" if col == "property" else "right")
    shown = shown_columns([r["property"] for r in rows], [(measured.get("entity") or {}).get("number_gpus")])
    for r in rows:
        if r["property"] not in shown:
            continue
        table.add_row(
            r["property"],
            fmt(r["predicted"]),
            fmt(r["measured"]),
            "" if r["error_percent"] is None else f"{r['error_percent']:+.1f}",
        )
    console.print(table)


def print_summary(console: Console, summary: dict[str, Any], items: list[dict]) -> None:
    """Many entities: MdAPE per property and the verdict agreement, then the entities not planned."""
    if not summary["entities"]:
        console.print("no measurements to compare in the store: run `tunebench explore` or `tunebench import` first")
        return
    agreement = summary["verdict_agreement_percent"]
    console.print(
        f"{summary['entities']} measured entities; valid/invalid verdict agrees for "
        f"{fmt(agreement)} % of {summary['verdicts']}"
    )
    table = Table(title="predicted vs measured, median absolute error")
    for col in ("property", "pairs", "MdAPE %"):
        table.add_column(col, justify="left" if col == "property" else "right")
    for name, p in summary["properties"].items():
        if p["pairs"]:
            table.add_row(name, str(p["pairs"]), fmt(p["mdape_percent"]))
    console.print(table)
    for item in items:
        if "error" in item:
            console.print(f"[yellow]not planned[/yellow] {item['experiment_id']} {item['entity_id']}: {item['error']}")
