"""GPUs attributed to replicas: the join rules as a table of cases (every bug seen on real
captures among them), the vectorised form held against the scalar one, tensor-parallel folds,
and the store's series: unmatched GPUs are listed and never spread over replicas."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.metrics.catalogue import labels_json
from servewatch.collectors.metrics.dcgm_catalogue import catalogue_dcgm_frame
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import target_from_labels
from servewatch.dashboards.report import ReportInputs, build_report
from servewatch.emulator.fixture_writer import FixtureWriter, record_fixture
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, HostSpec, TopologySpec
from servewatch.emulator.vllm_metrics import EngineSettings
from servewatch.pipeline.gpu_attribution import (
    REPLICA_GPUS_SCHEMA,
    UNMATCHED_GPUS_SCHEMA,
    JoinRule,
    ReplicaGpus,
    aggregate,
    gpu_identity,
    join_replicas,
    match_gpus,
    tensor_parallel,
    unmatched_gpu_readings,
)
from servewatch.pipeline.metric_frames import metric_minute_frames
from servewatch.pipeline.metric_sli import Scope, gauge_table, series_dimensions
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.signals import Signal
from servewatch.pipeline.tables import POINTS_SCHEMA, SERIES_SCHEMA, TARGETS_SCHEMA
from servewatch.store import Store
from tests.catalogue_oracle import RawSample, catalogue_dcgm
from tests.test_catalogues import parse, sample_file

MIB = 1024 * 1024
H100 = "dcgm_aicr-h100-vllm.txt"
UUID0 = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
UUID1 = "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"
UUID2 = "GPU-fbc2c554-4d37-8938-0032-f923bad0f716"
P, A, U, H, T, W = (
    JoinRule.POD,
    JoinRule.AMBIGUOUS,
    JoinRule.UNMATCHED,
    JoinRule.HOST,
    JoinRule.HOST_UUID,
    JoinRule.OTHER_WORKLOAD,
)


def replica_frame(replicas: list[ReplicaGpus]) -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "replica": [r.replica for r in replicas],
            "pod": [r.pod for r in replicas],
            "namespace": [r.namespace for r in replicas],
            "hostname": [r.hostname for r in replicas],
            "gpu_uuids": [list(r.gpu_uuids) for r in replicas],
            "gpus": [r.gpus for r in replicas],
        },
        schema=REPLICA_GPUS_SCHEMA,
    )


def dcgm_frame(samples: list[RawSample]) -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "ts": [0] * len(samples),
            "metric": [s.metric for s in samples],
            "labels": [labels_json(s.labels) for s in samples],
            "value": [float(s.value) for s in samples],
        }
    ).pipe(catalogue_dcgm_frame, page_by=["ts"])


def mig(uuid: str, instance: str, **labels: str) -> dict[str, str]:
    """A MIG slice's labels as dcgm-exporter writes them: the parent GPU's UUID."""
    return {
        "hostname": "n1",
        "UUID": uuid,
        "gpu": "0",
        "GPU_I_PROFILE": "1g.10gb",
        "GPU_I_ID": instance,
        **labels,
    }


POD = {"pod": "p1", "namespace": "ns"}

# (case, the GPUs the exporters show, the replicas, each GPU's (replica, rule) in GPU order)
JOIN_CASES: list[
    tuple[str, list[dict[str, str]], list[ReplicaGpus], list[tuple[str | None, JoinRule]]]
] = [
    (
        "pod and namespace win over hostname and UUID lists",
        [{"hostname": "n1", "UUID": "u1", **POD}],
        [
            ReplicaGpus("a", hostname="n1", gpu_uuids=("u1",)),
            ReplicaGpus("b", pod="p1", namespace="ns"),
        ],
        [("b", P)],
    ),
    (
        "the same pod name in another namespace is another workload",
        [{"hostname": "n1", "UUID": "u1", **POD}],
        [ReplicaGpus("b", hostname="n1", pod="p1", namespace="other", gpu_uuids=("u1",))],
        [(None, W)],
    ),
    (
        "bug: a GPU whose pod is another workload is not given by hostname to a pod-less replica",
        [{"hostname": "n1", "UUID": "u1", "pod": "trainer-0", "namespace": "ml"}],
        [ReplicaGpus("a", hostname="n1", gpus=1)],
        [(None, W)],
    ),
    (
        "bug: an unlabelled GPU on a host that maps pods is idle, not the pod replica's",
        [
            {"hostname": "n1", "UUID": "u0", **POD},
            {"hostname": "n1", "UUID": "u1"},
            {"hostname": "n1", "UUID": "u2"},
        ],
        [ReplicaGpus("a", hostname="n1", pod="p1", namespace="ns")],
        [("a", P), (None, U), (None, U)],
    ),
    (
        "bug: a pod replica alone on a host that maps no pods, owning all its GPUs",
        [{"hostname": "n1", "UUID": "u0"}, {"hostname": "n1", "UUID": "u1"}],
        [ReplicaGpus("a", hostname="n1", pod="p1", namespace="ns", gpus=2)],
        [("a", H), ("a", H)],
    ),
    (
        "bug: a one-GPU pod replica alone on a two-GPU host owns one, nobody knows which",
        [{"hostname": "n1", "UUID": "u0"}, {"hostname": "n1", "UUID": "u1"}],
        [ReplicaGpus("a", hostname="n1", pod="p1", namespace="ns", gpus=1)],
        [(None, U), (None, U)],
    ),
    (
        "bug: MIG slices of one GPU serve three pods, each its own replica",
        [mig("u0", str(i), pod=f"p{i}", namespace="ns") for i in (1, 2, 3)],
        [ReplicaGpus(f"r{i}", hostname="n1", pod=f"p{i}", namespace="ns") for i in (1, 2, 3)],
        [("r1", P), ("r2", P), ("r3", P)],
    ),
    (
        "bug: MIG slices count as GPUs of the host: a one-GPU replica cannot have three slices",
        [mig("u0", "1"), mig("u0", "2"), mig("u0", "3")],
        [ReplicaGpus("a", hostname="n1", gpus=1)],
        [(None, U), (None, U), (None, U)],
    ),
    (
        "a replica without pod facts may claim by hostname and its UUID list",
        [{"hostname": "n1", "UUID": "u1", **POD}],
        [ReplicaGpus("a", hostname="n1", gpu_uuids=("u1",))],
        [("a", T)],
    ),
    (
        "hostname alone when the replica is alone on its host (of unknown GPU count)",
        [{"Hostname": "N1", "UUID": "u1", "gpu": "0"}],
        [ReplicaGpus("a", hostname="n1"), ReplicaGpus("z", hostname="n2")],
        [("a", H)],
    ),
    (
        "two replicas on a host without UUID lists: not guessed",
        [{"hostname": "n1", "UUID": "u1", "gpu": "0"}],
        [ReplicaGpus("a", hostname="n1"), ReplicaGpus("b", hostname="n1")],
        [(None, U)],
    ),
    (
        "a GPU two replicas both list is ambiguous",
        [{"hostname": "n1", "UUID": "u1"}],
        [
            ReplicaGpus("a", hostname="n1", gpu_uuids=("u1",)),
            ReplicaGpus("b", hostname="n1", gpu_uuids=("u1", "u2")),
        ],
        [(None, A)],
    ),
    (
        "two replicas claiming one pod is ambiguous",
        [{"hostname": "n1", "UUID": "u1", **POD}],
        [ReplicaGpus("a", pod="p1", namespace="ns"), ReplicaGpus("b", pod="p1", namespace="ns")],
        [(None, A)],
    ),
    (
        "the gpu index is never a key",
        [{"hostname": "n1", "UUID": "u9", "gpu": "0"}],
        [
            ReplicaGpus("a", hostname="n1", gpu_uuids=("u1",)),
            ReplicaGpus("b", hostname="n1", gpu_uuids=("u2",)),
        ],
        [(None, U)],
    ),
    (
        "no hostname, no pod: nothing to join on",
        [{"UUID": "u1"}],
        [ReplicaGpus("a", hostname="n1", gpu_uuids=("u1",))],
        [(None, U)],
    ),
]


@pytest.mark.parametrize(
    ("gpus", "replicas", "expected"),
    [case[1:] for case in JOIN_CASES],
    ids=[case[0] for case in JOIN_CASES],
)
def test_gpu_join_rules(
    gpus: list[dict[str, str]],
    replicas: list[ReplicaGpus],
    expected: list[tuple[str | None, JoinRule]],
) -> None:
    samples = [RawSample("DCGM_FI_DEV_GPU_TEMP", labels, 50.0) for labels in gpus]
    identities = [gpu_identity(s.labels) for s in catalogue_dcgm(samples)]
    assert [(m.replica, m.rule) for m in match_gpus(identities, replicas)] == expected
    rows = join_replicas(dcgm_frame(samples), replicas=replica_frame(replicas)).collect()
    assert [(r["replica"], JoinRule(r["rule"])) for r in rows.to_dicts()] == expected


def test_captured_h100_gpus_join_by_pod_and_uuid_list_and_leave_idle_gpus_unmatched() -> None:
    frame = dcgm_frame(parse(sample_file(H100).read_text()))
    replicas = [
        ReplicaGpus(
            "decode-0",
            hostname="gpu-node-1",
            pod="vllm-agg-0-vllmdecodeworker-s65j5",
            namespace="dynamo-workload",
        ),
        ReplicaGpus("tp2", hostname="GPU-NODE-1", gpu_uuids=(UUID1, UUID2)),
    ]
    joined = join_replicas(frame, replicas=replica_frame(replicas)).collect()
    rules = joined.group_by("uuid").agg(pl.col("replica").first(), pl.col("rule").first())
    by_uuid = {row["uuid"]: (row["replica"], row["rule"]) for row in rules.to_dicts()}
    assert by_uuid[UUID0] == ("decode-0", JoinRule.POD.value)
    assert by_uuid[UUID1] == ("tp2", JoinRule.HOST_UUID.value)
    assert by_uuid[UUID2] == ("tp2", JoinRule.HOST_UUID.value)
    others = {v for k, v in by_uuid.items() if k not in {UUID0, UUID1, UUID2}}
    assert others == {(None, JoinRule.UNMATCHED.value)}

    folded = tensor_parallel(joined.lazy(), by=["ts"]).collect()
    tp2 = {row["signal"]: row for row in folded.filter(pl.col("replica") == "tp2").to_dicts()}
    assert tp2[Signal.GPU_TEMPERATURE_C.value]["value"] == 29.0  # max of 29 and 26
    assert tp2[Signal.GPU_POWER_W.value]["value"] == pytest.approx(68.347 + 65.709)
    assert tp2[Signal.GPU_UTIL_RATIO.value]["value"] == 0.0
    assert {row["gpus"] for row in tp2.values()} == {2}
    # the pod replica alone on the host is not handed the seven idle GPUs
    decode = folded.filter(pl.col("replica") == "decode-0")
    power = decode.filter(pl.col("signal") == Signal.GPU_POWER_W.value).row(0, named=True)
    assert (power["value"], power["gpus"]) == (pytest.approx(113.611), 1)


def gpu(uuid: str, name: str, value: float) -> RawSample:
    return RawSample(name, {"hostname": "n1", "UUID": uuid, "gpu": uuid[-1]}, value)


TP2: list[tuple[str, float, float, Signal, float | None]] = [
    ("DCGM_FI_DEV_GPU_TEMP", 60, 71, Signal.GPU_TEMPERATURE_C, 71.0),
    ("DCGM_FI_DEV_XID_ERRORS", 0, 79, Signal.GPU_LAST_XID, 79.0),
    ("DCGM_FI_DEV_POWER_USAGE", 300.5, 310.25, Signal.GPU_POWER_W, 610.75),
    ("DCGM_FI_DEV_FB_USED", 70000, 71000, Signal.GPU_FB_USED_BYTES, 141000.0 * MIB),
    ("DCGM_FI_DEV_GPU_UTIL", 100, 50, Signal.GPU_UTIL_RATIO, 0.75),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.2, 0.4, Signal.GPU_TENSOR_ACTIVE_RATIO, 0.3),
    # a GPU without data leaves the other's reading; two leave none
    ("DCGM_FI_DEV_MEMORY_TEMP", 9223372036854775794, 80, Signal.GPU_MEMORY_TEMPERATURE_C, 80.0),
    (
        "DCGM_FI_DEV_BOARD_POWER_WATTS",
        140737488355328.0,
        140737488355328.0,
        Signal.GPU_POWER_W,
        None,
    ),
]


@pytest.mark.parametrize(("name", "first", "second", "signal", "value"), TP2)
def test_tensor_parallel_gpus_fold_by_the_signals_aggregation(
    name: str, first: float, second: float, signal: Signal, value: float | None
) -> None:
    samples = [gpu("GPU-0", name, first), gpu("GPU-1", name, second)]
    replicas = [ReplicaGpus("tp2", hostname="n1", gpu_uuids=("GPU-0", "GPU-1"))]
    joined = join_replicas(dcgm_frame(samples), replicas=replica_frame(replicas))
    [row] = tensor_parallel(joined, by=["ts"]).collect().to_dicts()
    assert (row["replica"], row["signal"], row["gpus"]) == ("tp2", signal.value, 2)
    assert row["value"] == (None if value is None else pytest.approx(value))
    assert row["gpus_reporting"] == sum(s.value is not None for s in catalogue_dcgm(samples))
    scalar = aggregate(signal, [s.value for s in catalogue_dcgm(samples)])
    assert scalar == (None if value is None else pytest.approx(value))


identities = st.fixed_dictionaries(
    {},
    optional={
        "hostname": st.sampled_from(["n1", "N1", "n2"]),
        "UUID": st.sampled_from(["u1", "u2", "u3"]),
        "GPU_I_ID": st.sampled_from(["1", "2"]),
        "pod": st.sampled_from(["p1", "p2"]),
        "namespace": st.sampled_from(["ns"]),
    },
)
replica_lists = st.lists(
    st.builds(
        ReplicaGpus,
        replica=st.sampled_from(["a", "b", "c", "d"]),
        hostname=st.sampled_from(["n1", "N1", "n2", None]),
        pod=st.sampled_from(["p1", "p2", None]),
        namespace=st.sampled_from(["ns", None]),
        gpu_uuids=st.lists(st.sampled_from(["u1", "u2", "u3"]), max_size=2, unique=True).map(tuple),
        gpus=st.sampled_from([None, 1, 2, 3]),
    ),
    max_size=4,
    unique_by=lambda r: r.replica,
)


@settings(max_examples=80, deadline=None)
@given(gpus=st.lists(identities, min_size=1, max_size=8), replicas=replica_lists)
def test_vectorised_join_agrees_with_the_scalar_rules(
    gpus: list[dict[str, str]], replicas: list[ReplicaGpus]
) -> None:
    samples = [RawSample("DCGM_FI_DEV_GPU_TEMP", labels, 50.0) for labels in gpus]
    rows = join_replicas(dcgm_frame(samples), replicas=replica_frame(replicas)).collect()
    matches = match_gpus([gpu_identity(labels) for labels in gpus], replicas)
    for row, match in zip(rows.to_dicts(), matches, strict=True):
        assert (row["replica"], row["rule"]) == (match.replica, match.rule.value)


# -- the store's series: attributed on every read, unmatched listed ---------------------------

T0 = datetime(2026, 11, 18, 10, 0, 0)


def _store_frames() -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """Host h0 serves r0 (one GPU, pod ns/r0) and r1 (TP=2, pod ns/r1) and shows a fourth GPU
    no pod requested; host h1 is r2's alone (gpus=1) and shows one GPU without pod labels."""
    targets = [
        ("v0", "vllm", "ns/r0", "h0", 1),
        ("v1", "vllm", "ns/r1", "h0", 2),
        ("v2", "vllm", "r2", "h1", 1),
        ("d0", "dcgm", None, "h0", None),
        ("d1", "dcgm", None, "h1", None),
    ]
    target_frame = pl.DataFrame(
        [
            (t, k, f"http://{t}/metrics", r, h, "z", "m", "pool", g, T0, T0, None)
            for t, k, r, h, g in targets
        ],
        schema=TARGETS_SCHEMA,
        orient="row",
    ).lazy()
    gpus = [  # (target, uuid, pod, power W at each scrape)
        ("d0", "g0", "r0", (273.4, 275.4)),
        ("d0", "g1", "r1", (289.8, 291.8)),
        ("d0", "g2", "r1", (301.0, 303.0)),
        ("d0", "g3", None, (70.0, 70.0)),
        ("d1", "g4", None, (120.0, 124.0)),
    ]
    series: list[tuple[int, str, str, str, str, str]] = []
    points: list[tuple[int, datetime, float]] = []
    for i, (target, uuid, pod, watts) in enumerate(gpus):
        host = "h0" if target == "d0" else "h1"
        labels = {"UUID": uuid, "gpu": str(i), "hostname": host}
        if pod:
            labels |= {"pod": pod, "namespace": "ns"}
        series.append(
            (
                i,
                target,
                Signal.GPU_POWER_W.value,
                "DCGM_FI_DEV_POWER_USAGE",
                labels_json(labels),
                "dcgm",
            )
        )
        points += [(i, T0 + timedelta(seconds=10 * k), w) for k, w in enumerate(watts)]
    for j, target in enumerate(("v0", "v1", "v2"), start=100):
        labels = labels_json({"engine": "0"})
        metric = "vllm:num_requests_running"
        series.append((j, target, Signal.REQUESTS_RUNNING.value, metric, labels, "vllm_engine"))
        points += [(j, T0 + timedelta(seconds=10 * k), 1.0) for k in range(2)]
    return (
        pl.DataFrame(series, schema=SERIES_SCHEMA, orient="row").lazy(),
        target_frame,
        pl.DataFrame(points, schema=POINTS_SCHEMA, orient="row").lazy(),
    )


