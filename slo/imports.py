"""SLO files in the formats users already write, read into servewatch specs: Sloth
(`version: prometheus/v1`) and OpenSLO (`apiVersion: openslo/v1`, kind SLO), besides our own.

Only the parts that mean the same here are taken: the objective, the rolling period, and an
SLI whose PromQL counts vLLM's latency histograms or its request_success counter (with
`model_name`, `pool` and `replica` matchers as scope). Everything else (alert names and
routing, other metrics, calendar windows, timeslice budgeting) is listed in the notes of the
result, never dropped silently. An imported SLO is then validated as a servewatch spec, so a
threshold between bucket bounds fails the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from pathlib import Path
from typing import Any

from servewatch.slo.buckets import HISTOGRAMS, VLLM_DEFAULT_BUCKETS, LatencyMetric
from servewatch.slo.durations import parse_duration_s
from servewatch.slo.fields import Fields, SpecError
from servewatch.slo.spec import PERIODS_S, SloSpec
from servewatch.slo.spec_file import Buckets, parse_slo, parse_spec_document, read_yaml_documents
from servewatch.slo.windows import BurnWindow, Severity, default_burn_windows


class SloFormat(Enum):
    SERVEWATCH = "servewatch/v1"
    SLOTH = "prometheus/v1"
    OPENSLO = "openslo/v1"


@dataclass(frozen=True)
class SloFile:
    path: Path
    format: SloFormat
    specs: tuple[SloSpec, ...]
    notes: tuple[str, ...] = ()


def load_slo_file(
    path: Path,
    *,
    buckets: Buckets = VLLM_DEFAULT_BUCKETS,
    windows: Sequence[BurnWindow] | None = None,
) -> SloFile:
    """Read `path` in whichever of the three formats it is written."""
    documents = read_yaml_documents(path)
    where = str(path)
    table = tuple(windows) if windows is not None else default_burn_windows()
    first = documents[0] if documents else None
    if isinstance(first, Mapping) and first.get("version") == SloFormat.SLOTH.value:
        if len(documents) != 1:
            raise SpecError(f"{where}: a Sloth file holds one document, found {len(documents)}")
        specs, notes = import_sloth(first, where=where, buckets=buckets, windows=table)
        return SloFile(path, SloFormat.SLOTH, specs, notes)
    if any(isinstance(d, Mapping) and d.get("apiVersion") == "openslo/v1" for d in documents):
        specs, notes = import_openslo(documents, where=where, buckets=buckets, windows=table)
        return SloFile(path, SloFormat.OPENSLO, specs, notes)
    if len(documents) != 1:
        raise SpecError(f"{where}: expected one YAML document with `slos:`, found {len(documents)}")
    specs = parse_spec_document(documents[0], where=where, buckets=buckets, windows=table)
    return SloFile(path, SloFormat.SERVEWATCH, specs)


# -- PromQL that counts vLLM's events ------------------------------------------------------

_SELECTOR = re.compile(r"(?P<name>vllm[:_][A-Za-z0-9_:]*)\s*(?:\{(?P<matchers>[^{}]*)\})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_SCOPE_LABELS = {"model_name": "model", "pool": "pool", "replica": "replica"}
# Matchers that select within the SLI's own series rather than narrowing its scope.
_SLI_LABELS = {"le", "finished_reason", "engine"}
_FAMILIES = {name: metric for metric, name in HISTOGRAMS.items()}


@dataclass(frozen=True)
class _Sli:
    fields: dict[str, Any]
    scope: dict[str, str]
    notes: tuple[str, ...]


def _family(name: str) -> tuple[str, str]:
    base = name[len("vllm:") :]
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if base.endswith(suffix):
            return base.removesuffix(suffix), suffix
    return base, ""


def recognize_sli(queries: Mapping[str, str], *, where: str) -> _Sli | None:
    """The servewatch SLI that `queries` (role -> PromQL) count, or None if they count
    something other than vLLM's latency histograms or request_success counter."""
    latency: set[LatencyMetric] = set()
    thresholds: set[str] = set()
    availability = False
    scope: dict[str, str] = {}
    notes: list[str] = []
    for role, query in queries.items():
        for match in _SELECTOR.finditer(query):
            family, suffix = _family(match.group("name"))
            if family in _FAMILIES:
                latency.add(_FAMILIES[family])
            elif family == "request_success":
                availability = True
            for label, op, value in _MATCHER.findall(match.group("matchers") or ""):
                if label == "le" and op == "=" and suffix == "_bucket" and value != "+Inf":
                    thresholds.add(value)
                elif label in _SCOPE_LABELS and op == "=":
                    key = _SCOPE_LABELS[label]
                    if scope.setdefault(key, value) != value:
                        notes.append(
                            f"{where}: {role} selects {label}={value!r} and "
                            f"{scope[key]!r}; kept {scope[key]!r}"
                        )
                elif label not in _SLI_LABELS:
                    notes.append(f"{where}: {role}: matcher {label}{op}{value!r} not kept")
    if len(latency) == 1 and len(thresholds) == 1:
        (metric,), (threshold,) = latency, thresholds
        try:
            threshold_s = float(threshold)
        except ValueError:
            return None
        fields = {"kind": "latency", "metric": metric.value, "threshold_s": threshold_s}
        return _Sli({**fields, "source": "metrics"}, scope, tuple(dict.fromkeys(notes)))
    if availability and not latency:
        notes.append(f'{where}: availability counts finished_reason="error" as bad events')
        fields = {"kind": "availability", "source": "metrics"}
        return _Sli(fields, scope, tuple(dict.fromkeys(notes)))
    return None


