"""An emulated fleet's configuration: typed, validated, loaded from TOML.

One TOML file (docs/fleet.example.toml shows every key) holds the topology, the engine
model, the router policy, the workload, the failure timeline and the SLO at which capacity is
measured. Every key is optional; `FleetConfig.default()` is what an empty file gives. A bad
value fails the load with an error naming the file, the field path (`workload.arrival.rate_rps`,
`failures[1].target`) and what is allowed; unknown keys are errors too, so typos do not pass
silently.

Size: over 500 lines on purpose: one file format: its typed sections and the validation that
names each bad field's path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from servewatch.emulator.engine import EngineParams
from servewatch.emulator.failures import FailureKind, FailureSpec, check_targets
from servewatch.emulator.records import EngineKind, ReplicaPlacement
from servewatch.emulator.trace_replay import TraceFormat
from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    DistributionKind,
    RateStep,
    ReplaySpec,
    SpecError,
    TenantSpec,
    WorkloadSpec,
)

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class RouterPolicy(Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"  # fewest requests held (running + waiting)
    PREFIX_AFFINITY = "prefix_affinity"  # consistent hash by conversation, bounded load


@dataclass(frozen=True)
class RouterSpec:
    """The router in front of the replicas.

    prefix_affinity sends a conversation to its replica on a consistent-hash ring
    (`virtual_nodes` points per replica) unless that replica is full, then to the next
    replica on the ring that is not. Full means holding at least `load_factor` times the
    mean load (rounded up) and at least `min_load_cap` requests, so a lightly loaded fleet
    keeps every conversation on its own replica.
    """

    policy: RouterPolicy = RouterPolicy.LEAST_LOADED
    load_factor: float = 1.25
    min_load_cap: int = 8
    virtual_nodes: int = 64

    def __post_init__(self) -> None:
        if not self.load_factor >= 1.0:
            raise SpecError("load_factor", f"must be >= 1, got {self.load_factor}")
        if self.min_load_cap < 1:
            raise SpecError("min_load_cap", f"must be >= 1, got {self.min_load_cap}")
        if self.virtual_nodes < 1:
            raise SpecError("virtual_nodes", f"must be >= 1, got {self.virtual_nodes}")


@dataclass(frozen=True)
class HostSpec:
    """One host of an explicit layout: its zone and the GPUs of each replica on it.

    With `mig_profile`, the host's replicas share one MIG GPU, a slice of that profile each
    (`replica_gpus` must then be all ones).
    """

    zone: str
    replica_gpus: tuple[int, ...] = (1, 1)
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        if not self.replica_gpus or any(g < 1 for g in self.replica_gpus):
            raise SpecError(
                "replica_gpus", f"needs one count >= 1 per replica, got {self.replica_gpus}"
            )
        if self.mig_profile is not None and set(self.replica_gpus) != {1}:
            raise SpecError(
                "replica_gpus",
                f"a MIG host's replicas use one slice each, got {self.replica_gpus}",
            )


@dataclass(frozen=True)
class TopologySpec:
    """Zones of hosts, each host running `replicas_per_host` replicas.

    `hosts_per_zone` is one count for every zone, or one count per zone in the order of
    `zones` (uneven zones: `(2, 1)` puts two hosts in the first zone and one in the second).
    Hosts are named host-0, host-1, ... and replicas vllm-0, vllm-1, ... zone by zone (pools
    rename each replica after its engine, `FleetConfig.placements`). `layout`, when given,
    replaces the uniform counts with one `HostSpec` per host (mixed single-GPU and
    tensor-parallel replicas, MIG hosts), hosts numbered in its order. With `namespace` every
    replica is a Kubernetes pod of that namespace named as the replica.
    """

    zones: tuple[str, ...] = ("zone-a", "zone-b", "zone-c")
    hosts_per_zone: int | tuple[int, ...] = 1
    replicas_per_host: int = 2
    gpus_per_replica: int = 1
    layout: tuple[HostSpec, ...] = ()
    namespace: str | None = None

    def __post_init__(self) -> None:
        strays = sorted({h.zone for h in self.layout} - set(self.zones))
        if strays:
            raise SpecError("layout", f"zones {strays} are not among zones {list(self.zones)}")
        if not self.zones:
            raise SpecError("zones", "needs at least one zone")
        if len(set(self.zones)) != len(self.zones) or not all(self.zones):
            raise SpecError("zones", f"names must be unique and non-empty, got {self.zones}")
        if isinstance(self.hosts_per_zone, tuple):
            if len(self.hosts_per_zone) != len(self.zones):
                raise SpecError(
                    "hosts_per_zone",
                    f"has {len(self.hosts_per_zone)} counts for {len(self.zones)} zones; "
                    "give one count, or one per zone",
                )
            for i, count in enumerate(self.hosts_per_zone):
                if count < 1:
                    raise SpecError(f"hosts_per_zone[{i}]", f"must be >= 1, got {count}")
        elif self.hosts_per_zone < 1:
            raise SpecError("hosts_per_zone", f"must be >= 1, got {self.hosts_per_zone}")
        for name in ("replicas_per_host", "gpus_per_replica"):
            if getattr(self, name) < 1:
                raise SpecError(name, f"must be >= 1, got {getattr(self, name)}")

    @property
    def zone_hosts(self) -> tuple[int, ...]:
        """Hosts in each zone, in the order of `zones`."""
        if isinstance(self.hosts_per_zone, tuple):
            return self.hosts_per_zone
        return (self.hosts_per_zone,) * len(self.zones)

    @property
    def hosts(self) -> int:
        return len(self.layout) if self.layout else sum(self.zone_hosts)

    @property
    def replicas(self) -> int:
        if self.layout:
            return sum(len(h.replica_gpus) for h in self.layout)
        return self.hosts * self.replicas_per_host

    def placements(self, *, model: str, pool: str) -> list[ReplicaPlacement]:
        if self.layout:
            return [
                ReplicaPlacement(
                    replica=f"vllm-{n}",
                    host=f"host-{h}",
                    zone=spec.zone,
                    model=model,
                    pool=pool,
                    gpus=gpus,
                    mig_profile=spec.mig_profile,
                    namespace=self.namespace,
                )
                for n, (h, spec, gpus) in enumerate(
                    (h, spec, gpus)
                    for h, spec in enumerate(self.layout)
                    for gpus in spec.replica_gpus
                )
            ]
        out: list[ReplicaPlacement] = []
        host = 0
        for zone, hosts in zip(self.zones, self.zone_hosts, strict=True):
            for _ in range(hosts):
                first = len(out)
                out.extend(
                    ReplicaPlacement(
                        replica=f"vllm-{first + i}",
                        host=f"host-{host}",
                        zone=zone,
                        model=model,
                        pool=pool,
                        gpus=self.gpus_per_replica,
                        namespace=self.namespace,
                    )
                    for i in range(self.replicas_per_host)
                )
                host += 1
        return out


@dataclass(frozen=True)
class PoolSpec:
    """A pool of replicas running one engine (and, when given, its own model).

    Pools take the topology's replicas in placement order: the first pool the first
    `replicas` of them, and so on, so their counts add up to the topology's replicas. A
    pool's replicas are named after its engine with the fleet-wide index (`vllm-0`,
    `sglang-2`, `trtllm-dynamo-4`), and each serves its page in its engine's shape.
    """

    name: str
    replicas: int
    engine: EngineKind = EngineKind.VLLM
    model: str | None = None  # None: the fleet's model

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "must not be empty")
        if self.replicas < 1:
            raise SpecError("replicas", f"must be >= 1, got {self.replicas}")
        if self.model == "":
            raise SpecError("model", "must not be empty; leave it out for the fleet's model")

    @property
    def replica_prefix(self) -> str:
        return self.engine.value.replace("_", "-")


@dataclass(frozen=True)
class SloSpec:
    """The request SLO capacity is measured at: TTFT and TPOT limits (inclusive), and the
    share of requests that must meet both."""

    ttft_s: float = 0.5
    tpot_s: float = 0.05
    target_ratio: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            if not getattr(self, name) > 0:
                raise SpecError(name, f"must be > 0 seconds, got {getattr(self, name)}")
        if not 0.0 < self.target_ratio <= 1.0:
            raise SpecError("target_ratio", f"must be in (0, 1], got {self.target_ratio}")


@dataclass(frozen=True)
class AdmissionSpec:
    """The gateway's admission limit: a token bucket of `rate_rps` holding up to `burst`
    requests. An arrival finding the bucket empty is shed with a retry-after of
    `retry_after_s` (a client that retries waits at least that long)."""

    rate_rps: float
    burst: float = 1.0
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate_rps > 0:
            raise SpecError("rate_rps", f"must be > 0 requests per second, got {self.rate_rps}")
        if not self.burst >= 1.0:
            raise SpecError("burst", f"must be >= 1 request, got {self.burst}")
        if not self.retry_after_s >= 0:
            raise SpecError("retry_after_s", f"must be >= 0 seconds, got {self.retry_after_s}")


def _default_workload() -> WorkloadSpec:
    return WorkloadSpec(
        arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=6.0),
        conversation=ConversationSpec(turns_mean=2.5),
        tenants=(
            TenantSpec("chat", weight=3.0, system_prompt_tokens=300),
            TenantSpec("batch-api", weight=1.0, system_prompt_tokens=0),
        ),
    )


@dataclass(frozen=True)
class FleetConfig:
    """Everything an emulated fleet needs; `default()` is six replicas on three hosts."""

    model: str = DEFAULT_MODEL
    pool: str = "default"
    topology: TopologySpec = field(default_factory=TopologySpec)
    engine: EngineParams = field(default_factory=EngineParams)
    router: RouterSpec = field(default_factory=RouterSpec)
    workload: WorkloadSpec = field(default_factory=_default_workload)
    failures: tuple[FailureSpec, ...] = ()
    slo: SloSpec = field(default_factory=SloSpec)
    admission: AdmissionSpec | None = None  # None: the gateway admits everything
    # The gateway names each request's conversation on its span (gen_ai.conversation.id).
    conversation_ids: bool = False
    # Replica groups by engine; () is one pool (`pool`) of vLLM replicas.
    pools: tuple[PoolSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.model:
            raise SpecError("model", "must not be empty")
        if self.pools:
            names = [p.name for p in self.pools]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise SpecError("pools", f"pool names must be unique, {repeated} repeat")
            total = sum(p.replicas for p in self.pools)
            if total != self.topology.replicas:
                raise SpecError(
                    "pools",
                    f"hold {total} replicas in all, but the topology has {self.topology.replicas}"
                    " (hosts x replicas_per_host); the counts must add up to it",
                )
        try:
            check_targets(self.failures, self.placements())
        except SpecError as exc:
            raise SpecError(f"failures{exc.field}", exc.reason) from exc

    @classmethod
    def default(cls) -> FleetConfig:
        return cls()

    def placements(self) -> list[ReplicaPlacement]:
        placements = self.topology.placements(model=self.model, pool=self.pool)
        if not self.pools:
            return placements
        out: list[ReplicaPlacement] = []
        for spec in self.pools:
            for placement in placements[len(out) : len(out) + spec.replicas]:
                out.append(
                    dataclasses.replace(
                        placement,
                        replica=f"{spec.replica_prefix}-{len(out)}",
                        model=spec.model or self.model,
                        pool=spec.name,
                        engine=spec.engine,
                    )
                )
        return out


class FleetConfigError(ValueError):
    """A fleet config is not valid; the message names the file, the field path and the rule."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        super().__init__(f"{source}: {path}: {reason}" if path else f"{source}: {reason}")
        self.source = source
        self.path = path
        self.reason = reason