def test_replicas_get_their_own_gpus_and_unmatched_gpus_are_listed_not_spread() -> None:
    series, targets, points = _store_frames()
    dimensions = series_dimensions(series, targets)
    end_s = T0.replace(tzinfo=UTC).timestamp() + 10  # naive UTC, as the store keeps time
    args = {"range_s": 10.0, "window_ends_s": [end_s]}
    per_replica = {
        row["replica"]: row
        for row in gauge_table(points, dimensions, scope=Scope.REPLICA, **args).collect().to_dicts()
    }
    assert per_replica["ns/r0"]["gpu_power_w_mean"] == pytest.approx(274.4)
    assert per_replica["ns/r1"]["gpu_power_w_mean"] == pytest.approx(290.8 + 302.0)
    # r2 is alone on h1, one GPU of one shown: unambiguous by hostname
    assert per_replica["r2"]["gpu_power_w_mean"] == pytest.approx(122.0)
    assert None not in per_replica  # the idle GPU is in no group
    [fleet] = gauge_table(points, dimensions, scope=Scope.FLEET, **args).collect().to_dicts()
    assert fleet["gpu_power_w_mean"] == pytest.approx(274.4 + 290.8 + 302.0 + 122.0)

    listed = unmatched_gpu_readings(points, dimensions).collect()
    assert listed.select(UNMATCHED_GPUS_SCHEMA.names()).schema == UNMATCHED_GPUS_SCHEMA
    assert listed.to_dicts() == [
        {
            "target_id": "d0",
            "hostname": "h0",
            "uuid": "g3",
            "gpu_instance": None,
            "pod": None,
            "namespace": None,
            "rule": JoinRule.UNMATCHED.value,
            "gpu_power_w_mean": 70.0,
            "gpu_util_ratio_mean": None,
        }
    ]


