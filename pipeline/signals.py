"""Canonical signals: the names collectors map raw metric names onto, and the catalogued sample.

A signal is one quantity in one unit, whichever vLLM or DCGM version exposed it and under
whichever name. `SIGNALS` gives each its unit, metric type and how the series of one replica
combine (data-parallel engines for vLLM, tensor-parallel GPUs for DCGM). Points are stored in
the signal's unit, so nothing downstream needs to know which exporter version wrote them:

    time: seconds          memory: bytes        clocks: hertz       energy: joules
    power: watts           temperature: Celsius utilisation and activity: ratio 0-1
    throughput: bytes/s    counts: tokens, requests or events

A catalogue (the vLLM and DCGM ones live in collectors/) is data: a `Catalogue` of
`CatalogueEntry` rows, one per sample name as exposed. `catalogue_page` applies it to one page
of exposed samples (anything with `metric`, `labels`, `value`, as the exposition parser's
`Sample` has); `catalogue_frame` is the same mapping as a Polars transform for pages by the
thousand. Every input sample comes out with a `Disposition`: catalogued, or counted as unknown,
`_created` or shadowed, never silently dropped; `kept` / `kept_rows` choose what is stored.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property
from typing import Protocol

import orjson
import polars as pl


class Unit(StrEnum):
    SECONDS = "s"
    TOKENS = "tokens"
    REQUESTS = "requests"
    EVENTS = "events"
    RATIO = "ratio"
    HERTZ = "Hz"
    CELSIUS = "Celsius"
    WATTS = "W"
    JOULES = "J"
    BYTES = "bytes"
    BYTES_PER_SECOND = "bytes/s"
    CODE = "code"  # an identifier (an XID number), not a quantity
    FLAG = "flag"  # 0 or 1
    INFO = "info"  # always 1; the labels carry the data


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


class Aggregation(StrEnum):
    """How the series of one replica combine into one (engines under DP, GPUs under TP)."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    NONE = "none"  # not combinable (configuration info)


class Source(StrEnum):
    """Who emitted a sample. Router re-exports are never summed with engine metrics."""

    VLLM_ENGINE = "vllm_engine"
    VLLM_ROUTER = "vllm_router"
    DCGM = "dcgm"


class Signal(StrEnum):
    # vLLM scheduler state
    REQUESTS_RUNNING = "requests_running"
    REQUESTS_WAITING = "requests_waiting"
    REQUESTS_WAITING_BY_REASON = "requests_waiting_by_reason"
    KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
    # vLLM counters
    PREFIX_CACHE_QUERIES_TOKENS = "prefix_cache_queries_tokens"
    PREFIX_CACHE_HITS_TOKENS = "prefix_cache_hits_tokens"
    PROMPT_TOKENS = "prompt_tokens"
    PROMPT_TOKENS_BY_SOURCE = "prompt_tokens_by_source"
    GENERATION_TOKENS = "generation_tokens"
    PREEMPTIONS = "preemptions"
    REQUESTS_FINISHED = "requests_finished"
    ADMISSION_REJECTIONS = "admission_rejections"
    # vLLM latency histograms
    TTFT_S = "ttft_s"
    INTER_TOKEN_LATENCY_S = "inter_token_latency_s"  # noqa: S105 (a signal, not a secret)
    REQUEST_TPOT_S = "request_tpot_s"
    E2E_LATENCY_S = "e2e_latency_s"
    QUEUE_TIME_S = "queue_time_s"
    PREFILL_TIME_S = "prefill_time_s"
    DECODE_TIME_S = "decode_time_s"
    INFERENCE_TIME_S = "inference_time_s"
    # vLLM length histograms
    REQUEST_PROMPT_TOKENS = "request_prompt_tokens"
    REQUEST_GENERATION_TOKENS = "request_generation_tokens"
    REQUEST_PREFILL_KV_COMPUTED_TOKENS = "request_prefill_kv_computed_tokens"
    ITERATION_TOKENS = "iteration_tokens"
    # vLLM configuration
    CACHE_CONFIG_INFO = "cache_config_info"
    # DCGM, one GPU each
    GPU_SM_CLOCK_HZ = "gpu_sm_clock_hz"
    GPU_MEMORY_CLOCK_HZ = "gpu_memory_clock_hz"
    GPU_TEMPERATURE_C = "gpu_temperature_c"
    GPU_MEMORY_TEMPERATURE_C = "gpu_memory_temperature_c"
    GPU_POWER_W = "gpu_power_w"
    GPU_ENERGY_J = "gpu_energy_j"
    GPU_UTIL_RATIO = "gpu_util_ratio"
    GPU_MEMORY_COPY_UTIL_RATIO = "gpu_memory_copy_util_ratio"
    GPU_ENCODER_UTIL_RATIO = "gpu_encoder_util_ratio"
    GPU_DECODER_UTIL_RATIO = "gpu_decoder_util_ratio"
    GPU_FB_FREE_BYTES = "gpu_fb_free_bytes"
    GPU_FB_USED_BYTES = "gpu_fb_used_bytes"
    GPU_FB_RESERVED_BYTES = "gpu_fb_reserved_bytes"
    GPU_FB_TOTAL_BYTES = "gpu_fb_total_bytes"
    GPU_PCIE_REPLAYS = "gpu_pcie_replays"
    GPU_PCIE_TX_BYTES_PER_S = "gpu_pcie_tx_bytes_per_s"
    GPU_PCIE_RX_BYTES_PER_S = "gpu_pcie_rx_bytes_per_s"
    GPU_NVLINK_BYTES_PER_S = "gpu_nvlink_bytes_per_s"
    GPU_LAST_XID = "gpu_last_xid"
    GPU_REMAPPED_ROWS_UNCORRECTABLE = "gpu_remapped_rows_uncorrectable"
    GPU_REMAPPED_ROWS_CORRECTABLE = "gpu_remapped_rows_correctable"
    GPU_ROW_REMAP_FAILED = "gpu_row_remap_failed"
    GPU_GRAPHICS_ACTIVE_RATIO = "gpu_graphics_active_ratio"
    GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
    GPU_SM_OCCUPANCY_RATIO = "gpu_sm_occupancy_ratio"
    GPU_TENSOR_ACTIVE_RATIO = "gpu_tensor_active_ratio"
    GPU_DRAM_ACTIVE_RATIO = "gpu_dram_active_ratio"


