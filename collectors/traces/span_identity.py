"""Span identity: which replica a request span speaks for, and the scrape target it matches.

The OpenTelemetry Python SDK (what vLLM exports with) fills `service.instance.id` with a random
UUID per process, so that id names a process, not a replica: every restart would be a new
replica that never matches its scrape target. A replica is named instead by what the
deployment sets and keeps: `k8s.pod.name` (the Kubernetes downward API), else the host
(`host.name`), else a configured attribute. Spans are matched to engine scrape targets by the
same labels the targets carry (`replica`, then `host`): a span of a host that one engine target
serves takes that target's replica, so its requests join the target's series, and its missing
model, pool and zone come from the target's labels. Where several engine targets share a host
and nothing tells them apart, the process id (`vllm.process_id`, which vLLM sets on its
resource) is added to the host so that each engine process stays apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import polars as pl

from servewatch.collectors.scrape.targets import Target, TargetKind

# Targets of these kinds serve no requests (GPU exporters); spans are never matched to them.
_NOT_ENGINES = frozenset({TargetKind.DCGM.value})


@dataclass(frozen=True, slots=True)
class TargetLabels:
    """The labels of one engine scrape target that request rows share."""

    replica: str | None = None
    host: str | None = None
    zone: str | None = None
    model: str | None = None
    pool: str | None = None


@dataclass(frozen=True)
class TargetDirectory:
    """Engine scrape targets by the labels spans are matched on: replica, and host."""

    by_replica: Mapping[str, TargetLabels] = field(default_factory=dict)
    by_host: Mapping[str, tuple[TargetLabels, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, targets: Iterable[TargetLabels]) -> TargetDirectory:
        by_replica: dict[str, TargetLabels] = {}
        by_host: dict[str, list[TargetLabels]] = {}
        for target in targets:
            if target.replica is not None:
                by_replica.setdefault(target.replica, target)
            if target.host is not None and target not in by_host.get(target.host, ()):
                by_host.setdefault(target.host, []).append(target)
        return cls(by_replica, {host: tuple(found) for host, found in by_host.items()})

    @classmethod
    def from_targets(cls, targets: Iterable[Target]) -> TargetDirectory:
        """The directory of configured or discovered targets (GPU exporters left out)."""
        return cls.of(
            TargetLabels(t.replica, t.host, t.zone, t.model, t.pool)
            for t in targets
            if t.kind.value not in _NOT_ENGINES
        )

    @classmethod
    def from_frame(cls, targets: pl.DataFrame) -> TargetDirectory:
        """The directory of the store's `targets` rows (GPU exporters left out)."""
        engines = targets.filter(~pl.col("kind").is_in(list(_NOT_ENGINES)))
        return cls.of(
            TargetLabels(row["replica"], row["host"], row["zone"], row["model"], row["pool"])
            for row in engines.iter_rows(named=True)
        )


@dataclass(frozen=True, slots=True)
class SpanIdentity:
    """The replica a resource's spans speak for, and the target they matched (None: none)."""

    replica: str | None
    target: TargetLabels | None = None


def resolve_replica(
    *,
    named: str | None,
    namespace: str | None = None,
    host: str | None,
    process: str | None,
    model: str | None,
    per_process: bool,
    directory: TargetDirectory,
) -> SpanIdentity:
    """The replica of a resource that names a replica outright (`named`: a pod name, or a
    configured attribute), or else runs on `host` as `process`, serving `model`.

    A named replica is matched to the target of that replica. A pod name is matched as a
    target speaking for a pod names its replica, `<namespace>/<pod>` (`targets.py`): with the
    resource's `namespace`, or else the one pod target of that name in any namespace. A host is
    matched to a target
    named after it, else to the one engine target on that host (several are told apart by
    their model when the resource names one). A host that several targets share and nothing
    tells apart, or every host when `per_process`, names its replica `host/process`.
    """
    if named is not None:
        return _named(named, namespace, directory)
    if host is None:
        return SpanIdentity(None)
    target = directory.by_replica.get(host)
    if target is not None:
        return SpanIdentity(host, target)
    on_host = directory.by_host.get(host, ())
    if len(on_host) > 1 and model is not None:
        serving = tuple(t for t in on_host if t.model == model)
        on_host = serving or on_host
    if len(on_host) == 1:
        return SpanIdentity(on_host[0].replica or host, on_host[0])
    if process is not None and (per_process or len(on_host) > 1):
        return SpanIdentity(f"{host}/{process}")
    return SpanIdentity(host)


def _named(named: str, namespace: str | None, directory: TargetDirectory) -> SpanIdentity:
    target = directory.by_replica.get(named)
    if target is not None:
        return SpanIdentity(named, target)
    if namespace is not None:
        pod = f"{namespace}/{named}"
        return SpanIdentity(pod, directory.by_replica.get(pod))
    pods = [t for replica, t in directory.by_replica.items() if replica.endswith(f"/{named}")]
    if len(pods) == 1 and pods[0].replica is not None:
        return SpanIdentity(pods[0].replica, pods[0])
    return SpanIdentity(named)
