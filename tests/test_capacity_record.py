"""`servewatch size` and the decision record: seed worked examples end to end, JSON, Markdown."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servewatch.capacity.capacity_fit import FitSpec, LoadUnit, fit_capacity
from servewatch.capacity.cost import cost_lines, default_hours_per_month
from servewatch.capacity.decision_record import SCHEMA
from servewatch.capacity.figure import assumed
from servewatch.capacity.placement import Host, Layout
from servewatch.capacity.recommendation import recommend
from servewatch.capacity.requirement import RequirementError, parse_requirement
from servewatch.capacity.worksheet import size, size_from_file
from tests.conftest import REPO_ROOT

NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def rows_by_hosts(document: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["hosts"]: row for row in document["failure_table"]["rows"]}


def test_size_reproduces_the_seed_exercise() -> None:
    record = size(
        now=NOW,
        demand_req_per_min=120,
        capacity_req_per_min=40,
        failure_unit="host",
        replicas_per_host=2,
        zones=2,
        usd_per_gpu_hour=2.0,
    )
    document = record.to_json()
    rows = rows_by_hosts(document)
    assert [rows[h]["healthy_capacity"] for h in (2, 3, 4)] == [160, 240, 320]
    assert [rows[h]["after_host_loss"] for h in (2, 3, 4)] == [80, 160, 240]
    assert document["recommendation"]["hosts"] == 3
    assert document["recommendation"]["replicas"] == 6
    assert document["recommendation"]["max_admission"] == 160
    assert document["failure_table"]["minimum_hosts"] == 3
    reserve = document["recommendation"]["reserve_usd_per_month"]
    assert reserve["value"] == pytest.approx(2 * 2.0 * 730)
    assert reserve["source"].startswith("derived: (6 - 4 replicas that meet healthy demand)")
    assert record.verdict().startswith("3 hosts (6 replicas, 6 GPUs, in 2 zones) meet")
    markdown = record.to_markdown()
    assert "| 3 | 6 | 240 | 200 | 160 | 80 | 160 | 0 s | yes (minimum) |" in markdown
    assert "| 2 | 4 | 160 | 120 | 80 | 80 | 80 | never | no |" in markdown


@pytest.mark.parametrize(
    ("failure_unit", "replicas_per_host", "hosts", "replicas", "failed"),
    [("replica", 1, 4, 4, 90), ("host", 2, 3, 6, 120)],
)
def test_size_reproduces_the_seed_worked_example(
    failure_unit: str, replicas_per_host: int, hosts: int, replicas: int, failed: float
) -> None:
    document = size(
        now=NOW,
        demand_req_per_min=90,
        capacity_req_per_min=30,
        failure_unit=failure_unit,
        replicas_per_host=replicas_per_host,
    ).to_json()
    recommendation = document["recommendation"]
    assert (recommendation["hosts"], recommendation["replicas"]) == (hosts, replicas)
    assert recommendation["failed_capacity"] == failed


def test_size_takes_candidate_hosts_and_backlog() -> None:
    document = size(
        now=NOW,
        demand_req_per_min=120,
        capacity_req_per_min=40,
        failure_unit="host",
        replicas_per_host=2,
        hosts=[3],
        backlog_requests=600,
    ).to_json()
    (row,) = document["failure_table"]["rows"]
    assert row["drain_s"] == pytest.approx(900)
    assert row["meets_failure"] is False
    assert document["recommendation"]["hosts"] == 5
    assert document["failure_table"]["backlog"]["value"] == 600


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas_per_host": 0}, "size options: --replicas-per-host: must be a positive whole"),
        ({"failure_unit": "rack"}, "size options: --failure-unit: is 'rack'; allowed: none,"),
        ({"demand_req_per_min": -1}, "size options: --demand-req-per-min: must be a positive"),
        ({"headroom_ratio": -0.5}, "size options: --headroom: must be a number >= 0"),
        ({"zones": 0}, "size options: --zones: must be 1 or more"),
        ({"usd_per_gpu_hour": -2}, "size options: --usd-per-gpu-hour: must be a number >= 0"),
    ],
)
def test_size_errors_name_the_option(options: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {
        "demand_req_per_min": 120,
        "capacity_req_per_min": 40,
        "failure_unit": "host",
    } | options
    with pytest.raises(RequirementError) as caught:
        size(now=NOW, **arguments)
    assert str(caught.value).startswith(message)


def test_seed_chat_record_from_the_documented_requirement(tmp_path: Path) -> None:
    text = (REPO_ROOT / "docs" / "capacity.md").read_text(encoding="utf-8")
    match = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert match
    path = tmp_path / "chat.toml"
    path.write_text(match.group(1), encoding="utf-8")
    record = size_from_file(path, now=NOW)
    document = json.loads(json.dumps(record.to_json(), allow_nan=False))
    assert document["schema"] == SCHEMA
    assert document["created_at"] == "2026-11-18T12:00:00+00:00"
    chain = {step["step"]: step for step in document["chain"]}
    assert 37 <= chain["replicas for demand"]["value"] < 38
    assert 45 <= chain["replicas with headroom"]["value"] < 46
    assert chain["replicas with headroom"]["source"] == "derived: 37.6 x (1 + headroom 0.2)"
    # one eight-GPU replica per host, one host may be lost: 46 + 1
    assert document["recommendation"]["replicas"] == 47
    assert document["recommendation"]["gpus"] == 376
    markdown = record.to_markdown()
    assert "| decode replicas if decode had the GPUs to itself | 26.3 replicas |" in markdown
    assert "Riskiest assumption: `replica.decode_tokens_per_s`" in markdown
    assert "Not perturbed (no range stated):" in markdown
    for step in document["chain"]:
        assert step["source"].startswith("derived: ")


def test_record_json_has_no_non_finite_numbers_and_keeps_the_stated_capacity() -> None:
    data = {
        "failure_unit": "replica",
        "demand": {"req_per_min": 120},
        "replica": {"capacity_req_per_min": 40},
    }
    flat = pl.LazyFrame(
        {"replica": ["a"] * 4, "load": [1.0, 2.0, 3.0, 4.0], "latency_p95_s": [0.02] * 4}
    )
    fit = fit_capacity(
        flat,
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=1),
        data="flat week",
    )
    record = recommend(parse_requirement(data, where="r.toml"), now=NOW, fit=fit)
    document = json.loads(json.dumps(record.to_json(), allow_nan=False))
    assert document["capacity_fit"]["knee_load"] is None
    assert "kept the stated 40 req/min" in document["notes"][0]
    assert document["recommendation"]["replicas"] == 4


def test_a_fleet_larger_than_the_requirement_needs_is_told_how_many_hosts_fewer() -> None:
    # Seed 000's exercise (120 req/min, 40 a replica, two a host, one host may be lost) on a
    # fleet of five hosts today: three are the answer, two fewer, and two meet healthy demand.
    data = {
        "failure_unit": "host",
        "demand": {"req_per_min": 120},
        "replica": {"capacity_req_per_min": 40},
        "placement": {"replicas_per_host": 2, "zones": ["a", "b"]},
    }
    today = Layout(tuple(Host(f"h{i}", "ab"[i % 2], 2) for i in range(5)))
    record = recommend(parse_requirement(data, where="r.toml"), now=NOW, layout=today)
    document = record.to_json()
    assert document["recommendation"]["hosts"] == 3
    assert sorted(rows_by_hosts(document)) == [2, 3, 4]
    assert "That is 2 hosts fewer than the 5 in service today" in record.verdict()


def test_cost_lines_reproduce_seed_003s_sanity_step() -> None:
    # "360 H100s at $2.50/h ~ $900/h ~ $650k/month at peak-sized capacity ... 10,000 users";
    # decode demand 50,000 tokens/s.
    lines = cost_lines(
        replicas=45,
        gpus_per_replica=8,
        usd_per_gpu_hour=assumed(2.5, "usd/GPU-hour", "seed 003"),
        hours_per_month=default_hours_per_month(),
        output_tokens_per_s=assumed(50_000, "tokens/s", "seed 003 decode demand"),
        users=assumed(10_000, "users", "seed 003"),
    )
    assert lines.usd_per_hour.value == pytest.approx(900)
    assert lines.usd_per_month.value == pytest.approx(657_000)
    assert lines.usd_per_user_month is not None
    assert lines.usd_per_user_month.value == pytest.approx(65.7)
    assert lines.usd_per_million_output_tokens is not None
    assert lines.usd_per_million_output_tokens.value == pytest.approx(5.0)
    assert lines.usd_per_million_output_tokens.source.startswith("derived: $900/hour / (50,000")


def test_the_chat_record_prices_the_fleet_per_hour_per_token_and_per_user(tmp_path: Path) -> None:
    text = (REPO_ROOT / "docs" / "capacity.md").read_text(encoding="utf-8")
    match = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert match
    path = tmp_path / "chat.toml"
    path.write_text(match.group(1), encoding="utf-8")  # it states $2.50 a GPU-hour
    record = size_from_file(path, now=NOW)
    cost = record.to_json()["recommendation"]["cost"]
    gpus = record.to_json()["recommendation"]["gpus"]
    assert cost["usd_per_hour"]["value"] == pytest.approx(gpus * 2.5)
    assert cost["usd_per_month"]["value"] == pytest.approx(gpus * 2.5 * 730)
    assert cost["usd_per_user_month"]["value"] == pytest.approx(gpus * 2.5 * 730 / 10_000)
    assert cost["usd_per_million_output_tokens"]["value"] > 0
    markdown = record.to_markdown()
    assert "- per user-month: $" in markdown
    assert "- per million output tokens: $" in markdown
