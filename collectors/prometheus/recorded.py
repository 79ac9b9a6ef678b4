"""Recorded SLI import: the series a fleet's Prometheus-compatible server (Prometheus, Thanos,
Mimir, VictoriaMetrics with vmalert) recorded from `servewatch rules sli`, read as stored into
`recorded_points`.

Only the records that are SLIs are read (`pipeline.recorded_sli.record_catalogue`: quantiles,
rates, ratios and means per replica, pool and pool and model; not the bucket rates), found with
the label-values API over the window, then record by record in time chunks as range vectors
(`{__name__="x"}[d]`): the values at the instants the rules were evaluated, never re-sampled.
Their labels are kept as they are (the level's labels, plus whatever the server adds), because
an aggregate belongs to no target. Importing a range twice adds nothing; an import cut short
keeps the chunks it wrote, and a rerun fills in the rest. A failed query raises
`PrometheusApiError`; malformed series or points and server warnings are recorded in
`ingest_errors` and the rest is kept, as the raw import does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.collectors.metrics.catalogue import labels_json
from servewatch.collectors.prometheus.api import Matrix, PrometheusApi, promql_string
from servewatch.collectors.prometheus.reader import (
    Chunk,
    ImportWindow,
    Resolution,
    import_chunks,
    read_raw,
)
from servewatch.collectors.traces.ingest import Reject, rejects_frame
from servewatch.pipeline.recorded_sli import record_catalogue
from servewatch.pipeline.tables import RECORDED_POINTS_SCHEMA
from servewatch.store import Store


@dataclass(frozen=True)
class RecordedImportReport:
    """What a recorded import read and wrote: the records found, chunks and queries made,
    series and points read, points new to the store, and what was left out or warned about."""

    url: str
    records: tuple[str, ...]
    chunks: int
    queries: int
    series_read: int
    points_read: int
    new_points: int
    problems: tuple[Reject, ...]


def recorded_names(api: PrometheusApi, *, window: ImportWindow) -> tuple[str, ...]:
    """The SLI records that have series in the window, sorted."""
    present = api.label_values("__name__", start_ms=window.start_ms, end_ms=window.end_ms)
    names = pl.LazyFrame({"record": sorted(present)}, schema={"record": pl.String()})
    found = record_catalogue(names).select("record").collect().get_column("record")
    return tuple(sorted(found.to_list()))


def recorded_rows(matrix: Matrix, *, source: str, chunk: Chunk) -> pl.DataFrame:
    """One answer's samples within [chunk start, chunk end) as `recorded_points` rows."""
    records: list[str] = []
    labels: list[str] = []
    ts_ms: list[int] = []
    values: list[float] = []
    for series in matrix.series:
        record = series.labels.get("__name__", "")
        text = labels_json({k: v for k, v in series.labels.items() if k != "__name__"})
        # A range vector reaches a millisecond before the chunk (`read_raw`) and up to its
        # end, which belongs to the next chunk.
        for at_ms, value in zip(series.timestamps_ms, series.values, strict=True):
            if chunk.holds(at_ms):
                records.append(record)
                labels.append(text)
                ts_ms.append(at_ms)
                values.append(value)
    return pl.DataFrame(
        {"source": source, "record": records, "labels": labels, "ts_ms": ts_ms, "value": values},
        schema={
            "source": pl.String(),
            "record": pl.String(),
            "labels": pl.String(),
            "ts_ms": pl.Int64(),
            "value": pl.Float64(),
        },
    ).select(
        "source",
        "record",
        "labels",
        ts=pl.from_epoch(pl.col("ts_ms"), time_unit="ms").cast(pl.Datetime("us")),
        value="value",
    )


def import_recorded(
    api: PrometheusApi,
    *,
    store: Store,
    window: ImportWindow,
    records: Sequence[str] | None = None,
    on_query: Callable[[int], None] | None = None,
) -> RecordedImportReport:
    """Read the SLI records (`records`, default: those `recorded_names` finds) over `window`
    into `store`, chunk by chunk; `on_query(1)` after each query. The window's resolution
    must be raw: a recorded series is already one value per evaluation."""
    if window.resolution is not Resolution.RAW:
        raise ValueError(
            "recorded series are read as stored (resolution raw): each sample is one rule "
            f"evaluation, got resolution {window.resolution.value}"
        )
    names = tuple(records) if records is not None else recorded_names(api, window=window)
    chunks = import_chunks(window) if names else []
    queries = series_read = points_read = new_points = 0
    problems: list[Reject] = []
    for chunk in chunks:
        frames: list[pl.DataFrame] = []
        rejects: list[Reject] = []
        for record in names:
            matrix = read_raw(api, f"{{__name__={promql_string(record)}}}", chunk=chunk)
            queries += 1
            series_read += len(matrix.series)
            rows = recorded_rows(matrix, source=api.base_url, chunk=chunk)
            points_read += rows.height
            frames.append(rows)
            rejects += [
                Reject(api.base_url, f"{chunk.label()} {p.location}", p.message)
                for p in matrix.problems
            ]
            if on_query is not None:
                on_query(1)
        chunk_rows = pl.concat(frames).cast(RECORDED_POINTS_SCHEMA)
        new_points += store.write_recorded_points(chunk_rows)
        if rejects:
            store.write_ingest_errors(rejects_frame(rejects, recorded_ts=store.now()))
        problems += rejects
    return RecordedImportReport(
        url=api.base_url,
        records=names,
        chunks=len(chunks),
        queries=queries,
        series_read=series_read,
        points_read=points_read,
        new_points=new_points,
        problems=tuple(problems),
    )