@dataclass(frozen=True)
class SignalSpec:
    unit: Unit
    kind: MetricType
    aggregation: Aggregation
    description: str


_C, _G, _H, _I = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM, MetricType.INFO
_SUM, _MEAN, _MAX = Aggregation.SUM, Aggregation.MEAN, Aggregation.MAX

# One row per signal: unit, type, how a replica's series combine, what it means.
_SIGNAL_ROWS: tuple[tuple[Signal, Unit, MetricType, Aggregation, str], ...] = (
    (Signal.REQUESTS_RUNNING, Unit.REQUESTS, _G, _SUM, "requests in the running batch"),
    (Signal.REQUESTS_WAITING, Unit.REQUESTS, _G, _SUM, "requests queued, incl. deferred"),
    (Signal.REQUESTS_WAITING_BY_REASON, Unit.REQUESTS, _G, _SUM, "waiting, split by reason"),
    # Usage is a fraction of one engine's blocks; engines are alike, so the mean is the fleet
    # reading (REFERENCE: mean or max for usage gauges).
    (Signal.KV_CACHE_USAGE_RATIO, Unit.RATIO, _G, _MEAN, "fraction of KV blocks in use"),
    (Signal.PREFIX_CACHE_QUERIES_TOKENS, Unit.TOKENS, _C, _SUM, "prefix-cache lookups"),
    (Signal.PREFIX_CACHE_HITS_TOKENS, Unit.TOKENS, _C, _SUM, "prefix-cache hits"),
    (Signal.PROMPT_TOKENS, Unit.TOKENS, _C, _SUM, "prompt tokens, cached ones included"),
    (Signal.PROMPT_TOKENS_BY_SOURCE, Unit.TOKENS, _C, _SUM, "prompt tokens by source"),
    (Signal.GENERATION_TOKENS, Unit.TOKENS, _C, _SUM, "generated tokens"),
    (Signal.PREEMPTIONS, Unit.EVENTS, _C, _SUM, "scheduler preemptions"),
    (Signal.REQUESTS_FINISHED, Unit.REQUESTS, _C, _SUM, "finished requests by reason"),
    (Signal.ADMISSION_REJECTIONS, Unit.REQUESTS, _C, _SUM, "requests refused by reason"),
    (Signal.TTFT_S, Unit.SECONDS, _H, _SUM, "arrival to first token"),
    (Signal.INTER_TOKEN_LATENCY_S, Unit.SECONDS, _H, _SUM, "per decode iteration"),
    (Signal.REQUEST_TPOT_S, Unit.SECONDS, _H, _SUM, "decode time / (tokens - 1)"),
    (Signal.E2E_LATENCY_S, Unit.SECONDS, _H, _SUM, "arrival to last token"),
    (Signal.QUEUE_TIME_S, Unit.SECONDS, _H, _SUM, "time waiting"),
    (Signal.PREFILL_TIME_S, Unit.SECONDS, _H, _SUM, "time in prefill"),
    (Signal.DECODE_TIME_S, Unit.SECONDS, _H, _SUM, "time in decode"),
    (Signal.INFERENCE_TIME_S, Unit.SECONDS, _H, _SUM, "prefill + decode"),
    (Signal.REQUEST_PROMPT_TOKENS, Unit.TOKENS, _H, _SUM, "prompt length"),
    (Signal.REQUEST_GENERATION_TOKENS, Unit.TOKENS, _H, _SUM, "output length"),
    (Signal.REQUEST_PREFILL_KV_COMPUTED_TOKENS, Unit.TOKENS, _H, _SUM, "prefill not cached"),
    (Signal.ITERATION_TOKENS, Unit.TOKENS, _H, _SUM, "tokens per engine step"),
    (Signal.CACHE_CONFIG_INFO, Unit.INFO, _I, Aggregation.NONE, "KV-cache configuration"),
    (Signal.GPU_SM_CLOCK_HZ, Unit.HERTZ, _G, _MEAN, "SM clock"),
    (Signal.GPU_MEMORY_CLOCK_HZ, Unit.HERTZ, _G, _MEAN, "memory clock"),
    (Signal.GPU_TEMPERATURE_C, Unit.CELSIUS, _G, _MAX, "GPU temperature"),
    (Signal.GPU_MEMORY_TEMPERATURE_C, Unit.CELSIUS, _G, _MAX, "memory temperature"),
    (Signal.GPU_POWER_W, Unit.WATTS, _G, _SUM, "board power draw"),
    (Signal.GPU_ENERGY_J, Unit.JOULES, _C, _SUM, "energy since driver load"),
    (Signal.GPU_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "a kernel ran (not a load signal)"),
    (Signal.GPU_MEMORY_COPY_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "memory interface busy"),
    (Signal.GPU_ENCODER_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "video encoder busy"),
    (Signal.GPU_DECODER_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "video decoder busy"),
    (Signal.GPU_FB_FREE_BYTES, Unit.BYTES, _G, _SUM, "framebuffer free"),
    (Signal.GPU_FB_USED_BYTES, Unit.BYTES, _G, _SUM, "framebuffer used (fit, not load)"),
    (Signal.GPU_FB_RESERVED_BYTES, Unit.BYTES, _G, _SUM, "framebuffer reserved"),
    (Signal.GPU_FB_TOTAL_BYTES, Unit.BYTES, _G, _SUM, "framebuffer capacity"),
    (Signal.GPU_PCIE_REPLAYS, Unit.EVENTS, _C, _SUM, "PCIe retries"),
    (Signal.GPU_PCIE_TX_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "PCIe transmit rate"),
    (Signal.GPU_PCIE_RX_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "PCIe receive rate"),
    (Signal.GPU_NVLINK_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "NVLink, all links"),
    # The last XID seen, not a count; the max over a replica's GPUs flags any drainable one.
    (Signal.GPU_LAST_XID, Unit.CODE, _G, _MAX, "value of the last XID error"),
    (Signal.GPU_REMAPPED_ROWS_UNCORRECTABLE, Unit.EVENTS, _C, _SUM, "rows remapped, fatal"),
    (Signal.GPU_REMAPPED_ROWS_CORRECTABLE, Unit.EVENTS, _C, _SUM, "rows remapped, corrected"),
    (Signal.GPU_ROW_REMAP_FAILED, Unit.FLAG, _G, _MAX, "row remapping failed"),
    (Signal.GPU_GRAPHICS_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "graphics/compute engine busy"),
    (Signal.GPU_SM_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "SMs with a warp resident"),
    (Signal.GPU_SM_OCCUPANCY_RATIO, Unit.RATIO, _G, _MEAN, "warps resident / maximum"),
    (Signal.GPU_TENSOR_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "tensor pipe busy"),
    (Signal.GPU_DRAM_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "device memory interface busy"),
)