E = TypeVar("E", bound=Enum)
T = TypeVar("T")


def _join(path: str, key: str) -> str:
    if not path:
        return key
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key}"


class _Table:
    """A TOML table being read: typed getters that record which keys were used."""

    def __init__(self, data: Mapping[str, Any], path: str, source: str) -> None:
        self.data = data
        self.path = path
        self.source = source
        self._used: set[str] = set()

    def fail(self, key: str, reason: str) -> NoReturn:
        raise FleetConfigError(self.source, _join(self.path, key), reason)

    def has(self, key: str) -> bool:
        return key in self.data

    def _raw(self, key: str) -> Any:
        self._used.add(key)
        return self.data.get(key)

    def number(self, key: str, default: float) -> float:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            self.fail(key, f"must be finite, got {value!r}")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        if self.data.get(key) is None:
            self._used.add(key)
            return None
        return self.number(key, 0.0)

    def integer(self, key: str, default: int) -> int:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, got {value!r}")
        return value

    def text(self, key: str, default: str) -> str:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, enum: type[E], default: E) -> E:
        value = self._raw(key)
        if value is None:
            return default
        allowed = [member.value for member in enum]
        if value not in allowed:
            self.fail(key, f"must be one of {allowed}, got {value!r}")
        return enum(value)

    def texts(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, f"must be a list of strings, got {value!r}")
        return tuple(value)

    def table(self, key: str) -> _Table | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(key, f"must be a table, got {value!r}")
        return _Table(value, _join(self.path, key), self.source)

    def tables(self, key: str) -> list[_Table]:
        value = self._raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, f"must be an array of tables, got {value!r}")
        where = _join(self.path, key)
        return [_Table(item, f"{where}[{i}]", self.source) for i, item in enumerate(value)]

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._used)
        if unknown:
            self.fail(unknown[0], f"unknown key; allowed here: {sorted(self._used)}")

    def build(self, make: Callable[[], T]) -> T:
        """Construct a spec from this table, reporting its field errors at their path."""
        self.done()
        try:
            return make()
        except SpecError as exc:
            self.fail(exc.field, exc.reason)


