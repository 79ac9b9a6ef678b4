"""Sharded collection: Prometheus' hashmod on target addresses, `scrape.shard`, `--shard`, and
several collectors over one fleet storing every target exactly once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.answers import status_answer
from servewatch.cli import app
from servewatch.collectors.scrape.shards import Shard, select_shard, shard_of, target_address
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.config import ConfigError, load_config, parse_config
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.records import FinishedReason, FinishedRequest, ReplicaPlacement
from servewatch.pipeline.instants import format_instant
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.scraping import TargetHealth, resolve_targets, scrape_round, shard_targets
from servewatch.service import Service
from servewatch.store import IN_MEMORY, Store, roll_up_request_minutes, utc_now
from tests.conftest import free_port, require_program


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod, written out again here: md5, the digest's last 8 bytes as a
    big-endian uint64, modulo the modulus."""
    digest = hashlib.md5(value.encode()).digest()
    return int.from_bytes(digest[8:16], byteorder="big", signed=False) % modulus


ADDRESSES = [
    "10.0.0.5:8000",
    "10.0.0.6:8000",
    "gpu-node-1:8000",
    "gpu-node-1:9400",
    "vllm-0.serving.svc.cluster.local:8000",
    "[2001:db8::1]:8000",
    "127.0.0.1:9090",
    "",
]


@pytest.mark.parametrize("address", ADDRESSES)
@pytest.mark.parametrize("modulus", [1, 2, 3, 5, 7, 16, 1000, 2**32 + 15])
def test_shard_of_is_prometheus_hashmod(address: str, modulus: int) -> None:
    assert shard_of(address, modulus) == hashmod(address, modulus)
    assert shard_of(address, modulus) == shard_of(address, modulus)  # stable


def test_shard_of_known_digests() -> None:
    # md5("10.0.0.5:8000") written out, so that a changed byte order or digest half fails
    # even if the helper above were changed alike.
    digest = hashlib.md5(b"10.0.0.5:8000").hexdigest()
    low = int(digest[16:], 16)
    assert shard_of("10.0.0.5:8000", 3) == low % 3
    assert shard_of("10.0.0.5:8000", 2**64) == low
    with pytest.raises(ValueError, match="modulus must be a whole number >= 1, got 0"):
        shard_of("10.0.0.5:8000", 0)


def target(url: str) -> Target:
    return Target(target_id=url, kind=TargetKind.VLLM, url=url)


def test_a_targets_address_is_the_host_and_port_of_its_url() -> None:
    assert target_address(target("http://10.0.0.5:8000/metrics")) == "10.0.0.5:8000"
    assert target_address(target("https://user:pw@Host-A:443/x/metrics")) == "Host-A:443"
    assert target_address(target("http://[2001:db8::1]:8000/metrics")) == "[2001:db8::1]:8000"
    assert target_address(target("http://host-a/metrics")) == "host-a"


FLEET = [target(f"http://10.0.{i // 50}.{i % 50}:8000/metrics") for i in range(200)]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_every_target_lands_in_exactly_one_shard(count: int) -> None:
    selections = [select_shard(FLEET, Shard(i, count)) for i in range(count)]
    kept = [t.target_id for s in selections for t in s.kept]
    assert sorted(kept) == sorted(t.target_id for t in FLEET)  # each once, none lost
    assert all(s.listed == len(FLEET) for s in selections)
    for s in selections:
        assert all(hashmod(target_address(t), count) == s.shard.index for t in s.kept)
        assert [t for t in FLEET if t in s.kept] == list(s.kept)  # listed order kept
    if count > 1:  # 200 addresses spread: no shard is empty
        assert all(s.kept for s in selections)


def test_one_shard_keeps_everything() -> None:
    selection = select_shard(FLEET, Shard())
    assert selection.kept == tuple(FLEET)
    assert selection.summary() == "shard 0/1: 200 of 200 listed targets"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "3/3",
            'must be "INDEX/COUNT", whole numbers with 0 <= INDEX < COUNT (e.g. "0/3"), got 3/3',
        ),
        ("0/0", "got 0/0"),
        ("-1/3", "got '-1/3'"),
        ("1", "got '1'"),
        ("1/3/4", "got '1/3/4'"),
        ("a/b", "got 'a/b'"),
        ("1.0/3", "got '1.0/3'"),
        ("", "got ''"),
        (2, 'must be a string "INDEX/COUNT"'),
        (["0", "3"], "must be a string"),
    ],
)
def test_bad_shard_settings_are_named(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"scrape": {"shard": value}}, source=Path("servewatch.toml"))
    assert str(caught.value).startswith("servewatch.toml: scrape.shard: must be ")
    assert message in str(caught.value)


