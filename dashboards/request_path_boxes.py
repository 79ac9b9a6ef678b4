"""Request path boxes: the gateway (failed, rate-limited and aborted requests) and the router
(load skew across replicas, prefix affinity), from traced requests, finish reasons and the
prefix-cache counters.

Thresholds are starting points a reader checks against the number printed beside each state.
"""

from __future__ import annotations

import re

import polars as pl

from servewatch.dashboards.box_signal import (
    NAMES_LISTED,
    Box,
    BoxFrames,
    BoxSignal,
    BoxState,
    finding_text,
    findings_of,
    has_rows,
    verdict,
)
from servewatch.dashboards.load_balance import window_shares
from servewatch.health.finding import FindingKind

FAILED_RATIO_DEGRADED = 0.01
RATE_LIMITED_RATIO_DEGRADED = 0.01
ABORTED_RATIO_DEGRADED = 0.05
# The busiest replica's share over the even share 1/n, and the quietest's.
LOAD_SKEW_DEGRADED = 1.5
LOAD_FLOOR_DEGRADED = 0.5
HTTP_STATUS = re.compile(r"^[1-5][0-9][0-9]$")
RATE_LIMITED = "429"


# -- gateway --------------------------------------------------------------------------------------


def gateway_signals(frames: BoxFrames) -> list[BoxSignal]:
    box, requests = Box.GATEWAY, frames.requests
    if not has_rows(requests):
        why = "no traced requests in the window (servewatch ingest traces, or OTLP to run)"
        return [
            BoxSignal(box, "failed requests", BoxState.NO_SIGNAL, "-", why),
            BoxSignal(box, "rate limited (HTTP 429)", BoxState.NO_SIGNAL, "-", why),
            _aborted(frames),
        ]
    assert requests is not None
    total = requests.height
    failed = requests.filter(~pl.col("ok"))
    types = (
        failed.group_by(kind=pl.col("error_type").fill_null("unnamed"))
        .agg(pl.len().alias("n"))
        .sort("n", "kind", descending=[True, False])
    )
    named = ", ".join(f"{r['kind']} {r['n']:,}" for r in types.head(NAMES_LISTED).to_dicts())
    ratio = failed.height / total
    signals = [
        BoxSignal(
            box,
            "failed requests",
            verdict(ratio > FAILED_RATIO_DEGRADED),
            f"{failed.height:,} of {total:,} ({ratio:.2%})" + (f": {named}" if named else ""),
            "traced requests whose span failed / all traced requests, by error.type; "
            f"degraded above {FAILED_RATIO_DEGRADED:.0%}",
        )
    ]
    statuses = requests["error_type"].drop_nulls()
    http = statuses.filter(statuses.str.contains(HTTP_STATUS.pattern))
    if http.is_empty():
        signals.append(
            BoxSignal(
                box,
                "rate limited (HTTP 429)",
                BoxState.NO_SIGNAL,
                "-",
                "no traced request names an HTTP status in error.type: the engine's spans "
                "never see a gateway's rejections; a gateway's own spans would",
            )
        )
    else:
        limited = int((http == RATE_LIMITED).sum())
        share = limited / total
        signals.append(
            BoxSignal(
                box,
                "rate limited (HTTP 429)",
                verdict(share > RATE_LIMITED_RATIO_DEGRADED),
                f"{limited:,} of {total:,} ({share:.2%})",
                "traced requests whose error.type is 429 / all traced requests; degraded "
                f"above {RATE_LIMITED_RATIO_DEGRADED:.0%}",
            )
        )
    signals.append(_aborted(frames))
    return signals


def _aborted(frames: BoxFrames) -> BoxSignal:
    reasons = frames.finish_reasons
    if not has_rows(reasons):
        return BoxSignal(
            Box.GATEWAY,
            "aborted by clients",
            BoxState.NO_SIGNAL,
            "-",
            "needs vLLM's request_success_total by finished_reason (spans carry no abort)",
        )
    assert reasons is not None
    total = float(reasons["requests"].sum())
    aborted = float(reasons.filter(pl.col("finished_reason") == "abort")["requests"].sum())
    share = aborted / total if total > 0 else 0.0
    return BoxSignal(
        Box.GATEWAY,
        "aborted by clients",
        verdict(share > ABORTED_RATIO_DEGRADED),
        f"{aborted:,.0f} of {total:,.0f} finished requests ({share:.2%})",
        "increase of request_success_total{finished_reason=abort} / of all finished "
        f"requests; degraded above {ABORTED_RATIO_DEGRADED:.0%}",
    )


# -- router ---------------------------------------------------------------------------------------


def _hit_rates(prefix: pl.DataFrame) -> pl.DataFrame:
    return (
        prefix.group_by("replica")
        .agg(pl.col("hits_tokens").sum(), pl.col("queries_tokens").sum())
        .filter(pl.col("queries_tokens") > 0)
        .with_columns(rate=pl.col("hits_tokens") / pl.col("queries_tokens"))
    )


def router_signals(frames: BoxFrames) -> list[BoxSignal]:
    box, minutes = Box.ROUTER, frames.request_minutes
    signals = []
    rows = (
        None
        if minutes is None
        else minutes.filter(pl.col("replica").is_not_null() & (pl.col("requests") > 0))
    )
    if rows is None or rows.is_empty():
        signals.append(
            BoxSignal(
                box,
                "load skew",
                BoxState.NO_SIGNAL,
                "-",
                "needs traced requests per replica (servewatch ingest traces)",
            )
        )
    else:
        shares = window_shares(rows)
        even = 1.0 / shares.height
        top = shares.sort("requests_share", "replica", descending=[True, False]).row(0, named=True)
        low = shares.sort("requests_share", "replica").row(0, named=True)
        high_x, low_x = top["requests_share"] / even, low["requests_share"] / even
        signals.append(
            BoxSignal(
                box,
                "load skew",
                verdict(high_x > LOAD_SKEW_DEGRADED or low_x < LOAD_FLOOR_DEGRADED),
                f"busiest {top['replica']} {high_x:.2f}x even, quietest {low['replica']} "
                f"{low_x:.2f}x even ({shares.height} replicas)",
                "each replica's share of the window's traced requests over the even share "
                f"1/n; degraded above {LOAD_SKEW_DEGRADED}x or below {LOAD_FLOOR_DEGRADED}x",
            )
        )
    prefix = frames.prefix_cache
    rates = None if prefix is None else _hit_rates(prefix)
    if rates is None or rates.is_empty():
        signals.append(
            BoxSignal(
                box,
                "prefix affinity",
                BoxState.NO_SIGNAL,
                "-",
                "needs vLLM's prefix_cache_hits and prefix_cache_queries counters",
            )
        )
        return signals
    lost = findings_of(frames, (FindingKind.AFFINITY_LOSS,))
    lowest = rates.sort("rate", "replica").row(0, named=True)
    highest = rates.sort("rate", "replica", descending=[True, False]).row(0, named=True)
    value = (
        f"hit rate by replica {lowest['rate']:.1%} ({lowest['replica']}) to "
        f"{highest['rate']:.1%} ({highest['replica']})"
    )
    how = (
        "prefix-cache hits / queries per replica over the window (a wide spread is a router "
        "that does not keep prefixes together); degraded when the affinity-loss detector "
        "found a drop"
    )
    if frames.findings is None:
        how += " (detectors not run)"
    elif lost:
        value += f"; affinity loss: {finding_text(lost)}"
    signals.append(BoxSignal(box, "prefix affinity", verdict(bool(lost)), value, how))
    return signals
