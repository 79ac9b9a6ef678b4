"""The report's answers, without a browser: natural order of names, SLO verdicts (met, missed,
no data), the replica table's order and GPU figures, and the verdict read from a store."""

from __future__ import annotations

import html
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servewatch.dashboards.replica_table import replica_rows, replica_table_html
from servewatch.dashboards.slo_verdict import (
    AlertFigure,
    SloVerdict,
    VerdictState,
    budget_text,
    verdicts_html,
)
from servewatch.pipeline.natural_sort import natural_key, natural_order
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import build_sli_report
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.report_service import report_span, slo_views
from servewatch.slo_service import limits_of, load_specs
from servewatch.store import Store

AT = datetime(2026, 11, 19, 2, 0)


@pytest.mark.parametrize(
    ("labels", "ordered"),
    [
        (["vllm-10", "vllm-2", "vllm-1", "vllm-0"], ["vllm-0", "vllm-1", "vllm-2", "vllm-10"]),
        (["host-2/gpu-10", "host-2/gpu-9", "host-10/gpu-1"], None),
        (["b", "a10", "a9", "a"], ["a", "a9", "a10", "b"]),
        (["pool-b", "pool-a", "pool-a"], ["pool-a", "pool-b"]),
    ],
)
def test_names_sort_as_people_count(labels: list[str], ordered: list[str] | None) -> None:
    want = ordered or ["host-2/gpu-9", "host-2/gpu-10", "host-10/gpu-1"]
    assert natural_order(labels) == want


def test_no_name_sorts_last() -> None:
    assert sorted(["vllm-1", None, "vllm-0"], key=natural_key) == ["vllm-0", "vllm-1", None]


def alert(**given: Any) -> AlertFigure:
    fields: dict[str, Any] = {
        "severity": "page",
        "window": "1h",
        "short_window": "5m",
        "burn_threshold": 14.4,
        "long_burn_rate": 0.5,
        "short_burn_rate": 0.9,
        "state": "inactive",
        "state_since": None,
        "fired_in_window": 0,
    }
    return AlertFigure(**(fields | given))


def verdict(**given: Any) -> SloVerdict:
    fields: dict[str, Any] = {
        "slo": "chat",
        "objective_ratio": 0.99,
        "period": "7d",
        "at": AT,
        "good": 990,
        "total": 1000,
        "budget_remaining_ratio": 0.0,
        "alerts": (),
    }
    return SloVerdict(**(fields | given))


@pytest.mark.parametrize(
    ("given", "state", "budget"),
    [
        ({"good": 990}, VerdictState.MET, "0.0% left"),
        ({"good": 995, "budget_remaining_ratio": 0.5}, VerdictState.MET, "50.0% left"),
        ({"good": 989, "budget_remaining_ratio": -0.1}, VerdictState.MISSED, "overspent by 10.0%"),
        ({"good": 0, "total": 0, "budget_remaining_ratio": 1.0}, VerdictState.NO_DATA, "no data"),
        ({"no_data": True, "budget_remaining_ratio": 1.0}, VerdictState.NO_DATA, "no data"),
    ],
)
def test_a_verdict_is_met_missed_or_no_data(
    given: dict[str, Any], state: VerdictState, budget: str
) -> None:
    shown = verdict(**given)
    assert shown.state is state
    assert budget_text(shown) == budget


def test_the_verdict_table_names_alerts_firing_and_fired_and_escapes_names() -> None:
    name = "<b>chat</b>"
    page = verdicts_html(
        [
            verdict(
                slo=name,
                alerts=(
                    alert(state="firing", fired_in_window=2),
                    alert(severity="ticket", window="1d", short_window="2h", fired_in_window=1),
                    alert(severity="ticket", window="3d", short_window="6h"),
                ),
            )
        ]
    )
    assert name not in page
    assert html.escape(name) in page
    firing = page.split('class="firing">')[1].split("</td>")[0]
    fired = page.split('class="fired">')[1].split("</td>")[0]
    assert firing == "page 1h/5m"
    assert fired == "page 1h/5m (2 times)<br>ticket 1d/2h"
    assert "1h: 0.5 · 5m: 0.9 (alerts at 14.4)" in page


def sli_report_of(groups: list[dict[str, Any]], scraped: list[dict[str, Any]]) -> dict[str, Any]:
    return {"by": "replica", "groups": groups, "histograms": {"groups": scraped}}


