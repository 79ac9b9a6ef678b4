"""Prometheus import: a fleet's series read from Prometheus, Thanos or Mimir into the store.

For fleets that already keep their metrics in Prometheus. The catalogued families present in
the range are found with the label-values API (both `vllm:` and `vllm_` spellings, old
aliases, DCGM names before and after 4.9.0), then read family by family, in time chunks, into
the same `targets`, `scrapes`, `series` and `points` rows a live scrape writes:

- `Resolution.RAW` (the default) reads range vectors (`{__name__="x"}[d]`): the samples as
  stored, at their scrape timestamps. PromQL functions over these agree with Prometheus's own
  answers exactly.
- `Resolution.STEP` reads `query_range` at instants on a grid of `step_s` (aligned to multiples
  of the step, so overlapping imports share instants), at most `chunk_points` per series per
  query, below Prometheus's 11,000. Values are what Prometheus answers at each instant: the
  latest sample within its lookback (5 minutes by default), stamped with the instant, so rates,
  quantiles and means over them drift from PromQL's (docs/prometheus-import.md has the
  measured error).

Labels: `job` and `instance` name the target (its id is `http://<instance>/metrics` when the
instance is an address, as a servewatch scrape of it would name it); `replica`, `host`,
`zone`, `model`, `pool` and `gpus` (a fleet's relabelling) and `kind` (servewatch's file_sd
convention) fill the target's row. All of these are left out of the series labels, because a
scrape of the page itself would not see them; the remaining labels are the page's own and go
through the catalogue as scraped ones do. A vLLM target without `replica` whose series name
a `pod` and `namespace` (a Kubernetes service discovery's relabelling) is the replica
`<namespace>/<pod>`, as a scrape target labelled so is; those two labels stay on the series.
A series's kind is its `kind` label, else the catalogue that knows its name, else its
target's kind.

Every instant (STEP) or scrape timestamp (RAW) of a target becomes a scrape; `up == 0` at an
instant records a failed one, and a NaN at an instant its target was not scraped (`up == 1`
absent) is a staleness marker, not a value: VictoriaMetrics returns them in range vectors, and
they are left out and counted. Scrapes already stored are skipped with their samples, so
importing a range twice leaves the tables as they were. Malformed series or points in an
answer, and server warnings, are recorded in `ingest_errors` and the rest is kept; a failed
query stops the import with `PrometheusApiError` (chunks written before it stay written, and a
rerun fills in the rest).

Size: over 500 lines on purpose: the import plan, its chunks and both resolutions (step, raw)
write the same rows and resume the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum

import polars as pl

from servewatch.collectors.metrics.catalogue import (
    CREATED_SUFFIX,
    Disposition,
    catalogue_frame,
    labels_json,
)
from servewatch.collectors.metrics.page_kind import CATALOGUES, KIND_PREFIXES
from servewatch.collectors.prometheus.api import (
    MAX_POINTS_PER_SERIES,
    AnswerProblem,
    Matrix,
    PrometheusApi,
    promql_string,
)
from servewatch.collectors.scrape.targets import (
    Target,
    TargetKind,
    gpu_uuid_list,
    targets_frame,
)
from servewatch.collectors.traces.ingest import Reject, rejects_frame
from servewatch.pipeline.tables import SAMPLES_SCHEMA, SCRAPES_SCHEMA, UNKNOWN_FAMILIES_SCHEMA
from servewatch.store import Store

DEFAULT_CHUNK_POINTS = 720  # three hours of 15 s steps per query
KIND_LABEL = "kind"
TARGET_LABELS = ("replica", "host", "zone", "model", "pool", "gpus", "gpu_uuids")
IDENTITY_LABELS = ("job", "instance")
NOT_SERIES_LABELS = frozenset({"__name__", KIND_LABEL, *IDENTITY_LABELS, *TARGET_LABELS})
UP = "up"
# Series Prometheus writes about each scrape itself, not the target's page.
_SYNTHETIC_PREFIX = "scrape_"
_ADDRESS_RE = re.compile(r"[^/\s]+:[0-9]+")
_PAGE = ["target_id", "scrape_ts"]

_EPOCH = datetime(1970, 1, 1)


class Resolution(Enum):
    """How values are read: at step instants (`query_range`) or as stored (range vectors)."""

    STEP = "step"
    RAW = "raw"


def to_ms(moment: datetime) -> int:
    """A naive UTC (or aware) datetime as Unix milliseconds."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


