"""Generated Prometheus rules: promtool accepts them, and on the series of
tests/promtool/burn_alerts_test.yml Prometheus's alerts fire and resolve at the same
evaluations as servewatch's own evaluator."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from servewatch.slo.alert_state import AlertState
from servewatch.slo.alerting import replay
from servewatch.slo.buckets import LatencyMetric
from servewatch.slo.imports import load_slo_file
from servewatch.slo.notification import ABSENT_ALERT_NAME, ALERT_NAME, alert_labels
from servewatch.slo.prometheus_rules import prometheus_rules
from servewatch.slo.spec import AvailabilitySli, GoodputSli, LatencySli, SliSource, SloSpec
from servewatch.slo.spec_file import load_spec_file
from servewatch.slo.windows import BurnWindow, Severity, default_burn_windows
from tests.conftest import REPO_ROOT, require_program

PROMTOOL_DIR = REPO_ROOT / "tests" / "promtool"
EXAMPLES = REPO_ROOT / "docs" / "examples" / "slo"
EPOCH = datetime(1970, 1, 1)  # promtool's series start at Unix time 0


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_program("promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    "source",
    [*sorted(EXAMPLES.glob("*.yaml")), PROMTOOL_DIR / "slos.yml"],
    ids=lambda p: p.name,
)
def test_generated_rules_pass_promtool_check(source: Path, tmp_path: Path) -> None:
    specs = load_slo_file(source).specs
    rules = prometheus_rules(specs)
    assert rules.groups, "every example has at least one SLO vLLM's metrics can express"
    path = tmp_path / "rules.yml"
    path.write_text(rules.to_yaml(), encoding="utf-8")
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def expand(values: str) -> list[float]:
    """promtool's expanding notation, as far as the test file uses it: `a+bxn` and numbers."""
    out: list[float] = []
    for token in values.split():
        match = re.fullmatch(r"(-?[\d.]+)([+-][\d.]+)x(\d+)", token)
        if match:
            start, step, count = float(match[1]), float(match[2]), int(match[3])
            out.extend(start + step * i for i in range(count + 1))
        else:
            out.append(float(token))
    return out


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition("{")
    return name, dict(re.findall(r'(\w+)="([^"]*)"', rest))


def minute_counts(input_series: list[dict[str, str]]) -> pl.LazyFrame:
    """Per-minute good/total events of each SLO of slos.yml from the test group's counters
    (all of model llama): the increase between the samples at minute m and m + 1 belongs to
    minute m."""
    counters: dict[str, list[float]] = {}
    for item in input_series:
        name, labels = parse_series(item["series"])
        values = expand(item["values"])
        if name == "vllm:time_to_first_token_seconds_count":
            counters["ttft_total"] = values
        elif name == "vllm:time_to_first_token_seconds_bucket" and labels["le"] == "0.5":
            counters["ttft_good"] = values
        elif name == "vllm:request_success_total":
            role = "errors" if labels["finished_reason"] == "error" else "ok"
            counters[role] = [
                a + b for a, b in zip(counters.get(role, [0.0] * len(values)), values, strict=True)
            ]
    rows: list[dict[str, Any]] = []

    def add(slo: str, good: list[float], total: list[float]) -> None:
        rows.extend(
            {
                "minute_ts": EPOCH + timedelta(minutes=m),
                "slo": slo,
                "model": "llama",
                "good": round(good[m + 1] - good[m]),
                "total": round(total[m + 1] - total[m]),
            }
            for m in range(len(total) - 1)
        )

    if "ttft_total" in counters:
        add("chat-ttft", counters["ttft_good"], counters["ttft_total"])
    if "ok" in counters:
        errors = counters.get("errors", [0.0] * len(counters["ok"]))
        add(
            "chat-availability",
            counters["ok"],
            [a + b for a, b in zip(counters["ok"], errors, strict=True)],
        )
    schema = {
        "minute_ts": pl.Datetime("us"),
        "slo": pl.String(),
        "model": pl.String(),
        "good": pl.Int64(),
        "total": pl.Int64(),
    }
    return pl.LazyFrame(rows, schema=schema)


def minutes_of(duration: str) -> int:
    assert duration.endswith("m"), duration
    return int(duration[:-1])