def group(replica: str, requests: int, attainment: float | None) -> dict[str, Any]:
    return {
        "replica": replica,
        "requests": requests,
        "failed_requests": 0,
        "attainment_ratio": attainment,
        "ttft_s": {"p95": 0.2},
        "tpot_s": {"p95": 0.03},
    }


def test_replica_rows_put_the_worst_first_then_natural_order() -> None:
    rows = replica_rows(
        sli_report_of(
            [
                group("vllm-10", 100, 0.99),
                group("vllm-2", 100, 0.99),
                group("vllm-9", 200, 0.90),
                group("vllm-3", 0, None),
            ],
            [{"replica": "vllm-9", "gpu_power_w": {"mean": 410.0}, "gpu_util_ratio": {}}],
        )
    )
    assert rows["replica"].to_list() == ["vllm-9", "vllm-2", "vllm-10", "vllm-3"]
    assert rows["load_share_ratio"].to_list() == [0.5, 0.25, 0.25, 0.0]
    # GPU figures are the replica's own (attributed) ones; no figure is not zero.
    assert rows["gpu_power_w"].to_list() == [410.0, None, None, None]
    table = replica_table_html(rows, objective_ratio=0.95)
    assert table.count('class="bad"') == 1
    assert 'data-replica="vllm-9"' in table.split('class="bad"')[1][:40]
    assert "GPU W" in table


def test_a_table_without_attributed_gpus_says_so_and_drops_their_columns() -> None:
    rows = replica_rows(sli_report_of([group("vllm-0", 10, 1.0)], []))
    table = replica_table_html(rows)
    assert "GPU W" not in table
    assert "No GPU figures" in table
    assert replica_rows({"by": "pool", "groups": []}).is_empty()


SLOS = """\
version: servewatch/v1
slos:
  - name: chat-goodput
    sli: {kind: goodput, ttft_s: 0.5, tpot_s: 0.05}
    objective_ratio: 0.9
    period: 7d
  - name: quiet
    sli: {kind: latency, metric: ttft, threshold_s: 0.5, source: traces}
    objective_ratio: 0.99
    period: 7d
    scope: {model: nobody-serves-this}
"""


def test_verdicts_from_a_store_at_the_end_of_its_data(tmp_path: Path) -> None:
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text(SLOS, encoding="utf-8")
    specs, _ = load_specs([slo_file])
    assert limits_of(specs) == GoodputLimits(ttft_s=0.5, tpot_s=0.05)
    start = datetime(2026, 11, 19, 1, 0)
    requests = pl.DataFrame(
        [
            {
                "trace_id": f"t{i}",
                "span_id": f"s{i}",
                "request_id": f"r{i}",
                "replica": "vllm-10" if i % 3 == 0 else "vllm-1",
                "model": "llama",
                "pool": "chat",
                "arrival_ts": start + timedelta(seconds=20 * i),
                "end_ts": start + timedelta(seconds=20 * i + 2),
                "ok": True,
                "prompt_tokens": 100,
                "completion_tokens": 11,
                # Every third request's first token is late: 20 of 30 are good.
                "ttft_s": 0.9 if i % 3 == 0 else 0.1,
                "e2e_s": 2.0,
                "decode_s": 0.3,
                "emulated": True,
                "source": "test",
            }
            for i in range(30)
        ],
        schema_overrides=REQUESTS_SCHEMA,
    )
    requests = requests.with_columns(
        pl.lit(None, dtype=dtype).alias(name)
        for name, dtype in REQUESTS_SCHEMA.items()
        if name not in requests.columns
    ).select(REQUESTS_SCHEMA.names())
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_requests(requests)
        window = store.read_window()
        span = report_span(window)
        assert span is not None
        views = slo_views(store, specs=specs, start=span[0], end=span[1])
        report = build_sli_report(window, limits=limits_of(specs))
    by_name = {v.slo: v for v in views.verdicts}
    chat = by_name["chat-goodput"]
    assert (chat.good, chat.total) == (20, 30)
    assert chat.state is VerdictState.MISSED
    assert chat.at == span[1]
    # An SLO whose selector matches nothing has no data, not a full budget.
    assert by_name["quiet"].state is VerdictState.NO_DATA
    assert by_name["quiet"].budget_remaining_ratio is None
    assert views.replica_objective_ratio == 0.99
    assert [g["replica"] for g in report["groups"]] == ["vllm-1", "vllm-10"]
    assert not views.slo_minutes.is_empty()
    assert set(views.burn_rates["slo"].unique()) <= {"chat-goodput", "quiet"}
    assert pl.DataFrame(views.budget_remaining).height > 0
