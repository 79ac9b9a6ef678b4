"""The catalogue sample by sample: the oracle the vectorised catalogue is held to.

`catalogue_page` applies a catalogue to one page of exposed samples (anything with `metric`,
`labels`, `value`), one result per sample in input order, as plainly as it can be written;
`collectors.metrics.catalogue.catalogue_frame` must agree with it on every page.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from servewatch.collectors.metrics.catalogue import (
    CREATED_SUFFIX,
    Catalogue,
    CatalogueEntry,
    Disposition,
    labels_json,
)
from servewatch.collectors.metrics.dcgm_catalogue import DCGM_CATALOGUE
from servewatch.collectors.metrics.vllm_catalogue import VLLM_CATALOGUE
from servewatch.pipeline.signals import Signal, Source

_STEM_RE = re.compile(r"(?:_bucket|_sum|_count|_total|_created)\Z")


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


def family_stem(name: str) -> str:
    return _STEM_RE.sub("", name, count=1)


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
    if raw in entry.blank_values:
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


def catalogue_vllm(samples: Iterable[ExposedSample]) -> list[CataloguedSample]:
    """One vLLM page catalogued: one result per sample, in order."""
    return catalogue_page(samples, catalogue=VLLM_CATALOGUE)


def catalogue_dcgm(samples: Iterable[ExposedSample]) -> list[CataloguedSample]:
    """One dcgm-exporter page catalogued: one result per sample, in order."""
    return catalogue_page(samples, catalogue=DCGM_CATALOGUE)
