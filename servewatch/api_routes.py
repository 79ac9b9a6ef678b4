"""The local API's routes: each `/api/v1/<name>` request's parameters read as the matching
command reads its options, then answered with that command's `--json` document
(`servewatch.answers`).

Parameters mirror the options: `sli` takes from, to, ttft_ms, tpot_ms, e2e_ms, by, window,
source and metric (repeatable); `health` takes from, to, version_label and zone_loss; `slo`
takes at and slo (repeatable: the SLOs to answer for, by name; all the service evaluates when
none); `alerts` takes at; `recommendation` none; `status` takes stale_after_s. Store reads
run on the writer's thread between writes; what is computed from a window runs on the
request's own thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from servewatch.answers import (
    DEFAULT_STALE_AFTER_S,
    NoRecommendationError,
    alerts_answer,
    health_answer,
    recommendation_answer,
    sli_answer,
    slo_answer,
    status_answer,
)
from servewatch.health.rollout_comparison import VersionLabelError
from servewatch.health_service import DEFAULT_VERSION_LABEL
from servewatch.pipeline.instants import parse_duration, parse_instant
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, points_window
from servewatch.pipeline.window import Window, WindowQuery
from servewatch.scraping import TargetHealth, collector_status
from servewatch.service_http import ApiInputError, ApiMissingError, Params, one, only
from servewatch.slo.spec import SloSpec
from servewatch.store import Store

T = TypeVar("T")
# Runs a function of the store on the writer's thread and returns what it returns.
StoreCall = Callable[[Callable[[Store], Any]], Any]


def _instant(params: Params, name: str) -> datetime | None:
    text = one(params, name)
    if text is None:
        return None
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise ApiInputError(f"{name}: {exc}") from exc


def _limit_s(params: Params, name: str) -> float | None:
    text = one(params, name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise ApiInputError(f"{name}: {text!r} is not a number of milliseconds") from exc
    if not value > 0:
        raise ApiInputError(f"{name} must be a positive number of milliseconds, got {text}")
    return value / 1000.0


def _choice(params: Params, name: str, kind: type[T], default: T) -> T:
    text = one(params, name)
    if text is None:
        return default
    try:
        return kind(text)  # type: ignore[call-arg]
    except ValueError as exc:
        allowed = [m.value for m in kind]  # type: ignore[attr-defined]
        raise ApiInputError(f"{name}: {text!r} is not one of {allowed}") from exc


def _span(params: Params) -> tuple[datetime | None, datetime | None]:
    from_ts, to_ts = _instant(params, "from"), _instant(params, "to")
    if from_ts and to_ts and to_ts <= from_ts:
        raise ApiInputError(f"to ({to_ts.isoformat()}) must be after from ({from_ts.isoformat()})")
    return from_ts, to_ts


class ApiRoutes:
    """Answers by route name; `specs` gives the SLOs the service evaluates now."""

    def __init__(
        self,
        *,
        call: StoreCall,
        specs: Callable[[], tuple[SloSpec, ...]],
        target_health: TargetHealth | None = None,
        now_s: Callable[[], float] = time.time,
    ) -> None:
        self.call = call
        self.specs = specs
        # The serving collector's targets: `status` adds its shard and /healthz.
        self.target_health = target_health
        self.now_s = now_s

    def answer(self, name: str, params: Params) -> dict[str, Any]:
        routes: dict[str, Callable[[Params], dict[str, Any]]] = {
            "sli": self.sli,
            "slo": self.slo,
            "alerts": self.alerts,
            "health": self.health,
            "recommendation": self.recommendation,
            "status": self.status,
        }
        route = routes.get(name)
        if route is None:
            raise ApiMissingError(f"no such answer; the API answers {sorted(routes)} and window")
        return route(params)

    def _window(self, query: WindowQuery) -> Window:
        window: Window = self.call(lambda store: store.read_query(query))
        return window

    def sli(self, params: Params) -> dict[str, Any]:
        only(
            params,
            ("from", "to", "ttft_ms", "tpot_ms", "e2e_ms", "by", "window", "source", "metric"),
        )
        from_ts, to_ts = _span(params)
        limits = GoodputLimits(
            ttft_s=_limit_s(params, "ttft_ms"),
            tpot_s=_limit_s(params, "tpot_ms"),
            e2e_s=_limit_s(params, "e2e_ms"),
        )
        step_text = one(params, "window")
        try:
            step = None if step_text is None else parse_duration(step_text)
        except ValueError as exc:
            raise ApiInputError(f"window: {exc}") from exc
        window = self._window(WindowQuery(from_ts, to_ts, **points_window(step)))
        return sli_answer(
            window,
            limits=limits,
            by=_choice(params, "by", Grouping, Grouping.REPLICA),
            step=step,
            source=_choice(params, "source", SliSource, SliSource.BOTH),
            families=params.get("metric", []),
        )

    def health(self, params: Params) -> dict[str, Any]:
        only(params, ("from", "to", "version_label", "zone_loss"))
        from_ts, to_ts = _span(params)
        zone_loss = one(params, "zone_loss")
        if zone_loss not in (None, "true", "false"):
            raise ApiInputError(f"zone_loss: {zone_loss!r} is not true or false")
        window = self._window(WindowQuery(from_ts, to_ts))
        try:
            document, _ = health_answer(
                window,
                version_label=one(params, "version_label") or DEFAULT_VERSION_LABEL,
                zone_loss_in_scope=zone_loss != "false",
                specs=self.specs(),
            )
        except (ValueError, VersionLabelError) as exc:
            raise ApiInputError(str(exc)) from exc
        return document

    def slo(self, params: Params) -> dict[str, Any]:
        only(params, ("at", "slo"))
        at = _instant(params, "at")
        specs = self.specs()
        if not specs:
            raise ApiMissingError("the service's configuration names no SLO files ([slo] files)")
        wanted = params.get("slo") or [s.name for s in specs]
        known = {s.name: s for s in specs}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise ApiMissingError(
                f"the service does not evaluate {unknown}; it evaluates {sorted(known)} "
                "(its configuration's [slo] files)"
            )
        chosen = tuple(known[name] for name in wanted)
        answer: dict[str, Any] = self.call(lambda store: slo_answer(store, specs=chosen, at=at))
        return answer

    def alerts(self, params: Params) -> dict[str, Any]:
        only(params, ("at",))
        at = _instant(params, "at")
        answer: dict[str, Any] = self.call(lambda store: alerts_answer(store, at=at))
        return answer

    def status(self, params: Params) -> dict[str, Any]:
        only(params, ("stale_after_s",))
        text = one(params, "stale_after_s") or repr(DEFAULT_STALE_AFTER_S)
        try:
            stale_after_s = float(text)
        except ValueError as exc:
            raise ApiInputError(f"stale_after_s: {text!r} is not a number of seconds") from exc
        if not stale_after_s > 0:
            raise ApiInputError(f"stale_after_s must be a positive number of seconds, got {text}")
        now = datetime.fromtimestamp(self.now_s(), UTC).replace(tzinfo=None)
        answer: dict[str, Any] = self.call(
            lambda store: status_answer(store, stale_after_s=stale_after_s, now=now)
        )
        health = self.target_health
        collector = None if health is None else collector_status(health)
        return answer | {"collector": collector}

    def recommendation(self, params: Params) -> dict[str, Any]:
        only(params, ())
        try:
            answer: dict[str, Any] = self.call(recommendation_answer)
        except NoRecommendationError as exc:
            raise ApiMissingError(str(exc)) from exc
        return answer
