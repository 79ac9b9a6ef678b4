"""GPU attribution: which replica a DCGM GPU (or MIG slice) serves, or that it serves none.

A GPU is known by its node `hostname`, its `UUID` and, for a MIG slice, its GPU instance id
(`GPU_I_ID`; dcgm-exporter writes the parent GPU's UUID on every slice, beside
`GPU_I_PROFILE`); Kubernetes mapping adds the `pod` and `namespace` that requested it. So a GPU
is keyed by (hostname, UUID, GPU_I_ID): the slices of one GPU stay apart. In the store, a DCGM
series' host is its target's `host` when given, else its `hostname` label. A replica is known by
its target (`replica`, `host`, `gpus`), its pod (the `pod` and `namespace` labels of its engine
series, as a Kubernetes-discovering Prometheus attaches them, else a replica named
`<namespace>/<pod>`), and optionally the UUIDs of its GPUs (a target's `gpu_uuids`: what its
CUDA_VISIBLE_DEVICES names, the one way to tell apart replicas sharing a host without
Kubernetes). A DCGM target that itself names a replica gives that
replica its GPUs (`target`). Otherwise the rules, first that applies:

1. pod: a GPU naming a pod and namespace goes to the replica with that pod and namespace. A
   GPU whose pod is no replica's serves another workload and stays unmatched
   (`other_workload`): the exporter said who uses it, and hostname cannot overrule that.
2. UUID list: a GPU goes to the replica on its host whose UUID list names it, unless both the
   GPU and that replica name a pod (then rule 1 has decided).
3. hostname: a GPU without a pod goes to the only replica on its host, and only when the host
   names that one replica unambiguously: the replica lists no UUIDs, no GPU on the host names
   a pod (an exporter that maps pods leaves unlabelled exactly the GPUs no pod requested, so
   such a GPU is idle, not the replica's), and the replica's GPU count, when known, equals
   the GPU keys its host shows (a one-GPU replica on an eight-GPU host owns one of them, and
   nothing says which). A replica named by pod is held to the same test, nothing looser.
4. otherwise the GPU stays unmatched (`unmatched`), or `ambiguous` when two replicas claim it
   alike. Unmatched GPUs are listed, never spread over replicas; the `gpu` index is never a
   key (it is per node and reorders across reboots and MIG changes). Hostnames compare
   case-insensitively.

`tensor_parallel` folds a replica's GPUs with each signal's `Aggregation` (max for temperature
and XID, sum for memory and power, mean for activity ratios and clocks). `attribute_series`
applies the rules to the store's series, which is how every reader (SLIs, the report, health)
sees DCGM series: with the replica they serve, or none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import polars as pl

from servewatch.pipeline.signals import SIGNALS, Aggregation, Signal, Source, signal_table

HOSTNAME_LABEL = "hostname"
UUID_LABEL = "UUID"
GPU_INSTANCE_LABEL = "GPU_I_ID"
POD_LABEL = "pod"
NAMESPACE_LABEL = "namespace"

IDENTITY_COLUMNS: tuple[str, ...] = ("hostname", "uuid", "gpu_instance", "pod", "namespace")
GPU_KEY: tuple[str, ...] = ("hostname", "uuid", "gpu_instance")

REPLICA_GPUS_SCHEMA = pl.Schema(
    {
        "replica": pl.String(),
        "pod": pl.String(),
        "namespace": pl.String(),
        "hostname": pl.String(),
        "gpu_uuids": pl.List(pl.String()),
        "gpus": pl.Int64(),
    }
)

# What `unmatched_gpus` lists: one row per GPU (or slice) no replica was given.
UNMATCHED_GPUS_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "hostname": pl.String(),
        "uuid": pl.String(),
        "gpu_instance": pl.String(),
        "pod": pl.String(),
        "namespace": pl.String(),
        "rule": pl.String(),
    }
)


class JoinRule(StrEnum):
    TARGET = "target"  # the DCGM target itself names the replica
    POD = "pod_namespace"
    HOST_UUID = "hostname_uuid"
    HOST = "hostname_sole_replica"
    OTHER_WORKLOAD = "other_workload"
    AMBIGUOUS = "ambiguous"
    UNMATCHED = "unmatched"


UNATTRIBUTED = frozenset({JoinRule.OTHER_WORKLOAD, JoinRule.AMBIGUOUS, JoinRule.UNMATCHED})


@dataclass(frozen=True)
class GpuIdentity:
    hostname: str | None
    uuid: str | None
    gpu_instance: str | None = None
    pod: str | None = None
    namespace: str | None = None

    @property
    def pod_known(self) -> bool:
        return self.pod is not None and self.namespace is not None

    @property
    def key(self) -> tuple[str | None, str | None, str | None]:
        return (self.hostname, self.uuid, self.gpu_instance)


@dataclass(frozen=True)
class ReplicaGpus:
    """What is known of one replica's GPUs; any field may be missing."""

    replica: str
    hostname: str | None = None
    pod: str | None = None
    namespace: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    gpus: int | None = None

    @property
    def pod_known(self) -> bool:
        return self.pod is not None and self.namespace is not None