@pytest.mark.slow
def test_promtool_and_our_evaluator_fire_and_resolve_at_the_same_evaluations(
    tmp_path: Path,
) -> None:
    specs = load_spec_file(PROMTOOL_DIR / "slos.yml")
    (tmp_path / "rules.yml").write_text(prometheus_rules(specs).to_yaml(), encoding="utf-8")
    shutil.copy(PROMTOOL_DIR / "burn_alerts_test.yml", tmp_path)
    result = promtool("test", "rules", "burn_alerts_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

    # The same series through servewatch. Prometheus 2.42's range selectors include both
    # ends, so with one sample a minute `[1h]` spans exactly the 60 minutes servewatch sums:
    # the two agree at every evaluation, not merely within one interval.
    document = yaml.safe_load((PROMTOOL_DIR / "burn_alerts_test.yml").read_text(encoding="utf-8"))
    compared = 0
    for group in document["tests"]:
        last = max(minutes_of(t["eval_time"]) for t in group["alert_rule_test"])
        changes = replay(
            minute_counts(group["input_series"]),
            specs=specs,
            start=EPOCH,
            end=EPOCH + timedelta(minutes=last),
        )
        for check in group["alert_rule_test"]:
            at = EPOCH + timedelta(minutes=minutes_of(check["eval_time"]))
            latest = {c.key: c for c in changes if c.changed_ts <= at}
            ours = {
                frozenset((k, v) for k, v in alert_labels(c).items() if k != "alertname")
                for c in latest.values()
                if c.state is AlertState.FIRING
            }
            theirs = {frozenset(alert["exp_labels"].items()) for alert in check["exp_alerts"]}
            assert ours == theirs, check["eval_time"]
            compared += 1
    assert compared == 10


def test_first_page_evaluation_is_the_one_after_52_s_of_outage() -> None:
    # The file's page case: outage from minute 400; 14.4 * 0.1 % of an hour = 51.84 s, so the
    # first evaluation that can see it is at minute 401, where the file expects the page.
    document = yaml.safe_load((PROMTOOL_DIR / "burn_alerts_test.yml").read_text(encoding="utf-8"))
    group = document["tests"][0]
    specs = load_spec_file(PROMTOOL_DIR / "slos.yml")
    changes = replay(
        minute_counts(group["input_series"]),
        specs=specs,
        start=EPOCH + timedelta(minutes=390),
        end=EPOCH + timedelta(minutes=410),
    )
    fired = [c for c in changes if c.state is AlertState.FIRING]
    assert [(c.key.window, c.changed_ts) for c in fired] == [("1h", EPOCH + timedelta(minutes=401))]
    page_tests = [t["eval_time"] for t in group["alert_rule_test"] if t["exp_alerts"]]
    assert page_tests[0] == "401m"


def test_rules_for_a_histogram_slo() -> None:
    spec = SloSpec(
        "e2e",
        LatencySli(LatencyMetric.E2E, 10.0, SliSource.METRICS),
        0.99,
        28 * 86400,
        (BurnWindow(Severity.TICKET, 86400, 7200, 0.1, for_s=1800),),
        scope=(("model", "m"),),
        min_events=20,
        labels=(("team", "a"),),
    )
    (group,) = prometheus_rules([spec], metric_prefix="vllm_").groups
    records = {r["record"]: r for r in group["rules"] if "record" in r}
    assert set(records) == {
        "slo:sli_error:ratio_rate1d",
        "slo:sli_error:ratio_rate2h",
        "slo:sli_events:increase1d",
        "slo:sli_events:increase2h",
    }
    ratio = records["slo:sli_error:ratio_rate2h"]
    assert 'vllm_e2e_request_latency_seconds_bucket{le="10.0",model_name="m"}[2h]' in ratio["expr"]
    assert ratio["labels"] == {"slo": "e2e", "model": "m", "team": "a"}
    (alert,) = (r for r in group["rules"] if r.get("alert") == ALERT_NAME)
    assert alert["for"] == "30m"
    assert "(2.8 * (1 - 0.99))" in alert["expr"]
    assert 'slo:sli_events:increase2h{slo="e2e"} >= 20' in alert["expr"]
    assert alert["labels"] == {
        "slo": "e2e",
        "severity": "ticket",
        "window": "1d",
        "short_window": "2h",
    }
    # Pyrra's absent alert: 2.8 x 1 % of 1d is 2419 s, plus the 30m `for`, to the minute.
    (absent,) = (r for r in group["rules"] if r.get("alert") == ABSENT_ALERT_NAME)
    assert (
        absent["expr"] == 'absent(sum(vllm_e2e_request_latency_seconds_count{model_name="m"})) == 1'
    )
    assert absent["for"] == "70m"
    assert absent["labels"] == {"slo": "e2e", "severity": "page", "model": "m", "team": "a"}


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (SloSpec("g", GoodputSli(0.5, 0.05), 0.9, 7 * 86400, ()), "g: counted from traces"),
        (
            SloSpec("t", AvailabilitySli(SliSource.TRACES), 0.9, 7 * 86400, ()),
            "t: counted from traces",
        ),
        (
            SloSpec(
                "n",
                AvailabilitySli(SliSource.METRICS),
                0.9,
                7 * 86400,
                (),
                scope=(("tenant", "x"),),
            ),
            "n: scope tenant='x' has no label on vLLM's metrics (known: model, pool, replica)",
        ),
    ],
)
def test_slos_metrics_cannot_express_are_skipped_with_the_reason(
    spec: SloSpec, reason: str
) -> None:
    rules = prometheus_rules([spec])
    assert rules.groups == ()
    (skipped,) = rules.skipped
    assert skipped.startswith(reason), skipped
    assert f"# skipped: {skipped}" in rules.to_yaml()


def test_thresholds_in_rules_are_the_floats_the_evaluator_compares() -> None:
    spec = SloSpec(
        "a", AvailabilitySli(SliSource.METRICS), 0.999, 30 * 86400, default_burn_windows()
    )
    rules = prometheus_rules([spec]).groups[0]["rules"]
    alerts = [r for r in rules if r.get("alert") == ALERT_NAME]
    for window, alert in zip(spec.windows, alerts, strict=True):
        literal = re.search(r"> \(([\d.e-]+) \* \(1 - ([\d.]+)\)\)", alert["expr"])
        assert literal is not None
        assert float(literal[1]) * (1 - float(literal[2])) == spec.max_error_ratio(window)
