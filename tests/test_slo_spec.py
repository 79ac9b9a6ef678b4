"""SLO spec files: the examples load; every bad spec names the file, the field path and what
is allowed; histogram thresholds must sit on a bucket bound; the workbook's thresholds come
out of the window table for 30 and 28 days."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.utils import floatToGoString

from servewatch.slo.buckets import VLLM_DEFAULT_BUCKETS, LatencyMetric, le_label, nearest_bounds
from servewatch.slo.durations import format_duration, parse_duration_s
from servewatch.slo.fields import SpecError
from servewatch.slo.spec import GoodputSli, LatencySli, SliSource, TokenGoodputSli
from servewatch.slo.spec_file import load_spec_file, parse_spec_document
from servewatch.slo.windows import Severity, default_burn_windows, load_burn_windows
from tests.conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "docs" / "examples" / "slo"

GOOD: dict[str, Any] = {
    "slos": [
        {
            "name": "chat-ttft",
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 0.5, "source": "metrics"},
            "objective_ratio": 0.999,
            "period": "30d",
        }
    ]
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the field at dotted `path` (list items as numbers) set, or removed if ...."""
    data = copy.deepcopy(GOOD)
    node: Any = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def test_good_spec_parses_with_defaults() -> None:
    (spec,) = parse_spec_document(GOOD, where="slos.yaml")
    assert spec.sli == LatencySli(LatencyMetric.TTFT, 0.5, SliSource.METRICS)
    assert spec.period_s == 30 * 86400
    assert spec.min_events == 1
    assert spec.windows == default_burn_windows()
    assert spec.scope == ()


def test_example_spec_file_loads() -> None:
    specs = {s.name: s for s in load_spec_file(EXAMPLES / "chat.yaml")}
    assert set(specs) == {"chat-ttft", "chat-availability", "chat-goodput", "batch-e2e"}
    assert dict(specs["chat-ttft"].scope) == {
        "pool": "chat",
        "model": "meta-llama/Llama-3.1-70B-Instruct",
    }
    assert specs["chat-goodput"].sli == GoodputSli(ttft_s=0.5, tpot_s=0.05)
    assert specs["chat-goodput"].period == "7d"
    (ticket,) = specs["batch-e2e"].windows
    assert (ticket.severity, ticket.long_window, ticket.short_window, ticket.for_s) == (
        Severity.TICKET,
        "1d",
        "2h",
        1800,
    )


def window(**fields: Any) -> list[dict[str, Any]]:
    return [{"severity": "page", "long_window": "1h", "budget_ratio": 0.02, **fields}]