def _distribution(parent: _Table, key: str, default: Distribution) -> Distribution:
    t = parent.table(key)
    if t is None:
        return default
    kind = t.choice("kind", DistributionKind, default.kind)
    # Fields left out keep the default distribution's values when the kind is unchanged.
    base = default if kind is default.kind else None

    def field_value(name: str, attribute: str, fallback: float) -> float:
        return t.number(name, getattr(base, attribute) if base is not None else fallback)

    value = field_value("value", "value", 0.0)
    low = field_value("low", "low", 0.0)
    high = field_value("high", "high", 0.0)
    median = field_value("median", "median", 0.0)
    sigma = field_value("sigma", "sigma", 0.0)
    mean = field_value("mean", "mean", 0.0)
    lo = field_value("min", "min_value", 0.0)
    hi = field_value("max", "max_value", math.inf)
    return t.build(
        lambda: Distribution(
            kind,
            value=value,
            low=low,
            high=high,
            median=median,
            sigma=sigma,
            mean=mean,
            min_value=lo,
            max_value=hi,
        )
    )


def _arrival(parent: _Table, default: ArrivalSpec) -> ArrivalSpec:
    t = parent.table("arrival")
    if t is None:
        return default
    kind = t.choice("kind", ArrivalKind, default.kind)
    rate = t.number("rate_rps", default.rate_rps)
    ratio = t.number("peak_to_mean_ratio", default.peak_to_mean_ratio)
    peak = t.number("peak_hour_utc", default.peak_hour_utc)
    steps: list[RateStep] = []
    for step in t.tables("steps"):
        for key in ("at_s", "rate_rps"):
            if not step.has(key):
                step.fail(key, "is required in every step")
        at_s = step.number("at_s", 0.0)
        step_rate = step.number("rate_rps", 0.0)
        steps.append(step.build(functools.partial(RateStep, at_s, step_rate)))
    return t.build(
        lambda: ArrivalSpec(
            kind=kind,
            rate_rps=rate,
            peak_to_mean_ratio=ratio,
            peak_hour_utc=peak,
            steps=tuple(steps),
        )
    )


