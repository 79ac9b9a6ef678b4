"""`slo rules` covers every SLO: the ones vLLM's metrics cannot express (traced, goodput) are
read from the event counters `servewatch run` serves, and promtool computes from those
counters the error ratio servewatch's own counts give."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.demo import DEMO_SLOS
from servewatch.slo.imports import load_slo_file
from servewatch.slo.prometheus_rules import (
    ERROR_RATIO_RECORD,
    SERVICE_EVENTS_COUNTER,
    SERVICE_GOOD_COUNTER,
    prometheus_rules,
)
from tests.test_slo_prometheus_rules import promtool


def demo_specs(tmp_path: Path) -> Path:
    path = tmp_path / "slos.yaml"
    path.write_text(DEMO_SLOS, encoding="utf-8")
    return path


def test_rules_cover_every_demo_slo_and_pass_promtool_check(
    tmp_path: Path, runner: CliRunner
) -> None:
    out = tmp_path / "rules.yml"
    result = runner.invoke(
        app, ["slo", "rules", "--slo", str(demo_specs(tmp_path)), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"skipped": []' in result.stdout
    groups = yaml.safe_load(out.read_text(encoding="utf-8"))["groups"]
    assert [g["name"] for g in groups] == [
        "servewatch-slo-ttft-500ms",
        "servewatch-slo-chat-goodput",
        "servewatch-slo-availability",
    ]
    for group in groups:
        alerts = [r for r in group["rules"] if "alert" in r]
        assert alerts, group["name"]
        assert all(r["annotations"]["runbook"] for r in alerts)
    text = out.read_text(encoding="utf-8")
    assert SERVICE_GOOD_COUNTER in text  # the traced SLOs
    assert "vllm:request_success_total" in text  # availability stays on vLLM's counters
    check = promtool("check", "rules", str(out), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    skip = ["--no-service-counters", "--json"]
    skipping = runner.invoke(
        app, ["slo", "rules", "--slo", str(tmp_path / "slos.yaml"), "--out", str(out), *skip]
    )
    assert skipping.exit_code == 0, skipping.output
    assert "ttft-500ms: counted from traces" in skipping.stdout


def test_promtool_reads_the_error_ratio_from_the_service_counters(tmp_path: Path) -> None:
    specs = load_slo_file(demo_specs(tmp_path)).specs
    rules = prometheus_rules([s for s in specs if s.name == "ttft-500ms"], service_counters=True)
    (tmp_path / "rules.yml").write_text(rules.to_yaml(), encoding="utf-8")
    # The shortest window's ratio: an hour of all good events, then half of them bad.
    record = next(r for r in rules.groups[0]["rules"] if "record" in r)
    assert record["record"].startswith(ERROR_RATIO_RECORD)
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(record["labels"].items()))
    served = '{slo="ttft-500ms", instance="127.0.0.1:9464", job="servewatch"}'
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"{SERVICE_EVENTS_COUNTER}{served}", "values": "0+100x300"},
                    {
                        "series": f"{SERVICE_GOOD_COUNTER}{served}",
                        "values": "0+100x60 6100+50x239",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": record["record"],
                        "eval_time": "30m",
                        "exp_samples": [{"labels": f"{record['record']}{{{labels}}}", "value": 0}],
                    },
                    {
                        "expr": record["record"],
                        "eval_time": "240m",
                        "exp_samples": [
                            {"labels": f"{record['record']}{{{labels}}}", "value": 0.5}
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "case.yml").write_text(yaml.safe_dump(case), encoding="utf-8")
    result = promtool("test", "rules", "case.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
