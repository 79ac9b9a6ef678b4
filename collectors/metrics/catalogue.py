"""Catalogues: how exposed samples map onto the canonical signals (`pipeline.signals`).

A catalogue (the vLLM and DCGM ones are `metrics/vllm_catalogue.py` and
`metrics/dcgm_catalogue.py`) is data: a `Catalogue` of `CatalogueEntry` rows, one per sample
name as exposed. `catalogue_frame` applies it to pages of exposed samples as a Polars transform
(pages by the thousand). Every input sample comes out with a `Disposition`: catalogued, or
counted as unknown, `_created` or shadowed, never silently dropped; `kept_rows` chooses what is
stored. (The tests hold it to a sample-by-sample oracle, tests/catalogue_oracle.py.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import orjson
import polars as pl

from servewatch.pipeline.signals import Signal, Source

# -- the catalogued sample ---------------------------------------------------------------------


class Disposition(StrEnum):
    CATALOGUED = "catalogued"
    UNKNOWN = "unknown"  # a family no catalogue knows: counted, stored only on request
    CREATED = "created"  # a `<name>_created` timestamp: never a count, never stored
    SHADOWED = "shadowed"  # an old alias sent beside its current name on the same page


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
    blank_values: tuple[float, ...] = ()  # raw values that mean "no data" wherever they fall
    clamp: tuple[float, float] | None = None  # range of the normalised value

    @property
    def changes_value(self) -> bool:
        """Whether a value as exposed is not the value stored (scaled, blanked or clamped)."""
        return (
            self.scale != 1.0
            or self.blank_at is not None
            or bool(self.blank_values)
            or self.clamp is not None
        )


@dataclass(frozen=True)
class SourceRule:
    """Who emitted a sample: `default`, or `labelled` when the label `label` is present.
    A `default` of None: the source is not known (a page whose kind could not be told)."""

    default: Source | None
    label: str | None = None
    labelled: Source | None = None

    def source(self, labels: Mapping[str, str]) -> Source | None:
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
                "_cat_blank_values": [list(e.blank_values) or None for e in self.entries],
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
                "_cat_blank_values": pl.List(pl.Float64()),
                "_cat_clamp_lo": pl.Float64(),
                "_cat_clamp_hi": pl.Float64(),
            },
        )


CREATED_SUFFIX = "_created"
# The family stem of a name no catalogue knows: histogram, counter and _created suffixes off.
_STEM_PATTERN = "(?:_bucket|_sum|_count|_total|_created)$"


def family_stem(name: pl.Expr) -> pl.Expr:
    """The family a sample name no catalogue knows belongs to: its sample suffix taken off."""
    return name.str.replace(_STEM_PATTERN, "")


def labels_json(labels: Mapping[str, str]) -> str:
    """Canonical label encoding (the store's `series.labels`): compact JSON, keys sorted."""
    return orjson.dumps(dict(labels), option=orjson.OPT_SORT_KEYS).decode()


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
    default = pl.lit(None if rule.default is None else rule.default.value, dtype=pl.String)
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
    the `_cat_scale`, `_cat_blank_at`, `_cat_blank_values`, `_cat_clamp_lo` and `_cat_clamp_hi`
    columns that `Catalogue.entry_frame` gives a sample's row (all null: the value as exposed,
    in float)."""
    raw = value.cast(pl.Float64)
    # Polars orders NaN above every number; a NaN is not a sentinel, as in `normalised_value`.
    at_or_above = (
        pl.col("_cat_blank_at").is_not_null() & ~raw.is_nan() & (raw >= pl.col("_cat_blank_at"))
    )
    blank = at_or_above | pl.col("_cat_blank_values").list.contains(raw).fill_null(value=False)
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
            family=pl.coalesce(pl.col("_cat_family"), family_stem(pl.col("exposed"))),
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
            "_cat_blank_values",
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