def _workload(parent: _Table, base_dir: Path) -> WorkloadSpec:
    default = _default_workload()
    t = parent.table("workload")
    if t is None:
        return default
    arrival = _arrival(t, default.arrival)
    user = _distribution(t, "user_tokens", default.user_tokens)
    output = _distribution(t, "output_tokens", default.output_tokens)
    max_tokens = t.integer("max_tokens", default.max_tokens)
    max_context = t.integer("max_context_tokens", default.max_context_tokens)
    conversation = default.conversation
    ct = t.table("conversation")
    if ct is not None:
        turns = ct.number("turns_mean", conversation.turns_mean)
        think = _distribution(ct, "think_time_s", conversation.think_time_s)
        conversation = ct.build(lambda: ConversationSpec(turns_mean=turns, think_time_s=think))
    tenants = default.tenants
    if t.has("tenants"):
        built: list[TenantSpec] = []
        for tt in t.tables("tenants"):
            name = tt.text("name", "")
            weight = tt.number("weight", 1.0)
            system = tt.integer("system_prompt_tokens", 0)
            built.append(tt.build(functools.partial(TenantSpec, name, weight, system)))
        tenants = tuple(built)
    replay = None
    rt = t.table("replay")
    if rt is not None:
        raw_path = rt.text("path", "")
        if not raw_path:
            rt.fail("path", "is required: the trace file to replay")
        path = Path(raw_path)
        if not path.is_absolute():
            path = base_dir / path
        trace_format = rt.choice("format", TraceFormat, TraceFormat.AZURE_CSV)
        speedup = rt.number("speedup", 1.0)
        tenant = rt.text("tenant", "") or None
        replay = rt.build(lambda: ReplaySpec(path, trace_format, speedup, tenant))
    return t.build(
        lambda: WorkloadSpec(
            arrival=arrival,
            user_tokens=user,
            output_tokens=output,
            max_tokens=max_tokens,
            conversation=conversation,
            tenants=tenants,
            max_context_tokens=max_context,
            replay=replay,
        )
    )