@dataclass(frozen=True)
class ReplicaMatch:
    replica: str | None
    rule: JoinRule


def gpu_identity(labels: dict[str, str]) -> GpuIdentity:
    """A GPU's identity from its canonical DCGM labels."""
    hostname = labels.get(HOSTNAME_LABEL)
    return GpuIdentity(
        hostname=None if hostname is None else hostname.lower(),
        uuid=labels.get(UUID_LABEL),
        gpu_instance=labels.get(GPU_INSTANCE_LABEL),
        pod=labels.get(POD_LABEL),
        namespace=labels.get(NAMESPACE_LABEL),
    )


def match_gpus(gpus: Sequence[GpuIdentity], replicas: Sequence[ReplicaGpus]) -> list[ReplicaMatch]:
    """The replica each GPU serves, by the rules in the module docstring. The GPUs given are
    all the exporters show: whether a host maps pods, and how many GPUs it has, is read from
    them."""
    maps_pods = {g.hostname for g in gpus if g.pod_known}
    keys_on_host: dict[str | None, set[tuple[str | None, str | None, str | None]]] = {}
    for g in gpus:
        keys_on_host.setdefault(g.hostname, set()).add(g.key)
    return [
        _match(
            g,
            replicas,
            host_maps_pods=g.hostname in maps_pods,
            host_gpus=len(keys_on_host[g.hostname]),
        )
        for g in gpus
    ]


