"""The SLI report: request SLIs per replica and overall, as one JSON-ready document."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from pipeline.request_sli import LATENCY_SLIS, PERCENTILES, GoodputLimits, request_slis
from pipeline.store import Store
from servewatch.instants import format_instant

COUNT_FIELDS = (
    "requests",
    "failed_requests",
    "good_requests",
    "attainment_ratio",
    "goodput_rps",
    "throughput_rps",
    "prompt_tokens",
    "completion_tokens",
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {name: row[name] for name in COUNT_FIELDS}
    for sli in LATENCY_SLIS:
        stem = sli.removesuffix("_s")
        out[sli] = {f"p{p}": row[f"{stem}_p{p}_s"] for p in PERCENTILES}
        out[sli]["samples"] = row[f"{stem}_samples"]
    return out


def build_sli_report(
    store: Store,
    *,
    limits: GoodputLimits,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
) -> dict[str, Any]:
    """SLIs of requests that finished in [from_ts, to_ts), per replica and for the fleet.

    The window length for rates is to_ts - from_ts when both are given, else the span from
    the first arrival to the last completion of the selected requests.
    """
    window_s = (to_ts - from_ts).total_seconds() if from_ts and to_ts else None
    requests = store.read_requests(from_ts=from_ts, to_ts=to_ts)
    # Both summaries share one scan of the requests; collect_all runs them together.
    overall, per_replica = pl.collect_all(
        [
            request_slis(requests, limits=limits, window_s=window_s),
            request_slis(requests, limits=limits, window_s=window_s, by=["replica"]),
        ]
    )
    overall_row = overall.row(0, named=True)
    return {
        "window": {
            "from": format_instant(from_ts),
            "to": format_instant(to_ts),
            "window_s": overall_row["window_s"],
        },
        "limits": {
            "ttft_ms": _ms(limits.ttft_s),
            "tpot_ms": _ms(limits.tpot_s),
            "e2e_ms": _ms(limits.e2e_s),
        },
        "overall": _row_to_json(overall_row),
        "replicas": [
            {"replica": row["replica"], **_row_to_json(row)}
            for row in per_replica.iter_rows(named=True)
        ],
    }