def _engine(parent: _Table) -> EngineParams:
    default = EngineParams()
    t = parent.table("engine")
    if t is None:
        return default
    kwargs: dict[str, Any] = {}
    for name, value in vars(default).items():
        if isinstance(value, bool):
            kwargs[name] = t.flag(name, value)
        elif isinstance(value, int):
            kwargs[name] = t.integer(name, value)
        else:
            kwargs[name] = t.number(name, value)
    return t.build(lambda: EngineParams(**kwargs))


def _failures(parent: _Table) -> tuple[FailureSpec, ...]:
    out: list[FailureSpec] = []
    for ft in parent.tables("failures"):
        if not ft.has("kind"):
            ft.fail("kind", f"is required: one of {[k.value for k in FailureKind]}")
        kind = ft.choice("kind", FailureKind, FailureKind.REPLICA_CRASH)
        if not ft.has("at_s"):
            ft.fail("at_s", "is required (seconds after the start)")
        at_s = ft.number("at_s", 0.0)
        target = ft.text("target", "")
        duration = ft.optional_number("duration_s")
        factor = ft.number("factor", 3.0)
        ratio = ft.number("error_ratio", 1.0)
        version = ft.text("version", "v2")
        out.append(
            ft.build(
                functools.partial(FailureSpec, kind, at_s, target, duration, factor, ratio, version)
            )
        )
    return tuple(out)


def _hosts_per_zone(
    t: _Table, zones: tuple[str, ...], default: int | tuple[int, ...]
) -> int | tuple[int, ...]:
    """`hosts_per_zone`: one whole number for every zone, a list with one per zone (in the
    order of `zones`), or a table of counts by zone name."""
    value = t._raw("hosts_per_zone")
    if value is None:
        return default
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(zones))
        if unknown:
            t.fail(f"hosts_per_zone.{unknown[0]}", f"is not one of the zones {list(zones)}")
        missing = [z for z in zones if z not in value]
        if missing:
            t.fail(f"hosts_per_zone.{missing[0]}", "is missing: give a count for every zone")
        counts = [(f"hosts_per_zone.{z}", value[z]) for z in zones]
    elif isinstance(value, list):
        counts = [(f"hosts_per_zone[{i}]", v) for i, v in enumerate(value)]
    else:
        counts = [("hosts_per_zone", value)]
    for key, count in counts:
        if isinstance(count, bool) or not isinstance(count, int):
            t.fail(key, f"must be an integer, got {count!r}")
    if isinstance(value, int):
        return value
    return tuple(count for _, count in counts)


