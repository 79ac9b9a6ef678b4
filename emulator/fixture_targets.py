"""A fixture's scrape targets: one per replica (of its engine's kind), one DCGM exporter per
host and, for a fleet with an admission limit, its gateway's endpoint picker; the kinds they
take, their page folders and how the manifest lists them (emulator/fixture_writer.py writes
them, emulator/live_server.py serves them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from servewatch.emulator.dcgm_metrics import host_gpus
from servewatch.emulator.gateway_metrics import GatewaySpec
from servewatch.emulator.records import EngineKind, ReplicaPlacement

PAGES_DIR = "pages"
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class FixtureError(ValueError):
    """A fixture folder or its inputs are not what the layout allows."""


class TargetKind(Enum):
    """What serves a target's page: a replica's engine, a host's DCGM exporter, or the
    gateway's endpoint picker (the kinds servewatch's scrape targets take; both TensorRT-LLM
    page shapes are `trtllm`)."""

    VLLM = "vllm"
    DCGM = "dcgm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TGI = "tgi"
    LLAMACPP = "llamacpp"
    GATEWAY = "gateway"


ENGINE_TARGET_KINDS = {
    EngineKind.VLLM: TargetKind.VLLM,
    EngineKind.SGLANG: TargetKind.SGLANG,
    EngineKind.TRTLLM: TargetKind.TRTLLM,
    EngineKind.TRTLLM_DYNAMO: TargetKind.TRTLLM,
    EngineKind.TGI: TargetKind.TGI,
    EngineKind.LLAMACPP: TargetKind.LLAMACPP,
}


@dataclass(frozen=True)
class FixtureTarget:
    """One scrape target of the recorded fleet: `kind/name` is its id and its page folder.

    `engine` is the replica's engine (None for DCGM and gateway targets); it tells the two
    TensorRT-LLM page shapes apart, which share the kind `trtllm`. A gateway target is on no
    host or zone (both empty) and names its pool instead.
    """

    kind: TargetKind
    name: str  # the replica for engine targets, the host for DCGM, the pool for a gateway
    host: str
    zone: str
    replicas: tuple[str, ...]
    model: str | None = None
    pool: str | None = None
    gpus: int = 1
    namespace: str | None = None  # a vLLM replica that is a Kubernetes pod of this namespace
    # The UUIDs of a replica's whole GPUs, as an operator lists them for replicas that share
    # a host (empty for DCGM targets and MIG slices, whose UUID is the shared parent's).
    gpu_uuids: tuple[str, ...] = ()

    @property
    def replica_label(self) -> str:
        """The replica as a scraper names it: `<namespace>/<pod>` for a pod."""
        return self.name if self.namespace is None else f"{self.namespace}/{self.name}"

    engine: EngineKind | None = None

    @property
    def target_id(self) -> str:
        return f"{self.kind.value}/{self.name}"

    @property
    def pages_dir(self) -> str:
        return f"{PAGES_DIR}/{self.kind.value}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        if self.kind is TargetKind.GATEWAY:
            return {
                "id": self.target_id,
                "kind": self.kind.value,
                "job": self.kind.value,
                "labels": {} if self.pool is None else {"pool": self.pool},
                "replicas": list(self.replicas),
                "model": self.model,
                "pool": self.pool,
                "gpus": None,
                "pages": self.pages_dir,
            }
        labels = {"host": self.host, "zone": self.zone}
        if self.kind is not TargetKind.DCGM:
            labels = {"replica": self.replica_label, **labels}
        out = {
            "id": self.target_id,
            "kind": self.kind.value,
            "job": self.kind.value,
            "labels": labels,
            "replicas": list(self.replicas),
            "model": self.model,
            "pool": self.pool,
            "gpus": self.gpus,
            "pages": self.pages_dir,
        }
        if self.gpu_uuids:
            out["gpu_uuids"] = list(self.gpu_uuids)
        if self.engine is not None and self.engine is not EngineKind.VLLM:
            out["engine"] = self.engine.value
        return out


def fleet_targets(
    placements: Iterable[ReplicaPlacement], *, gateway: GatewaySpec | None = None
) -> list[FixtureTarget]:
    """A target per replica (of its engine's kind), then a DCGM target per host (hosts in
    placement order), then the gateway's when there is one."""
    placement_list = list(placements)
    for placement in placement_list:
        for what, value in (("replica", placement.replica), ("host", placement.host)):
            if not SAFE_NAME.match(value):
                raise FixtureError(
                    f"{what} name {value!r} cannot name a page folder: use letters, digits, "
                    "'.', '_' and '-', starting with a letter or digit"
                )
    uuids: dict[str, list[str]] = {}
    for devices in host_gpus(placement_list).values():
        for device in devices:
            if device.gpu_instance is None:
                uuids.setdefault(device.replica, []).append(device.uuid)
    targets = [
        FixtureTarget(
            kind=ENGINE_TARGET_KINDS[p.engine],
            name=p.replica,
            host=p.host,
            zone=p.zone,
            replicas=(p.replica,),
            model=p.model,
            pool=p.pool,
            gpus=p.gpus,
            namespace=p.namespace,
            gpu_uuids=tuple(uuids.get(p.replica, ())),
            engine=p.engine,
        )
        for p in placement_list
    ]
    hosts: dict[str, list[ReplicaPlacement]] = {}
    for p in placement_list:
        hosts.setdefault(p.host, []).append(p)
    for host, on_host in hosts.items():
        zones = {p.zone for p in on_host}
        if len(zones) > 1:
            raise FixtureError(f"host {host!r} is placed in several zones: {sorted(zones)}")
        targets.append(
            FixtureTarget(
                kind=TargetKind.DCGM,
                name=host,
                host=host,
                zone=on_host[0].zone,
                replicas=tuple(p.replica for p in on_host),
                gpus=sum(p.gpus for p in on_host),
            )
        )
    if gateway is not None:
        if not SAFE_NAME.match(gateway.name):
            raise FixtureError(f"gateway name {gateway.name!r} cannot name a page folder")
        targets.append(
            FixtureTarget(
                kind=TargetKind.GATEWAY,
                name=gateway.name,
                host="",
                zone="",
                replicas=tuple(
                    p.replica
                    for p in placement_list
                    if gateway.pool is None or p.pool == gateway.pool
                ),
                model=gateway.model,
                pool=gateway.pool,
            )
        )
    return targets
