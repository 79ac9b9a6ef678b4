"""servewatch's own alert evaluation and Prometheus' evaluation (`promtool test rules`) of the
rules `slo rules` generates agree at every minute, on hours of generated vLLM counters with
error and latency bursts, a scrape gap, a counter reset and an error counter that first
appears already holding a value, fed to servewatch through the real ingest path (exposition
pages with scrape times into a store)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.slo.absent_alert import is_absent_alert
from servewatch.slo.alert_state import AlertChange, AlertKey, AlertState
from servewatch.slo.counter_windows import LOOKBACK_S
from servewatch.slo.notification import ABSENT_ALERT_NAME as ABSENT
from servewatch.slo.notification import ALERT_NAME, alert_labels
from servewatch.slo.prometheus_rules import prometheus_rules
from servewatch.slo.spec_file import parse_spec_document
from servewatch.slo_service import replay_from_store
from servewatch.store import Store
from tests.conftest import require_program

EPOCH = datetime(1970, 1, 1)  # promtool's series start at Unix time 0
MINUTES = 420
GAP = range(150, 165)  # no scrape answered
RESET = 200  # the server restarted: every counter starts again from zero
ERRORS_APPEAR = 100  # the error series is first exposed here, already holding 30
# From 390 to 420 the 7-day SLO's 84m window holds only this minute's 84 slow first tokens
# of 8400: its error ratio lands on the ticket's threshold of 1 x 1 %.
TIE = 380

SLOS: dict[str, Any] = {
    "version": "servewatch/v1",
    "slos": [
        {  # the demo's availability SLO
            "name": "availability",
            "sli": {"kind": "availability", "source": "metrics"},
            "objective_ratio": 0.999,
            "period": "30d",
        },
        {  # a 7-day SLO: the default windows scaled to the period (14m/1m ... 1008m/84m)
            "name": "ttft",
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 0.5, "source": "metrics"},
            "objective_ratio": 0.99,
            "period": "7d",
            "min_events": 50,
            "scope": {"model": "llama"},
        },
    ],
}


def per_minute(minute: int) -> tuple[int, int, int]:
    """(finished without error, errors, slow first tokens) in the minute ending at `minute`."""
    errors = 40 if 100 <= minute < 110 else 20 if 250 <= minute < 257 else 0
    errors += 3 if minute in (330, 331) else 0
    slow = 50 if 30 <= minute < 40 else 12 if 300 <= minute < 306 else 0
    slow += 84 if minute == TIE else 0  # 84 slow of 8400 in the 84m window: exactly 1 %
    return 100, errors, slow


def counters() -> dict[str, list[float | None]]:
    """Each series' value at every minute (None: not scraped, or not exposed yet)."""
    values: dict[str, list[float | None]] = {k: [] for k in ("stop", "error", "count", "good")}
    running = dict.fromkeys(values, 0.0)
    for minute in range(MINUTES + 1):
        if minute == RESET:
            running = dict.fromkeys(values, 0.0)
        ok, errors, slow = per_minute(minute)
        running["stop"] += ok
        running["error"] += errors
        running["count"] += ok
        running["good"] += ok - slow
        if minute == ERRORS_APPEAR:
            running["error"] += 30 - errors  # appears holding 30
        for key, series in values.items():
            hidden = minute in GAP or (key == "error" and minute < ERRORS_APPEAR)
            series.append(None if hidden else running[key])
    return values


LABELS = 'engine="0",model_name="llama"'
SERIES = {
    "stop": f'vllm:request_success_total{{{LABELS},finished_reason="stop"}}',
    "error": f'vllm:request_success_total{{{LABELS},finished_reason="error"}}',
    "count": f"vllm:time_to_first_token_seconds_count{{{LABELS}}}",
    "good": f'vllm:time_to_first_token_seconds_bucket{{{LABELS},le="0.5"}}',
}


def page(minute: int, values: dict[str, list[float | None]]) -> str:
    value = {k: v[minute] for k, v in values.items()}
    lines = ["# TYPE vllm:request_success_total counter"]
    lines += [f"{SERIES[k]} {value[k]}" for k in ("stop", "error") if value[k] is not None]
    lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
    lines.append(f"{SERIES['good']} {value['good']}")
    lines.append(f'vllm:time_to_first_token_seconds_bucket{{{LABELS},le="+Inf"}} {value["count"]}')
    lines.append(f"{SERIES['count']} {value['count']}")
    lines.append(f"vllm:time_to_first_token_seconds_sum{{{LABELS}}} 0.0")
    return "\n".join(lines) + "\n"