def _window_rows(windows: Sequence[BurnWindow], keep: set[Severity]) -> list[dict[str, Any]]:
    return [
        {
            "severity": w.severity.value,
            "long_window": w.long_window,
            "short_window": w.short_window,
            "budget_ratio": w.budget_ratio,
            "for": f"{w.for_s}s",
        }
        for w in windows
        if w.severity in keep
    ]


def _convert(
    document: dict[str, Any],
    *,
    where: str,
    buckets: Buckets,
    windows: Sequence[BurnWindow],
) -> SloSpec:
    fields = Fields(document, where=f"{where} (as a servewatch spec)")
    return parse_slo(fields, buckets=buckets, default_windows=windows)


def _ratio_from_percent(fields: Fields, key: str) -> float:
    value = fields.raw(key)
    try:
        percent = Decimal(str(value))
    except InvalidOperation as exc:
        raise fields.fail(key, f"must be a percentage such as 99.9, got {value!r}") from exc
    if isinstance(value, bool) or not 0 < percent < 100:
        raise fields.fail(key, f"must be a percentage above 0 and below 100, got {value!r}")
    return float(percent / 100)


# -- Sloth ----------------------------------------------------------------------------------


def import_sloth(
    document: Mapping[str, Any],
    *,
    where: str,
    buckets: Buckets = VLLM_DEFAULT_BUCKETS,
    windows: Sequence[BurnWindow] | None = None,
) -> tuple[tuple[SloSpec, ...], tuple[str, ...]]:
    """Specs from a Sloth `prometheus/v1` document. Sloth has no period in the file (its
    CLI defaults to 30 days), so imported SLOs get 30d."""
    table = tuple(windows) if windows is not None else default_burn_windows()
    root = Fields(document, where=where)
    root.raw("version")
    service = root.text("service")
    if service is None:
        raise root.fail("service", "is required (Sloth names SLOs <service>-<name>)")
    service_labels = root.string_map("labels")
    items = root.items("slos", required=True)
    notes = [f"{where}: {key}: not mapped" for key in sorted(set(document) - root.read - {"slos"})]
    specs: list[SloSpec] = []
    for item in items:
        name = item.text("name")
        if name is None:
            raise item.fail("name", "is required")
        objective_ratio = _ratio_from_percent(item, "objective")
        sli_fields = item.mapping("sli")
        if sli_fields is None:
            raise item.fail("sli", "is required")
        events = sli_fields.mapping("events")
        if events is None:
            kinds = ", ".join(sorted(str(k) for k in sli_fields.data)) or "nothing"
            notes.append(
                f"{where}: {item.path}: skipped; only sli.events maps (error_query and "
                f"total_query), found {kinds}"
            )
            continue
        queries = {
            f"{events.path}.error_query": str(events.required("error_query", "PromQL")),
            f"{events.path}.total_query": str(events.required("total_query", "PromQL")),
        }
        sli = recognize_sli(queries, where=where)
        if sli is None:
            notes.append(
                f"{where}: {item.path}: skipped; its queries count neither vLLM's latency "
                "histograms (one `le` bound) nor vllm:request_success_total"
            )
            continue
        notes.extend(sli.notes)
        keep = {Severity.PAGE, Severity.TICKET}
        alerting = item.mapping("alerting")
        if alerting is not None:
            for key, severity in (("page_alert", Severity.PAGE), ("ticket_alert", Severity.TICKET)):
                alert = alerting.mapping(key)
                if alert is not None and alert.raw("disable") is True:
                    keep.discard(severity)
            notes.append(
                f"{where}: {alerting.path}: names, labels and annotations not mapped; "
                "servewatch alerts are SLOErrorBudgetBurn with severity page or ticket"
            )
        if not keep:
            notes.append(f"{where}: {item.path}: both alerts disabled; budget only, no alerts")
        labels = {**service_labels, **item.string_map("labels")}
        document_out: dict[str, Any] = {
            "name": f"{service}-{name}",
            "sli": sli.fields,
            "objective_ratio": objective_ratio,
            "period": "30d",
            "scope": sli.scope,
            "labels": labels,
        }
        if (description := item.text("description")) is not None:
            document_out["description"] = description
        if keep != {Severity.PAGE, Severity.TICKET}:
            document_out["alert_windows"] = _window_rows(table, keep)
        notes.extend(
            f"{where}: {item.name(str(key))}: not mapped"
            for key in sorted(set(item.data) - item.read)
        )
        specs.append(
            _convert(document_out, where=f"{where}: {item.path}", buckets=buckets, windows=table)
        )
    notes.append(f"{where}: period not in Sloth files; imported SLOs use 30d (Sloth's default)")
    return tuple(specs), tuple(notes)


