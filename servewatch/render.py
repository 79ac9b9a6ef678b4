"""Output for people and for scripts: one JSON document on stdout, or rich tables."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from servewatch.health.finding import Finding
from servewatch.slo.absent_alert import ABSENT_WINDOW_S
from servewatch.slo.alert_state import AlertChange
from servewatch.slo.durations import format_duration

# How an absent-data alert's window reads in an alert's JSON (both windows are it).
ABSENT_WINDOW = format_duration(ABSENT_WINDOW_S)

# Messages are never wrapped by width (a terminal wraps them, a log keeps them whole), and no
# text is read as markup: paths, config sections such as [slo] and errors are shown as they are.
err_console = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)
# Piped output gets a fixed width, so tables stay readable in files and CI logs.
out_console = Console(markup=False) if sys.stdout.isatty() else Console(width=140, markup=False)


def counting_progress(label: str) -> Progress:
    """A progress bar on stderr counting steps (queries, pages, partitions) with the time left;
    hidden when stderr is not a terminal, gone when done."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )


def labelled(label: str, text: str, *, style: str = "yellow") -> Text:
    """A message line: a styled label, then `text` exactly as given."""
    return Text.assemble((label, style), " ", text)


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
        "token goodput tok/s",
        "token goodput %",
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
            _fmt(row["token_goodput_tps"], digits=1),
            _fmt(row["token_goodput_ratio"], scale=100.0),
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
        "token goodput tok/s",
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
            _fmt(row["token_goodput_tps"], digits=1),
        )
    return table


_FAMILY_COLUMNS = {
    "histogram": ("p50", "p90", "p95", "p99", "observations"),
    "counter": ("increase", "per_s"),
    "gauge": ("mean", "max", "samples"),
}


def _significant(value: Any) -> str:
    """A value of any magnitude (a family's unit is not known): four significant digits."""
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else f"{value:,}"


def recorded_sli_table(document: dict[str, Any]) -> Table:
    """`sli --recorded`: one row per recorded group, one column per SLI it recorded."""
    table = Table(title=f"Recorded SLIs at {document['at']} (by {document['by']})")
    names = sorted({name for group in document["groups"] for name in group["slis"]})
    for header in ("group", "window", "evaluated", *names):
        table.add_column(header, justify="left" if header == "group" else "right")
    for group in document["groups"]:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(group["labels"].items()))
        table.add_row(
            labels,
            format_duration(round(group["window_s"])),
            group["at"],
            *(_significant(group["slis"].get(name)) for name in names),
        )
    return table


def sli_family_tables(report: dict[str, Any]) -> list[Table]:
    """One table per family of `sli --metric`, its groups then the fleet."""
    group = report["by"] if report["by"] != "fleet" else "scope"
    tables = []
    for name, section in report.get("families", {}).items():
        if section["shape"] is None:
            tables.append(Table(title=f"{name}: no series in this window"))
            continue
        columns = _FAMILY_COLUMNS[section["shape"]]
        table = Table(title=f"{name} ({section['shape']})")
        table.add_column(group)
        for column in columns:
            table.add_column(column, justify="right")
        rows = [*section["groups"], {group: "fleet", **(section["overall"] or {})}]
        for row in rows:
            table.add_row(str(row.get(group)), *(_significant(row.get(c)) for c in columns))
        tables.append(table)
    return tables