GOODPUT = {"kind": "goodput", "ttft_s": 0.5, "tpot_s": 0.05}
NOT_A_BOUND = (
    "slos[0].sli.threshold_s: 0.3 s is not a bucket bound of vllm:time_to_first_token_seconds, "
    "so a histogram cannot count requests under it; nearest bounds: 0.25 and 0.5"
)
WEEK = {**GOOD["slos"][0], "period": "7d"}
BAD_SPECS = [
    (
        with_change("slos.0.sli.kind", "throughput"),
        "slos[0].sli.kind: is 'throughput'; allowed: latency, availability, goodput, token_goodput",
    ),
    (
        with_change("slos.0.objective_ratio", 1.0),
        "slos[0].objective_ratio: must be above 0 and below 1 (0.999 means 99.9 %), got 1",
    ),
    (with_change("slos.0.objective_ratio", 1.5), "objective_ratio: must be above 0 and below 1"),
    (with_change("slos.0.objective_ratio", 0), "objective_ratio: must be above 0 and below 1"),
    (with_change("slos.0.objective_ratio", -0.5), "objective_ratio: must be above 0 and below 1"),
    (with_change("slos.0.objective_ratio", 99.9), "got 99.9; for 99.9 % write 0.999"),
    (with_change("slos.0.objective_ratio", "99.9%"), "must be a number, got '99.9%'"),
    (with_change("slos.0.sli.threshold_s", 0.3), NOT_A_BOUND),
    (with_change("slos.0.sli.threshold_s", 5000), "nearest bounds: 2560 ("),
    (
        with_change("slos.0.sli.threshold_s", -1),
        "slos[0].sli.threshold_s: must be a positive number of seconds, got -1",
    ),
    (with_change("slos.0.sli.metric", "itl"), "sli.metric: is 'itl'; allowed: ttft, tpot, e2e"),
    (
        with_change("slos.0.sli.treshold_s", 0.5),
        "slos[0].sli.treshold_s: unknown field; allowed here: kind, metric, source, threshold_s",
    ),
    (with_change("slos.0.objectve", 0.99), "slos[0].objectve: unknown field; allowed here:"),
    (with_change("slos.0.colour", "red"), "slos[0].colour: unknown field"),
    (
        with_change("slos.0.sli", {**GOODPUT, "source": "metrics"}),
        "slos[0].sli.source: goodput needs source: traces",
    ),
    (with_change("slos.0.sli", {**GOODPUT, "tpot_s": None}), "slos[0].sli.tpot_s: is required"),
    (
        with_change("slos.0.sli", {**GOODPUT, "kind": "token_goodput", "source": "metrics"}),
        "slos[0].sli.source: token_goodput needs source: traces",
    ),
    (
        with_change("slos.0.sli", {**GOODPUT, "kind": "token_goodput", "ttft_s": None}),
        "slos[0].sli.ttft_s: is required",
    ),
    (
        with_change("slos.0.sli", {"kind": "availability", "threshold_s": 1}),
        "slos[0].sli.threshold_s: unknown field; allowed here: kind, source",
    ),
    (with_change("slos.0.sli", ...), "slos[0].sli: is required (kind: latency, availability"),
    (with_change("slos.0.name", ...), "slos[0].name: is required"),
    (with_change("slos.0.name", "chat ttft"), "name: 'chat ttft' must start with a letter"),
    (with_change("slos.0.period", "14d"), "slos[0].period: is 14d; allowed: 7d, 28d, 30d"),
    (with_change("slos.0.period", "a month"), "slos[0].period: 'a month' is not a duration"),
    (
        with_change("slos.0.scope", {"zone": "a"}),
        "slos[0].scope.zone: unknown field; allowed here: adapter, model, pool, replica, tenant",
    ),
    (with_change("slos.0.scope", {"pool": None}), "slos[0].scope.pool: needs a value"),
    (with_change("slos.0.min_events", 0), "min_events: must be a whole number >= 1, got 0"),
    (
        with_change("slos.0.labels", {"severity": "high"}),
        "slos[0].labels.severity: must be a Prometheus label name other than",
    ),
    (
        with_change("slos.0.alert_windows", window(long_window="40d")),
        "slos[0].alert_windows[0].long_window: 40d is longer than the period 30d",
    ),
    (
        {"slos": [{**WEEK, "alert_windows": window(long_window="8d", short_window="1d")}]},
        "slos[0].alert_windows[0].long_window: 8d is longer than the period 7d",
    ),
    (
        with_change("slos.0.alert_windows", window(short_window="2h")),
        "slos[0].alert_windows[0].short_window: 2h must be shorter than long_window 1h",
    ),
    (
        with_change("slos.0.alert_windows", window(severity="urgent")),
        "slos[0].alert_windows[0].severity: is 'urgent'; allowed: page, ticket",
    ),
    (
        with_change("slos.0.alert_windows", window(budget_ratio=2)),
        "slos[0].alert_windows[0].budget_ratio: must be above 0 and at most 1",
    ),
    (
        with_change("slos.0.alert_windows", window(long_window="90s", short_window="30s")),
        "slos[0].alert_windows[0].long_window: is '90s'; must be a whole number of minutes",
    ),
    (
        with_change("slos.0.alert_windows", window() * 2),
        "slos[0].alert_windows[1].long_window: the pair 1h/5m appears twice",
    ),
    (
        {"slos": [GOOD["slos"][0], GOOD["slos"][0]]},
        "slos[1].name: 'chat-ttft' is used by an earlier SLO",
    ),
    ({"slos": []}, "slos: is empty"),
    ({"slo": []}, "slos: is required"),
    (
        {"version": "prometheus/v1", "slos": []},
        "version: is 'prometheus/v1'; this reader takes servewatch/v1",
    ),
    ([1, 2], "document: must be a mapping, got list"),
]


