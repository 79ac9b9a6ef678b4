"""`servewatch report` over a store of ingested spans: an offline page and per-chart specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from tests.conftest import FIXTURES


def test_report_writes_an_offline_page(tmp_path: Path, runner: CliRunner) -> None:
    db = str(tmp_path / "r.duckdb")
    spans = str(FIXTURES / "vllm_spans_small" / "spans.jsonl")
    assert runner.invoke(app, ["--db", db, "ingest", "traces", spans]).exit_code == 0
    out = tmp_path / "report"
    result = runner.invoke(
        app, ["--db", db, "report", "--out", str(out), "--ttft-ms", "500", "--no-images", "--json"]
    )
    assert result.exit_code == 0, result.output
    html = Path(json.loads(result.stdout)["html"]).read_text(encoding="utf-8")
    assert "<script src=" not in html  # everything inlined, nothing fetched
    specs = sorted(p.name for p in (out / "charts").glob("*.vl.json"))
    assert "latency-ttft.vl.json" in specs


SLOS = """\
version: servewatch/v1
slos:
  - name: chat-goodput
    sli: {kind: goodput, ttft_s: 0.5, tpot_s: 0.05}
    objective_ratio: 0.9
    period: 7d
"""


def test_report_opens_with_the_verdicts_of_the_given_slos(
    tmp_path: Path, runner: CliRunner
) -> None:
    db = str(tmp_path / "r.duckdb")
    spans = str(FIXTURES / "vllm_spans_small" / "spans.jsonl")
    assert runner.invoke(app, ["--db", db, "ingest", "traces", spans]).exit_code == 0
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text(SLOS, encoding="utf-8")
    plain = runner.invoke(
        app, ["--db", db, "report", "--out", str(tmp_path / "a"), "--no-images", "--json"]
    )
    assert plain.exit_code == 0, plain.output
    missing = {m["panel"]: m["reason"] for m in json.loads(plain.stdout)["not_shown"]}
    assert "--slo FILE" in missing["SLO verdicts"]
    assert "--requirement FILE" in missing["Capacity answer"]

    out = tmp_path / "b"
    args = ["--db", db, "report", "--out", str(out), "--slo", str(slo_file), "--no-images"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (verdict,) = document["slo_verdicts"]
    assert verdict["slo"] == "chat-goodput"
    assert verdict["verdict"] in ("met", "missed")
    assert verdict["total"] == 228
    assert "SLO verdicts" not in {m["panel"] for m in document["not_shown"]}
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.index('id="slo-verdicts"') < page.index('id="replica-table"')


def test_report_reads_the_slo_files_of_servewatch_toml(
    tmp_path: Path, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "r.duckdb"
    spans = str(FIXTURES / "vllm_spans_small" / "spans.jsonl")
    assert runner.invoke(app, ["--db", str(db), "ingest", "traces", spans]).exit_code == 0
    (tmp_path / "slos.yaml").write_text(SLOS, encoding="utf-8")
    (tmp_path / "servewatch.toml").write_text(
        f'[store]\npath = "{db.name}"\n[slo]\nfiles = ["slos.yaml"]\n', encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", "--out", "report", "--no-images", "--json"])
    assert result.exit_code == 0, result.output
    assert [v["slo"] for v in json.loads(result.stdout)["slo_verdicts"]] == ["chat-goodput"]
