"""The demo's report in headless Chromium, read from the rendered DOM: each SLO's verdict,
budget and burn rates at the top, the alerts that fired, the recommended fleet with its reserve
cost, the bad replica (vllm-9) first in the sortable per-replica table, and a "Not shown" list
that names no data the store holds.

The demo runs as `make demo` runs it, over two emulated hours instead of a day (the same
fleet, failures and SLOs, scaled to the shorter day) and without its live phase.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servewatch.demo import LOST_HOST, REGRESSED_REPLICA, run_demo
from tests.conftest import require_program
from tests.test_dashboards_browser import (
    DevTools,
    attach_offline_page,
    console_problems,
    fetched_urls,
    open_report,
    screenshot,
)

VERDICTS_JS = """
JSON.stringify(Array.from(document.querySelectorAll("#slo-verdicts tr[data-slo]")).map((tr) => ({
  slo: tr.dataset.slo,
  verdict: tr.querySelector("td.verdict").innerText,
  counts: tr.children[2].innerText,
  budget: tr.querySelector("td.budget").innerText,
  burn: tr.querySelector("td.burn").innerText,
  firing: tr.querySelector("td.firing").innerText,
  fired: tr.querySelector("td.fired").innerText,
})))
"""
REPLICAS_JS = """
JSON.stringify(Array.from(document.querySelectorAll("#replica-table tbody tr")).map((tr) => ({
  replica: tr.dataset.replica,
  bad: tr.classList.contains("bad"),
  text: tr.innerText,
})))
"""
SECTIONS_JS = (
    "JSON.stringify(Array.from(document.querySelectorAll('body > section > h2'))"
    ".map((h) => h.innerText))"
)
NOT_SHOWN_JS = (
    "JSON.stringify(Array.from(document.querySelectorAll('section.omitted li'))"
    ".map((li) => li.innerText))"
)


# Session-scoped: the shuffled CI pass interleaves this module's tests with others', and a
# module-scoped fixture would be built again at every return to the module.
@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    # Half the demo's day: its regression lasts a tenth of the run, and the 7-day goodput SLO's
    # windows (84 min and up) burn past their thresholds only on a regression that long; a
    # 2 h run's 12 minutes truly fire nothing.
    summary: dict[str, Any] = run_demo(out=out, hours=12.0, live_seconds=0).summary
    return summary


@pytest.fixture
def page(demo: dict[str, Any], tmp_path: Path) -> Iterator[DevTools]:
    chromium = require_program("chromium")
    devtools = DevTools(chromium, tmp_path / "profile")
    try:
        attach_offline_page(devtools, width_px=1100)
        charts = open_report(devtools, Path(demo["report"]))
        assert all(c["rendered"] == "true" for c in charts), charts
        yield devtools
    finally:
        devtools.close()


def dom(page: DevTools, script: str) -> Any:
    return json.loads(page.evaluate(script))


@pytest.mark.slow
def test_the_page_opens_with_the_answers(page: DevTools, demo: dict[str, Any]) -> None:
    sections = dom(page, SECTIONS_JS)
    assert sections[:3] == ["SLO verdicts", "Capacity: the recommended fleet", "Which replica"]
    screenshot(page, "demo-report.png")
    assert console_problems(page) == [], console_problems(page)
    assert fetched_urls(page, Path(demo["report"])) == []


@pytest.mark.slow
def test_each_slo_shows_its_verdict_budget_burn_rates_and_alerts(
    page: DevTools, demo: dict[str, Any]
) -> None:
    rows = {row["slo"]: row for row in dom(page, VERDICTS_JS)}
    statuses = {s["slo"]: s for s in demo["slo_status"]}
    assert sorted(rows) == sorted(statuses) == ["availability", "chat-goodput", "ttft-500ms"]
    fired_on_page = set()
    for name, status in statuses.items():
        row = rows[name]
        met = status["good"] / status["total"] >= status["objective_ratio"]
        assert row["verdict"].split("\n")[0] == ("met" if met else "missed"), row
        assert row["counts"] == f"{status['good']:,} / {status['total']:,} requests"
        assert row["budget"] == f"{status['budget_remaining_ratio']:.1%} left"
        for alert in status["alerts"]:
            # Each alert window's burn rates, as `slo status` computes them.
            long = f"{alert['long_burn_rate']:.3g}"
            assert f"{alert['window']}: {long} · {alert['short_window']}:" in row["burn"], row
            name_on_page = f"{alert['severity']} {alert['window']}/{alert['short_window']}"
            assert (name_on_page in row["firing"]) == (alert["state"] == "firing"), row
        fired_on_page |= {
            f"{name} {line.split(' ')[0]} {line.split(' ')[1].split('/')[0]}"
            for line in row["fired"].split("\n")
            if line != "none"
        }
    # The alerts the demo's minute-by-minute evaluation fired, every one of them.
    assert fired_on_page == set(demo["alerts_fired"])
    assert fired_on_page, "the demo's regression fires alerts"


@pytest.mark.slow
def test_the_recommended_fleet_and_its_reserve_cost(page: DevTools, demo: dict[str, Any]) -> None:
    text = page.evaluate("document.getElementById('capacity-answer').innerText")
    verdict = demo["recommendation"]
    fleet = re.match(r"(\d+) hosts \((\d+) replicas, (\d+) GPUs, in (\d+) zones\)", verdict)
    assert fleet is not None, verdict
    assert f"Recommended fleet: {fleet.group(0)}" in text
    cost = re.search(r"Cost (\$[\d,]+)/month, of which (\$[\d,]+)/month", verdict)
    assert cost is not None, verdict
    assert f"cost\t{cost.group(1)}/month" in text
    assert f"reserve cost\t{cost.group(2)}/month buys the failure reserve" in text
    slugs = set(
        page.evaluate(
            "Object.keys(JSON.parse(document.getElementById('servewatch-specs').textContent))"
        )
    )
    assert {"failure-table", "sensitivity-tornado", "failure-drill"} <= slugs


@pytest.mark.slow
def test_the_bad_replica_leads_the_sortable_replica_table(page: DevTools) -> None:
    rows = dom(page, REPLICAS_JS)
    assert len(rows) == 12
    assert rows[0]["replica"] == REGRESSED_REPLICA
    assert rows[0]["bad"]
    assert REGRESSED_REPLICA in rows[0]["text"]
    assert [r["replica"] for r in rows if r["bad"]] == [REGRESSED_REPLICA]
    # Each replica's own GPU: the demo's targets list their GPUs' UUIDs.
    headers = dom(
        page,
        "JSON.stringify(Array.from(document.querySelectorAll("
        "'#replica-table thead th')).map((th) => th.innerText))",
    )
    assert any(h.startswith("GPU W") for h in headers), headers
    # A click on the name header sorts in natural order; a second one reverses it.
    names = [f"vllm-{n}" for n in range(12)]
    page.evaluate("document.querySelector('#replica-table thead th').click()")
    assert [r["replica"] for r in dom(page, REPLICAS_JS)] == names
    page.evaluate("document.querySelector('#replica-table thead th').click()")
    assert [r["replica"] for r in dom(page, REPLICAS_JS)] == names[::-1]


@pytest.mark.slow
def test_not_shown_names_nothing_the_store_holds(page: DevTools) -> None:
    # The demo's replicas share hosts without pods; their targets list their GPUs' UUIDs, so
    # the GPU panels are drawn too.
    assert dom(page, NOT_SHOWN_JS) == []


@pytest.mark.slow
def test_the_demos_findings_name_the_host_loss_and_the_slowed_replicas_true_factor(
    demo: dict[str, Any],
) -> None:
    findings = demo["health_findings"]
    losses = [f for f in findings if f["kind"] == "host_loss"]
    assert [(f["scope_unit"], f["scope"]) for f in losses] == [("host", LOST_HOST)], findings
    (slow,) = [f for f in findings if f["kind"] == "slow_replica"]
    assert slow["scope"] == REGRESSED_REPLICA
    slowdown = {e["name"]: e["value"] for e in slow["evidence"]}["slowdown_ratio"]
    # The demo slows the replica's decode steps twice (servewatch.demo.demo_fleet).
    assert 1.8 <= slowdown <= 2.2, slow["summary"]
