"""servewatch SLO spec files (YAML): reading and validating them into `SloSpec`s.

A file holds `slos:`, a list of SLOs (see docs/slo.md). Every error names the file and the
path of the bad field (`slos[1].sli.threshold_s`), what was found and what is allowed.
Latency SLIs counted from histograms are checked against the bucket bounds the caller passes
(vLLM's defaults unless told), because a threshold between bounds cannot be counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from servewatch.slo.buckets import (
    VLLM_DEFAULT_BUCKETS,
    LatencyMetric,
    bucket_bound,
    not_a_bound_message,
)
from servewatch.slo.durations import format_duration
from servewatch.slo.fields import Fields, SpecError, read_text
from servewatch.slo.spec import (
    PERIODS_S,
    SCOPE_KEYS,
    AvailabilitySli,
    GoodputSli,
    LatencySli,
    Sli,
    SliKind,
    SliSource,
    SloSpec,
    TokenGoodputSli,
)
from servewatch.slo.windows import (
    MIN_BURN_THRESHOLD,
    BurnWindow,
    burn_windows_from_items,
    default_burn_windows,
    windows_for_period,
)

FORMAT_VERSION = "servewatch/v1"
DEFAULT_PERIOD_S = 30 * 86400
# Labels the alerts set themselves; a spec's own labels may not shadow them.
RESERVED_LABELS = frozenset({"alertname", "slo", "severity", "window", "short_window"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Buckets = Mapping[LatencyMetric, Sequence[float]]


def read_yaml_documents(path: Path) -> list[Any]:
    """Every YAML document in `path` (OpenSLO files often hold several)."""
    text = read_text(path, error=SpecError, language="YAML")
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc


def load_spec_file(
    path: Path,
    *,
    buckets: Buckets = VLLM_DEFAULT_BUCKETS,
    windows: Sequence[BurnWindow] | None = None,
) -> tuple[SloSpec, ...]:
    documents = read_yaml_documents(path)
    if len(documents) != 1:
        raise SpecError(f"{path}: expected one YAML document with `slos:`, found {len(documents)}")
    return parse_spec_document(documents[0], where=str(path), buckets=buckets, windows=windows)


def parse_spec_document(
    data: object,
    *,
    where: str,
    buckets: Buckets = VLLM_DEFAULT_BUCKETS,
    windows: Sequence[BurnWindow] | None = None,
) -> tuple[SloSpec, ...]:
    """The SLOs of one document; `windows` replaces the default table for SLOs without
    `alert_windows`."""
    root = Fields.of(data, where=where, path="")
    version = root.text("version", default=FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise root.fail(
            "version",
            f"is {version!r}; this reader takes {FORMAT_VERSION} (Sloth prometheus/v1 and "
            "OpenSLO openslo/v1 files are read by slo.imports)",
        )
    items = root.items("slos", required=True)
    root.done()
    if not items:
        raise root.fail("slos", "is empty; list at least one SLO")
    default_windows = tuple(windows) if windows is not None else default_burn_windows()
    specs: list[SloSpec] = []
    names: set[str] = set()
    for item in items:
        spec = parse_slo(item, buckets=buckets, default_windows=default_windows)
        if spec.name in names:
            raise item.fail("name", f"{spec.name!r} is used by an earlier SLO; names are unique")
        names.add(spec.name)
        specs.append(spec)
    return tuple(specs)


def parse_slo(
    fields: Fields, *, buckets: Buckets, default_windows: Sequence[BurnWindow]
) -> SloSpec:
    name = fields.text("name")
    if name is None:
        raise fields.fail("name", "is required (it labels the SLO's alerts and rows)")
    if not _NAME.match(name):
        raise fields.fail(
            "name", f"{name!r} must start with a letter or digit and use only A-Z a-z 0-9 _ . -"
        )
    description = fields.text("description", default="") or ""
    sli_fields = fields.mapping("sli")
    if sli_fields is None:
        raise fields.fail(
            "sli", "is required (kind: latency, availability, goodput or token_goodput)"
        )
    sli = parse_sli(sli_fields, buckets=buckets)
    objective_ratio = _objective(fields)
    period_s = fields.duration_s("period", default_s=DEFAULT_PERIOD_S)
    if period_s not in PERIODS_S:
        allowed = ", ".join(format_duration(p) for p in PERIODS_S)
        raise fields.fail("period", f"is {format_duration(period_s)}; allowed: {allowed}")
    scope = _scope(fields)
    min_events = fields.whole("min_events", default=1, minimum=1)
    labels = fields.string_map("labels")
    for label in labels:
        if not _LABEL_NAME.match(label) or label in RESERVED_LABELS or label in SCOPE_KEYS:
            raise fields.fail(
                f"labels.{label}",
                "must be a Prometheus label name other than "
                f"{', '.join(sorted(RESERVED_LABELS | set(SCOPE_KEYS)))}",
            )
    windows = _windows(fields, period_s=period_s, default_windows=default_windows)
    fields.done()
    return SloSpec(
        name=name,
        sli=sli,
        objective_ratio=objective_ratio,
        period_s=period_s,
        windows=windows,
        scope=tuple(sorted(scope.items())),
        min_events=min_events,
        labels=tuple(sorted(labels.items())),
        description=description,
    )


def parse_sli(fields: Fields, *, buckets: Buckets) -> Sli:
    kind = fields.choice("kind", SliKind)
    sli: Sli
    if kind is SliKind.LATENCY:
        metric = fields.choice("metric", LatencyMetric)
        threshold_s = _positive(fields, "threshold_s", "the latency limit in seconds")
        source = fields.choice("source", SliSource, default=SliSource.TRACES)
        if source is SliSource.METRICS:
            bounds = buckets.get(metric, ())
            bound = bucket_bound(bounds, threshold_s)
            if bound is None:
                raise fields.fail("threshold_s", not_a_bound_message(metric, bounds, threshold_s))
            threshold_s = bound
        sli = LatencySli(metric=metric, threshold_s=threshold_s, source=source)
    elif kind is SliKind.AVAILABILITY:
        sli = AvailabilitySli(source=fields.choice("source", SliSource, default=SliSource.TRACES))
    else:
        ttft_s = _positive(fields, "ttft_s", "the TTFT limit in seconds")
        tpot_s = _positive(fields, "tpot_s", "the TPOT limit in seconds")
        source = fields.choice("source", SliSource, default=SliSource.TRACES)
        if source is not SliSource.TRACES:
            raise fields.fail(
                "source",
                f"{kind.value} needs source: traces; histograms count TTFT and TPOT separately "
                "and cannot tell whether one request met both limits",
            )
        sli = (
            TokenGoodputSli(ttft_s=ttft_s, tpot_s=tpot_s)
            if kind is SliKind.TOKEN_GOODPUT
            else GoodputSli(ttft_s=ttft_s, tpot_s=tpot_s)
        )
    fields.done()
    return sli


def _positive(fields: Fields, key: str, what: str) -> float:
    value = fields.number(key)
    if value is None:
        raise fields.fail(key, f"is required ({what})")
    if not value > 0:
        raise fields.fail(key, f"must be a positive number of seconds, got {value:g}")
    return value


def _objective(fields: Fields) -> float:
    value = fields.number("objective_ratio")
    if value is None:
        raise fields.fail("objective_ratio", "is required (e.g. 0.999 for 99.9 %)")
    if not 0 < value < 1:
        hint = f"; for {value:g} % write {value / 100:g}" if 1 < value < 100 else ""
        raise fields.fail(
            "objective_ratio",
            f"must be above 0 and below 1 (0.999 means 99.9 %), got {value:g}{hint}",
        )
    return value


def _scope(fields: Fields) -> dict[str, str]:
    scope_fields = fields.mapping("scope")
    if scope_fields is None:
        return {}
    selectors: dict[str, str] = {}
    for key in SCOPE_KEYS:
        if scope_fields.has(key):
            value = scope_fields.text(key)
            if value is None:
                raise scope_fields.fail(key, "needs a value (omit the key to cover all)")
            selectors[key] = value
    scope_fields.read.update(SCOPE_KEYS)  # so an unknown key's error lists them all
    scope_fields.done()
    return selectors


def _windows(
    fields: Fields, *, period_s: int, default_windows: Sequence[BurnWindow]
) -> tuple[BurnWindow, ...]:
    if not fields.has("alert_windows"):
        chosen = windows_for_period(default_windows, period_s=period_s)
        for window in chosen:
            if window.long_window_s > period_s:
                raise fields.fail(
                    "period",
                    f"{format_duration(period_s)} is shorter than the default alert window "
                    f"{window.long_window}; give alert_windows that fit the period",
                )
        return chosen
    # An empty list is deliberate: the budget is tracked, nobody is alerted.
    items = fields.items("alert_windows")
    windows = burn_windows_from_items(items)
    for item, window in zip(items, windows, strict=True):
        if window.long_window_s > period_s:
            raise item.fail(
                "long_window",
                f"{window.long_window} is longer than the period {format_duration(period_s)}; "
                "a window can hold at most the whole period",
            )
        threshold = window.burn_threshold(period_s=period_s)
        if threshold < MIN_BURN_THRESHOLD:
            raise item.fail(
                "budget_ratio",
                f"{window.budget_ratio:g} of the budget in {window.long_window} of a "
                f"{format_duration(period_s)} period is a burn rate of {threshold:.3g}, below "
                f"{MIN_BURN_THRESHOLD:g}: a budget burning that slowly lasts the period; use at "
                f"least {window.long_window_s / period_s:.4g}",
            )
    return windows
