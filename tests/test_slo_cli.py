"""`servewatch slo status|evaluate|rules` and `alerts` over a replayed trace fixture: the budget
counts equal a brute-force count of the raw spans."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.slo_service import evaluation_instant, load_specs
from servewatch.store import Store
from tests.conftest import FIXTURES
from tests.test_replay import raw_requests

CASE = FIXTURES / "vllm_spans_small"
SLOS = CASE / "slos.yaml"
AT = "2026-11-18T11:20:00Z"  # after the fixture's last request


@pytest.fixture
def db(tmp_path: Path, runner: CliRunner) -> str:
    path = str(tmp_path / "slo.duckdb")
    result = runner.invoke(app, ["--db", path, "ingest", "traces", str(CASE / "spans.jsonl")])
    assert result.exit_code == 0, result.output
    return path


def test_status_counts_equal_the_raw_spans(db: str, runner: CliRunner) -> None:
    result = runner.invoke(
        app, ["--db", db, "slo", "status", "--slo", str(SLOS), "--at", AT, "--json"]
    )
    assert result.exit_code == 0, result.output
    statuses = {s["slo"]: s for s in json.loads(result.stdout)["slos"]}
    raw = raw_requests(CASE)
    ok = [r for r in raw if r["ok"]]
    assert statuses["availability"]["total"] == len(raw)
    assert statuses["availability"]["good"] == len(ok)
    assert statuses["ttft-500ms"]["good"] == sum(r["ttft"] <= 0.5 for r in ok)
    goodput = sum(
        r["ttft"] <= 0.5 and (r["n"] <= 1 or r["decode"] / (r["n"] - 1) <= 0.05) for r in ok
    )
    assert statuses["chat-goodput"]["good"] == goodput
    error_ratio = 1 - len(ok) / len(raw)
    assert statuses["availability"]["budget_consumed_ratio"] == pytest.approx(error_ratio / 0.01)


TOKEN_SLOS = """
version: servewatch/v1
slos:
  - name: chat-goodput
    sli: {kind: goodput, ttft_s: 0.5, tpot_s: 0.05}
    objective_ratio: 0.9
    period: 7d
    scope: {pool: chat-8b}
  - name: chat-token-goodput
    sli: {kind: token_goodput, ttft_s: 0.5, tpot_s: 0.05}
    objective_ratio: 0.9
    period: 7d
    scope: {pool: chat-8b}
