"""Recording rules for the metric SLIs (`servewatch rules sli`): promtool accepts them, their
names and expressions are as documented, promtool's own evaluator answers the fallbacks
(renamed families, no error series, router re-exports, unlabelled series) as intended, a
real Prometheus scraping a live emulated fleet records, for every rule, the number the same
PromQL gives over the raw series at the same instant, and VictoriaMetrics scraping the same
fleet with vmalert evaluating the same file loads every rule and records every series."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.emulator.fleet_config import FleetConfig, PoolSpec, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, WorkloadSpec
from servewatch.slo.sli_rules import (
    SliLabels,
    SliRulesError,
    metricsql_prometheus_rate,
    quantile_name,
    sli_rules,
)
from tests.conftest import require_program
from tests.live_prometheus import (
    fleet_ports,
    instant_query,
    live_fleet,
    poll,
    running_prometheus,
)
from tests.live_victoria import running_victoria_metrics, running_vmalert, vmalert_rules
from tests.test_slo_prometheus_rules import promtool

RECORD_NAME = re.compile(r"^(replica|pool|pool_model):vllm_[a-z0-9_]+:[a-z0-9_]+$")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"window": "1h", "quantiles": (0.5, 0.95, 0.999), "interval": "30s"},
        {"metric_prefix": "vllm_", "labels": SliLabels(replica="pod", pool="service")},
    ],
    ids=["defaults", "1h-window", "relabelled"],
)
def test_generated_rules_pass_promtool_check(options: dict[str, Any], tmp_path: Path) -> None:
    rules = sli_rules(**options)
    path = tmp_path / "rules.yml"
    path.write_text(rules.to_yaml(), encoding="utf-8")
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules.records)} rules found" in result.stdout


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"window": "1h", "quantiles": (0.5, 0.95, 0.999), "interval": "30s"},
        {"metric_prefix": "vllm_", "labels": SliLabels(replica="pod", pool="service")},
    ],
    ids=["defaults", "1h-window", "relabelled"],
)
@pytest.mark.parametrize("dialect", ["prometheus", "metricsql"])
def test_generated_rules_pass_vmalert_dry_run(
    options: dict[str, Any], dialect: str, tmp_path: Path
) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(sli_rules(**options, dialect=dialect).to_yaml(), encoding="utf-8")
    result = subprocess.run(
        [require_program("vmalert"), "-dryRun", f"-rule={path}", "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metricsql_dialect_changes_only_the_rates() -> None:
    promql = sli_rules(window="20s")
    metricsql = sli_rules(window="20s", dialect="metricsql")
    assert sli_rules(window="20s", dialect="prometheus") == promql
    assert metricsql.records == promql.records
    assert [g["name"] for g in metricsql.groups] == [g["name"] for g in promql.groups]
    rate = re.compile(r"rate\((\S+?)\[20s\]\)")
    for old_group, new_group in zip(promql.groups, metricsql.groups, strict=True):
        for old, new in zip(old_group["rules"], new_group["rules"], strict=True):
            rewritten = rate.sub(
                lambda m: metricsql_prometheus_rate(m.group(1), "20s"), old["expr"]
            )
            assert new["expr"] == rewritten, old["record"]
            assert not rate.search(new["expr"]), old["record"]
    assert metricsql.to_yaml().startswith(promql.to_yaml().split("groups:")[0])
    assert "MetricsQL" in metricsql.to_yaml().split("groups:")[0]


def test_metricsql_rate_is_prometheus_extrapolation() -> None:
    expr = metricsql_prometheus_rate('x{a="b"}', "5m")
    # the rollups it is built from, all over the same window, and the window in seconds
    assert set(re.findall(r"(\w+)\(x\{a=\"b\"\}\[5m\]\)", expr)) == {
        "increase_prometheus",
        "count_over_time",
        "tfirst_over_time",
        "tlast_over_time",
        "first_over_time",
    }
    assert "(time() - 300)" in expr
    assert expr.endswith('if (count_over_time(x{a="b"}[5m]) >= 2))')
    assert " / 300) " in expr
    assert "rate(" not in expr.replace("_rate(", "")


def test_rule_names_follow_level_metric_operations() -> None:
    rules = sli_rules()
    assert [g["name"] for g in rules.groups] == [
        "servewatch-sli-replica",
        "servewatch-sli-pool",
        "servewatch-sli-pool_model",
    ]
    assert all("interval" not in g for g in rules.groups)  # Prometheus' own interval
    assert len(set(rules.records)) == len(rules.records) == 72
    for record in rules.records:
        assert RECORD_NAME.match(record), record
    pool = {r["record"] for r in rules.groups[1]["rules"]}
    latency = (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds",
    )
    assert pool == {
        *(f"pool:vllm_{h}_bucket:rate5m" for h in latency),
        *(f"pool:vllm_{h}:{p}_5m" for h in latency for p in ("p50", "p90", "p99")),
        "pool:vllm_request_success:rate5m",
        "pool:vllm_prompt_tokens:rate5m",
        "pool:vllm_generation_tokens:rate5m",
        "pool:vllm_request_errors:ratio_rate5m",
        "pool:vllm_prefix_cache_hits:ratio_rate5m",
        "pool:vllm_kv_cache_usage_perc:mean5m",
        "pool:vllm_num_requests_waiting:mean5m",
        "pool:vllm_num_requests_running:mean5m",
    }


def test_expressions_are_the_promql_servewatch_evaluates() -> None:
    groups = {g["name"]: {r["record"]: r["expr"] for r in g["rules"]} for g in sli_rules().groups}
    pool = groups["servewatch-sli-pool"]
    assert pool["pool:vllm_time_to_first_token_seconds_bucket:rate5m"] == (
        'sum by (pool, le) (rate(vllm:time_to_first_token_seconds_bucket{server="",pool!=""}[5m]))'
    )
    assert pool["pool:vllm_time_to_first_token_seconds:p90_5m"] == (
        "histogram_quantile(\n  0.9,\n  "
        'sum by (pool, le) (rate(vllm:time_to_first_token_seconds_bucket{server="",pool!=""}[5m]))'
        "\n)"
    )
    assert pool["pool:vllm_generation_tokens:rate5m"] == (
        'sum by (pool) (rate(vllm:generation_tokens_total{server="",pool!=""}[5m]))'
    )
    model = groups["servewatch-sli-pool_model"]
    assert model["pool_model:vllm_num_requests_waiting:mean5m"] == (
        "sum by (pool, model_name) "
        '(avg_over_time(vllm:num_requests_waiting{server="",pool!="",model_name!=""}[5m]))'
    )
    # No rule reads a record: vmalert could only hand it an earlier evaluation's value.
    for group in sli_rules().groups:
        for rule in group["rules"]:
            assert not re.findall(r"\b(\w+:\w+:\w+)\b", rule["expr"]), rule


def test_options_reach_names_labels_and_selectors() -> None:
    rules = sli_rules(
        window="300s",
        quantiles=(0.999,),
        metric_prefix="vllm_",
        labels=SliLabels(replica="pod", pool="service", model="model"),
        interval="15s",
    )
    assert {g["interval"] for g in rules.groups} == {"15s"}
    replica = {r["record"]: r["expr"] for r in rules.groups[0]["rules"]}
    assert replica["replica:vllm_e2e_request_latency_seconds:p99_9_5m"] == (
        "histogram_quantile(\n  0.999,\n  sum by (pod, le) "
        '(rate(vllm_e2e_request_latency_seconds_bucket{server="",pod!=""}[5m]))\n)'
    )
    assert replica["replica:vllm_request_success:rate5m"] == (
        'sum by (pod) (rate(vllm_request_success_total{server="",pod!=""}[5m]))'
    )


@pytest.mark.parametrize(
    ("options", "option", "says"),
    [
        ({"window": "5"}, "window", "not a duration"),
        ({"interval": "1.5m"}, "interval", "not a duration"),
        ({"quantiles": ()}, "quantiles", "at least one"),
        ({"quantiles": (0.9, 1.5)}, "quantiles", "1.5 is outside [0, 1]"),
        ({"quantiles": (0.9, 0.90)}, "quantiles", "same quantile twice"),
        ({"metric_prefix": "9vllm"}, "metric_prefix", "not the start of a metric name"),
        ({"labels": SliLabels(replica="le")}, "replica_label", "not le or server"),
        ({"labels": SliLabels(pool="__meta_pool")}, "pool_label", "'__'"),
        ({"labels": SliLabels(pool="replica")}, "replica_label", "need three labels"),
        ({"dialect": "promql"}, "dialect", "give prometheus"),
    ],
)
def test_bad_options_say_which_and_what_is_allowed(
    options: dict[str, Any], option: str, says: str
) -> None:
    with pytest.raises(SliRulesError) as caught:
        sli_rules(**options)
    assert caught.value.option == option
    assert says in caught.value.problem


def test_quantile_names() -> None:
    assert [quantile_name(q) for q in (0.5, 0.9, 0.99, 0.999, 0.07, 1.0)] == [
        "p50",
        "p90",
        "p99",
        "p99_9",
        "p7",
        "p100",
    ]


def test_cli_writes_the_rules_and_reports_them(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    result = runner.invoke(app, ["rules", "sli", "--out", str(out), "--window", "10m", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["path"] == str(out)
    assert document["groups"] == [g["name"] for g in sli_rules(window="10m").groups]
    assert document["rules"] == list(sli_rules(window="10m").records)
    written = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert [g["name"] for g in written["groups"]] == document["groups"]
    assert "pool:vllm_generation_tokens:rate10m" in document["rules"]
    assert out.read_text(encoding="utf-8") == sli_rules(window="10m").to_yaml()


def test_cli_metricsql_dialect_writes_the_same_records(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    args = ["rules", "sli", "--out", str(out), "--window", "10m", "--dialect", "metricsql"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"path", "groups", "rules"}
    assert document["rules"] == list(sli_rules(window="10m").records)
    written = out.read_text(encoding="utf-8")
    assert written == sli_rules(window="10m", dialect="metricsql").to_yaml()
    assert "increase_prometheus(" in written


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "soon"], "--window: 'soon' is not a duration"),
        (["--quantiles", "0.9,high"], "--quantiles '0.9,high': give numbers"),
        (["--pool-label", "1pool"], "--pool-label: '1pool' is not a label"),
        (["--dialect", "vm"], "--dialect: 'vm' is not a dialect"),
    ],
)
def test_cli_refuses_bad_options(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "rules.yml"
    result = runner.invoke(app, ["rules", "sli", "--out", str(out), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not out.exists()


FALLBACK_TEST = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # vLLM 0.9: the old ITL and KV names only; no error series at all
      - series: 'vllm:time_per_output_token_seconds_bucket{R,le="0.1"}'
        values: '0+6x10'
      - series: 'vllm:time_per_output_token_seconds_bucket{R,le="+Inf"}'
        values: '0+10x10'
      - series: 'vllm:gpu_cache_usage_perc{R}'
        values: '0.5x10'
      - series: 'vllm:request_success_total{R,finished_reason="stop"}'
        values: '0+60x10'
      # a router's re-export, and a target nobody gave a pool: neither is the pool's
      - series: 'vllm:request_success_total{server="router",pool="p",finished_reason="stop"}'
        values: '0+600x10'
      - series: 'vllm:request_success_total{replica="stray",model_name="m",finished_reason="error"}'
        values: '0+60x10'
    promql_expr_test:
      - expr: pool:vllm_inter_token_latency_seconds:p50_5m
        eval_time: 10m
        exp_samples:
          - labels: 'pool:vllm_inter_token_latency_seconds:p50_5m{pool="p"}'
            value: 0.08333333333333334  # 0.1 * ((0.5 * 10/60) / (6/60)), in float64
      - expr: pool_model:vllm_kv_cache_usage_perc:mean5m
        eval_time: 10m
        exp_samples:
          - labels: 'pool_model:vllm_kv_cache_usage_perc:mean5m{pool="p",model_name="m"}'
            value: 0.5
      - expr: pool:vllm_request_success:rate5m
        eval_time: 10m
        exp_samples:
          - labels: 'pool:vllm_request_success:rate5m{pool="p"}'
            value: 1
      - expr: pool:vllm_request_errors:ratio_rate5m
        eval_time: 10m
        exp_samples:
          - labels: 'pool:vllm_request_errors:ratio_rate5m{pool="p"}'
            value: 0
      - expr: replica:vllm_request_errors:ratio_rate5m
        eval_time: 10m
        exp_samples:
          - labels: 'replica:vllm_request_errors:ratio_rate5m{replica="r"}'
            value: 0
          - labels: 'replica:vllm_request_errors:ratio_rate5m{replica="stray"}'
            value: 1
""".replace("{R", '{replica="r",pool="p",model_name="m"')


