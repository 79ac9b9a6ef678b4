"""Output for people and for scripts: one JSON document on stdout, or rich tables."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

err_console = Console(stderr=True)
# Piped output gets a fixed width, so tables stay readable in files and CI logs.
out_console = Console() if sys.stdout.isatty() else Console(width=140)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def print_json(document: Any) -> None:
    """Strict JSON (no NaN or Infinity) on stdout, one document."""
    sys.stdout.write(json.dumps(_clean(document), indent=2, allow_nan=False) + "\n")


def _fmt(value: Any, *, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * scale:,.{digits}f}"
    return f"{value:,}"


def sli_table(report: dict[str, Any]) -> Table:
    limits = report["limits"]
    given = ", ".join(f"{k.removesuffix('_ms')} <= {v:g} ms" for k, v in limits.items() if v)
    window = report["window"]
    title = f"Request SLIs over {_fmt(window['window_s'], digits=0)} s"
    table = Table(title=title, caption=f"goodput limits: {given or 'none given'}")
    group = report["by"] if report["by"] != "fleet" else "scope"
    for header in (
        group,
        "requests",
        "failed",
        "TTFT p50/p95/p99 ms",
        "TPOT p50/p95/p99 ms",
        "e2e p50/p95/p99 ms",
        "attainment %",
        "goodput req/s",
    ):
        table.add_column(header, justify="left" if header == group else "right")

    def triple(sli: dict[str, Any]) -> str:
        return " / ".join(_fmt(sli[p], scale=1000.0, digits=0) for p in ("p50", "p95", "p99"))

    rows = [*report["groups"], {group: "fleet", **report["overall"]}]
    for index, row in enumerate(rows):
        table.add_row(
            str(row[group]) if row[group] is not None else "(unknown)",
            _fmt(row["requests"]),
            _fmt(row["failed_requests"]),
            triple(row["ttft_s"]),
            triple(row["tpot_s"]),
            triple(row["e2e_s"]),
            _fmt(row["attainment_ratio"], scale=100.0),
            _fmt(row["goodput_rps"], digits=3),
            end_section=index == len(rows) - 2,
        )
    return table


def sli_series_table(report: dict[str, Any]) -> Table:
    """The fleet's SLIs window by window."""
    table = Table(title="Fleet SLIs per window")
    for header in (
        "from",
        "requests",
        "failed",
        "TTFT p95 ms",
        "TPOT p95 ms",
        "attainment %",
        "goodput req/s",
    ):
        table.add_column(header, justify="left" if header == "from" else "right")
    for window in report.get("series", []):
        row = window["overall"]
        table.add_row(
            window["from"],
            _fmt(row["requests"]),
            _fmt(row["failed_requests"]),
            _fmt(row["ttft_s"]["p95"], scale=1000.0, digits=0),
            _fmt(row["tpot_s"]["p95"], scale=1000.0, digits=0),
            _fmt(row["attainment_ratio"], scale=100.0),
            _fmt(row["goodput_rps"], digits=3),
        )
    return table