def test_the_reports_gpu_frame_folds_each_replicas_own_gpus_and_names_the_rest() -> None:
    series, targets, points = _store_frames()
    dimensions = series_dimensions(series, targets)
    frames = metric_minute_frames(points, dimensions, start=T0, end=T0 + timedelta(minutes=1))
    gpu = {row["replica"]: row for row in frames["gpu"].collect().to_dicts()}
    assert set(gpu) == {"ns/r0", "ns/r1", "r2"}
    assert gpu["ns/r1"]["power_w"] == pytest.approx(290.8 + 302.0)
    assert gpu["ns/r1"]["temperature_c"] is None  # no temperature series: null, not 0
    report = build_report(
        ReportInputs(gpu=frames["gpu"], unmatched_gpus=frames["unmatched_gpus"]),
        limits=GoodputLimits(),
    )
    facts = dict(report.facts)
    assert facts["GPUs serving no replica"] == "1: h0 g3 (unmatched)"
    assert "gpu-health" in {chart.slug for chart in report.charts}


@pytest.mark.slow
def _recorded_histograms(tmp_path: Path, topology: TopologySpec) -> dict[str, Any]:
    """Two minutes of an emulated fleet of `topology`, recorded in virtual time, replayed into
    a store: `sli --source histograms --by replica --json`'s histograms section."""
    config = FleetConfig(topology=topology)
    start_s = 1_790_000_000.0
    writer = FixtureWriter(
        tmp_path / "rec",
        config.placements(),
        start_s=start_s,
        scrape_interval_s=15.0,
        engine=EngineSettings.from_engine(config.engine),
        seed=1,
    )
    simulation = FleetSimulation(config, observer=writer, seed=1, start_s=start_s)
    record_fixture(simulation, writer, end_s=start_s + 120)
    db = tmp_path / "fleet.duckdb"
    runner = CliRunner()
    replayed = runner.invoke(app, ["--db", str(db), "replay", str(tmp_path / "rec")])
    assert replayed.exit_code == 0, replayed.output
    sli = runner.invoke(
        app, ["--db", str(db), "sli", "--source", "histograms", "--by", "replica", "--json"]
    )
    assert sli.exit_code == 0, sli.output
    section: dict[str, Any] = json.loads(sli.stdout)["histograms"]
    return section


