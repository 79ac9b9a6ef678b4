"""Uneven zones: `hosts_per_zone` as one count, one per zone, or a table by zone, in code and in
TOML; every bad count is named by its field path."""

from __future__ import annotations

import tomllib
from collections import Counter

import pytest

from servewatch.emulator.dcgm_metrics import DcgmObserver
from servewatch.emulator.fleet_config import (
    FleetConfigError,
    TopologySpec,
    fleet_config_from_mapping,
)
from servewatch.emulator.records import ReplicaState
from servewatch.emulator.workload import SpecError
from tests.test_emulator_outputs import dcgm_samples


def load(topology_toml: str) -> TopologySpec:
    doc = tomllib.loads(f"[topology]\n{topology_toml}")
    return fleet_config_from_mapping(doc, source="fleet.toml").topology


def test_one_count_for_every_zone_is_unchanged() -> None:
    topology = TopologySpec(zones=("a", "b"), hosts_per_zone=2, replicas_per_host=3)
    assert topology.zone_hosts == (2, 2)
    assert topology.replicas == 12
    placements = topology.placements(model="m", pool="p")
    assert [p.replica for p in placements] == [f"vllm-{i}" for i in range(12)]
    assert Counter(p.host for p in placements) == {f"host-{i}": 3 for i in range(4)}


def test_uneven_zones_place_hosts_zone_by_zone() -> None:
    topology = TopologySpec(zones=("zone-a", "zone-b"), hosts_per_zone=(2, 1), replicas_per_host=4)
    assert topology.hosts == 3
    assert topology.replicas == 12
    placements = topology.placements(model="m", pool="p")
    assert {(p.host, p.zone) for p in placements} == {
        ("host-0", "zone-a"),
        ("host-1", "zone-a"),
        ("host-2", "zone-b"),
    }
    assert [p.replica for p in placements if p.host == "host-1"] == [
        "vllm-4",
        "vllm-5",
        "vllm-6",
        "vllm-7",
    ]


@pytest.mark.parametrize(
    "text",
    [
        'zones = ["zone-a", "zone-b"]\nhosts_per_zone = [2, 1]\nreplicas_per_host = 4\n',
        (
            'zones = ["zone-a", "zone-b"]\nreplicas_per_host = 4\n'
            "[topology.hosts_per_zone]\nzone-b = 1\nzone-a = 2\n"
        ),
    ],
)
def test_toml_takes_a_list_or_a_table_by_zone(text: str) -> None:
    topology = load(text)
    assert topology.zone_hosts == (2, 1)
    assert topology.replicas == 12


def test_toml_keeps_a_single_count() -> None:
    assert load('zones = ["a", "b", "c"]\nhosts_per_zone = 2\n').zone_hosts == (2, 2, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'zones = ["a", "b"]\nhosts_per_zone = [2, 1, 1]\n',
            (
                "fleet.toml: topology.hosts_per_zone: has 3 counts for 2 zones; give one count, or "
                "one per zone"
            ),
        ),
        (
            'zones = ["a", "b"]\nhosts_per_zone = [2, 0]\n',
            "fleet.toml: topology.hosts_per_zone[1]: must be >= 1, got 0",
        ),
        (
            'zones = ["a", "b"]\nhosts_per_zone = [2, "x"]\n',
            "fleet.toml: topology.hosts_per_zone[1]: must be an integer, got 'x'",
        ),
        (
            'zones = ["a", "b"]\n[topology.hosts_per_zone]\na = 1\nc = 2\n',
            "fleet.toml: topology.hosts_per_zone.c: is not one of the zones ['a', 'b']",
        ),
        (
            'zones = ["a", "b"]\n[topology.hosts_per_zone]\na = 1\n',
            "fleet.toml: topology.hosts_per_zone.b: is missing: give a count for every zone",
        ),
        (
            'zones = ["a", "b"]\n[topology.hosts_per_zone]\na = 1\nb = 1.5\n',
            "fleet.toml: topology.hosts_per_zone.b: must be an integer, got 1.5",
        ),
        ("hosts_per_zone = 0\n", "fleet.toml: topology.hosts_per_zone: must be >= 1, got 0"),
        ("hosts_per_zone = true\n", "fleet.toml: topology.hosts_per_zone: must be an integer"),
    ],
)
def test_bad_counts_name_their_path(text: str, message: str) -> None:
    with pytest.raises(FleetConfigError) as raised:
        load(text)
    assert str(raised.value).startswith(message)