def test_promtool_evaluates_the_fallbacks_as_intended(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(sli_rules().to_yaml(), encoding="utf-8")
    (tmp_path / "test.yml").write_text(FALLBACK_TEST, encoding="utf-8")
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a real Prometheus over a live emulated fleet ---------------------------------------------

LOADED_S = 10.0
FLEET = FleetConfig(
    topology=TopologySpec(zones=("zone-a",), hosts_per_zone=2, replicas_per_host=2),
    pools=(PoolSpec("chat", 2), PoolSpec("batch", 2)),
    workload=WorkloadSpec(arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=6.0)),
)


def _vllm_job(server: LiveFleetServer) -> dict[str, Any]:
    """The fleet's vLLM targets with their replica, host, zone and (as a user's relabelling
    gives it) pool."""
    pools = {p.replica: p.pool for p in FLEET.placements()}
    groups = [
        {"targets": [t.address], "labels": {**t.labels, "pool": pools[t.name]}}
        for t in server.targets
        if t.kind.value == "vllm"
    ]
    return {"job_name": "vllm", "static_configs": groups}


def _by(answer: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in answer}


def _same(recorded: dict[str, float], direct: dict[str, float]) -> None:
    assert recorded.keys() == direct.keys()
    for key, value in recorded.items():
        assert math.isclose(value, direct[key], rel_tol=1e-9, abs_tol=0.0), (key, value)