def test_a_recorded_mixed_fleet_replays_with_every_gpu_under_its_own_replica(
    tmp_path: Path,
) -> None:
    """Single-GPU, tensor-parallel and MIG replicas run as pods, recorded in virtual time and
    replayed: each replica's GPU power is its own GPUs' sum, none is unmatched."""
    topology = TopologySpec(
        zones=("zone-a",),
        layout=(
            HostSpec("zone-a", replica_gpus=(1, 1)),
            HostSpec("zone-a", replica_gpus=(2,)),
            HostSpec("zone-a", replica_gpus=(1, 1), mig_profile="1g.10gb"),
        ),
        namespace="serving",
    )
    section = _recorded_histograms(tmp_path, topology)
    assert section["unmatched_gpus"] == []
    power = {g["replica"]: g["gpu_power_w"]["mean"] for g in section["groups"]}
    assert set(power) == {f"serving/vllm-{i}" for i in range(5)}
    assert all(watts is not None and watts > 0 for watts in power.values())
    # the TP=2 replica draws on two GPUs: more than any one-GPU or one-slice replica
    assert power["serving/vllm-2"] > max(w for r, w in power.items() if r != "serving/vllm-2")


def test_a_recorded_fleet_without_pods_joins_gpus_by_the_targets_uuid_lists(
    tmp_path: Path,
) -> None:
    """Replicas sharing hosts outside Kubernetes (two one-GPU replicas on a host, a TP=2 one on
    another): the emulator lists each replica's GPU UUIDs on its target, as an operator would
    from CUDA_VISIBLE_DEVICES, and every GPU lands under its own replica."""
    topology = TopologySpec(
        zones=("zone-a",),
        layout=(HostSpec("zone-a", replica_gpus=(1, 1)), HostSpec("zone-a", replica_gpus=(2,))),
    )
    section = _recorded_histograms(tmp_path, topology)
    assert section["unmatched_gpus"] == []
    power = {g["replica"]: g["gpu_power_w"]["mean"] for g in section["groups"]}
    assert set(power) == {"vllm-0", "vllm-1", "vllm-2"}
    assert all(watts is not None and watts > 0 for watts in power.values())
    assert power["vllm-2"] > max(power["vllm-0"], power["vllm-1"])


