"""A page: one scrape of one target as the ingest takes it, and the scrape row it leaves.

The row says whether the scrape answered and parsed cleanly, how many samples it stored, what
went wrong (the fetch's error, a kind that could not be told, the first malformed lines) and
the kind its page was catalogued as.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from servewatch.collectors.metrics.exposition import LineError
from servewatch.collectors.metrics.page_kind import PageKind
from servewatch.collectors.scrape.targets import Target

MAX_ERRORS_IN_SCRAPE_ROW = 3


@dataclass(frozen=True)
class Page:
    """One scrape of one target: the body when it was fetched, else the fetch error."""

    target: Target
    scrape_ts: datetime  # naive UTC
    body: str | None
    duration_s: float | None = None
    openmetrics: bool | None = None  # None: decide from the page
    error: str | None = None


def scrape_row(
    page: Page,
    errors: Sequence[LineError],
    kind: PageKind | None,
    stored: int,
) -> tuple[object, ...]:
    target_id = page.target.target_id
    if page.body is None or kind is None:
        error = page.error or "no page"
        return (target_id, page.scrape_ts, False, page.duration_s, 0, error, None)
    noted = [kind.error] if kind.error else []
    if errors:
        noted.append(_scrape_error(errors))
    return (
        target_id,
        page.scrape_ts,
        not noted,
        page.duration_s,
        stored,
        "; ".join(noted) or None,
        None if kind.kind is None else kind.kind.value,
    )


def _scrape_error(errors: Sequence[LineError]) -> str:
    shown = "; ".join(str(e) for e in errors[:MAX_ERRORS_IN_SCRAPE_ROW])
    more = len(errors) - MAX_ERRORS_IN_SCRAPE_ROW
    suffix = f"; and {more} more" if more > 0 else ""
    return f"{len(errors)} malformed line(s) left out: {shown}{suffix}"
