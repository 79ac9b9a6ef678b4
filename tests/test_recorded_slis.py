"""The recorded path and servewatch's own raw path agree: on one live emulated fleet, scraped
by a real Prometheus 2.42 evaluating `servewatch rules sli` and by VictoriaMetrics with vmalert
evaluating `servewatch rules sli --dialect metricsql`, the SLIs `servewatch sli --recorded`
answers from the imported recorded series equal what `servewatch sli --source histograms`
computes from the raw series imported from the same server, at the instants the rules were
evaluated, over the rules' window ending there."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.prometheus.reader import ImportWindow
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import FleetConfig, PoolSpec, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, WorkloadSpec
from servewatch.prometheus_import import import_from_prometheus, import_recorded_from_prometheus
from servewatch.slo.sli_rules import sli_rules
from servewatch.store import Store
from tests.live_prometheus import fleet_ports, instant_query, live_fleet, poll, running_prometheus
from tests.live_victoria import running_victoria_metrics, running_vmalert

# Long enough that, after the fleet stops, three evaluations of vmalert fit before the window
# stops holding the whole run: its MetricsQL rates (docs/promql.md) make an evaluation of the
# 72 rules take 2 to 4 s on two busy cores, where Prometheus evaluates every second.
WINDOW = "30s"
WINDOW_S = 30.0
LOADED_S = 13.0
RECORD = f"pool:vllm_request_success:rate{WINDOW}"
SETTLED_S = 2.0  # after the stop, by when every scrape is stored
INSTANTS = 3  # evaluations compared per server
TOLERANCE = 0.01
MIN_COMPARED = 300
DIALECTS = {"prometheus": "prometheus", "victoria": "metricsql"}
FLEET = FleetConfig(
    topology=TopologySpec(zones=("zone-a",), hosts_per_zone=2, replicas_per_host=2),
    pools=(PoolSpec("chat", 2), PoolSpec("batch", 2)),
    workload=WorkloadSpec(arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=8.0)),
    # errors on one replica, so that error ratios are not all zero
    failures=(FailureSpec(FailureKind.ERROR_BURST, at_s=0.0, target="vllm-1", error_ratio=0.3),),
)


def _vllm_job(server: LiveFleetServer) -> dict[str, Any]:
    pools = {p.replica: p.pool for p in FLEET.placements()}
    groups = [
        {"targets": [t.address], "labels": {**t.labels, "pool": pools[t.name]}}
        for t in server.targets
        if t.kind.value == "vllm"
    ]
    return {"job_name": "vllm", "static_configs": groups}


def _text(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds") + "Z"


def _raw_slis(block: dict[str, Any], window_s: float) -> dict[str, float | None]:
    """servewatch's own figures (`sli --source histograms`) under the recorded SLIs' names."""
    out: dict[str, float | None] = {}
    for stem in ("ttft", "itl", "tpot", "e2e"):
        for p in ("p50", "p90", "p99"):
            out[f"{stem}_{p}_s"] = block[f"{stem}_s"][p]
    reasons = {k: v for k, v in block["finish_reasons"].items() if v is not None}
    finished = sum(reasons.values())
    out["requests_per_s"] = finished / window_s
    out["error_ratio"] = reasons.get("error", 0.0) / finished if finished else None
    out["prompt_tokens_per_s"] = block["prompt_tokens_per_s"]
    out["generation_tokens_per_s"] = block["generation_tokens_per_s"]
    out["prefix_cache_hit_ratio"] = block["prefix_cache_hit_ratio"]
    out["kv_cache_usage_ratio_mean"] = block["kv_cache_usage_ratio"]["mean"]
    out["requests_waiting_mean"] = block["requests_waiting"]["mean"]
    out["requests_running_mean"] = block["requests_running"]["mean"]
    return out


def _cli(runner: CliRunner, db: Path, *args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["--db", str(db), *args, "--json"])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _comparisons(
    runner: CliRunner, db: Path, at: datetime
) -> Iterator[tuple[str, str, str, float, float | None]]:
    """(level, group, SLI, recorded, raw) at `at`, for every recorded figure of the replica
    and pool levels."""
    for by in ("replica", "pool"):
        recorded = _cli(runner, db, "sli", "--recorded", "--by", by, "--to", _text(at))
        raw = _cli(
            runner,
            db,
            "sli",
            "--source",
            "histograms",
            "--by",
            by,
            "--from",
            _text(at - timedelta(seconds=WINDOW_S)),
            "--to",
            _text(at),
        )
        section = raw["histograms"]
        window_s = section["window"]["window_s"]
        assert window_s == WINDOW_S
        own = {group[by]: _raw_slis(group, window_s) for group in section["groups"]}
        for group in recorded["groups"]:
            name = group["labels"][by]
            for sli, value in group["slis"].items():
                if value is not None:
                    yield by, name, sli, value, own.get(name, {}).get(sli)


def _evaluations(client: httpx.Client, record: str, *, after_s: float) -> list[datetime]:
    """The instants (whole milliseconds) a rule was evaluated at after `after_s`."""
    answer = instant_query(client, f"{record}[60s]")
    stamps = {round(float(t) * 1000) for r in answer for t, _ in r["values"]}
    return [
        datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)
        for ms in sorted(stamps)
        if ms / 1000 > after_s
    ]


def _stored_evaluations(db: Path, record: str, *, after_s: float) -> list[datetime]:
    """The instants a rule's imported record was evaluated at after `after_s`."""
    after = datetime.fromtimestamp(after_s, tz=UTC).replace(tzinfo=None)
    with Store.open(db, read_only=True) as store:
        points = store.read_recorded_points(from_ts=after).collect()
    return sorted(set(points.filter(pl.col("record") == record)["ts"].to_list()))


