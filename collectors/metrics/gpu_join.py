"""GPUs joined to replicas: which vLLM replica a DCGM GPU serves, and its GPUs as one reading.

A GPU is known by its node `hostname` and `UUID`; Kubernetes mapping adds the `pod` and
`namespace` that requested it. A replica is known by the same facts from its target's labels
(`REPLICA_GPUS_SCHEMA`). The rules, in order (../shared/REFERENCE.md section 4):

1. pod + namespace, when both the GPU and the replica have them;
2. otherwise hostname, narrowed by the replica's GPU UUID list when it has one; a replica
   without a list claims a host's GPUs only if it is the only replica on that host;
3. never the `gpu` index: it is per node and reorders across reboots and MIG changes.

A GPU whose pod names a replica-less pod stays unmatched (it serves another workload), and so
does one that two replicas claim alike (ambiguous). Hostnames compare case-insensitively.

Under tensor parallelism one replica owns several GPUs; `tensor_parallel` folds them with each
signal's `Aggregation` (max for temperature and XID, sum for memory and power, mean for
activity ratios and clocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import polars as pl

from servewatch.collectors.metrics.catalogue import Disposition
from servewatch.pipeline.signals import SIGNALS, Aggregation, Signal, signal_table

HOSTNAME_LABEL = "hostname"
UUID_LABEL = "UUID"
POD_LABEL = "pod"
NAMESPACE_LABEL = "namespace"

IDENTITY_COLUMNS: tuple[str, ...] = ("hostname", "uuid", "pod", "namespace")

REPLICA_GPUS_SCHEMA = pl.Schema(
    {
        "replica": pl.String(),
        "pod": pl.String(),
        "namespace": pl.String(),
        "hostname": pl.String(),
        "gpu_uuids": pl.List(pl.String()),
    }
)


class JoinRule(StrEnum):
    POD = "pod_namespace"
    HOST_UUID = "hostname_uuid"
    HOST = "hostname_sole_replica"
    AMBIGUOUS = "ambiguous"
    UNMATCHED = "unmatched"


@dataclass(frozen=True)
class GpuIdentity:
    hostname: str | None
    uuid: str | None
    pod: str | None = None
    namespace: str | None = None

    @property
    def pod_known(self) -> bool:
        return self.pod is not None and self.namespace is not None


@dataclass(frozen=True)
class ReplicaGpus:
    """What is known of one replica's GPUs; any field may be missing."""

    replica: str
    hostname: str | None = None
    pod: str | None = None
    namespace: str | None = None
    gpu_uuids: tuple[str, ...] = ()

    @property
    def pod_known(self) -> bool:
        return self.pod is not None and self.namespace is not None


@dataclass(frozen=True)
class ReplicaMatch:
    replica: str | None
    rule: JoinRule


def gpu_identity(labels: Mapping[str, str]) -> GpuIdentity:
    """A GPU's identity from its canonical DCGM labels."""
    hostname = labels.get(HOSTNAME_LABEL)
    return GpuIdentity(
        hostname=None if hostname is None else hostname.lower(),
        uuid=labels.get(UUID_LABEL),
        pod=labels.get(POD_LABEL),
        namespace=labels.get(NAMESPACE_LABEL),
    )


def match_replica(gpu: GpuIdentity, replicas: Sequence[ReplicaGpus]) -> ReplicaMatch:
    """The replica a GPU serves, by the rules in the module docstring."""
    by_pod = {
        r.replica
        for r in replicas
        if gpu.pod_known and r.pod_known and (r.pod, r.namespace) == (gpu.pod, gpu.namespace)
    }
    if by_pod:
        return _single(by_pod, JoinRule.POD)
    on_host = [
        r
        for r in replicas
        if gpu.hostname is not None
        and r.hostname is not None
        and r.hostname.lower() == gpu.hostname
    ]
    # A GPU and a replica that both name their pod are judged by pod alone.
    eligible = [r for r in on_host if not (gpu.pod_known and r.pod_known)]
    by_uuid = {r.replica for r in eligible if r.gpu_uuids and gpu.uuid in r.gpu_uuids}
    if by_uuid:
        return _single(by_uuid, JoinRule.HOST_UUID)
    sole = {r.replica for r in eligible if not r.gpu_uuids and len(on_host) == 1}
    if sole:
        return _single(sole, JoinRule.HOST)
    return ReplicaMatch(replica=None, rule=JoinRule.UNMATCHED)


def _single(replicas: set[str], rule: JoinRule) -> ReplicaMatch:
    if len(replicas) == 1:
        return ReplicaMatch(replica=next(iter(replicas)), rule=rule)
    return ReplicaMatch(replica=None, rule=JoinRule.AMBIGUOUS)