@pytest.mark.parametrize(("data", "message"), BAD_SPECS)
def test_bad_specs_name_file_field_and_what_is_allowed(data: Any, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec_document(data, where="slos.yaml")
    text = str(caught.value)
    assert text.startswith("slos.yaml: "), text
    assert message in text, text


def test_custom_buckets_change_which_thresholds_are_allowed() -> None:
    data = with_change("slos.0.sli.threshold_s", 0.3)
    buckets = {**VLLM_DEFAULT_BUCKETS, LatencyMetric.TTFT: (0.1, 0.3, 1.0)}
    (spec,) = parse_spec_document(data, where="slos.yaml", buckets=buckets)
    assert isinstance(spec.sli, LatencySli)
    assert spec.sli.threshold_s == 0.3
    # From traces any threshold counts: no buckets are involved.
    traced = with_change("slos.0.sli.source", "traces")
    traced["slos"][0]["sli"]["threshold_s"] = 0.3
    (spec,) = parse_spec_document(traced, where="slos.yaml")
    assert isinstance(spec.sli, LatencySli)
    assert spec.sli.source is SliSource.TRACES


def test_threshold_snaps_to_the_bound_through_float_noise() -> None:
    (spec,) = parse_spec_document(with_change("slos.0.sli.threshold_s", 0.1 + 0.15), where="x")
    assert isinstance(spec.sli, LatencySli)
    assert spec.sli.threshold_s == 0.25


def test_file_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("slos:\n  - name: a\n    objective_ratio: [\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML"):
        load_spec_file(path)
    with pytest.raises(SpecError, match=r"missing.yaml: cannot read"):
        load_spec_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("values", "value", "expected"),
    [
        ((0.1, 0.25, 0.5), 0.3, (0.25, 0.5)),
        ((0.1, 0.25, 0.5), 0.05, (None, 0.1)),
        ((0.1, 0.25, 0.5), 0.9, (0.5, None)),
        ((0.5, 0.1), 0.2, (0.1, 0.5)),
    ],
)
def test_nearest_bounds(
    values: tuple[float, ...], value: float, expected: tuple[float | None, float | None]
) -> None:
    assert nearest_bounds(values, value) == expected


@pytest.mark.parametrize(
    "bound",
    [
        *{b for bounds in VLLM_DEFAULT_BUCKETS.values() for b in bounds},
        1e7,
        12345678.5,
        float("inf"),
    ],
)
def test_le_label_matches_prometheus_client(bound: float) -> None:
    assert le_label(bound) == floatToGoString(bound)


@pytest.mark.parametrize(
    ("text", "seconds", "formatted"),
    [
        ("5m", 300, "5m"),
        ("1h", 3600, "1h"),
        ("3d", 259200, "3d"),
        ("4w", 2419200, "28d"),
        ("90s", 90, "90s"),
        ("120m", 7200, "2h"),
    ],
)
def test_durations_round_trip(text: str, seconds: int, formatted: str) -> None:
    assert parse_duration_s(text) == seconds
    assert format_duration(seconds) == formatted