SIGNALS: Mapping[Signal, SignalSpec] = {
    signal: SignalSpec(unit=unit, kind=kind, aggregation=aggregation, description=description)
    for signal, unit, kind, aggregation, description in _SIGNAL_ROWS
}


def signal_table() -> pl.LazyFrame:
    """`SIGNALS` as a frame: signal, unit, kind, aggregation (for joins in transforms)."""
    return pl.LazyFrame(
        {
            "signal": [s.value for s in SIGNALS],
            "unit": [spec.unit.value for spec in SIGNALS.values()],
            "kind": [spec.kind.value for spec in SIGNALS.values()],
            "aggregation": [spec.aggregation.value for spec in SIGNALS.values()],
        }
    )


# -- the catalogued sample ---------------------------------------------------------------------


class Disposition(StrEnum):
    CATALOGUED = "catalogued"
    UNKNOWN = "unknown"  # a family no catalogue knows: counted, stored only on request
    CREATED = "created"  # a `<name>_created` timestamp: never a count, never stored
    SHADOWED = "shadowed"  # an old alias sent beside its current name on the same page


class ExposedSample(Protocol):
    """One sample as exposed: its sample name (`metric`), labels and value."""

    @property
    def metric(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...


@dataclass(frozen=True)
class RawSample:
    """An `ExposedSample` of one's own making (tests, readers other than the parser)."""

    metric: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class CataloguedSample:
    """A sample mapped onto its signal; `exposed` is its name as exposed, `metric` canonical.

    `value` is in the signal's unit; None where the exporter said "no data". For samples that
    are not catalogued, `metric`, `labels` (empty ones dropped) and `value` are as exposed.
    """

    exposed: str
    disposition: Disposition
    signal: Signal | None
    source: Source
    metric: str
    family: str
    labels: Mapping[str, str]
    value: float | None


@dataclass(frozen=True)
class CatalogueEntry:
    """One sample name a catalogue knows, and how to read it."""

    exposed: str  # the sample name as exposed, e.g. "vllm_gpu_cache_usage_perc"
    signal: Signal
    metric: str  # canonical sample name, e.g. "vllm:kv_cache_usage_perc"
    family: str  # canonical family (histogram parts share it)
    alias: bool = False  # an older spelling: the current one wins on the same page
    scale: float = 1.0  # raw value x scale = value in the signal's unit
    blank_at: float | None = None  # raw values at or above mean "no data"
    clamp: tuple[float, float] | None = None  # range of the normalised value


@dataclass(frozen=True)
class SourceRule:
    """Who emitted a sample: `default`, or `labelled` when the label `label` is present."""

    default: Source
    label: str | None = None
    labelled: Source | None = None

    def source(self, labels: Mapping[str, str]) -> Source:
        if self.label is not None and self.labelled is not None and self.label in labels:
            return self.labelled
        return self.default


class CatalogueError(ValueError):
    """A catalogue table contradicts itself."""


@dataclass(frozen=True)
class Catalogue:
    """A catalogue as data: entries by exposed name, label renames, how to tell the source.

    A label rename (old, new) replaces the label `new` when both are present.
    """

    name: str
    entries: tuple[CatalogueEntry, ...]
    source_rule: SourceRule
    label_renames: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for entry in self.entries:
            if entry.exposed in seen:
                raise CatalogueError(f"catalogue {self.name}: sample name {entry.exposed} twice")
            seen.add(entry.exposed)
        olds = [old for old, _ in self.label_renames]
        news = [new for _, new in self.label_renames]
        if len(set(news)) != len(news) or set(olds) & set(news):
            raise CatalogueError(
                f"catalogue {self.name}: label renames {self.label_renames} must have distinct "
                "targets, and no target may itself be renamed"
            )

    @cached_property
    def index(self) -> Mapping[str, CatalogueEntry]:
        return {entry.exposed: entry for entry in self.entries}

    def entry_frame(self) -> pl.LazyFrame:
        """The entries as a frame keyed by `exposed` (other columns prefixed `_cat_`)."""
        return pl.LazyFrame(
            {
                "exposed": [e.exposed for e in self.entries],
                "_cat_signal": [e.signal.value for e in self.entries],
                "_cat_metric": [e.metric for e in self.entries],
                "_cat_family": [e.family for e in self.entries],
                "_cat_alias": [e.alias for e in self.entries],
                "_cat_scale": [e.scale for e in self.entries],
                "_cat_blank_at": [e.blank_at for e in self.entries],
                "_cat_clamp_lo": [None if e.clamp is None else e.clamp[0] for e in self.entries],
                "_cat_clamp_hi": [None if e.clamp is None else e.clamp[1] for e in self.entries],
            },
            schema={
                "exposed": pl.String(),
                "_cat_signal": pl.String(),
                "_cat_metric": pl.String(),
                "_cat_family": pl.String(),
                "_cat_alias": pl.Boolean(),
                "_cat_scale": pl.Float64(),
                "_cat_blank_at": pl.Float64(),
                "_cat_clamp_lo": pl.Float64(),
                "_cat_clamp_hi": pl.Float64(),
            },
        )


CREATED_SUFFIX = "_created"
# The family stem of a name no catalogue knows: histogram, counter and _created suffixes off.
_STEM_SUFFIXES = "(?:_bucket|_sum|_count|_total|_created)"
_STEM_RE = re.compile(_STEM_SUFFIXES + r"\Z")
_STEM_PATTERN = _STEM_SUFFIXES + "$"  # the same, in the regex dialect Polars speaks


def family_stem(name: str) -> str:
    return _STEM_RE.sub("", name, count=1)


def labels_json(labels: Mapping[str, str]) -> str:
    """Canonical label encoding (the store's `series.labels`): compact JSON, keys sorted."""
    return orjson.dumps(dict(labels), option=orjson.OPT_SORT_KEYS).decode()


def canonical_labels(
    labels: Mapping[str, str], *, renames: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """Labels renamed (a renamed label replaces one already there), empty ones dropped.

    Prometheus treats an empty label as an absent one, so two series that differ only by an
    empty label are the same series.
    """
    olds = {old for old, _ in renames}
    out = {key: value for key, value in labels.items() if key not in olds}
    for old, new in renames:
        if old in labels:
            out[new] = labels[old]
    return {key: out[key] for key in sorted(out) if out[key] != ""}


def normalised_value(raw: float, entry: CatalogueEntry) -> float | None:
    # Compared as a float, as the value arrived in text: the int64 sentinels all round to 2**63.
    raw = float(raw)
    if entry.blank_at is not None and raw >= entry.blank_at:
        return None
    value = raw * entry.scale
    if entry.clamp is not None:
        low, high = entry.clamp
        value = min(max(value, low), high)
    return value


def catalogue_page(
    samples: Iterable[ExposedSample], *, catalogue: Catalogue
) -> list[CataloguedSample]:
    """Catalogue one page: one `CataloguedSample` per input sample, in input order."""
    out: list[CataloguedSample] = []
    current: set[tuple[str, str]] = set()
    for sample in samples:
        labels = canonical_labels(sample.labels, renames=catalogue.label_renames)
        source = catalogue.source_rule.source(labels)
        entry = catalogue.index.get(sample.metric)
        if entry is None:
            created = sample.metric.endswith(CREATED_SUFFIX)
            out.append(
                CataloguedSample(
                    exposed=sample.metric,
                    disposition=Disposition.CREATED if created else Disposition.UNKNOWN,
                    signal=None,
                    source=source,
                    metric=sample.metric,
                    family=family_stem(sample.metric),
                    labels=labels,
                    value=float(sample.value),
                )
            )
            continue
        if not entry.alias:
            current.add((entry.metric, labels_json(labels)))
        out.append(
            CataloguedSample(
                exposed=sample.metric,
                disposition=Disposition.CATALOGUED,
                signal=entry.signal,
                source=source,
                metric=entry.metric,
                family=entry.family,
                labels=labels,
                value=normalised_value(sample.value, entry),
            )
        )
    return [_shadow(sample, catalogue=catalogue, current=current) for sample in out]


def _shadow(
    sample: CataloguedSample, *, catalogue: Catalogue, current: set[tuple[str, str]]
) -> CataloguedSample:
    # vLLM 0.9-0.11 sends deprecated names beside their successors with the same numbers:
    # storing both would double every count.
    if (
        sample.disposition is not Disposition.CATALOGUED
        or not catalogue.index[sample.exposed].alias
    ):
        return sample
    if (sample.metric, labels_json(sample.labels)) not in current:
        return sample
    return replace(sample, disposition=Disposition.SHADOWED)


def kept(
    samples: Iterable[CataloguedSample], *, keep_unknown: bool = False
) -> list[CataloguedSample]:
    """The samples to store: catalogued ones, and unknown ones too when asked."""
    wanted = {Disposition.CATALOGUED} | ({Disposition.UNKNOWN} if keep_unknown else set())
    return [sample for sample in samples if sample.disposition in wanted]


@dataclass(frozen=True)
class CatalogueTally:
    """What a catalogue did with a batch: samples per disposition, unknown samples per family."""

    dispositions: Mapping[Disposition, int]
    unknown_families: Mapping[str, int]


def tally(samples: Iterable[CataloguedSample]) -> CatalogueTally:
    dispositions: Counter[Disposition] = Counter()
    unknown: Counter[str] = Counter()
    for sample in samples:
        dispositions[sample.disposition] += 1
        if sample.disposition is Disposition.UNKNOWN:
            unknown[sample.family] += 1
    return CatalogueTally(dispositions=dict(dispositions), unknown_families=dict(unknown))


# -- the same, vectorised -----------------------------------------------------------------------

# Columns a catalogued frame adds to its input (`metric`, `labels`, `value` become canonical).
CATALOGUE_COLUMNS = pl.Schema(
    {
        "exposed": pl.String(),
        "disposition": pl.String(),
        "signal": pl.String(),
        "source": pl.String(),
        "metric": pl.String(),
        "family": pl.String(),
    }
)

# A JSON string, and one "key":"value" member of a label object (keys and values are strings).
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_MEMBER = _JSON_STRING + ":" + _JSON_STRING


def _without_empty_labels(labels: pl.Expr) -> pl.Expr:
    # On compact JSON an unescaped `"` only ever opens or closes a key or value, so these
    # patterns cannot match inside a value.
    return (
        labels.str.replace_all("," + _JSON_STRING + ':""', "")
        .str.replace("^\\{" + _JSON_STRING + ':"",', "{")
        .str.replace("^\\{" + _JSON_STRING + ':""}$', "{}")
    )


def _with_canonical_labels(
    samples: pl.LazyFrame, *, renames: Sequence[tuple[str, str]]
) -> pl.LazyFrame:
    if not renames:
        return samples.with_columns(labels=_without_empty_labels(pl.col("labels")))
    # Renaming reorders keys, so members are split out, renamed, deduplicated (a renamed key
    # wins), sorted and joined again.
    olds = [old for old, _ in renames]
    indexed = samples.with_row_index("_cat_row")
    members = (
        indexed.select("_cat_row", _cat_member=pl.col("labels").str.extract_all(_MEMBER))
        .explode("_cat_member")
        .drop_nulls("_cat_member")
        .with_columns(
            _cat_key=pl.col("_cat_member").str.extract("^(" + _JSON_STRING + "):", 1),
            _cat_value=pl.col("_cat_member").str.extract("^" + _JSON_STRING + ":(.*)$", 1),
        )
        .with_columns(
            _cat_renamed=pl.col("_cat_key").is_in([f'"{old}"' for old in olds]),
            _cat_key=pl.col("_cat_key").replace({f'"{old}"': f'"{new}"' for old, new in renames}),
        )
        .sort(["_cat_row", "_cat_key", "_cat_renamed"], descending=[False, False, True])
        .unique(["_cat_row", "_cat_key"], keep="first", maintain_order=True)
        .filter(pl.col("_cat_value") != '""')
        .group_by("_cat_row")
        .agg(
            _cat_labels=pl.concat_str(pl.col("_cat_key"), pl.lit(":"), pl.col("_cat_value"))
            .sort_by(pl.col("_cat_key"))
            .str.join(",")
        )
    )
    return (
        indexed.join(members, on="_cat_row", how="left", maintain_order="left")
        .with_columns(labels=pl.concat_str(pl.lit("{"), pl.col("_cat_labels"), pl.lit("}")))
        .with_columns(labels=pl.col("labels").fill_null("{}"))
        .drop("_cat_row", "_cat_labels")
    )


def _source(rule: SourceRule) -> pl.Expr:
    default = pl.lit(rule.default.value, dtype=pl.String)
    if rule.label is None or rule.labelled is None:
        return default
    key = orjson.dumps(rule.label).decode() + ":"
    labels = pl.col("labels")
    present = labels.str.contains("{" + key, literal=True) | labels.str.contains(
        "," + key, literal=True
    )
    return pl.when(present).then(pl.lit(rule.labelled.value)).otherwise(default)


def entry_value(value: pl.Expr) -> pl.Expr:
    """A sample's value as its entry stores it (scaled, blanked at a sentinel, clamped), from
    the `_cat_scale`, `_cat_blank_at`, `_cat_clamp_lo` and `_cat_clamp_hi` columns that
    `Catalogue.entry_frame` gives a sample's row (all null: the value as exposed, in float)."""
    raw = value.cast(pl.Float64)
    # Polars orders NaN above every number; a NaN is not a sentinel, as in `normalised_value`.
    blank = pl.col("_cat_blank_at").is_not_null() & ~raw.is_nan() & (raw >= pl.col("_cat_blank_at"))
    return (
        pl.when(blank)
        .then(None)
        .otherwise(raw * pl.col("_cat_scale").fill_null(1.0))
        .clip(pl.col("_cat_clamp_lo"), pl.col("_cat_clamp_hi"))
    )


def catalogue_frame(
    samples: pl.LazyFrame, *, catalogue: Catalogue, page_by: Sequence[str] = ()
) -> pl.LazyFrame:
    """`catalogue_page` over many pages at once.

    `samples` has `metric` (the sample name as exposed), `labels` (canonical JSON, see
    `labels_json`) and `value` (float), as the exposition parser's frame does, plus any other
    columns, which pass through. `page_by` names the columns that
    identify one page (e.g. target and scrape time): an alias is shadowed only by its current
    name on the same page. The exposed name moves to `exposed`; `metric`, `labels` and `value`
    become canonical; `CATALOGUE_COLUMNS` are added; row order is kept.
    """
    missing = {"metric", "labels", "value"} - set(samples.collect_schema().names())
    if missing:
        raise ValueError(
            f"catalogue {catalogue.name}: the sample frame lacks columns {sorted(missing)}; "
            "it needs metric (the name as exposed), labels (canonical JSON) and value (float)"
        )
    value = entry_value(pl.col("value"))
    catalogued = pl.col("_cat_signal").is_not_null()
    disposition = (
        pl.when(catalogued)
        .then(pl.lit(Disposition.CATALOGUED.value))
        .when(pl.col("exposed").str.ends_with(CREATED_SUFFIX))
        .then(pl.lit(Disposition.CREATED.value))
        .otherwise(pl.lit(Disposition.UNKNOWN.value))
    )
    alias = pl.col("_cat_alias").fill_null(value=False)
    has_current = (catalogued & ~alias).any().over([*page_by, "metric", "labels"])
    return (
        samples.rename({"metric": "exposed"})
        .pipe(_with_canonical_labels, renames=catalogue.label_renames)
        .join(catalogue.entry_frame(), on="exposed", how="left", maintain_order="left")
        .with_columns(
            value=value,
            metric=pl.coalesce(pl.col("_cat_metric"), pl.col("exposed")),
            family=pl.coalesce(
                pl.col("_cat_family"), pl.col("exposed").str.replace(_STEM_PATTERN, "")
            ),
            signal=pl.col("_cat_signal"),
            source=_source(catalogue.source_rule),
            disposition=disposition,
        )
        .with_columns(
            disposition=pl.when(catalogued & alias & has_current)
            .then(pl.lit(Disposition.SHADOWED.value))
            .otherwise(pl.col("disposition"))
        )
        .drop(
            "_cat_signal",
            "_cat_metric",
            "_cat_family",
            "_cat_alias",
            "_cat_scale",
            "_cat_blank_at",
            "_cat_clamp_lo",
            "_cat_clamp_hi",
        )
    )


def kept_rows(samples: pl.LazyFrame, *, keep_unknown: bool = False) -> pl.LazyFrame:
    """`kept` for a catalogued frame."""
    wanted = [Disposition.CATALOGUED.value] + ([Disposition.UNKNOWN.value] if keep_unknown else [])
    return samples.filter(pl.col("disposition").is_in(wanted))


def disposition_counts(samples: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """Samples per disposition (and per `by` group), for the scrape's record."""
    keys = [*by, "disposition"]
    return samples.group_by(keys).agg(samples=pl.len()).sort(keys)


def unknown_family_counts(samples: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """Samples per unknown family (and per `by` group): what a catalogue does not know yet."""
    keys = [*by, "family"]
    return (
        samples.filter(pl.col("disposition") == Disposition.UNKNOWN.value)
        .group_by(keys)
        .agg(samples=pl.len())
        .sort(keys)
    )