def minute_of(moment: datetime) -> int:
    return int((moment - EPOCH) / timedelta(minutes=1))


def promtool_values(values: list[float | None]) -> str:
    return " ".join("_" if v is None else repr(v) for v in values)


@pytest.mark.slow
def test_alerts_fire_and_resolve_at_the_same_minutes_as_prometheus(tmp_path: Path) -> None:
    specs = parse_spec_document(SLOS, where="test")
    rules = prometheus_rules(specs)
    assert not rules.skipped
    values = counters()

    target = Target("r0", TargetKind.VLLM, "file:r0", replica="r0", model="llama")
    pages = [
        Page(target, EPOCH + timedelta(minutes=m), page(m, values))
        for m in range(MINUTES + 1)
        if m not in GAP
    ]
    with Store.open(tmp_path / "store.duckdb") as store:
        ingest_pages(pages, store=store)
        changes = replay_from_store(
            store, specs=specs, start=EPOCH, end=EPOCH + timedelta(minutes=MINUTES)
        )

    # Prometheus' annotations are the rules' (servewatch's carry the numbers of the moment).
    annotations = {
        (rule["alert"], rule["labels"]["slo"], rule["labels"].get("window")): rule["annotations"]
        for group in rules.groups
        for rule in group["rules"]
        if "alert" in rule
    }
    firing: dict[AlertKey, AlertChange] = {}
    expected_by_minute: dict[str, list[list[dict[str, Any]]]] = {ALERT_NAME: [], ABSENT: []}
    by_minute: dict[int, list[AlertChange]] = {}
    for change in changes:
        by_minute.setdefault(minute_of(change.changed_ts), []).append(change)
    for minute in range(MINUTES + 1):
        for change in by_minute.get(minute, []):
            firing.pop(change.key, None)
            if change.state is AlertState.FIRING:
                firing[change.key] = change
        for name, expected in expected_by_minute.items():
            alerts = []
            for key in sorted(firing, key=AlertKey.sort_key):
                # The labels servewatch's notifiers send, which the rules must produce too.
                labels = alert_labels(firing[key])
                if labels.pop("alertname") == name:
                    alerts.append(
                        {
                            "exp_labels": labels,
                            "exp_annotations": annotations[(name, key.slo, labels.get("window"))],
                        }
                    )
            expected.append(alerts)
    # At the tie PromQL's ratio, 1 - rate(good) / rate(total), rounds above the threshold:
    # the ticket fires on both sides (the ratio of the counts, 84 / 8400, would not).
    ticket = [c for c in changes if c.key.slo == "ttft" and c.key.window == "1008m"]
    assert ticket
    assert ticket[-1].state is AlertState.FIRING
    assert ticket[-1].changed_ts <= EPOCH + timedelta(minutes=TIE + 10)
    # The case exercises both directions for both SLOs.
    burns = [c for c in changes if not is_absent_alert(c.key)]
    fired = {c.key.slo for c in burns if c.state is AlertState.FIRING}
    resolved = {c.key.slo for c in burns if c.state is AlertState.RESOLVED}
    assert fired == resolved == {"availability", "ttft"}
    # The gap: the series are absent once their last sample is older than the 5m lookback,
    # the absent alert fires after its `for` (1m for the 30-day SLO, 2m for the 7-day one)
    # and resolves with the first scrape after the gap.
    absent_from = GAP.start - 1 + LOOKBACK_S // 60 + 1
    absent = sorted(
        (c.key.slo, c.state.value, minute_of(c.changed_ts)) for c in changes if c not in burns
    )
    assert absent == [
        ("availability", "firing", absent_from + 1),
        ("availability", "pending", absent_from),
        ("availability", "resolved", GAP.stop),
        ("ttft", "firing", absent_from + 2),
        ("ttft", "pending", absent_from),
        ("ttft", "resolved", GAP.stop),
    ]

    test_file = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": SERIES[k], "values": promtool_values(v)} for k, v in values.items()
                ],
                "alert_rule_test": [
                    {"eval_time": f"{m}m", "alertname": name, "exp_alerts": expected}
                    for name, by_minute_expected in expected_by_minute.items()
                    for m, expected in enumerate(by_minute_expected)
                ],
            }
        ],
    }
    (tmp_path / "rules.yml").write_text(rules.to_yaml(), encoding="utf-8")
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test_file, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [require_program("promtool"), "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