# -- OpenSLO --------------------------------------------------------------------------------

_OPENSLO_ROLES = ("good", "bad", "total")


def _openslo_queries(indicator: Fields) -> tuple[dict[str, str] | None, str | None]:
    spec = indicator.mapping("spec")
    if spec is None:
        return None, f"{indicator.path}: has no spec"
    ratio = spec.mapping("ratioMetric")
    if ratio is None:
        found = ", ".join(sorted(str(k) for k in spec.data)) or "nothing"
        return None, f"{spec.path}: only ratioMetric maps (counted events), found {found}"
    queries: dict[str, str] = {}
    roles = {role for role in _OPENSLO_ROLES if ratio.has(role)}
    if "total" not in roles or not roles & {"good", "bad"}:
        return None, f"{ratio.path}: needs total and one of good or bad"
    for role in _OPENSLO_ROLES:
        part = ratio.mapping(role)
        if part is None:
            continue
        source = part.mapping("metricSource")
        kind = source.raw("type") if source is not None else None
        query = None
        if source is not None:
            inner = source.mapping("spec")
            query = inner.raw("query") if inner is not None else None
        if kind != "Prometheus" or not isinstance(query, str):
            return None, f"{part.path}.metricSource: only type Prometheus with a query maps"
        queries[f"{part.path}.metricSource.spec.query"] = query
    return queries, None


def _openslo_period(spec: Fields) -> tuple[str | None, str | None]:
    windows = spec.items("timeWindow")
    if len(windows) != 1:
        return None, f"{spec.name('timeWindow')}: needs exactly one window, found {len(windows)}"
    window = windows[0]
    duration = window.raw("duration")
    rolling = window.raw("isRolling")
    if rolling is not True:
        return None, f"{window.path}: calendar windows do not map; servewatch periods roll"
    try:
        seconds = parse_duration_s(str(duration))
    except ValueError:
        return None, f"{window.path}.duration: {duration!r} is not a duration"
    if seconds not in PERIODS_S:
        return None, f"{window.path}.duration: {duration} is not 7d, 28d or 30d"
    return str(duration), None