@dataclass(frozen=True)
class ImportWindow:
    """What to import: [start, end) (naive UTC), the step, resolution and chunk size.

    In RAW mode `step_s` is the expected scrape interval: chunks hold `chunk_points` of them.
    """

    start: datetime
    end: datetime
    step_s: float = 15.0
    resolution: Resolution = Resolution.RAW
    chunk_points: int = DEFAULT_CHUNK_POINTS

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(
                f"the end ({self.end.isoformat()}Z) must be after the start "
                f"({self.start.isoformat()}Z)"
            )
        if not self.step_s >= 0.001 or self.step_ms / 1000 != self.step_s:
            raise ValueError(
                f"step must be a positive whole number of milliseconds, got {self.step_s} s"
            )
        if not 1 <= self.chunk_points <= MAX_POINTS_PER_SERIES:
            raise ValueError(
                f"chunk_points must be in 1-{MAX_POINTS_PER_SERIES} (Prometheus's limit of "
                f"points per series in one range query), got {self.chunk_points}"
            )

    @property
    def step_ms(self) -> int:
        return round(self.step_s * 1000)

    @property
    def start_ms(self) -> int:
        return to_ms(self.start)

    @property
    def end_ms(self) -> int:
        return to_ms(self.end)


@dataclass(frozen=True)
class Chunk:
    """Part of a window, [start_ms, end_ms); in STEP mode its instants are the step multiples
    from `start_ms` (itself one) below `end_ms`."""

    start_ms: int
    end_ms: int

    def last_instant_ms(self, step_ms: int) -> int:
        return self.start_ms + (self.end_ms - 1 - self.start_ms) // step_ms * step_ms

    def holds(self, at_ms: int) -> bool:
        return self.start_ms <= at_ms < self.end_ms

    def label(self) -> str:
        return f"{from_ms(self.start_ms).isoformat()}Z..{from_ms(self.end_ms).isoformat()}Z"