@pytest.mark.parametrize("text", ["", "5", "1.5h", "0m", "-1h", "1h30m", "5M"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s(text)


# The SRE Workbook's table (REFERENCE section 6) for 30 days, and the same rows scaled to the
# other periods as Pyrra scales its own (windows x period / reference, rounded to the minute,
# burn rates kept): (severity, long, short, burn threshold) per period.
PERIOD_WINDOWS = {
    "30d": [
        (Severity.PAGE, "1h", "5m", 14.4),
        (Severity.PAGE, "6h", "30m", 6.0),
        (Severity.TICKET, "1d", "2h", 3.0),
        (Severity.TICKET, "3d", "6h", 1.0),
    ],
    "28d": [
        (Severity.PAGE, "56m", "5m", 14.4),
        (Severity.PAGE, "336m", "28m", 6.0),
        (Severity.TICKET, "1344m", "112m", 3.0),
        (Severity.TICKET, "4032m", "336m", 1.0),
    ],
    "7d": [
        (Severity.PAGE, "14m", "1m", 14.4),
        (Severity.PAGE, "84m", "7m", 6.0),
        (Severity.TICKET, "336m", "28m", 3.0),
        (Severity.TICKET, "1008m", "84m", 1.0),
    ],
}


@pytest.mark.parametrize("period", sorted(PERIOD_WINDOWS))
def test_default_windows_scale_with_the_period_and_keep_the_workbook_burn_rates(
    period: str,
) -> None:
    (spec,) = parse_spec_document(with_change("slos.0.period", period), where="x")
    derived = [
        (w.severity, w.long_window, w.short_window, spec.burn_threshold(w)) for w in spec.windows
    ]
    # exact, not merely close: these floats go into alert rules
    assert derived == PERIOD_WINDOWS[period]
    assert min(spec.burn_threshold(w) for w in spec.windows) >= 1.0
    for window in spec.windows:  # each row spends its share of the budget in its long window
        spent = spec.burn_threshold(window) * window.long_window_s / spec.period_s
        assert spent == pytest.approx(window.budget_ratio)


def test_a_custom_row_burning_below_1_is_refused() -> None:
    document = with_change(
        "slos.0.alert_windows",
        [{"severity": "ticket", "long_window": "3d", "budget_ratio": 0.1}],
    )
    document["slos"][0]["period"] = "7d"
    with pytest.raises(SpecError, match=r"burn rate of 0.233, below 1.*use at least 0.4286"):
        parse_spec_document(document, where="x")


def test_window_table_errors_name_the_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "windows.toml"
    path.write_text(
        '[[windows]]\nseverity = "page"\nlong_window = "1h"\nbudget_ratio = 0.02\nbudget = 1\n',
        encoding="utf-8",
    )
    with pytest.raises(SpecError, match=r"windows.toml: windows\[0\].budget: unknown field"):
        load_burn_windows(path)
    path.write_text("[[windows]]\nseverity = 'page'\nlong_window = '1h'\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"windows\[0\].budget_ratio: is required"):
        load_burn_windows(path)
    path.write_text("windows = [\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"windows.toml: not valid TOML"):
        load_burn_windows(path)


def test_alert_windows_can_be_empty_to_track_the_budget_only() -> None:
    (spec,) = parse_spec_document(with_change("slos.0.alert_windows", []), where="x")
    assert spec.windows == ()
    assert spec.window_lengths_s() == (30 * 86400,)


def test_token_goodput_counts_tokens_with_the_goodput_criterion() -> None:
    document = with_change("slos.0.sli", {**GOODPUT, "kind": "token_goodput"})
    (spec,) = parse_spec_document(document, where="x")
    assert spec.sli == TokenGoodputSli(ttft_s=0.5, tpot_s=0.05)
    assert spec.counts_tokens
    criterion = spec.event_criterion()
    assert criterion is not None
    assert (criterion.ttft_limit_s, criterion.tpot_limit_s, criterion.e2e_limit_s) == (
        0.5,
        0.05,
        None,
    )
    (requests,) = parse_spec_document(with_change("slos.0.sli", GOODPUT), where="x")
    assert not requests.counts_tokens


def test_event_criterion_for_the_pipeline() -> None:
    specs = {s.name: s for s in load_spec_file(EXAMPLES / "chat.yaml")}
    assert specs["chat-ttft"].event_criterion() is None  # counted from histograms
    goodput = specs["chat-goodput"].event_criterion()
    assert goodput is not None
    assert (goodput.name, goodput.ttft_limit_s, goodput.tpot_limit_s) == ("chat-goodput", 0.5, 0.05)
    e2e = specs["batch-e2e"].event_criterion()
    assert e2e is not None
    assert (e2e.ttft_limit_s, e2e.e2e_limit_s) == (None, 120.0)