@pytest.mark.slow
def test_recorded_slis_equal_the_same_promql_over_the_raw_series(tmp_path: Path) -> None:
    rules = sli_rules()
    rule_file = tmp_path / "sli_rules.yml"
    rule_file.write_text(rules.to_yaml(), encoding="utf-8")
    ports = fleet_ports(FLEET)
    unstarted = LiveFleetServer(FLEET.placements(), started_s=0.0, ports=ports)
    job = _vllm_job(unstarted)
    replicas = len(job["static_configs"])
    with running_prometheus(tmp_path, [job], rule_files=[rule_file]) as client:
        poll(
            "Prometheus to scrape every replica",
            lambda: True if len(instant_query(client, "up")) == replicas else None,
        )
        with live_fleet(FLEET, seed=5, ports=ports):
            time.sleep(LOADED_S)  # the fleet serves load; nothing to wait on but time
        stopped_s = time.time()

        # Once every target is down no sample is added, so a rule evaluated after that and
        # the same query asked later at its instant read the same samples.
        def evaluated_after_the_fleet() -> float | None:
            down = instant_query(client, 'up{job="vllm"} == 0')
            stamps = instant_query(client, "timestamp(pool:vllm_request_success:rate5m)")
            at = min((float(r["value"][1]) for r in stamps), default=0.0)
            return at if len(down) == replicas and at > stopped_s + 2.0 else None

        at_s = poll("a rule evaluation after the fleet stopped", evaluated_after_the_fleet)

        for record in rules.records:
            level = record.split(":")[0]
            answer = instant_query(client, record, time_s=at_s)
            expected = {"replica": replicas, "pool": 2, "pool_model": 2}[level]
            if record.endswith("_bucket:rate5m"):
                expected *= len({r["metric"]["le"] for r in answer})
            assert len(answer) == expected, (record, answer)

        _same(
            _by(
                instant_query(client, "pool:vllm_time_to_first_token_seconds:p90_5m", time_s=at_s),
                "pool",
            ),
            _by(
                instant_query(
                    client,
                    "histogram_quantile(0.9, sum by (pool, le) "
                    "(rate(vllm:time_to_first_token_seconds_bucket[5m])))",
                    time_s=at_s,
                ),
                "pool",
            ),
        )
        _same(
            _by(instant_query(client, "pool:vllm_request_success:rate5m", time_s=at_s), "pool"),
            _by(
                instant_query(
                    client, "sum by (pool) (rate(vllm:request_success_total[5m]))", time_s=at_s
                ),
                "pool",
            ),
        )
        rates = _by(instant_query(client, "pool:vllm_request_success:rate5m", time_s=at_s), "pool")
        assert set(rates) == {"chat", "batch"}
        assert all(v > 0 for v in rates.values()), rates