def test_the_shard_setting_is_read_and_defaults_to_all() -> None:
    assert parse_config({}, source=None).scrape.shard == Shard(0, 1)
    assert parse_config({"scrape": {"shard": "2/5"}}, source=None).scrape.shard == Shard(2, 5)
    assert parse_config({"scrape": {"shard": " 0 / 1 "}}, source=None).scrape.shard == Shard()


# Two (and three) collectors over one live emulated fleet

T0 = 1_795_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLACEMENTS = tuple(
    ReplicaPlacement(f"vllm-{i}", f"host-{i // 2}", f"zone-{i // 4}", MODEL, "chat", 1)
    for i in range(6)
)
AT = datetime(2026, 11, 18, 11, 0, 0)  # every collector's scrapes start at this instant


def finished(replica: str, n: int) -> FinishedRequest:
    return FinishedRequest(
        replica=replica,
        request_id=f"cmpl-{replica}-{n}",
        conversation_id=None,
        tenant=None,
        arrival_s=T0 + n,
        queue_s=0.01,
        prefill_s=0.05,
        decode_s=0.3,
        prompt_tokens=100,
        cached_prompt_tokens=0,
        completion_tokens=16,
        max_tokens=16,
        finished_reason=FinishedReason.LENGTH if n % 3 else FinishedReason.STOP,
    )


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[LiveFleetServer, Path]]:
    """A live emulated fleet (6 vLLM replicas, 3 DCGM hosts) frozen after replica i has
    finished 2i+1 requests: its pages stay the same however often they are scraped. Yields
    it with a config listing its targets through file_sd."""
    server = LiveFleetServer(PLACEMENTS, started_s=T0)
    server.start()
    for i, placement in enumerate(PLACEMENTS):
        for n in range(2 * i + 1):
            server.request_finished(finished(placement.replica, n))
    (tmp_path / "fleet.json").write_text(json.dumps(server.file_sd()), encoding="utf-8")
    config = tmp_path / "servewatch.toml"
    config.write_text(
        '[store]\npath = "fleet.duckdb"\n[scrape]\ninterval_s = 15\ntimeout_s = 5\n'
        '[[file_sd]]\npath = "fleet.json"\n'
        '[otlp]\nlisten = "127.0.0.1:0"\ngrpc = false\n',
        encoding="utf-8",
    )
    try:
        yield server, config
    finally:
        server.stop()


def stored_points(store: Store) -> pl.DataFrame:
    points = store.read_points().collect().join(store.read_series().collect(), on="series_id")
    return points.select("target_id", "metric", "labels", "ts", "value").sort(pl.all())


def requests_by_replica(store: Store) -> dict[str, float]:
    """Per replica: requests finished, from `vllm:request_success_total` (all reasons)."""
    points = store.read_points().collect().join(store.read_series().collect(), on="series_id")
    targets = store.read_targets().collect().select("target_id", "replica")
    success = points.filter(pl.col("metric") == "vllm:request_success_total").join(
        targets, on="target_id"
    )
    totals = success.group_by("replica").agg(pl.col("value").sum())
    return dict(totals.iter_rows())


@pytest.mark.parametrize("count", [2, 3])
def test_shards_together_store_every_target_once_and_agree_with_one_collector(
    fleet: tuple[LiveFleetServer, Path], count: int
) -> None:
    _, path = fleet
    listed, problems = resolve_targets(load_config(path))
    assert not problems
    assert len(listed) == 9

    def collect(shard: Shard | None) -> tuple[tuple[Target, ...], Store]:
        config = load_config(path, shard=shard)
        targets, _ = resolve_targets(config)
        selection = shard_targets(targets, config.scrape)
        store = Store.open(IN_MEMORY)
        report = scrape_round(selection.kept, store=store, settings=config.scrape, now=lambda: AT)
        assert not report.failed_scrapes
        return selection.kept, store

    everything, whole = collect(None)
    shards = [collect(Shard(i, count)) for i in range(count)]
    try:
        assert len(everything) == len(listed)
        # Every target kept by exactly one shard, and stored by that one only.
        kept = [t.target_id for targets, _ in shards for t in targets]
        assert sorted(kept) == sorted(t.target_id for t in listed)
        for targets, store in shards:
            stored = set(store.read_targets().collect()["target_id"])
            assert stored == {t.target_id for t in targets}
        # The shards' stores together hold what one collector over all targets holds.
        union = pl.concat([stored_points(store) for _, store in shards]).sort(pl.all())
        assert union.equals(stored_points(whole))
        per_replica: dict[str, float] = {}
        for _, store in shards:
            counts = requests_by_replica(store)
            assert not set(counts) & set(per_replica)  # no replica counted by two shards
            per_replica |= counts
        assert per_replica == requests_by_replica(whole)
        assert per_replica == {f"vllm-{i}": 2 * i + 1 for i in range(6)}
    finally:
        whole.close()
        for _, store in shards:
            store.close()