def _host_spec(t: _Table) -> HostSpec:
    """One `[[topology.hosts]]` entry: zone, replica_gpus (a list of counts), mig_profile."""
    zone = t.text("zone", "")
    if not zone:
        t.fail("zone", "is required: the zone of this host")
    counts = t._raw("replica_gpus")
    if counts is None:
        counts = [1, 1]
    if not isinstance(counts, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in counts
    ):
        t.fail("replica_gpus", f"must be a list of GPU counts, one per replica, got {counts!r}")
    profile = t.text("mig_profile", "") or None
    return t.build(lambda: HostSpec(zone, tuple(counts), profile))


def _pools(root: _Table) -> tuple[PoolSpec, ...]:
    out: list[PoolSpec] = []
    for pt in root.tables("pools"):
        for key in ("name", "replicas"):
            if not pt.has(key):
                pt.fail(key, "is required in every pool")
        name = pt.text("name", "")
        replicas = pt.integer("replicas", 0)
        engine = pt.choice("engine", EngineKind, EngineKind.VLLM)
        model = pt.text("model", "") if pt.has("model") else None
        out.append(pt.build(functools.partial(PoolSpec, name, replicas, engine, model)))
    if out and root.has("pool"):
        root.fail("pool", "names the one pool of a fleet without [[pools]]; give one or the other")
    return tuple(out)


def fleet_config_from_mapping(
    doc: Mapping[str, Any], *, source: str, base_dir: Path | None = None
) -> FleetConfig:
    """A config from a parsed TOML document; relative paths are resolved against `base_dir`."""
    root = _Table(doc, "", source)
    model = root.text("model", DEFAULT_MODEL)
    pool = root.text("pool", "default")
    topology = TopologySpec()
    tt = root.table("topology")
    if tt is not None:
        zones = tt.texts("zones", topology.zones)
        hosts = _hosts_per_zone(tt, zones, topology.hosts_per_zone)
        per_host = tt.integer("replicas_per_host", topology.replicas_per_host)
        gpus = tt.integer("gpus_per_replica", topology.gpus_per_replica)
        layout = tuple(_host_spec(ht) for ht in tt.tables("hosts"))
        namespace = tt.text("namespace", "") or None
        topology = tt.build(
            lambda: TopologySpec(zones, hosts, per_host, gpus, layout=layout, namespace=namespace)
        )
    engine = _engine(root)
    router = RouterSpec()
    rt = root.table("router")
    if rt is not None:
        policy = rt.choice("policy", RouterPolicy, router.policy)
        load_factor = rt.number("load_factor", router.load_factor)
        min_cap = rt.integer("min_load_cap", router.min_load_cap)
        vnodes = rt.integer("virtual_nodes", router.virtual_nodes)
        router = rt.build(lambda: RouterSpec(policy, load_factor, min_cap, vnodes))
    workload = _workload(root, base_dir or Path.cwd())
    failures = _failures(root)
    pools = _pools(root)
    slo = SloSpec()
    st = root.table("slo")
    if st is not None:
        ttft = st.number("ttft_s", slo.ttft_s)
        tpot = st.number("tpot_s", slo.tpot_s)
        target = st.number("target_ratio", slo.target_ratio)
        slo = st.build(lambda: SloSpec(ttft, tpot, target))
    conversation_ids = False
    gt = root.table("gateway")
    if gt is not None:
        conversation_ids = gt.flag("conversation_ids", default=False)
        gt.done()
    return root.build(
        lambda: FleetConfig(
            model=model,
            pool=pool,
            topology=topology,
            engine=engine,
            router=router,
            workload=workload,
            failures=failures,
            slo=slo,
            conversation_ids=conversation_ids,
            pools=pools,
        )
    )


def load_fleet_config(path: Path | str) -> FleetConfig:
    """Read and validate a fleet TOML file."""
    # Its own few lines rather than `slo.fields.read_toml`, which every other TOML file of the
    # project goes through: the emulator imports nothing of the project, so that it compiles
    # on its own (emulator/native.py) and runs without the analytics.
    location = Path(path)
    source = str(location)
    try:
        doc = tomllib.loads(location.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetConfigError(source, "", f"cannot read the config: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise FleetConfigError(source, "", f"not UTF-8 text: {exc.reason}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FleetConfigError(source, "", f"not valid TOML: {exc}") from exc
    return fleet_config_from_mapping(doc, source=source, base_dir=location.parent)
