"""The catalogue applied once per distinct (name, labels) key, remembered across batches.

A target exposes the same keys every scrape, and the replicas of a pool share them, so what the
catalogue makes of a key (canonical name and labels, family, signal, source, disposition, and
whether its entry changes values) is worked out once per thread and a steady batch is one join.
"""

from __future__ import annotations

import threading

import polars as pl

from servewatch.collectors.metrics.catalogue import (
    Catalogue,
    Disposition,
    catalogue_frame,
    entry_value,
)

_THREAD = threading.local()


_KEY = ["metric", "labels"]
_BY_KEY = ["canonical_metric", "canonical_labels", "family", "signal", "source", "disposition"]
_VALUE_BY_KEY = [
    "_cat_scale",
    "_cat_blank_at",
    "_cat_blank_values",
    "_cat_clamp_lo",
    "_cat_clamp_hi",
]
_KEY_SCHEMA = pl.Schema(
    dict.fromkeys([*_KEY, *_BY_KEY], pl.String())
    | {"alias": pl.Boolean(), "rescales": pl.Boolean()}
    | dict.fromkeys(_VALUE_BY_KEY, pl.Float64())
    | {"_cat_blank_values": pl.List(pl.Float64())}
)
MAX_CACHED_KEYS = 200_000


def _known_keys(catalogue: Catalogue) -> dict[str, pl.DataFrame]:
    """This thread's catalogue results per (name, labels) key as exposed, by catalogue."""
    known: dict[str, pl.DataFrame] | None = getattr(_THREAD, "catalogued_keys", None)
    if known is None:
        known = {}
        _THREAD.catalogued_keys = known
    if catalogue.name not in known or known[catalogue.name].height > MAX_CACHED_KEYS:
        known[catalogue.name] = pl.DataFrame(schema=_KEY_SCHEMA)
    return known


def _learn_keys(keys: pl.DataFrame, *, catalogue: Catalogue) -> pl.DataFrame:
    """What the catalogue makes of each (name, labels) key on its own: each key is its own
    page here, so no key shadows another; shadowing is decided per batch by `_catalogued`."""
    exposed = pl.col("metric")
    return (
        catalogue_frame(
            keys.lazy()
            .with_row_index("key")
            .with_columns(value=pl.lit(0.0), _exposed_labels=pl.col("labels")),
            catalogue=catalogue,
            page_by=["key"],
        )
        .select(
            metric="exposed",
            labels=pl.col("_exposed_labels"),
            canonical_metric="metric",
            canonical_labels="labels",
            family="family",
            signal="signal",
            source="source",
            disposition="disposition",
        )
        .join(
            catalogue.entry_frame().select("exposed", *_VALUE_BY_KEY),
            left_on="metric",
            right_on="exposed",
            how="left",
        )
        .collect()
        .with_columns(
            alias=exposed.is_in([e.exposed for e in catalogue.entries if e.alias]),
            rescales=exposed.is_in([e.exposed for e in catalogue.entries if e.changes_value]),
        )
        .select(_KEY_SCHEMA.names())
        .cast(_KEY_SCHEMA)
    )


def catalogued_by_key(samples: pl.DataFrame, *, catalogue: Catalogue) -> pl.LazyFrame:
    """`catalogue_frame` of a batch, with the name and label work done once per distinct
    (name, labels) key and remembered across batches (this thread's, `_known_keys`): a
    target exposes the same keys every scrape, and the replicas of a pool share them, so a
    steady batch is one join. Exact: values still go through the catalogue wherever its
    entry rescales, blanks or clamps them, and a batch where an old alias meets its current
    name falls back to cataloguing every sample, since shadowing is decided page by page."""
    cache = _known_keys(catalogue)
    keyed = samples.join(cache[catalogue.name], on=_KEY, how="left")
    if keyed.get_column("disposition").null_count():
        unknown = keyed.filter(pl.col("disposition").is_null())
        learnt = _learn_keys(unknown.select(_KEY).unique(), catalogue=catalogue)
        cache[catalogue.name] = pl.concat([cache[catalogue.name], learnt], rechunk=True)
        keyed = pl.concat(
            [
                keyed.filter(pl.col("disposition").is_not_null()),
                unknown.select(samples.columns).join(learnt, on=_KEY, how="inner"),
            ]
        )
    catalogued = pl.col("disposition") == Disposition.CATALOGUED.value
    if keyed.get_column("alias").any():
        twins = keyed.filter(catalogued).group_by("canonical_metric", "canonical_labels")
        if twins.agg(pl.col("alias").n_unique() > 1).get_column("alias").any():
            return catalogue_frame(samples.lazy(), catalogue=catalogue, page_by=["page"])
    # The entry's scale, sentinel and clamp are remembered with each key, so the values that
    # an entry changes are recomputed here, by the catalogue's own expression.
    value = pl.col("value")
    if keyed.get_column("rescales").any():
        value = pl.when(pl.col("rescales")).then(entry_value(value)).otherwise(value)
    return keyed.lazy().select(
        "page",
        "position",
        "timestamp_ms",
        value=value,
        metric="canonical_metric",
        labels="canonical_labels",
        family="family",
        signal="signal",
        source="source",
        disposition="disposition",
    )
