"""Engine families: an inference engine's metric families as data, and the catalogue they make.

Engines (vLLM, SGLang, TensorRT-LLM, TGI, llama.cpp) name their families with a prefix and
expose each with the sample suffixes of its type: a counter's `_total` (Python's client adds
it; TGI's Rust exporter and llama.cpp's hand-written page do not), a histogram's `_bucket`,
`_sum` and `_count`. An `EngineFamily` is one family by its current name, with the older
names that mean the same (read as aliases: on a page that has both, the current one wins) and
the releases it appears in. `family_catalogue` turns a table of them into a `Catalogue` whose
canonical names carry the engine's canonical prefix, whichever prefix a page used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from servewatch.collectors.metrics.catalogue import Catalogue, CatalogueEntry, SourceRule
from servewatch.pipeline.signals import SIGNALS, MetricType, Signal


@dataclass(frozen=True)
class EngineFamily:
    """A metric family by its current name (no prefix, no sample suffix) and older names.

    `since` and `until` are the first and last releases known to expose it (None: still in the
    newest read); `scale` converts the exposed unit to the signal's.
    """

    name: str
    signal: Signal
    aliases: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    scale: float = 1.0


# The sample names a family of each type exposes, as suffixes of the family name, for a
# client that appends `_total` to counters (Python's prometheus_client) ...
SAMPLE_SUFFIXES: Mapping[MetricType, tuple[str, ...]] = {
    MetricType.COUNTER: ("_total",),
    MetricType.GAUGE: ("",),
    MetricType.INFO: ("",),
    MetricType.HISTOGRAM: ("_bucket", "_sum", "_count"),
}
# ... and for one that prints a counter under its family name (OpenMetrics-minded readers of
# such a page, an OpenTelemetry Collector say, append `_total`, so both are read).
BARE_COUNTER_SUFFIXES: Mapping[MetricType, tuple[str, ...]] = {
    **SAMPLE_SUFFIXES,
    MetricType.COUNTER: ("", "_total"),
}


def family_entries(
    families: tuple[EngineFamily, ...],
    *,
    prefixes: tuple[str, ...],
    canonical_prefix: str,
    suffixes: Mapping[MetricType, tuple[str, ...]] = SAMPLE_SUFFIXES,
) -> Iterator[CatalogueEntry]:
    """One entry per (spelling, prefix, sample suffix) of every family."""
    for family in families:
        canonical = canonical_prefix + family.name
        spellings = [(family.name, False), *((alias, True) for alias in family.aliases)]
        for spelling, alias in spellings:
            for prefix in prefixes:
                for suffix in suffixes[SIGNALS[family.signal].kind]:
                    yield CatalogueEntry(
                        exposed=prefix + spelling + suffix,
                        signal=family.signal,
                        metric=canonical + suffix,
                        family=canonical,
                        alias=alias,
                        scale=family.scale,
                    )


def family_catalogue(
    name: str,
    families: tuple[EngineFamily, ...],
    *,
    prefixes: tuple[str, ...],
    source_rule: SourceRule,
    suffixes: Mapping[MetricType, tuple[str, ...]] = SAMPLE_SUFFIXES,
) -> Catalogue:
    """The catalogue of an engine's family table; the first prefix is the canonical one."""
    entries = family_entries(
        families, prefixes=prefixes, canonical_prefix=prefixes[0], suffixes=suffixes
    )
    return Catalogue(name=name, entries=tuple(entries), source_rule=source_rule)