def _bucket_bounds(db: Path) -> set[float]:
    """Every `le` of the stored histograms: where a quantile may sit on a tie (below)."""
    with Store.open(db, read_only=True) as store:
        labels = store.read_series().collect()["labels"]
    found = labels.str.json_path_match("$.le").drop_nulls().unique().to_list()
    return {float(le) for le in found if le != "+Inf"}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-12)


def _is_bound(value: float, bounds: set[float]) -> bool:
    return any(math.isclose(value, b, rel_tol=1e-9) for b in bounds)


def _first_sample_s(db: Path) -> float:
    with Store.open(db, read_only=True) as store:
        first = store.read_points().select(pl.col("ts").min()).collect().item()
    return float(first.replace(tzinfo=UTC).timestamp())


@pytest.mark.slow
def test_recorded_slis_equal_servewatch_raw_computation(runner: CliRunner, tmp_path: Path) -> None:
    rules = sli_rules(window=WINDOW)
    rule_files: dict[str, Path] = {}
    for name, dialect in DIALECTS.items():
        rule_files[name] = tmp_path / f"sli_rules_{dialect}.yml"
        text = sli_rules(window=WINDOW, dialect=dialect).to_yaml()
        rule_files[name].write_text(text, encoding="utf-8")
    ports = fleet_ports(FLEET)
    job = _vllm_job(LiveFleetServer(FLEET.placements(), started_s=0.0, ports=ports))
    replicas = len(job["static_configs"])
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "victoria").mkdir()
    with (
        running_prometheus(
            tmp_path / "prometheus", [job], rule_files=[rule_files["prometheus"]]
        ) as prometheus,
        running_victoria_metrics(tmp_path / "victoria", [job]) as victoria,
        running_vmalert(tmp_path / "victoria", victoria, [rule_files["victoria"]]),
    ):
        servers = {"prometheus": prometheus, "victoria": victoria}
        for client in servers.values():
            poll(
                "every replica to be scraped",
                lambda c=client: (
                    True if len(instant_query(c, 'up{job="vllm"}')) == replicas else None
                ),
            )
        started = datetime.now(UTC).replace(tzinfo=None)
        with live_fleet(FLEET, seed=11, ports=ports):
            time.sleep(LOADED_S)  # the fleet serves load; nothing to wait on but time
        stopped_s = time.time()
        # Once every target is down no sample is added, so what a rule evaluated after that
        # read is what the raw import reads back: no evaluation raced a scrape.
        poll(
            "rule evaluations after the fleet stopped",
            lambda: (
                True
                if all(
                    len(_evaluations(c, RECORD, after_s=stopped_s + SETTLED_S)) >= INSTANTS
                    for c in servers.values()
                )
                else None
            ),
        )
        end = datetime.now(UTC).replace(tzinfo=None)
        window = ImportWindow(start=started - timedelta(seconds=5), end=end, step_s=1.0)
        stores: dict[str, Path] = {}
        for name, client in servers.items():
            stores[name] = tmp_path / f"{name}.duckdb"
            url = str(client.base_url)
            with Store.open(stores[name]) as store:
                import_from_prometheus(url, store=store, window=window)
                report = import_recorded_from_prometheus(url, store=store, window=window)
            assert set(report.records) == {
                r for r in rules.records if not r.endswith("_bucket:rate" + WINDOW)
            }
    for name, db in stores.items():
        bounds = _bucket_bounds(db)
        # Instants whose window holds the fleet's whole run, with time to spare at its start
        # (see docs/prometheus-import.md on the edge).
        latest_s = _first_sample_s(db) + WINDOW_S - 1.5
        instants = [
            at
            for at in _stored_evaluations(db, RECORD, after_s=stopped_s + SETTLED_S)
            if at.replace(tzinfo=UTC).timestamp() < latest_s
        ][:INSTANTS]
        assert len(instants) >= 2, f"{name}: evaluations between the stop and window's end"
        compared: dict[tuple[str, str], int] = {}
        ties = 0
        for at in instants:
            for level, group, sli, recorded, raw in _comparisons(runner, db, at):
                assert raw is not None, (name, at, level, group, sli, recorded)
                if not _close(recorded, raw):
                    # A quantile whose rank lands exactly on a bucket's cumulative count may
                    # be either bucket's bound; float rounding in each evaluator decides.
                    tie = "_p" in sli and _is_bound(recorded, bounds) and _is_bound(raw, bounds)
                    assert tie, (name, _text(at), level, group, sli, recorded, raw)
                    ties += 1
                key = (level, sli)
                compared[key] = compared.get(key, 0) + 1
        expected = {"ttft_p90_s", "requests_per_s", "kv_cache_usage_ratio_mean", "error_ratio"}
        for level, count in (("replica", replicas), ("pool", 2)):
            for sli in expected:
                assert compared.get((level, sli), 0) >= count * len(instants), (name, level, sli)
        assert sum(compared.values()) >= MIN_COMPARED, (name, sum(compared.values()))
        # Ties are rare (0 to 3 of 360 in development runs): more would hide a real difference.
        assert ties * 20 <= sum(compared.values()), (name, ties)