def request_rows(records: list[FinishedRequest]) -> pl.DataFrame:
    """The request rows a collector stores for these requests' spans."""
    rows = [
        {
            "trace_id": f"{i:032x}",
            "span_id": f"{i:016x}",
            "request_id": r.request_id,
            "replica": r.replica,
            "host": next(p.host for p in PLACEMENTS if p.replica == r.replica),
            "zone": None,
            "model": MODEL,
            "pool": "chat",
            "tenant": None,
            "arrival_ts": datetime.fromtimestamp(r.arrival_s, UTC).replace(tzinfo=None),
            "end_ts": datetime.fromtimestamp(
                r.arrival_s + r.queue_s + r.prefill_s + r.decode_s, UTC
            ).replace(tzinfo=None),
            "ok": r.finished_reason is not FinishedReason.ABORT,
            "error_type": None,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "ttft_s": r.queue_s + r.prefill_s,
            "e2e_s": r.queue_s + r.prefill_s + r.decode_s,
            "queue_s": r.queue_s,
            "prefill_s": r.prefill_s,
            "decode_s": r.decode_s,
            "inference_s": r.prefill_s + r.decode_s,
            "max_tokens": r.max_tokens,
            "emulated": True,
            "source": "test",
            "ingested_ts": None,
            "conversation_id": None,
            "adapter": None,
        }
        for i, r in enumerate(records)
    ]
    return pl.DataFrame(rows, schema=REQUESTS_SCHEMA)