def import_openslo(
    documents: Sequence[Any],
    *,
    where: str,
    buckets: Buckets = VLLM_DEFAULT_BUCKETS,
    windows: Sequence[BurnWindow] | None = None,
) -> tuple[tuple[SloSpec, ...], tuple[str, ...]]:
    """Specs from the `kind: SLO` documents of an OpenSLO v1 file; `indicatorRef` resolves
    against `kind: SLI` documents of the same file."""
    table = tuple(windows) if windows is not None else default_burn_windows()
    notes: list[str] = []
    indicators: dict[str, Fields] = {}
    slos: list[Fields] = []
    for i, document in enumerate(documents):
        fields = Fields.of(document, where=where, path=f"document[{i}]")
        kind = fields.raw("kind")
        if fields.raw("apiVersion") != "openslo/v1":
            notes.append(f"{where}: {fields.path}: not openslo/v1; skipped")
        elif kind == "SLO":
            slos.append(fields)
        elif kind == "SLI":
            metadata = fields.mapping("metadata")
            name = metadata.raw("name") if metadata is not None else None
            if isinstance(name, str):
                indicators[name] = fields
        else:
            notes.append(f"{where}: {fields.path}: kind {kind} not mapped")
    specs: list[SloSpec] = []
    for fields in slos:
        documents_out = _openslo_slo(fields, indicators=indicators, notes=notes)
        specs.extend(
            _convert(document, where=f"{where}: {path}", buckets=buckets, windows=table)
            for path, document in documents_out
        )
    return tuple(specs), tuple(notes)


def _openslo_slo(
    fields: Fields, *, indicators: Mapping[str, Fields], notes: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """servewatch spec documents (with the path each came from) for one OpenSLO SLO, one per
    objective; none, with a note saying why, when it does not map."""
    where = fields.where
    metadata = fields.mapping("metadata")
    name = metadata.text("name") if metadata is not None else None
    if name is None:
        raise fields.fail("metadata.name", "is required")
    spec = fields.mapping("spec")
    if spec is None:
        raise fields.fail("spec", "is required")
    indicator = spec.mapping("indicator")
    reference = spec.raw("indicatorRef")
    if indicator is None and isinstance(reference, str):
        indicator = indicators.get(reference)
        if indicator is None:
            notes.append(f"{where}: {fields.path}: skipped; SLI {reference!r} not in file")
            return []
    if indicator is None:
        raise spec.fail("indicator", "is required (or indicatorRef)")
    method = spec.raw("budgetingMethod")
    period, problem = _openslo_period(spec)
    queries, query_problem = _openslo_queries(indicator)
    sli = recognize_sli(queries, where=where) if queries is not None else None
    if method != "Occurrences":
        problem = f"budgetingMethod {method} does not map; servewatch budgets count events"
    reason = problem or query_problem
    if period is None or sli is None or reason is not None:
        reason = reason or (
            "its queries count neither vLLM's latency histograms nor vllm:request_success_total"
        )
        notes.append(f"{where}: {fields.path} ({name}): skipped; {reason}")
        return []
    notes.extend(sli.notes)
    if spec.has("alertPolicies"):
        notes.append(
            f"{where}: {spec.path}.alertPolicies: not mapped; servewatch alerts on the "
            "multiwindow burn-rate table"
        )
    objectives = spec.items("objectives", required=True)
    service = spec.raw("service")
    description = spec.text("description")
    documents: list[tuple[str, dict[str, Any]]] = []
    for index, objective in enumerate(objectives):
        target = objective.number("target")
        if target is None and objective.has("targetPercent"):
            target = _ratio_from_percent(objective, "targetPercent")
        if target is None:
            raise objective.fail("target", "is required (or targetPercent)")
        document: dict[str, Any] = {
            "name": f"{name}-{index}" if len(objectives) > 1 else name,
            "sli": sli.fields,
            "objective_ratio": target,
            "period": period,
            "scope": sli.scope,
            "labels": {"service": service} if isinstance(service, str) else {},
        }
        if description is not None:
            document["description"] = description
        documents.append((objective.path, document))
    return documents
