"""The live page: the report of the store as it stands, served by `servewatch run` at `/`.

Building the report reads the whole store, so it is built when asked for and kept until the
store's data moves on: the page's key is the rollup watermarks and the last scraped minute,
brought up to date by the service each time its evaluation job has rolled the store up. A
request between two such moves is answered from the kept page; concurrent requests for a stale
page wait for one build.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servewatch.dashboards.export import chart_specs, report_html, spec_json
from servewatch.report_service import store_report
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import limits_of
from servewatch.store import Store


@dataclass(frozen=True)
class PageKey:
    """What the page was built from: the rollups' watermarks and the last scraped minute."""

    request_minutes_ts: datetime | None
    slo_minutes_ts: datetime | None
    last_point_minute: datetime | None


@dataclass(frozen=True)
class BuiltPage:
    html: str
    specs: Mapping[str, str]  # slug -> the chart's Vega-Lite JSON, as `report` writes it
    key: Hashable

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.html.encode("utf-8")).hexdigest()[:32] + '"'


def page_key(store: Store) -> PageKey:
    span = store.points_range()
    return PageKey(
        request_minutes_ts=store.watermark("request_minutes")[0],
        slo_minutes_ts=store.watermark("slo_minutes")[0],
        last_point_minute=None if span is None else span[1].replace(second=0, microsecond=0),
    )


def build_page(store: Store, *, key: Hashable, specs: Sequence[SloSpec]) -> BuiltPage:
    """The report page of the whole store with the verdicts of `specs` (no images: the page
    draws its charts itself)."""
    report = store_report(store, limits=limits_of(specs), specs=specs)
    charts: dict[str, dict[str, Any]] = chart_specs(report)
    return BuiltPage(
        html=report_html(report, charts),
        specs={slug: spec_json(spec) for slug, spec in charts.items()},
        key=key,
    )


class LivePage:
    """The kept page and the key the store is at; `page()` rebuilds only when they differ."""

    def __init__(self, build: Callable[[Hashable], BuiltPage]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._page: BuiltPage | None = None
        self._key: Hashable = None

    def moved(self, key: Hashable) -> None:
        """The store is at `key` now (the evaluation job says so after each roll-up)."""
        self._key = key

    def page(self) -> BuiltPage:
        with self._lock:
            key = self._key
            if self._page is None or self._page.key != key:
                self._page = self._build(key)
            return self._page

    @property
    def builds_key(self) -> Hashable:
        """The key of the kept page (None before the first build)."""
        return None if self._page is None else self._page.key