def sli_histogram_tables(report: dict[str, Any]) -> list[Table]:
    """SLIs from scraped series: latency quantiles, then engine state, throughput and GPUs."""
    section = report["histograms"]
    group = report["by"] if report["by"] != "fleet" else "scope"
    rows = [*section["groups"], {group: "fleet", **section["overall"]}]
    window = f"{_fmt(section['window']['window_s'], digits=0)} s"
    latency = Table(title=f"Latency from engine histograms over {window} (p50 / p95 / p99 ms)")
    state = Table(title=f"Engine state, throughput and GPUs from scraped series over {window}")
    for header in (group, "TTFT", "ITL", "TPOT", "e2e"):
        latency.add_column(header, justify="left" if header == group else "right")
    for header in (
        group,
        "KV mean/max %",
        "prefix hit %",
        "running",
        "waiting",
        "preempt",
        "gen tok/s",
        "prompt tok/s",
        "GPU util %",
        "GPU W",
    ):
        state.add_column(header, justify="left" if header == group else "right")

    def triple(sli: dict[str, Any]) -> str:
        return " / ".join(_fmt(sli[p], scale=1000.0, digits=0) for p in ("p50", "p95", "p99"))

    def pair(stats: dict[str, Any], scale: float = 1.0) -> str:
        return f"{_fmt(stats['mean'], scale=scale)} / {_fmt(stats['max'], scale=scale)}"

    for index, row in enumerate(rows):
        name = str(row[group]) if row[group] is not None else "(unknown)"
        last = index == len(rows) - 2
        latency.add_row(
            name, *(triple(row[f"{s}_s"]) for s in ("ttft", "itl", "tpot", "e2e")), end_section=last
        )
        state.add_row(
            name,
            pair(row["kv_cache_usage_ratio"], 100.0),
            _fmt(row["prefix_cache_hit_ratio"], scale=100.0),
            _fmt(row["requests_running"]["mean"]),
            _fmt(row["requests_waiting"]["mean"]),
            _fmt(row["preemptions"], digits=0),
            _fmt(row["generation_tokens_per_s"]),
            _fmt(row["prompt_tokens_per_s"]),
            pair(row["gpu_util_ratio"], 100.0),
            _fmt(row["gpu_power_w"]["mean"], digits=0),
            end_section=last,
        )
    tables = [latency, state]
    unmatched = section.get("unmatched_gpus") or []
    if unmatched:
        tables.append(unmatched_gpus_table(unmatched))
    return tables


def unmatched_gpus_table(rows: Sequence[dict[str, Any]]) -> Table:
    """GPUs (and MIG slices) that serve no replica: in no group's figures, so listed here."""
    table = Table(title="GPUs that serve no replica (in no group's figures)")
    for header in ("host", "UUID", "MIG", "pod", "why", "GPU W", "GPU util %"):
        table.add_column(header, justify="right" if header.startswith("GPU ") else "left")
    for row in rows:
        pod = f"{row['namespace']}/{row['pod']}" if row["pod"] else "-"
        table.add_row(
            str(row["hostname"] or "-"),
            str(row["uuid"] or "-"),
            str(row["gpu_instance"] or "-"),
            pod,
            str(row["rule"]),
            _fmt(row["gpu_power_w_mean"], digits=0),
            _fmt(row["gpu_util_ratio_mean"], scale=100.0),
        )
    return table


def change_json(change: AlertChange) -> dict[str, Any]:
    """One alert state change as plain JSON."""
    return {
        "slo": change.key.slo,
        "severity": change.key.severity.value,
        "window": change.key.window,
        "short_window": change.key.short_window,
        "state": change.state.value,
        "changed": change.changed_ts.isoformat() + "Z",
        "active_since": None
        if change.active_since_ts is None
        else change.active_since_ts.isoformat() + "Z",
        "long_burn_rate": change.long_burn_rate,
        "short_burn_rate": change.short_burn_rate,
        "burn_threshold": change.burn_threshold,
        "budget_consumed_ratio": change.budget_consumed_ratio,
        "labels": dict(change.labels),
    }


def alerts_table(changes: Sequence[dict[str, Any]]) -> Table:
    """The alert history from its JSON (`change_json`), as read or as the service answers it."""
    table = Table(title="Alert state history")
    for header in ("changed (UTC)", "SLO", "severity", "windows", "state", "burn long/short"):
        table.add_column(header)
    for change in changes:
        table.add_row(
            str(change["changed"]).removesuffix("Z")[:16],
            change["slo"],
            change["severity"],
            f"absent {change['window']}"
            if change["window"] == change["short_window"] == ABSENT_WINDOW
            else f"{change['window']}/{change['short_window']}",
            change["state"],
            f"{_fmt(change['long_burn_rate'], digits=2)} / "
            f"{_fmt(change['short_burn_rate'], digits=2)}",
        )
    if not changes:
        table.caption = "no alert has changed state yet"
    return table