def aggregate(signal: Signal, values: Iterable[float | None]) -> float | None:
    """One replica's GPUs folded into one value; None when no GPU reported."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    aggregation = SIGNALS[signal].aggregation
    if aggregation is Aggregation.SUM:
        return sum(present)
    if aggregation is Aggregation.MAX:
        return max(present)
    if aggregation is Aggregation.MEAN:
        return sum(present) / len(present)
    raise ValueError(f"signal {signal} has aggregation {aggregation}: its GPUs cannot be folded")


# -- the same, vectorised -----------------------------------------------------------------------


def with_gpu_identity(samples: pl.LazyFrame) -> pl.LazyFrame:
    """Add `hostname` (lower case), `uuid`, `pod`, `namespace` from the canonical `labels`."""
    labels = pl.col("labels").str
    return samples.with_columns(
        hostname=labels.json_path_match(f"$.{HOSTNAME_LABEL}").str.to_lowercase(),
        uuid=labels.json_path_match(f"$.{UUID_LABEL}"),
        pod=labels.json_path_match(f"$.{POD_LABEL}"),
        namespace=labels.json_path_match(f"$.{NAMESPACE_LABEL}"),
    )


def _pod_known(pod: str, namespace: str) -> pl.Expr:
    return pl.col(pod).is_not_null() & pl.col(namespace).is_not_null()


def replica_matches(identities: pl.LazyFrame, *, replicas: pl.LazyFrame) -> pl.LazyFrame:
    """For each distinct GPU identity (`IDENTITY_COLUMNS`), its `replica` and join `rule`."""
    ids = identities.select(IDENTITY_COLUMNS).unique()
    reps = replicas.select(
        "replica",
        r_pod="pod",
        r_namespace="namespace",
        hostname=pl.col("hostname").str.to_lowercase(),
        gpu_uuids=pl.col("gpu_uuids").fill_null([]),
    ).with_columns(on_host=pl.len().over("hostname"))
    by_pod = (
        ids.filter(_pod_known("pod", "namespace"))
        .join(
            reps.filter(_pod_known("r_pod", "r_namespace")),
            left_on=["pod", "namespace"],
            right_on=["r_pod", "r_namespace"],
        )
        .select(*IDENTITY_COLUMNS, "replica", rule=pl.lit(JoinRule.POD.value), rank=pl.lit(0))
    )
    listed = pl.col("gpu_uuids").list.len() > 0
    by_host = (
        ids.filter(pl.col("hostname").is_not_null())
        .join(reps.filter(pl.col("hostname").is_not_null()), on="hostname")
        .filter(~(_pod_known("pod", "namespace") & _pod_known("r_pod", "r_namespace")))
        .filter(
            pl.when(listed)
            .then(pl.col("gpu_uuids").list.contains(pl.col("uuid")).fill_null(value=False))
            .otherwise(pl.col("on_host") == 1)
        )
        .select(
            *IDENTITY_COLUMNS,
            "replica",
            rule=pl.when(listed)
            .then(pl.lit(JoinRule.HOST_UUID.value))
            .otherwise(pl.lit(JoinRule.HOST.value)),
            rank=pl.lit(1),
        )
    )
    key = list(IDENTITY_COLUMNS)
    candidates = pl.concat([by_pod, by_host]).filter(
        pl.col("rank") == pl.col("rank").min().over(key)
    )
    decided = candidates.group_by(key).agg(
        replicas=pl.col("replica").n_unique(),
        replica=pl.col("replica").first(),
        rule=pl.col("rule").first(),
    )
    single = pl.col("replicas") == 1
    return ids.join(decided, on=key, how="left", nulls_equal=True).select(
        *IDENTITY_COLUMNS,
        replica=pl.when(single).then(pl.col("replica")),
        rule=pl.when(pl.col("replica").is_null())
        .then(pl.lit(JoinRule.UNMATCHED.value))
        .when(single)
        .then(pl.col("rule"))
        .otherwise(pl.lit(JoinRule.AMBIGUOUS.value)),
    )


def join_replicas(samples: pl.LazyFrame, *, replicas: pl.LazyFrame) -> pl.LazyFrame:
    """Catalogued DCGM samples with their GPU identity, `replica` and join `rule` added.

    `replicas` has `REPLICA_GPUS_SCHEMA`. Unmatched and ambiguous GPUs keep a null replica,
    so the caller can count them.
    """
    identified = samples.pipe(with_gpu_identity)
    matches = replica_matches(identified, replicas=replicas)
    return identified.join(
        matches, on=list(IDENTITY_COLUMNS), how="left", nulls_equal=True, maintain_order="left"
    )


def tensor_parallel(joined: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """One row per replica, signal and `by` group (include the scrape time!): GPUs folded.

    Columns: replica, signal, *by, value (by the signal's aggregation; null when no GPU
    reported), aggregation, gpus (distinct UUIDs), gpus_reporting (non-null values).
    """
    keys = ["replica", "signal", *by]
    value = pl.col("value")
    folded = (
        joined.filter(
            pl.col("replica").is_not_null()
            & (pl.col("disposition") == Disposition.CATALOGUED.value)
        )
        .group_by(keys)
        .agg(
            _total=value.sum(),
            _peak=value.max(),
            _mean=value.mean(),
            gpus=pl.col("uuid").n_unique(),
            gpus_reporting=value.is_not_null().sum().cast(pl.Int64),
        )
        .join(signal_table().select("signal", "aggregation"), on="signal", how="left")
    )
    aggregation = pl.col("aggregation")
    return (
        folded.with_columns(
            value=pl.when(pl.col("gpus_reporting") == 0)
            .then(None)
            .when(aggregation == Aggregation.SUM.value)
            .then(pl.col("_total"))
            .when(aggregation == Aggregation.MAX.value)
            .then(pl.col("_peak"))
            .when(aggregation == Aggregation.MEAN.value)
            .then(pl.col("_mean"))
        )
        .select(*keys, "value", "aggregation", "gpus", "gpus_reporting")
        .sort(keys)
    )