def _two_replica_host(tmp_path: Path, *, pods: bool, uuids: bool = False) -> Path:
    """The issue's host: two single-GPU replicas, a DCGM page of two GPUs (273.4 W, 289.8 W)
    and, with `pods`, the Kubernetes mapping naming each GPU's pod; with `uuids`, each
    replica's target lists its GPU's UUID (what its CUDA_VISIBLE_DEVICES names)."""
    db = tmp_path / "host.duckdb"
    pages = []
    for k in range(3):
        at = T0 + timedelta(seconds=15 * k)
        lines = ["# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
        for i, watts in enumerate((273.4, 289.8)):
            name = (
                {"pod": f"vllm-{i}", "namespace": "serving"} if pods else {"replica": f"vllm-{i}"}
            )
            labels = {"kind": "vllm", "host": "node-1", "gpus": 1, **name}
            if uuids:
                labels["gpu_uuids"] = f"GPU-{i}"
            target = target_from_labels(f"10.0.0.{i}:8000", labels, where="t")
            running = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {i}\n"
            pages.append(Page(target, at, running))
            pod = f',namespace="serving",pod="vllm-{i}"' if pods else ""
            gpu = f'gpu="{i}",UUID="GPU-{i}",Hostname="node-1"{pod}'
            lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{gpu}}} {watts}")
        dcgm = target_from_labels("10.0.0.9:9400", {"kind": "dcgm", "host": "node-1"}, where="t")
        pages.append(Page(dcgm, at, "\n".join(lines) + "\n"))
    with Store.open(db) as store:
        ingest_pages(pages, store=store)
    return db


