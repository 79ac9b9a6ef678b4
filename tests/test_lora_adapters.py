"""The LoRA adapter dimension: spans ingested against a scraped target whose model is the base
model become requests of an adapter when they name another model; `sli --by adapter` groups by
it and an SLO scope selects one adapter."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.scrape.targets import targets_frame
from servewatch.emulator.otlp_jsonl import spans_to_otlp_json
from servewatch.store import Store
from tests.test_otlp_grpc_receiver import BASE_MODEL, TARGET, vllm_spans

SEEN = datetime(2026, 11, 18, 11, 0)
AT = "2026-11-18T12:00:00Z"
SLOS = f"""
version: servewatch/v1
slos:
  - name: sql-adapter-availability
    sli: {{kind: availability, source: traces}}
    objective_ratio: 0.99
    period: 7d
    scope: {{adapter: sql-lora}}
  - name: base-availability
    sli: {{kind: availability, source: traces}}
    objective_ratio: 0.99
    period: 7d
    scope: {{model: {BASE_MODEL}}}
"""


def test_sli_by_adapter_and_an_slo_scoped_to_an_adapter(tmp_path: Path, runner: CliRunner) -> None:
    db = tmp_path / "fleet.duckdb"
    with Store.open(db) as store:
        store.write_targets(targets_frame([(TARGET, SEEN, SEEN)]))
    # A LoRA request names its adapter as its model; something in front of vLLM puts that on
    # the span (vLLM's own span names no model).
    spans = [
        *vllm_spans(3),
        *vllm_spans(2, extra={"gen_ai.request.model": "sql-lora"}),
        *vllm_spans(1, extra={"gen_ai.request.model": "chat-lora"}),
    ]
    # Distinct trace ids per batch: each vllm_spans call makes its own provider's ids.
    files = []
    for index, batch in enumerate((spans[:3], spans[3:5], spans[5:])):
        path = tmp_path / f"spans-{index}.jsonl"
        path.write_text(spans_to_otlp_json(batch) + "\n", encoding="utf-8")
        files.append(str(path))
    ingested = runner.invoke(app, ["--db", str(db), "ingest", "traces", *files, "--json"])
    assert ingested.exit_code == 0, ingested.output
    assert json.loads(ingested.stdout)["new_requests"] == 6

    result = runner.invoke(app, ["--db", str(db), "sli", "--by", "adapter", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["by"] == "adapter"
    counts = {group["adapter"]: group["requests"] for group in report["groups"]}
    assert counts == {None: 3, "sql-lora": 2, "chat-lora": 1}

    slos = tmp_path / "slos.yaml"
    slos.write_text(SLOS, encoding="utf-8")
    status = runner.invoke(
        app, ["--db", str(db), "slo", "status", "--slo", str(slos), "--at", AT, "--json"]
    )
    assert status.exit_code == 0, status.output
    totals = {s["slo"]: s["total"] for s in json.loads(status.stdout)["slos"]}
    assert totals == {"sql-adapter-availability": 2, "base-availability": 3}


def test_ingest_traces_takes_the_default_model_from_the_config(
    tmp_path: Path, runner: CliRunner
) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text(f'[otlp.mapping]\ndefault_model = "{BASE_MODEL}"\n', encoding="utf-8")
    spans = tmp_path / "spans.jsonl"
    lines = [
        spans_to_otlp_json(vllm_spans(2, pod="unlisted-pod")),
        spans_to_otlp_json(
            vllm_spans(1, pod="unlisted-pod", extra={"gen_ai.request.model": "sql-lora"})
        ),
    ]
    spans.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = tmp_path / "fleet.duckdb"
    for extra in ([], ["--config", str(config)]):
        path = db.with_suffix(f".{len(extra)}.duckdb")
        result = runner.invoke(app, ["--db", str(path), "ingest", "traces", str(spans), *extra])
        assert result.exit_code == 0, result.output
        with Store.open(path, read_only=True) as store:
            rows = store.read_requests().collect()
        got = Counter(rows.select("model", "adapter").rows())
        if extra:
            assert got == Counter({(BASE_MODEL, None): 2, ("sql-lora", "sql-lora"): 1})
        else:  # no base model known: the span's model, and no adapter told apart
            assert got == Counter({(None, None): 2, ("sql-lora", None): 1})