# -- VictoriaMetrics scraping the fleet, vmalert evaluating the same rule file -----------------


def _expected_series(record: str, answer: list[dict[str, Any]], replicas: int) -> int:
    level = record.split(":", maxsplit=1)[0]
    expected = {"replica": replicas, "pool": 2, "pool_model": 2}[level]
    if record.endswith("_bucket:rate5m"):
        expected *= max(1, len({r["metric"].get("le") for r in answer}))
    return expected


@pytest.mark.slow
def test_victoria_metrics_with_vmalert_records_every_rule(tmp_path: Path) -> None:
    rules = sli_rules()
    rule_file = tmp_path / "sli_rules.yml"
    rule_file.write_text(rules.to_yaml(), encoding="utf-8")
    ports = fleet_ports(FLEET)
    job = _vllm_job(LiveFleetServer(FLEET.placements(), started_s=0.0, ports=ports))
    replicas = len(job["static_configs"])
    with (
        running_victoria_metrics(tmp_path, [job]) as victoria,
        running_vmalert(tmp_path, victoria, [rule_file]) as vmalert,
    ):
        loaded = vmalert_rules(vmalert)
        # vmalert lists its groups in an order of its own; each group's rules in file order.
        assert sorted(r["name"] for r in loaded) == sorted(rules.records)
        assert all(r["type"] == "recording" for r in loaded)
        with live_fleet(FLEET, seed=5, ports=ports):

            def every_record_has_its_series() -> dict[str, list[Any]] | None:
                answers = {record: instant_query(victoria, record) for record in rules.records}
                complete = all(
                    len(answer) == _expected_series(record, answer, replicas)
                    for record, answer in answers.items()
                )
                return answers if complete else None

            answers = poll(
                "vmalert to record every rule in VictoriaMetrics", every_record_has_its_series
            )
        failing = [(r["name"], r["lastError"]) for r in vmalert_rules(vmalert) if r["lastError"]]
        assert failing == []
    rates = _by(answers["pool:vllm_request_success:rate5m"], "pool")
    assert set(rates) == {"chat", "batch"}
    assert all(v > 0 for v in rates.values()), rates
    p90 = _by(answers["pool:vllm_time_to_first_token_seconds:p90_5m"], "pool")
    assert all(0 < v < 60 for v in p90.values()), p90
