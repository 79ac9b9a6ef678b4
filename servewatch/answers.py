"""Answers: the JSON documents the reading commands print with `--json` and the `run` service's
API answers, each built by one function from the store, so the two cannot drift apart.

`servewatch slo status --json` and `GET /api/v1/slo` are the same document (evaluated at the
same instant: `--at`, else the end of the data), as are `alerts` and `/api/v1/alerts`, and
`recommend --last` and `/api/v1/recommendation`, and one store's part of `status` and
`/api/v1/status`. `sli` and `health` compute theirs from a store
window (`sli_answer`, `health_answer`), which a reading command reads from the store or, while
the service holds it, from the service's `/api/v1/window`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

import polars as pl

from servewatch.health_service import finding_json, health_findings, health_window
from servewatch.pipeline.instants import format_instant, parse_instant
from servewatch.pipeline.recorded_sli import recorded_at, recorded_groups
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, build_sli_report
from servewatch.pipeline.window import Window
from servewatch.render import change_json
from servewatch.slo.alert_state import AlertState, changes_from_frame
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import EvaluationInstant, InstantBasis, evaluation_instant, status_at
from servewatch.store import Store, utc_now


class NoRecommendationError(LookupError):
    """The store holds no recommendation yet."""


def slo_answer(
    store: Store, *, specs: Sequence[SloSpec], at: datetime | None, now: datetime | None = None
) -> dict[str, Any]:
    """`slo status --json`: every SLO's budget, burn rates and alert state at `at` (None: the
    end of the data the SLOs read), and which instant was evaluated and why."""
    moment = evaluation_instant(store, specs=specs, at=at, now=now or utc_now())
    statuses = status_at(store, specs=specs, at=moment.at)
    return {
        "at": format_instant(moment.at),
        "evaluated": moment.to_json(),
        "slos": [s.to_json() for s in statuses],
    }


def alerts_answer(
    store: Store, *, at: datetime | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """`alerts --json`: the alert state history up to `at` (None: the end of the stored data)
    and the alerts firing then."""
    moment = evaluation_instant(store, specs=(), at=at, now=now or utc_now())
    recorded = changes_from_frame(store.read_alert_changes().collect())
    changes = sorted(
        (c for c in recorded if c.changed_ts <= moment.at),
        key=lambda c: (c.changed_ts, c.key.sort_key()),
    )
    latest = {c.key: c for c in changes}
    firing = [c for c in latest.values() if c.state is AlertState.FIRING]
    return {
        "at": format_instant(moment.at),
        "evaluated": moment.to_json(),
        "alerts": [change_json(c) for c in changes],
        "firing": [change_json(c) for c in sorted(firing, key=lambda c: c.key.sort_key())],
    }


def described(document: dict[str, Any]) -> str:
    """The sentence naming the instant an answer's `evaluated` part was evaluated at."""
    evaluated = document["evaluated"]

    def moment(text: str | None) -> datetime | None:
        return None if text is None else parse_instant(text)

    at = moment(evaluated["at"])
    assert at is not None
    return EvaluationInstant(
        at=at,
        basis=InstantBasis(evaluated["basis"]),
        requested=moment(evaluated["requested"]),
        data_end=moment(evaluated["data_end"]),
    ).describe()


def recommendation_answer(store: Store) -> dict[str, Any]:
    """`recommend --last --json`: the decision record of the last stored recommendation, as
    `recommend --json` printed it."""
    last = store.read_recommendations().collect().tail(1)
    if last.height == 0:
        raise NoRecommendationError(
            "no recommendation stored yet: `servewatch recommend --requirement FILE` or the "
            "service's [jobs] requirement makes one"
        )
    document: dict[str, Any] = json.loads(last.item(0, "record"))
    return document


def sli_answer(
    window: Window,
    *,
    limits: GoodputLimits,
    by: Grouping,
    step: timedelta | None,
    source: SliSource,
    families: Sequence[str],
) -> dict[str, Any]:
    """`sli --json` of a window."""
    return build_sli_report(
        window, limits=limits, by=by, step=step, source=source, families=tuple(families)
    )