@pytest.mark.parametrize(
    ("pods", "uuids"),
    [(True, False), (False, False), (False, True)],
    ids=["pods", "no pods", "targets list uuids"],
)
def test_two_single_gpu_replicas_on_one_host_never_share_its_gpus(
    tmp_path: Path, pods: bool, uuids: bool
) -> None:
    db = str(_two_replica_host(tmp_path, pods=pods, uuids=uuids))
    runner = CliRunner()
    base = ["--db", db, "sli", "--source", "histograms", "--by", "replica"]
    result = runner.invoke(app, [*base, "--json"])
    assert result.exit_code == 0, result.output
    section = json.loads(result.stdout)["histograms"]
    power = {g["replica"]: g["gpu_power_w"]["mean"] for g in section["groups"]}
    unmatched = {(g["uuid"], g["rule"], g["gpu_power_w_mean"]) for g in section["unmatched_gpus"]}
    if pods:
        assert power == {"serving/vllm-0": 273.4, "serving/vllm-1": 289.8}
        assert unmatched == set()
        assert section["overall"]["gpu_power_w"]["mean"] == pytest.approx(273.4 + 289.8)
    elif uuids:
        assert power == {"vllm-0": 273.4, "vllm-1": 289.8}
        assert unmatched == set()
    else:
        # two replicas on the host and nothing to tell their GPUs apart: listed, not spread
        assert power == {"vllm-0": None, "vllm-1": None}
        assert unmatched == {("GPU-0", "unmatched", 273.4), ("GPU-1", "unmatched", 289.8)}
        assert section["overall"]["gpu_power_w"]["mean"] is None
        table = runner.invoke(app, base, terminal_width=200)
        assert table.exit_code == 0, table.output
        assert "GPUs that serve no replica" in table.stdout
        assert "GPU-1" in table.stdout