"""


def test_token_goodput_slo_counts_output_tokens_from_raw_requests_and_the_rollup(
    db: str, tmp_path: Path, runner: CliRunner
) -> None:
    slos = tmp_path / "token-slos.yaml"
    slos.write_text(TOKEN_SLOS, encoding="utf-8")
    chat = [r for r in raw_requests(CASE) if r["pool"] == "chat-8b"]

    def good(r: dict[str, Any]) -> bool:
        n, decode, ttft = int(r["n"]), float(r["decode"]), float(r["ttft"])
        return bool(r["ok"]) and ttft <= 0.5 and (n <= 1 or decode / (n - 1) <= 0.05)

    good_tokens = sum(int(r["n"]) for r in chat if good(r))
    all_tokens = sum(int(r["n"]) for r in chat)
    assert 0 < good_tokens < all_tokens
    status = ["--db", db, "slo", "status", "--slo", str(slos), "--at", AT, "--json"]
    # First counted from the raw requests (no rollup holds these SLOs yet), then, after an
    # evaluation rolled them up in the store, from slo_minutes: both must be the oracle's.
    for step in ("raw", "rollup"):
        if step == "rollup":
            evaluated = runner.invoke(
                app, ["--db", db, "slo", "evaluate", "--slo", str(slos), "--at", AT, "--json"]
            )
            assert evaluated.exit_code == 0, evaluated.output
        result = runner.invoke(app, status)
        assert result.exit_code == 0, result.output
        statuses = {s["slo"]: s for s in json.loads(result.stdout)["slos"]}
        tokens = statuses["chat-token-goodput"]
        assert (tokens["good"], tokens["total"]) == (good_tokens, all_tokens), step
        assert tokens["events"] == "output tokens"
        requests = statuses["chat-goodput"]
        assert (requests["good"], requests["total"]) == (sum(map(good, chat)), len(chat)), step
        assert requests["events"] == "requests"
        error_ratio = 1 - good_tokens / all_tokens
        assert tokens["budget_consumed_ratio"] == pytest.approx(error_ratio / 0.1), step


def test_evaluate_records_alerts_that_alerts_lists(db: str, runner: CliRunner) -> None:
    # ~2% failures against a 99% objective burn the budget at about 2x: of the 7-day SLO's
    # windows only the slowest ticket (1x over 1008m and 84m) fires; the pages (14.4x, 6x)
    # and the 3x ticket do not.
    result = runner.invoke(
        app,
        [
            "--db",
            db,
            "slo",
            "evaluate",
            "--slo",
            str(SLOS),
            "--at",
            "2026-11-18T11:16:00Z",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    evaluation = json.loads(result.stdout)
    assert evaluation["notification_error"] is None
    fired = {(c["slo"], c["window"]) for c in evaluation["firing"]}
    assert ("availability", "1008m") in fired
    assert not {window for slo, window in fired if slo == "availability"} & {"14m", "84m", "336m"}
    listed = runner.invoke(app, ["--db", db, "alerts", "--json"])
    assert listed.exit_code == 0
    assert {(a["slo"], a["window"]) for a in json.loads(listed.stdout)["alerts"]} >= fired


def test_rules_are_written(tmp_path: Path, runner: CliRunner) -> None:
    out = tmp_path / "rules.yml"
    spec = Path(__file__).resolve().parents[1] / "docs" / "examples" / "slo" / "chat.yaml"
    result = runner.invoke(app, ["slo", "rules", "--slo", str(spec), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert "groups:" in out.read_text(encoding="utf-8")


def test_missing_slo_files_is_a_usage_error(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(app, ["--db", str(tmp_path / "x.duckdb"), "slo", "status"])
    assert result.exit_code == 2
    assert "no SLO files" in result.stderr


def test_recommend_refits_capacity_from_the_store(
    db: str, tmp_path: Path, runner: CliRunner
) -> None:
    requirement = tmp_path / "req.toml"
    requirement.write_text(
        'name = "small"\nfailure_unit = "host"\n[slo]\nlatency = "p95 TTFT"\n'
        "latency_limit_s = 0.5\n[demand]\nreq_per_min = 60\n[replica]\n"
        "capacity_req_per_min = 10\n[placement]\nreplicas_per_host = 2\n",
        encoding="utf-8",
    )
    out = tmp_path / "decision.md"
    result = runner.invoke(
        app,
        ["--db", db, "recommend", "--requirement", str(requirement), "--out", str(out), "--json"],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    fit = record["capacity_fit"]
    assert fit["points"] > 3
    assert fit["load_unit"] == "req/s"
    assert fit["knee_low_load"] <= fit["knee_load"] <= fit["knee_high_load"]
    assert any("measured" in note for note in record["notes"])
    assert "Capacity decision record" in out.read_text(encoding="utf-8")
    with Store.open(db) as store:
        assert store.count("recommendations") == 1


def test_status_without_at_evaluates_at_the_end_of_the_data(db: str, runner: CliRunner) -> None:
    result = runner.invoke(app, ["--db", db, "slo", "status", "--slo", str(SLOS), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    with Store.open(db, read_only=True) as store:
        span = store.requests_range()
    assert span is not None
    last = span[1]
    # the boundary after the minute the last request ended in
    expected = last.replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert document["evaluated"]["basis"] == "end of data"
    assert document["at"] == expected.isoformat() + "Z"
    totals = {s["slo"]: s["total"] for s in document["slos"]}
    assert totals["availability"] == len(raw_requests(CASE))
    text = runner.invoke(app, ["--db", db, "slo", "status", "--slo", str(SLOS)])
    assert "end of data" in " ".join(text.stdout.split())


def test_a_period_without_events_is_no_data_not_a_full_budget(
    tmp_path: Path, runner: CliRunner
) -> None:
    db = str(tmp_path / "empty.duckdb")
    with Store.open(db):
        pass
    result = runner.invoke(
        app, ["--db", db, "slo", "status", "--slo", str(SLOS), "--at", AT, "--json"]
    )
    assert result.exit_code == 0, result.output
    for status in json.loads(result.stdout)["slos"]:
        assert (status["total"], status["verdict"], status["no_data"]) == (0, "no data", True)
        assert status["budget_remaining_ratio"] is None
        assert status["budget_consumed_ratio"] is None
    text = runner.invoke(app, ["--db", db, "slo", "status", "--slo", str(SLOS), "--at", AT])
    assert "no data" in text.stdout


def test_alerts_show_the_history_up_to_the_instant_and_what_fires_then(
    db: str, runner: CliRunner
) -> None:
    evaluated = runner.invoke(
        app, ["--db", db, "slo", "evaluate", "--slo", str(SLOS), "--at", "2026-11-18T11:16:00Z"]
    )
    assert evaluated.exit_code == 0, evaluated.output
    before = json.loads(
        runner.invoke(app, ["--db", db, "alerts", "--at", "2026-11-18T11:15:00Z", "--json"]).stdout
    )
    after = json.loads(runner.invoke(app, ["--db", db, "alerts", "--json"]).stdout)
    assert before["alerts"] == []
    assert before["firing"] == []
    assert before["evaluated"]["basis"] == "requested"
    assert after["evaluated"]["basis"] == "end of data"
    assert after["firing"]
    assert all(a["state"] == "firing" for a in after["firing"])


@pytest.mark.parametrize(
    ("offset_s", "basis", "minute_after"),
    [
        (0.5, "requested, last minute counted", 1),  # inside the data's last minute: counted
        (-90.5, "requested, floored to the minute", 0),  # later data completes the minute
        (3600, "requested", 0),
    ],
)
def test_an_at_inside_a_minute_never_drops_it_silently(
    db: str, offset_s: float, basis: str, minute_after: int
) -> None:
    specs, _ = load_specs([SLOS])
    with Store.open(db, read_only=True) as store:
        span = store.requests_range()
        assert span is not None
        at = span[1] + timedelta(seconds=offset_s)
        if basis == "requested":
            at = at.replace(second=0, microsecond=0)
        moment = evaluation_instant(store, specs=specs, at=at)
    assert moment.basis.value == basis
    assert moment.at == at.replace(second=0, microsecond=0) + timedelta(minutes=minute_after)
    assert basis.split(",", maxsplit=1)[0] in moment.describe()