def same_document(a: object, b: object) -> bool:
    """Equal JSON documents, floats to the last few digits: a mean's last bit moves with the
    order a parallel group-by adds in, from run to run even on one store."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_document(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_document(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-12)
    return type(a) is type(b) and a == b


def test_the_analytics_over_two_shards_stores_equal_one_collectors(
    tmp_path: Path, runner: CliRunner
) -> None:
    """Two shard collectors and one collector over all targets scrape the same changing fleet
    in lockstep; the spans go to either shard (OTLP is not sharded), one of them to both.
    `sli` over both shards' stores answers as over the one collector's store, traced and
    scraped figures alike."""
    server = LiveFleetServer(PLACEMENTS, started_s=T0)
    server.start()
    (tmp_path / "fleet.json").write_text(json.dumps(server.file_sd()), encoding="utf-8")
    config = tmp_path / "servewatch.toml"
    config.write_text(
        '[scrape]\ninterval_s = 15\ntimeout_s = 5\n[[file_sd]]\npath = "fleet.json"\n',
        encoding="utf-8",
    )
    paths = {name: tmp_path / f"{name}.duckdb" for name in ("whole", "shard-0", "shard-1")}
    shards = {"whole": None, "shard-0": Shard(0, 2), "shard-1": Shard(1, 2)}
    stores = {name: Store.open(path, create=True) for name, path in paths.items()}
    records: list[FinishedRequest] = []
    try:
        for round_ in range(12):
            # Replica i finishes i + 1 requests every round; slower replicas decode slower.
            for i, placement in enumerate(PLACEMENTS):
                for n in range(i + 1):
                    record = replace(
                        finished(placement.replica, 100 * round_ + n),
                        arrival_s=T0 + 15 * round_ + n,
                        decode_s=0.2 + 0.05 * i + 0.01 * n,
                    )
                    server.request_finished(record)
                    records.append(record)
            now = AT + timedelta(seconds=15 * round_)
            for name, store in stores.items():
                loaded = load_config(config, shard=shards[name])
                targets, _ = resolve_targets(loaded)
                kept = shard_targets(targets, loaded.scrape).kept
                scrape_round(kept, store=store, settings=loaded.scrape, now=lambda at=now: at)
        rows = request_rows(records)
        stores["whole"].write_requests(rows)
        # Alternate spans between the shards; the first ten reach both (a retried export).
        stores["shard-0"].write_requests(rows.gather_every(2))
        stores["shard-1"].write_requests(pl.concat([rows.gather_every(2, offset=1), rows[:10]]))
        for store in stores.values():
            roll_up_request_minutes(store)
    finally:
        server.stop()
        for store in stores.values():
            store.close()

    def answer(*dbs: Path, command: list[str]) -> dict[str, object]:
        result = runner.invoke(
            app, [arg for db in dbs for arg in ("--db", str(db))] + [*command, "--json"]
        )
        assert result.exit_code == 0, result.output
        document: dict[str, object] = json.loads(result.stdout)
        return document

    both = (paths["shard-0"], paths["shard-1"])
    sli = ["sli", "--ttft-ms", "400", "--by", "replica", "--window", "1m"]
    whole = answer(paths["whole"], command=sli)
    assert len(whole["groups"]) == len(whole["histograms"]["groups"]) == 6  # type: ignore[index]
    assert same_document(whole, answer(*both, command=sli))
    assert same_document(whole, answer(*reversed(both), command=sli))
    # One shard alone is not the fleet.
    assert not same_document(whole, answer(paths["shard-0"], command=sli))
    by_pool = ["sli", "--by", "pool", "--source", "both"]
    assert same_document(answer(paths["whole"], command=by_pool), answer(*both, command=by_pool))
    # A command that writes or reads one store says so.
    result = runner.invoke(
        app,
        [
            "--db",
            str(both[0]),
            "--db",
            str(both[1]),
            "export",
            "--all",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2
    assert "--db names 2 stores" in " ".join(result.stderr.split())


def test_scrape_once_with_a_shard_says_what_it_kept(
    fleet: tuple[LiveFleetServer, Path], tmp_path: Path, runner: CliRunner
) -> None:
    server, path = fleet
    expected = {t.url for t in server.targets if hashmod(t.address, 2) == 1}
    db = tmp_path / "shard1.duckdb"
    result = runner.invoke(
        app,
        ["--db", str(db), "scrape", "--config", str(path), "--once", "--json"],
        env={"SERVEWATCH_SHARD": "1/2"},
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["shard"] == {
        "shard": "1/2",
        "index": 1,
        "count": 2,
        "targets_kept": len(expected),
        "targets_listed": 9,
    }
    assert document["rounds"][0]["pages"] == len(expected)
    with Store.open(db, read_only=True) as store:
        assert set(store.read_targets().collect()["url"]) == expected
    # The option wins over the environment and the file; a bad one is a usage error.
    result = runner.invoke(
        app,
        ["--db", str(db), "scrape", "--config", str(path), "--once", "--json", "--shard", "0/1"],
        env={"SERVEWATCH_SHARD": "1/2"},
    )
    assert json.loads(result.stdout)["shard"]["targets_kept"] == 9
    result = runner.invoke(app, ["scrape", "--config", str(path), "--once", "--shard", "2/2"])
    assert result.exit_code == 2
    assert '--shard (SERVEWATCH_SHARD): must be "INDEX/COUNT"' in " ".join(result.stderr.split())


def test_a_shard_without_targets_scrapes_nothing_and_succeeds(
    tmp_path: Path, runner: CliRunner
) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    address = url.split("/")[2]
    empty = next(i for i in range(4) if i != hashmod(address, 4))
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[scrape]\nshard = "{empty}/4"\n[[targets]]\nurl = "{url}"\nreplica = "vllm-0"\n',
        encoding="utf-8",
    )
    result = runner.invoke(
        app,
        ["--db", str(tmp_path / "s.duckdb"), "scrape", "--config", str(config), "--once", "--json"],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["shard"]["targets_kept"], document["shard"]["targets_listed"]) == (0, 1)
    assert document["rounds"][0]["pages"] == 0


def test_run_keeps_its_shard_across_file_sd_changes_and_says_so_on_healthz(
    tmp_path: Path,
) -> None:
    addresses = [f"10.9.{i // 100}.{i % 100}:8000" for i in range(12)]
    file_sd = tmp_path / "fleet.json"

    def list_targets(count: int) -> None:
        groups = [
            {"targets": [address], "labels": {"kind": "vllm", "replica": f"vllm-{i}"}}
            for i, address in enumerate(addresses[:count])
        ]
        file_sd.write_text(json.dumps(groups), encoding="utf-8")
        # A new mtime, so that the re-read sees the change even within one clock tick.
        os.utime(file_sd, ns=(count * 10**9, count * 10**9))

    list_targets(6)
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "s.duckdb"}"\n[scrape]\nshard = "0/3"\n'
        '[[file_sd]]\npath = "fleet.json"\n[otlp]\nlisten = "127.0.0.1:0"\ngrpc = false\n',
        encoding="utf-8",
    )
    service = Service(config, shard=Shard(1, 2))  # the option over the file's 0/3
    try:
        service.scrape_loop.start()
        for count in (6, 12):
            list_targets(count)
            service.sync_targets()
            mine = [a for a in addresses[:count] if hashmod(a, 2) == 1]
            assert service.scrape_loop.target_count == len(mine)
            assert service.target_health.answer().text == (
                f"ok\nshard 1/2: {len(mine)} of {count} listed targets"
            )
            # Spans still meet every listed target: OTLP is not sharded.
            assert len(service.target_directory.by_replica) == count
        service.reload_config()
        assert service.state.config.scrape.shard == Shard(1, 2)
    finally:
        service.stop()


def test_health_names_the_shard_after_its_verdict() -> None:
    health = TargetHealth(failing_after=1)
    health.follow(select_shard(FLEET, Shard(0, 1)))
    assert health.answer().text == "ok\nshard 0/1: 200 of 200 listed targets"


@pytest.mark.slow
def test_shards_agree_with_a_real_prometheus_hashmod(tmp_path: Path) -> None:
    """Prometheus itself labels each target with its hashmod shard; ours must agree."""
    binary = require_program("prometheus")
    addresses = [f"127.0.0.1:{port}" for port in range(20000, 20030)] + ADDRESSES[:6]
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1h"},
                "scrape_configs": [
                    {
                        "job_name": "fleet",
                        "static_configs": [{"targets": addresses}],
                        "relabel_configs": [
                            {
                                "source_labels": ["__address__"],
                                "modulus": 5,
                                "target_label": "shard",
                                "action": "hashmod",
                            }
                        ],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        labelled: dict[str, int] = {}
        while time.monotonic() < deadline and len(labelled) < len(addresses):
            assert process.poll() is None, "prometheus exited"
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=2)
            except httpx.HTTPError:
                response = None
            if response is None or response.status_code != 200:  # not ready yet
                time.sleep(0.1)
                continue
            answer = response.json()
            labelled = {
                t["labels"]["instance"]: int(t["labels"]["shard"])
                for t in answer["data"]["activeTargets"]
            }
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert set(labelled) == set(addresses)
    assert labelled == {a: shard_of(a, 5) for a in addresses}


def test_status_checks_the_shards_stores_together(
    fleet: tuple[LiveFleetServer, Path], tmp_path: Path, runner: CliRunner
) -> None:
    server, path = fleet
    now = utc_now() - timedelta(seconds=10)
    dbs = [tmp_path / f"shard-{i}.duckdb" for i in range(2)] + [tmp_path / "whole.duckdb"]
    for db, shard in zip(dbs, [Shard(0, 2), Shard(1, 2), None], strict=True):
        loaded = load_config(path, shard=shard)
        targets, _ = resolve_targets(loaded)
        with Store.open(db, create=True) as store:
            kept = shard_targets(targets, loaded.scrape).kept
            scrape_round(kept, store=store, settings=loaded.scrape, now=lambda: now)

    def status(*chosen: Path) -> tuple[int, dict[str, Any]]:
        args = [arg for db in chosen for arg in ("--db", str(db))]
        result = runner.invoke(app, [*args, "status", "--json"])
        return result.exit_code, json.loads(result.stdout)

    code, document = status(*dbs[:2])
    assert code == 0
    assert document["ok"]
    assert document["targets_scraped"] == 9
    assert document["targets_scraped_twice"] == []
    assert [s["verdict"] for s in document["stores"]] == ["ok", "ok"]
    assert sum(s["targets"] for s in document["stores"]) == 9
    # A collector over every target beside the shards: each target is scraped twice.
    code, document = status(*dbs)
    assert code == 1
    assert len(document["targets_scraped_twice"]) == 9
    # The fleet goes away: the shard's next round fails, and the shard is degraded.
    server.stop()
    loaded = load_config(path, shard=Shard(0, 2))
    with Store.open(dbs[0]) as store:
        kept = shard_targets(resolve_targets(loaded)[0], loaded.scrape).kept
        scrape_round(
            kept, store=store, settings=loaded.scrape, now=lambda: now + timedelta(seconds=5)
        )
    code, document = status(*dbs[:2])
    assert code == 1
    first = document["stores"][0]
    assert first["verdict"] == "degraded"
    assert len(first["targets_failing"]) == first["targets_scraped"] == len(kept)
    # Judged later, with nothing scraped since: stale (the collector stopped).
    with Store.open(dbs[1], read_only=True) as store:
        later = status_answer(store, stale_after_s=60, now=now + timedelta(minutes=2))
    assert later["verdict"] == "stale"
    assert later["last_scrape"] == format_instant(now)
    text = runner.invoke(app, ["--db", str(dbs[0]), "status", "--stale-after", "soon"])
    assert text.exit_code == 2
    assert "--stale-after: 'soon' is not a duration" in " ".join(text.stderr.split())
