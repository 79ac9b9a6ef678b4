"""`servewatch report` over a store of ingested spans: an offline page and per-chart specs."""

from __future__ import annotations

import json
from pathlib import Path

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