def test_a_dcgm_targets_host_wins_over_a_container_hostname() -> None:
    """The captured T4 page's `Hostname` is its exporter's container id; the target's `host`
    says where the exporter runs, so the one one-GPU replica there owns the one GPU."""
    samples = parse(sample_file("dcgm_datadog-fixture-t4.txt").read_text())
    catalogued = dcgm_frame(samples).filter(pl.col("signal").is_not_null()).collect()
    keys = catalogued.select("metric", "labels", "signal").unique(maintain_order=True)
    series = keys.with_columns(
        series_id=pl.int_range(pl.len()).cast(pl.Int32),
        target_id=pl.lit("d0"),
        source=pl.lit("dcgm"),
    ).select(SERIES_SCHEMA.names())
    engine = pl.DataFrame(
        [
            (
                1000,
                "v0",
                Signal.REQUESTS_RUNNING.value,
                "vllm:num_requests_running",
                "{}",
                "vllm_engine",
            )
        ],
        schema=SERIES_SCHEMA,
        orient="row",
    )
    seen = (T0, T0, None)  # first and last seen, no GPU UUIDs listed
    targets = pl.DataFrame(
        [
            ("v0", "vllm", "http://v0/metrics", "vllm-0", "GPU-NODE-1", "z", "m", "p", 1, *seen),
            ("d0", "dcgm", "http://d0/metrics", None, "gpu-node-1", "z", None, None, None, *seen),
        ],
        schema=TARGETS_SCHEMA,
        orient="row",
    )
    dimensions = series_dimensions(
        pl.concat([series.cast(dict(SERIES_SCHEMA)), engine]).lazy(), targets.lazy()
    ).collect()
    gpu = dimensions.filter(pl.col("source") == "dcgm")
    assert set(gpu["replica"].to_list()) == {"vllm-0"}
    assert set(gpu["gpu_rule"].to_list()) == {JoinRule.HOST.value}