def test_a_failure_on_a_host_of_the_smaller_zone_is_accepted_and_one_beyond_is_not() -> None:
    base = '[topology]\nzones = ["a", "b"]\nhosts_per_zone = [2, 1]\n'
    ok = tomllib.loads(base + '[[failures]]\nkind = "host_loss"\nat_s = 10\ntarget = "host-2"\n')
    fleet = fleet_config_from_mapping(ok, source="fleet.toml")
    assert fleet.failures[0].target == "host-2"
    bad = tomllib.loads(base + '[[failures]]\nkind = "host_loss"\nat_s = 10\ntarget = "host-3"\n')
    with pytest.raises(FleetConfigError, match=r"failures\[0\]\.target"):
        fleet_config_from_mapping(bad, source="fleet.toml")


def test_the_spec_refuses_a_bad_count_in_code_too() -> None:
    with pytest.raises(SpecError, match=r"hosts_per_zone\[0\]"):
        TopologySpec(zones=("a",), hosts_per_zone=(0,))


MIXED = """
zones = ["zone-a", "zone-b"]
namespace = "serving"
[[topology.hosts]]
zone = "zone-a"
replica_gpus = [1, 1]
[[topology.hosts]]
zone = "zone-a"
replica_gpus = [2]
[[topology.hosts]]
zone = "zone-b"
replica_gpus = [1, 1, 1]
mig_profile = "1g.10gb"
"""


def test_a_layout_mixes_single_gpu_tensor_parallel_and_mig_replicas() -> None:
    topology = load(MIXED)
    assert (topology.hosts, topology.replicas) == (3, 6)
    placements = topology.placements(model="m", pool="p")
    assert [(p.replica, p.host, p.gpus, p.mig_profile) for p in placements] == [
        ("vllm-0", "host-0", 1, None),
        ("vllm-1", "host-0", 1, None),
        ("vllm-2", "host-1", 2, None),
        ("vllm-3", "host-2", 1, "1g.10gb"),
        ("vllm-4", "host-2", 1, "1g.10gb"),
        ("vllm-5", "host-2", 1, "1g.10gb"),
    ]
    dcgm = DcgmObserver(placements, started_s=0.0)
    dcgm.sample(60.0, [ReplicaState(p.replica, True, 8, 0, 0.3, 0.5, 900.0) for p in placements])
    power: dict[tuple[str, str, str | None], float] = {}
    for host in ("host-0", "host-1", "host-2"):
        for name, labels, value in dcgm_samples(dcgm.page(host) or b""):
            if name == "DCGM_FI_DEV_POWER_USAGE":
                assert labels["namespace"] == "serving"
                assert labels["container"] == "vllm"
                power[labels["pod"], labels["UUID"], labels.get("GPU_I_ID")] = value
    # the MIG host shows one GPU: three slices under its UUID, one per replica
    slices = sorted((k, pod) for (pod, uuid, k) in power if k is not None)
    assert slices == [("1", "vllm-3"), ("2", "vllm-4"), ("3", "vllm-5")]
    assert len({uuid for (_, uuid, k) in power if k is not None}) == 1
    # the same load reads differently on every GPU, the two of the TP=2 replica included
    assert len(set(power.values())) == len(power) == 7


def test_a_mig_host_needs_one_slice_per_replica() -> None:
    with pytest.raises(FleetConfigError, match=r"topology.hosts\[0\].*one slice each"):
        load('zones = ["a"]\n[[topology.hosts]]\nzone = "a"\nreplica_gpus = [2]\nmig_profile = "x"')