def slo_status_table(
    statuses: Sequence[dict[str, Any]], *, at: str, caption: str | None = None
) -> Table:
    """SLO statuses from their JSON (`SloStatus.to_json`), as evaluated here or by the service;
    `at` as the document gives it."""
    table = Table(title=f"SLO status at {at.removesuffix('Z')[:16]} UTC", caption=caption)
    for header in (
        "SLO",
        "objective",
        "period",
        "events",
        "error ratio",
        "budget left %",
        "burn now",
        "exhausted in",
        "alerts firing",
    ):
        table.add_column(header, justify="left" if header == "SLO" else "right")
    for status in statuses:
        firing = [a for a in status["alerts"] if a["state"] == "firing"]
        exhaustion = status["time_to_exhaustion_s"]
        remaining = status["budget_remaining_ratio"]
        table.add_row(
            status["slo"],
            f"{status['objective_ratio']:.4%}",
            status["period"],
            f"{status['good']:,}/{status['total']:,}"
            + (" tokens" if status.get("events") == "output tokens" else ""),
            _fmt(status["error_ratio"], digits=5),
            "no data" if remaining is None else _fmt(remaining, scale=100.0),
            _fmt(status["current_burn_rate"], digits=2),
            "no data"
            if remaining is None
            else "exhausted"
            if remaining <= 0
            else "-"
            if exhaustion is None
            else f"{exhaustion / 3600:,.1f} h",
            ", ".join(f"{a['severity']} {a['window']}" for a in firing) or "-",
        )
    return table


def demo_summary(summary: dict[str, Any]) -> Text:
    """The demo's closing words: what happened, what it means, where the files are."""
    title = "servewatch demo (emulated fleet)"
    lines = ["", title]
    recorded = summary["recorded"]
    lines.append(
        f"recorded {recorded['hours']:g} h: {recorded['requests']:,} requests, "
        f"{recorded['pages']:,} pages; replayed {summary['replayed']['new_points']:,} points"
    )
    lines.append("SLO status at the end of the recording:")
    lines.extend(
        f"  {status['slo']}: {status['good']:,}/{status['total']:,} good, budget left "
        + (
            "no data"
            if status["budget_remaining_ratio"] is None
            else f"{status['budget_remaining_ratio']:.0%}"
        )
        for status in summary["slo_status"]
    )
    fired = summary["alerts_fired"]
    lines.append(f"alerts fired: {', '.join(fired) if fired else 'none'}")
    findings = summary.get("health_findings", [])
    lines.append(f"fleet-health findings: {len(findings) or 'none'}")
    lines.extend(
        f"  {f['kind']} {f['scope_unit']} {f['scope']} from {f['start']}"
        f"{' (ongoing)' if f['end'] is None else ' to ' + f['end']}: {f['summary']}"
        for f in findings[:6]
    )
    if len(findings) > 6:
        lines.append(f"  ... {len(findings) - 6} more in the report")
    lines.append(f"recommendation: {summary['recommendation']}")
    risk = summary.get("riskiest_assumption")
    if risk:
        lines.append(f"riskiest assumption: {risk['assumption']}: {risk['reason']}")
    live = summary.get("live")
    if live:
        lines.append(
            f"live phase: {live['targets']} targets scraped {live['scrapes']} times, "
            f"{live['requests_received']} spans received over OTLP"
        )
    lines.append(f"files: report {summary['report']}, decision record {summary['decision_record']}")
    lines.append(f"       store {summary['store']}, recording {summary['fixture']}")
    text = Text("\n".join(lines))
    text.stylize("bold", 1, 1 + len(title))
    return text


def _evidence_text(finding: Finding, *, limit: int = 4) -> str:
    parts = []
    for e in finding.evidence[:limit]:
        against = "" if e.baseline is None else f" vs {e.baseline:.4g}"
        parts.append(f"{e.name} {e.value:.4g}{against} {e.unit}")
    more = len(finding.evidence) - limit
    return "; ".join(parts) + (f"; +{more} more (--json)" if more > 0 else "")


def health_table(findings: Sequence[Finding], *, start: datetime | None = None) -> Table:
    """Fleet-health findings, earliest first: what, where, when, how sure, and why."""
    title = "Fleet health findings"
    if start is not None:
        title += f" since {start.isoformat(timespec='minutes')} UTC"
    table = Table(title=title, show_lines=True)
    for header in ("start (UTC)", "end", "kind", "scope", "confidence", "summary", "evidence"):
        table.add_column(header)
    for f in findings:
        table.add_row(
            f.start.isoformat(timespec="minutes"),
            "ongoing" if f.end is None else f.end.isoformat(timespec="minutes"),
            f.kind.value,
            f"{f.scope_unit.value} {f.scope}",
            f"{f.confidence:.0%}",
            f.summary + (f"\nsuggestion: {f.suggestion}" if f.suggestion else ""),
            _evidence_text(f),
        )
    if not findings:
        table.caption = "no findings: none of the failure modes shows in this window"
    return table