def import_chunks(window: ImportWindow) -> list[Chunk]:
    """The window cut into consecutive chunks of at most `chunk_points` steps each."""
    step = window.step_ms
    span = step * window.chunk_points
    first = window.start_ms
    if window.resolution is Resolution.STEP:
        first = -(-first // step) * step  # the first step multiple at or after the start
    return [
        Chunk(start, min(start + span, window.end_ms))
        for start in range(first, window.end_ms, span)
    ]


# -- targets and labels ------------------------------------------------------------------------


def target_id_of(labels: Mapping[str, str]) -> str | None:
    """The target a series came from, named as a servewatch scrape of it would name it.

    An instance that is an address (`host:port`) becomes the URL Prometheus scrapes by default;
    a URL stays as it is; any other instance (a relabelled pod name, say) is qualified by its
    job, because two jobs may share such a name. None without job and instance.
    """
    instance = labels.get("instance", "")
    job = labels.get("job", "")
    if "://" in instance:
        return instance
    if _ADDRESS_RE.fullmatch(instance):
        return f"http://{instance}/metrics"
    if instance or job:
        return f"prometheus://{job}/{instance}"
    return None


def _gpus(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _gpu_uuids(text: str | None) -> tuple[str, ...]:
    # A relabelling that wrote something else is no UUID list: no GPUs named, as for `gpus`.
    try:
        return () if not text else gpu_uuid_list(text)
    except ValueError:
        return ()


def target_of(labels: Mapping[str, str], *, target_id: str, kind: TargetKind) -> Target:
    def text(name: str) -> str | None:
        return labels.get(name) or None

    return Target(
        target_id=target_id,
        kind=kind,
        url=target_id,
        replica=text("replica") or (_pod_replica(labels) if kind is TargetKind.VLLM else None),
        host=text("host"),
        zone=text("zone"),
        model=text("model"),
        pool=text("pool"),
        gpus=_gpus(labels.get("gpus")),
        gpu_uuids=_gpu_uuids(labels.get("gpu_uuids")),
    )


def _pod_replica(labels: Mapping[str, str]) -> str | None:
    """A vLLM series that names its pod (a Kubernetes service discovery's relabelling) speaks
    for the replica `<namespace>/<pod>`, as a scrape target labelled so does. (A DCGM
    series' pod is its GPU's workload, not its target's replica.)"""
    pod, namespace = labels.get("pod"), labels.get("namespace")
    return f"{namespace}/{pod}" if pod and namespace else None


def series_labels(labels: Mapping[str, str]) -> str:
    """The labels a scrape of the page would have stored, as the store's canonical JSON."""
    return labels_json({k: v for k, v in labels.items() if k not in NOT_SERIES_LABELS and v})


def catalogue_kind(name: str) -> TargetKind | None:
    """Which catalogue knows a sample name, if one does. A name without its kind's prefix
    (TensorRT-LLM's first, unprefixed collector) is too generic to tell a kind by."""
    for kind, catalogue in CATALOGUES.items():
        if name in catalogue.index and name.startswith(KIND_PREFIXES[kind]):
            return kind
    return None


def _label_kind(labels: Mapping[str, str]) -> TargetKind | None:
    try:
        return TargetKind(labels.get(KIND_LABEL, ""))
    except ValueError:
        return None


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportPlan:
    """What an import will read: catalogued names, other names (keep-all), jobs, chunks."""

    window: ImportWindow
    names: tuple[str, ...]
    extra_names: tuple[str, ...]
    jobs: tuple[str, ...]
    chunks: tuple[Chunk, ...]

    @property
    def queries(self) -> int:
        """Range queries the import makes: every name and `up`, in every chunk."""
        if not self.names:
            return 0
        return len(self.chunks) * (len(self.names) + len(self.extra_names) + 1)


def _regex_of(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in values)


def _job_matcher(jobs: Sequence[str]) -> str:
    return f"job=~{promql_string(_regex_of(jobs))}"


def plan_import(
    api: PrometheusApi, *, window: ImportWindow, keep_uncatalogued: bool = True
) -> ImportPlan:
    """Find the catalogued names (and, with `keep_uncatalogued`, every other name of the same
    jobs) that have series in the window."""
    start_ms, end_ms = window.start_ms, window.end_ms
    present = api.label_values("__name__", start_ms=start_ms, end_ms=end_ms)
    names = tuple(sorted(n for n in present if catalogue_kind(n) is not None))
    jobs: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    if names:
        selector = f"{{__name__=~{promql_string(_regex_of(names))}}}"
        jobs = tuple(
            sorted(api.label_values("job", start_ms=start_ms, end_ms=end_ms, match=[selector]))
        )
    if keep_uncatalogued and jobs:
        of_jobs = api.label_values(
            "__name__", start_ms=start_ms, end_ms=end_ms, match=[f"{{{_job_matcher(jobs)}}}"]
        )
        extra = tuple(
            sorted(
                n
                for n in of_jobs
                if n not in names
                and n != UP
                and not n.startswith(_SYNTHETIC_PREFIX)
                and not n.endswith(CREATED_SUFFIX)
            )
        )
    return ImportPlan(
        window=window,
        names=names,
        extra_names=extra,
        jobs=jobs,
        chunks=tuple(import_chunks(window)),
    )


# -- a chunk's answers as rows -----------------------------------------------------------------


@dataclass
class ChunkRows:
    """Answers of one chunk gathered as columns: series (by index) and their points."""

    chunk: Chunk
    known_kinds: dict[str, TargetKind]
    targets: dict[str, Target] = field(default_factory=dict)
    series_target: list[str] = field(default_factory=list)
    series_kind: list[str] = field(default_factory=list)
    series_metric: list[str] = field(default_factory=list)
    series_labels: list[str] = field(default_factory=list)
    point_series: list[int] = field(default_factory=list)
    point_ts_ms: list[int] = field(default_factory=list)
    point_value: list[float] = field(default_factory=list)
    up_target: list[str] = field(default_factory=list)
    up_ts_ms: list[int] = field(default_factory=list)
    up_value: list[float] = field(default_factory=list)
    series_read: int = 0
    points_read: int = 0
    unassigned_series: int = 0

    def _in_chunk(self, timestamps_ms: Sequence[int]) -> list[int]:
        # RAW answers reach a millisecond before the chunk (`read_raw`) and up to its end,
        # which belongs to the next chunk.
        return [i for i, ts in enumerate(timestamps_ms) if self.chunk.holds(ts)]

    def add(self, matrix: Matrix) -> None:
        """Series of one family's answer, each assigned to its target and kind."""
        for series in matrix.series:
            self.series_read += 1
            labels = series.labels
            name = labels.get("__name__", "")
            target_id = target_id_of(labels)
            kind = _label_kind(labels) or catalogue_kind(name)
            if kind is None and target_id is not None:
                kind = self.known_kinds.get(target_id)
            if target_id is None or kind is None or not name:
                self.unassigned_series += 1
                continue
            self.known_kinds.setdefault(target_id, kind)
            self.targets.setdefault(target_id, target_of(labels, target_id=target_id, kind=kind))
            keep = self._in_chunk(series.timestamps_ms)
            index = len(self.series_target)
            self.series_target.append(target_id)
            self.series_kind.append(kind.value)
            self.series_metric.append(name)
            self.series_labels.append(series_labels(labels))
            self.point_series.extend([index] * len(keep))
            self.point_ts_ms.extend(series.timestamps_ms[i] for i in keep)
            self.point_value.extend(series.values[i] for i in keep)
            self.points_read += len(keep)

    def add_up(self, matrix: Matrix) -> None:
        """`up` of the targets known to be vLLM or DCGM ones: where it is 0, a failed scrape."""
        for series in matrix.series:
            labels = series.labels
            target_id = target_id_of(labels)
            if target_id is None:
                continue
            kind = _label_kind(labels) or self.known_kinds.get(target_id)
            if kind is None:
                continue
            self.targets.setdefault(target_id, target_of(labels, target_id=target_id, kind=kind))
            keep = self._in_chunk(series.timestamps_ms)
            self.up_target.extend([target_id] * len(keep))
            self.up_ts_ms.extend(series.timestamps_ms[i] for i in keep)
            self.up_value.extend(series.values[i] for i in keep)


def _ts(column: str) -> pl.Expr:
    return pl.from_epoch(pl.col(column), time_unit="ms").cast(pl.Datetime("us"))


@dataclass(frozen=True)
class ChunkFrames:
    """What one chunk writes: rows for `targets`, `scrapes`, samples and unknown families."""

    targets: pl.DataFrame
    scrapes: pl.DataFrame
    samples: pl.DataFrame
    unknown: pl.DataFrame
    duplicate_points: int
    stale_markers: int = 0


def chunk_frames(rows: ChunkRows, *, keep_uncatalogued: bool) -> ChunkFrames:
    """A chunk's answers in the store's shapes, catalogued as a scrape's samples are."""
    series = pl.LazyFrame(
        {
            "series_index": range(len(rows.series_target)),
            "target_id": rows.series_target,
            "kind": rows.series_kind,
            "metric": rows.series_metric,
            "labels": rows.series_labels,
        },
        schema={
            "series_index": pl.Int64(),
            "target_id": pl.String(),
            "kind": pl.String(),
            "metric": pl.String(),
            "labels": pl.String(),
        },
    )
    points = pl.LazyFrame(
        {"series_index": rows.point_series, "ts_ms": rows.point_ts_ms, "value": rows.point_value},
        schema={"series_index": pl.Int64(), "ts_ms": pl.Int64(), "value": pl.Float64()},
    )
    up = pl.LazyFrame(
        {"target_id": rows.up_target, "ts_ms": rows.up_ts_ms, "up": rows.up_value},
        schema={"target_id": pl.String(), "ts_ms": pl.Int64(), "up": pl.Float64()},
    ).select("target_id", ts=_ts("ts_ms"), up="up")
    # Two Prometheus series can differ only by labels the store does not keep (two jobs
    # scraping one address, say); the first one read is kept.
    read_points = (
        points.join(series, on="series_index", how="inner", maintain_order="left")
        .with_columns(scrape_ts=_ts("ts_ms"))
        .with_columns(ts=pl.col("scrape_ts"))
        .drop("series_index", "ts_ms")
    )
    # VictoriaMetrics answers range vectors with its staleness markers in them, as NaN at an
    # instant its target was not scraped (Prometheus leaves them out): no page said that NaN.
    scraped = up.filter(pl.col("up") == 1).select("target_id", "ts", _scraped=pl.lit(value=True))
    stale = pl.col("value").is_nan() & pl.col("_scraped").is_null()
    marked = read_points.join(scraped, on=["target_id", "ts"], how="left", maintain_order="left")
    joined = marked.filter(~stale).drop("_scraped")
    samples_all = joined.unique(["target_id", "metric", "labels", "ts"], keep="first").sort(
        "target_id", "ts", "metric", "labels"
    )
    wanted = [Disposition.CATALOGUED.value] + (
        [Disposition.UNKNOWN.value] if keep_uncatalogued else []
    )
    catalogued = [
        catalogue_frame(
            samples_all.filter(pl.col("kind") == kind.value), catalogue=catalogue, page_by=_PAGE
        )
        for kind, catalogue in CATALOGUES.items()
    ]
    all_samples = pl.concat(catalogued, how="vertical_relaxed")
    stored = all_samples.filter(pl.col("disposition").is_in(wanted)).select(SAMPLES_SCHEMA.names())
    unknown = (
        all_samples.filter(pl.col("disposition") == Disposition.UNKNOWN.value)
        .group_by("target_id", "family")
        .agg(
            samples=pl.len().cast(pl.Int64),
            first_seen_ts=pl.col("scrape_ts").min(),
            last_seen_ts=pl.col("scrape_ts").max(),
        )
        .sort("target_id", "family")
    )
    stored_counts = stored.group_by("target_id", ts="scrape_ts").agg(stored=pl.len())
    pages = (
        pl.concat(
            [
                samples_all.select("target_id", "ts", up=pl.lit(None, pl.Float64)),
                up.select("target_id", "ts", "up"),
            ]
        )
        .group_by("target_id", "ts")
        .agg(up=pl.col("up").min())
    )
    failed = pl.col("up") == 0
    scrapes = (
        pages.join(stored_counts, on=["target_id", "ts"], how="left")
        .select(
            "target_id",
            "ts",
            ok=~failed.fill_null(value=False),
            duration_s=pl.lit(None, pl.Float64),
            samples=pl.col("stored").fill_null(0).cast(pl.Int32),
            error=pl.when(failed).then(
                pl.lit("Prometheus could not scrape the target at this time (up == 0)")
            ),
            kind=pl.col("target_id").replace_strict(
                {t: target.kind.value for t, target in rows.targets.items()},
                default=None,
                return_dtype=pl.String,
            ),
        )
        .sort("target_id", "ts")
    )
    seen = scrapes.group_by("target_id").agg(
        first_seen_ts=pl.col("ts").min(), last_seen_ts=pl.col("ts").max()
    )
    markers, read, distinct, stored_df, unknown_df, scrapes_df, seen_df = pl.collect_all(
        [
            marked.filter(stale).select(pl.len()),
            joined.select(pl.len()),
            samples_all.select(pl.len()),
            stored,
            unknown,
            scrapes,
            seen,
        ]
    )
    targets = targets_frame(
        (rows.targets[target_id], first, last) for target_id, first, last in seen_df.iter_rows()
    ).sort("target_id")
    return ChunkFrames(
        targets=targets,
        scrapes=scrapes_df.cast(SCRAPES_SCHEMA),
        samples=stored_df.cast(SAMPLES_SCHEMA),
        unknown=unknown_df.cast(UNKNOWN_FAMILIES_SCHEMA),
        duplicate_points=int(read.item()) - int(distinct.item()),
        stale_markers=int(markers.item()),
    )


# -- the import --------------------------------------------------------------------------------


@dataclass
class PrometheusImportReport:
    """What an import read and wrote."""

    url: str
    names: list[str] = field(default_factory=list)
    extra_names: list[str] = field(default_factory=list)
    chunks: int = 0
    queries: int = 0
    series_read: int = 0
    points_read: int = 0
    new_scrapes: int = 0
    failed_scrapes: int = 0
    new_points: int = 0
    stored_samples: int = 0
    unknown_samples: int = 0
    unassigned_series: int = 0
    duplicate_points: int = 0
    stale_markers: int = 0
    problems: list[Reject] = field(default_factory=list)


def _selector(name: str, *, jobs: Sequence[str] = ()) -> str:
    matchers = [f"__name__={promql_string(name)}"]
    if jobs:
        matchers.append(_job_matcher(jobs))
    return "{" + ",".join(matchers) + "}"


def _read(api: PrometheusApi, selector: str, *, plan: ImportPlan, chunk: Chunk) -> Matrix:
    window = plan.window
    if window.resolution is Resolution.STEP:
        return api.query_range(
            selector,
            start_ms=chunk.start_ms,
            end_ms=chunk.last_instant_ms(window.step_ms),
            step_ms=window.step_ms,
        )
    return read_raw(api, selector, chunk=chunk)


def read_raw(api: PrometheusApi, selector: str, *, chunk: Chunk) -> Matrix:
    """Every sample of `selector` in the chunk, as stored: a range vector ending at its end.
    One millisecond more than the chunk, so that Prometheus 3's left-open ranges (2.x selects
    closed ones) reach its start too; callers keep what the chunk `holds`."""
    range_ms = chunk.end_ms - chunk.start_ms + 1
    return api.query_matrix(f"{selector}[{range_ms}ms]", time_ms=chunk.end_ms)


def import_range(
    api: PrometheusApi,
    *,
    store: Store,
    plan: ImportPlan,
    keep_uncatalogued: bool = True,
    on_query: Callable[[int], None] | None = None,
) -> PrometheusImportReport:
    """Read every chunk of `plan` and write it to `store`; `on_query(1)` after each query."""
    report = PrometheusImportReport(
        url=api.base_url,
        names=list(plan.names),
        extra_names=list(plan.extra_names),
    )
    if not plan.names:
        return report
    known_kinds = {
        target_id: TargetKind(kind)
        for target_id, kind in store.read_targets().select("target_id", "kind").collect().rows()
        if kind in {k.value for k in TargetKind}
    }
    for chunk in plan.chunks:
        rows = ChunkRows(chunk=chunk, known_kinds=known_kinds)
        problems: list[AnswerProblem] = []
        reads = [(name, _selector(name), False) for name in plan.names]
        reads += [(name, _selector(name, jobs=plan.jobs), False) for name in plan.extra_names]
        reads.append((UP, _selector(UP, jobs=plan.jobs), True))
        for _, selector, is_up in reads:
            matrix = _read(api, selector, plan=plan, chunk=chunk)
            problems.extend(matrix.problems)
            if is_up:
                rows.add_up(matrix)
            else:
                rows.add(matrix)
            report.queries += 1
            if on_query is not None:
                on_query(1)
        frames = chunk_frames(rows, keep_uncatalogued=keep_uncatalogued)
        store.write_targets(frames.targets)
        new_scrapes, new_points = store.write_scrapes(frames.scrapes, frames.samples)
        if new_scrapes:
            store.count_unknown_families(frames.unknown)
        rejects = [
            Reject(api.base_url, f"{chunk.label()} {p.location}", p.message) for p in problems
        ]
        if rejects:
            store.write_ingest_errors(rejects_frame(rejects, recorded_ts=store.now()))
        report.chunks += 1
        report.series_read += rows.series_read
        report.points_read += rows.points_read
        report.unassigned_series += rows.unassigned_series
        report.duplicate_points += frames.duplicate_points
        report.stale_markers += frames.stale_markers
        report.new_scrapes += new_scrapes
        report.new_points += new_points
        report.failed_scrapes += frames.scrapes.filter(~pl.col("ok")).height
        report.stored_samples += frames.samples.height
        report.unknown_samples += int(frames.unknown["samples"].sum())
        report.problems.extend(rejects)
    return report