def recorded_sli_answer(
    store: Store, *, at: datetime | None, level: str, lookback_s: float
) -> dict[str, Any]:
    """`sli --recorded --json`: the recorded SLIs of one level (`replica`, `pool`,
    `pool_model`) at `at` (None: the newest recorded evaluation), each series' latest sample
    no older than `lookback_s`; `at` is null and `groups` empty when nothing is recorded."""
    if at is None:
        newest = store.read_recorded_points().select(pl.col("ts").max()).collect().item()
        at = newest if isinstance(newest, datetime) else None
    document: dict[str, Any] = {
        "source": "recorded",
        "by": level,
        "at": format_instant(at),
        "lookback_s": lookback_s,
        "groups": [],
    }
    if at is None:
        return document
    points = store.read_recorded_points(from_ts=at - timedelta(seconds=lookback_s), to_ts=at)
    rows = recorded_at(points, at_ts=at, lookback_s=lookback_s).collect()
    document["groups"] = [
        {**group, "at": format_instant(group["at"])} for group in recorded_groups(rows, level=level)
    ]
    return document


def health_answer(
    window: Window,
    *,
    version_label: str,
    zone_loss_in_scope: bool,
    specs: Sequence[SloSpec] = (),
) -> tuple[dict[str, Any], bool]:
    """`health --json` of a window, and whether the window held anything to examine.
    ValueError: the window or the version label cannot be examined."""
    bounds = health_window(window)
    findings = health_findings(
        window, version_label=version_label, zone_loss_in_scope=zone_loss_in_scope, specs=specs
    )
    document = {
        "from": format_instant(bounds[0]) if bounds else None,
        "to": format_instant(bounds[1]) if bounds else None,
        "version_label": version_label,
        "findings": [finding_json(f) for f in findings],
    }
    return document, bounds is not None


# A collector that stored no scrape for this long has stopped (Prometheus' staleness, 5 m).
DEFAULT_STALE_AFTER_S = 300.0


class StoreVerdict(Enum):
    """A store's verdict in `servewatch status`."""

    OK = "ok"
    DEGRADED = "degraded"  # some of the targets it scrapes lately failed their last scrape
    STALE = "stale"  # it holds targets but nothing was scraped lately: its collector stopped
    EMPTY = "empty"  # it holds no targets


def status_answer(store: Store, *, stale_after_s: float, now: datetime) -> dict[str, Any]:
    """`status --json` for one store: its targets scraped since `now - stale_after_s` (the
    ones its collector scrapes now), which of them failed their last scrape, what it stored
    last, and the verdict."""
    since = now - timedelta(seconds=stale_after_s)
    targets = store.read_target_status(since=since)
    recent = targets.filter(pl.col("scrapes_since") > 0)
    failing = recent.filter(~pl.col("last_ok"))
    points, requests = store.points_range(), store.requests_range()
    last_scrape = targets["last_scrape_ts"].max()
    if targets.height == 0:
        verdict = StoreVerdict.EMPTY
    elif recent.height == 0:
        verdict = StoreVerdict.STALE
    else:
        verdict = StoreVerdict.DEGRADED if failing.height else StoreVerdict.OK
    return {
        "at": format_instant(now),
        "stale_after_s": stale_after_s,
        "verdict": verdict.value,
        "targets": targets.height,
        "targets_scraped": recent.height,
        "targets_failing": [
            {"target_id": row["target_id"], "kind": row["kind"], "error": row["last_error"]}
            for row in failing.iter_rows(named=True)
        ],
        "scraped_target_ids": recent["target_id"].to_list(),
        "scrapes": int(recent["scrapes_since"].sum()),
        "failed_scrapes": int(recent["failed_since"].sum()),
        "last_scrape": None if last_scrape is None else format_instant(last_scrape),  # type: ignore[arg-type]
        "last_point": None if points is None else format_instant(points[1]),
        "last_request": None if requests is None else format_instant(requests[1]),
    }