def _match(
    gpu: GpuIdentity, replicas: Sequence[ReplicaGpus], *, host_maps_pods: bool, host_gpus: int
) -> ReplicaMatch:
    if gpu.pod_known:
        by_pod = {
            r.replica
            for r in replicas
            if r.pod_known and (r.pod, r.namespace) == (gpu.pod, gpu.namespace)
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
    by_uuid = {
        r.replica
        for r in on_host
        if gpu.uuid in r.gpu_uuids and not (gpu.pod_known and r.pod_known)
    }
    if by_uuid:
        return _single(by_uuid, JoinRule.HOST_UUID)
    if not gpu.pod_known and not host_maps_pods and len(on_host) == 1:
        [sole] = on_host
        if not sole.gpu_uuids and sole.gpus in (None, host_gpus):
            return ReplicaMatch(replica=sole.replica, rule=JoinRule.HOST)
    rule = JoinRule.OTHER_WORKLOAD if gpu.pod_known else JoinRule.UNMATCHED
    return ReplicaMatch(replica=None, rule=rule)


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


def with_gpu_identity(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Add `IDENTITY_COLUMNS` (hostname in lower case) from the canonical JSON `labels`."""
    labels = pl.col("labels").str
    return frame.with_columns(
        hostname=labels.json_path_match(f"$.{HOSTNAME_LABEL}").str.to_lowercase(),
        uuid=labels.json_path_match(f"$.{UUID_LABEL}"),
        gpu_instance=labels.json_path_match(f"$.{GPU_INSTANCE_LABEL}"),
        pod=labels.json_path_match(f"$.{POD_LABEL}"),
        namespace=labels.json_path_match(f"$.{NAMESPACE_LABEL}"),
    )


def _pod_known(pod: str, namespace: str) -> pl.Expr:
    return pl.col(pod).is_not_null() & pl.col(namespace).is_not_null()


def replica_matches(identities: pl.LazyFrame, *, replicas: pl.LazyFrame) -> pl.LazyFrame:
    """For each distinct GPU identity (`IDENTITY_COLUMNS`) its `replica` and join `rule`.
    `identities` must hold every GPU the exporters show (host facts are read from them);
    `replicas` has `REPLICA_GPUS_SCHEMA`."""
    ids = (
        identities.select(IDENTITY_COLUMNS)
        .unique()
        .with_columns(
            _host_maps_pods=_pod_known("pod", "namespace").any().over("hostname"),
            _host_gpus=pl.struct("uuid", "gpu_instance").n_unique().over("hostname"),
        )
    )
    reps = replicas.select(
        "replica",
        r_pod="pod",
        r_namespace="namespace",
        hostname=pl.col("hostname").str.to_lowercase(),
        gpu_uuids=pl.col("gpu_uuids").fill_null([]),
        gpus=pl.col("gpus"),
    ).with_columns(_on_host=pl.len().over("hostname"))
    key = list(IDENTITY_COLUMNS)
    gpu_pod = _pod_known("pod", "namespace")
    replica_pod = _pod_known("r_pod", "r_namespace")
    listed = pl.col("gpu_uuids").list.len() > 0
    by_pod = (
        ids.filter(gpu_pod)
        .join(
            reps.filter(replica_pod),
            left_on=["pod", "namespace"],
            right_on=["r_pod", "r_namespace"],
        )
        .select(*key, "replica", rule=pl.lit(JoinRule.POD.value), rank=pl.lit(0))
    )
    on_host = ids.filter(pl.col("hostname").is_not_null()).join(
        reps.filter(pl.col("hostname").is_not_null()), on="hostname"
    )
    by_uuid = (
        on_host.filter(~(gpu_pod & replica_pod))
        .filter(pl.col("gpu_uuids").list.contains(pl.col("uuid")).fill_null(value=False))
        .select(*key, "replica", rule=pl.lit(JoinRule.HOST_UUID.value), rank=pl.lit(1))
    )
    by_host = on_host.filter(
        ~gpu_pod
        & ~pl.col("_host_maps_pods")
        & (pl.col("_on_host") == 1)
        & ~listed
        & (pl.col("gpus").is_null() | (pl.col("gpus") == pl.col("_host_gpus")))
    ).select(*key, "replica", rule=pl.lit(JoinRule.HOST.value), rank=pl.lit(2))
    candidates = pl.concat([by_pod, by_uuid, by_host]).filter(
        pl.col("rank") == pl.col("rank").min().over(key)
    )
    decided = candidates.group_by(key).agg(
        replicas=pl.col("replica").n_unique(),
        replica=pl.col("replica").first(),
        rule=pl.col("rule").first(),
    )
    single = pl.col("replicas") == 1
    return ids.join(decided, on=key, how="left", nulls_equal=True).select(
        *key,
        replica=pl.when(single).then(pl.col("replica")),
        rule=pl.when(pl.col("replicas").is_null())
        .then(
            pl.when(gpu_pod)
            .then(pl.lit(JoinRule.OTHER_WORKLOAD.value))
            .otherwise(pl.lit(JoinRule.UNMATCHED.value))
        )
        .when(single)
        .then(pl.col("rule"))
        .otherwise(pl.lit(JoinRule.AMBIGUOUS.value)),
    )


def join_replicas(samples: pl.LazyFrame, *, replicas: pl.LazyFrame) -> pl.LazyFrame:
    """DCGM samples (or series) with their GPU identity, `replica` and join `rule` added.

    `replicas` has `REPLICA_GPUS_SCHEMA`. Unattributed GPUs keep a null replica, so the caller
    can list them.
    """
    identified = samples.pipe(with_gpu_identity)
    matches = replica_matches(identified, replicas=replicas)
    return identified.join(
        matches, on=list(IDENTITY_COLUMNS), how="left", nulls_equal=True, maintain_order="left"
    )


def tensor_parallel(joined: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """One row per replica, signal and `by` group (include the scrape time!): GPUs folded.

    Columns: replica, signal, *by, value (by the signal's aggregation; null when no GPU
    reported), aggregation, gpus (distinct GPU keys: a MIG slice counts as one),
    gpus_reporting (non-null values).
    """
    keys = ["replica", "signal", *by]
    value = pl.col("value")
    folded = (
        joined.filter(pl.col("replica").is_not_null() & pl.col("signal").is_not_null())
        .group_by(keys)
        .agg(
            _total=value.sum(),
            _peak=value.max(),
            _mean=value.mean(),
            gpus=pl.struct(GPU_KEY).n_unique(),
            gpus_reporting=value.is_not_null().sum().cast(pl.Int64),
        )
        .join(signal_table().select("signal", "aggregation"), on="signal", how="left")
    )
    return (
        folded.with_columns(
            value=pl.when(pl.col("gpus_reporting") == 0).then(None).otherwise(_folded())
        )
        .select(*keys, "value", "aggregation", "gpus", "gpus_reporting")
        .sort(keys)
    )


def _folded() -> pl.Expr:
    aggregation = pl.col("aggregation")
    return (
        pl.when(aggregation == Aggregation.SUM.value)
        .then(pl.col("_total"))
        .when(aggregation == Aggregation.MAX.value)
        .then(pl.col("_peak"))
        .when(aggregation == Aggregation.MEAN.value)
        .then(pl.col("_mean"))
    )


# -- the store's series ---------------------------------------------------------------------


def replica_identities(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """One `REPLICA_GPUS_SCHEMA` row per replica of the engine series: its target's host and
    GPU count, and its pod: the `pod`/`namespace` labels of its series when they carry them,
    else its name when written `<namespace>/<pod>`. No UUID lists: targets carry none."""
    label = pl.col("labels").str.json_path_match
    named = pl.col("replica").str.split_exact("/", 1)
    return (
        dimensions.filter(
            (pl.col("source").is_null() | (pl.col("source") != Source.DCGM.value))
            & pl.col("replica").is_not_null()
        )
        .with_columns(_pod=label(f"$.{POD_LABEL}"), _namespace=label(f"$.{NAMESPACE_LABEL}"))
        .group_by("replica")
        .agg(
            hostname=pl.col("host").drop_nulls().first(),
            gpus=pl.col("gpus").drop_nulls().first().cast(pl.Int64),
            gpu_uuids=pl.col("gpu_uuids").drop_nulls().first(),
            _pod=pl.col("_pod").drop_nulls().first(),
            _namespace=pl.col("_namespace").drop_nulls().first(),
        )
        .with_columns(named=named)
        .select(
            "replica",
            pod=pl.when(pl.col("_pod").is_not_null() & pl.col("_namespace").is_not_null())
            .then(pl.col("_pod"))
            .otherwise(pl.col("named").struct.field("field_1")),
            namespace=pl.when(pl.col("_pod").is_not_null() & pl.col("_namespace").is_not_null())
            .then(pl.col("_namespace"))
            .otherwise(
                pl.when(pl.col("named").struct.field("field_1").is_not_null()).then(
                    pl.col("named").struct.field("field_0")
                )
            ),
            hostname="hostname",
            gpu_uuids="gpu_uuids",
            gpus="gpus",
        )
    )


def _series_gpu_identity(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """`with_gpu_identity` of stored DCGM series, the host being their exporter target's
    `host` when the target names one: the operator's statement of where the exporter runs
    wins over the page's `Hostname`, which is often the exporter's container or pod name."""
    return dimensions.pipe(with_gpu_identity).with_columns(
        hostname=pl.coalesce(pl.col("host").str.to_lowercase(), pl.col("hostname"))
    )


def attribute_series(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """Series dimensions (`metric_sli.series_dimensions` before attribution, with the target's
    `gpus`) with every DCGM series given the replica its GPU serves, that replica's pool,
    model and zone, and `gpu_rule` (null for other series). A DCGM series of a target that
    names its replica keeps it (`target`); an unattributed one keeps a null replica, pool and
    model."""
    is_dcgm = pl.col("source") == Source.DCGM.value
    engines = dimensions.filter(~is_dcgm | pl.col("source").is_null())
    own = dimensions.filter(is_dcgm & pl.col("replica").is_not_null()).with_columns(
        gpu_rule=pl.lit(JoinRule.TARGET.value)
    )
    hosted = dimensions.filter(is_dcgm & pl.col("replica").is_null()).pipe(_series_gpu_identity)
    placed = replica_identities(dimensions)
    matches = replica_matches(hosted, replicas=placed)
    serving = (
        engines.select("replica", "pool", "model", "zone")
        .drop_nulls("replica")
        .unique("replica", keep="first")
    )
    attributed = (
        hosted.drop("replica", "pool", "model")
        .join(matches, on=list(IDENTITY_COLUMNS), how="left", nulls_equal=True)
        .rename({"rule": "gpu_rule"})
        .join(serving.rename({"zone": "_zone"}), on="replica", how="left")
        .with_columns(zone=pl.coalesce("zone", "_zone"))
        .drop("_zone", *IDENTITY_COLUMNS)
    )
    return pl.concat(
        [engines.with_columns(gpu_rule=pl.lit(None, pl.String())), own, attributed],
        how="diagonal_relaxed",
    )


# An exporter page holds its own series beside its GPUs' (process and runtime families, now
# that every family is stored): a series without a GPU UUID is no GPU.
_IS_GPU = pl.col("uuid").is_not_null()


def unmatched_gpus(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """The GPUs (and MIG slices) of attributed dimensions that serve no replica, one row each
    (`UNMATCHED_GPUS_SCHEMA`), sorted by target, hostname, UUID and GPU instance."""
    rules = [r.value for r in UNATTRIBUTED]
    return (
        dimensions.filter(pl.col("gpu_rule").is_in(rules))
        .pipe(_series_gpu_identity)
        .filter(_IS_GPU)
        .select(*IDENTITY_COLUMNS, "target_id", rule="gpu_rule")
        .unique()
        .select(UNMATCHED_GPUS_SCHEMA.names())
        .cast(UNMATCHED_GPUS_SCHEMA)
        .sort("target_id", "hostname", "uuid", "gpu_instance", nulls_last=True)
    )


# The readings listed beside each unmatched GPU: (column, signal), means over the window.
UNMATCHED_READINGS: tuple[tuple[str, Signal], ...] = (
    ("gpu_power_w_mean", Signal.GPU_POWER_W),
    ("gpu_util_ratio_mean", Signal.GPU_UTIL_RATIO),
)


def unmatched_gpu_readings(points: pl.LazyFrame, dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """`unmatched_gpus` with each GPU's mean of every `UNMATCHED_READINGS` signal over the
    given points (null where it reported none), so what no replica was given stays visible."""
    rules = [r.value for r in UNATTRIBUTED]
    listed = unmatched_gpus(dimensions)
    series = (
        dimensions.filter(pl.col("gpu_rule").is_in(rules))
        .pipe(_series_gpu_identity)
        .filter(_IS_GPU)
        .select("series_id", "signal", "target_id", *IDENTITY_COLUMNS)
    )
    key = ["target_id", *IDENTITY_COLUMNS]
    means = (
        points.join(series, on="series_id", how="inner")
        .group_by(key)
        .agg(
            pl.col("value").filter(pl.col("signal") == signal.value).mean().alias(column)
            for column, signal in UNMATCHED_READINGS
        )
    )
    return listed.join(means, on=key, how="left", nulls_equal=True, maintain_order="left")
