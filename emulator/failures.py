"""Injected failures: what goes wrong, where and when, expanded into a per-replica timeline.

A `FailureSpec` names a failure unit (a replica, a host, a zone, or the artifact registry) and
when it fails, seconds after the simulation starts. `failure_timeline` expands specs into
`FailureAction`s on replicas, sorted by time; the fleet applies them. Recovery:
- a crashed replica restarts `duration_s` later (None: never) and serves after the engine's
  cold start; it restarts from its own node, so it does not need the artifact registry;
- a lost host or zone comes back (or is replaced) `duration_s` later (None: never); its
  replicas must pull their artifacts, so while the registry is out they cannot start;
- a slow replica or an error burst lasts `duration_s` (None: to the end of the run);
- a rollout replaces a replica's process by a new version (`<model>@<version>` in its model
  name, step time x `factor`): in-flight requests fail, the new process serves after a cold
  start; `duration_s` later (None: never) it is rolled back the same way;
- a KV squeeze (usable KV blocks divided by `factor`) lasts `duration_s` (None: to the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from servewatch.emulator.records import ReplicaPlacement
from servewatch.emulator.workload import SpecError


class FailureKind(Enum):
    REPLICA_CRASH = "replica_crash"
    HOST_LOSS = "host_loss"
    ZONE_LOSS = "zone_loss"
    SLOW_REPLICA = "slow_replica"  # step time x factor
    ERROR_BURST = "error_burst"  # a share of requests fails at once
    REGISTRY_OUTAGE = "registry_outage"  # replacements cannot pull artifacts
    ROLLOUT = "rollout"  # restarts as a new version whose step time is x factor
    KV_SQUEEZE = "kv_squeeze"  # usable KV blocks / factor (memory taken by something else)


TARGET_UNIT = {
    FailureKind.REPLICA_CRASH: "replica",
    FailureKind.HOST_LOSS: "host",
    FailureKind.ZONE_LOSS: "zone",
    FailureKind.SLOW_REPLICA: "replica",
    FailureKind.ERROR_BURST: "replica",
    FailureKind.REGISTRY_OUTAGE: "",
    FailureKind.ROLLOUT: "replica",
    FailureKind.KV_SQUEEZE: "replica",
}


@dataclass(frozen=True)
class FailureSpec:
    """One injected failure; `target` is a replica, host or zone name as `kind` requires."""

    kind: FailureKind
    at_s: float
    target: str = ""
    duration_s: float | None = None
    factor: float = 3.0  # slow_replica: step time multiplier
    error_ratio: float = 1.0  # error_burst: share of arriving requests that fail
    version: str = "v2"  # rollout: the new version's name, reported as `<model>@<version>`

    def __post_init__(self) -> None:
        if not self.at_s >= 0:
            raise SpecError("at_s", f"must be >= 0 seconds after the start, got {self.at_s}")
        if self.duration_s is not None and not self.duration_s >= 0:
            raise SpecError("duration_s", f"must be >= 0 or absent, got {self.duration_s}")
        unit = TARGET_UNIT[self.kind]
        if unit and not self.target:
            raise SpecError("target", f"{self.kind.value} needs a {unit} name")
        if not unit and self.target:
            raise SpecError("target", f"{self.kind.value} takes no target, got {self.target!r}")
        if self.kind is FailureKind.SLOW_REPLICA and not self.factor >= 1.0:
            raise SpecError("factor", f"must be >= 1 (a step-time multiplier), got {self.factor}")
        if self.kind is FailureKind.KV_SQUEEZE and not self.factor >= 1.0:
            raise SpecError(
                "factor", f"must be >= 1 (usable KV blocks are divided by it), got {self.factor}"
            )
        if self.kind is FailureKind.ERROR_BURST and not 0.0 < self.error_ratio <= 1.0:
            raise SpecError("error_ratio", f"must be in (0, 1], got {self.error_ratio}")
        if self.kind is FailureKind.ROLLOUT:
            if not self.factor > 0:
                raise SpecError(
                    "factor", f"must be > 0 (a step-time multiplier), got {self.factor}"
                )
            if not self.version or "@" in self.version:
                raise SpecError(
                    "version", f"must be a non-empty name without '@', got {self.version!r}"
                )


class ActionKind(Enum):
    CRASH = "crash"
    LOSE_HOST = "lose_host"
    START = "start"  # begin starting (a cold start follows)
    SLOW = "slow"
    RESTORE_SPEED = "restore_speed"
    ERRORS_ON = "errors_on"
    ERRORS_OFF = "errors_off"
    REGISTRY_DOWN = "registry_down"
    REGISTRY_UP = "registry_up"
    ROLL_OUT = "roll_out"  # replace the process by `version` ("": the original) at `factor`
    SQUEEZE_KV = "squeeze_kv"  # usable KV blocks / `factor`; 1 gives them all back


@dataclass(frozen=True)
class FailureAction:
    """Something that happens to `replicas` at `at_s` (Unix seconds on the simulation clock)."""

    at_s: float
    kind: ActionKind
    replicas: tuple[str, ...] = ()
    detail: str = ""
    factor: float = 1.0
    needs_registry: bool = False  # START: the replicas must pull artifacts first
    version: str = ""  # ROLL_OUT: the version the new process runs ("": the original)


def check_targets(specs: Sequence[FailureSpec], placements: Sequence[ReplicaPlacement]) -> None:
    """Every target names an existing unit of its kind; SpecError names the failure otherwise."""
    names = {
        "replica": sorted({p.replica for p in placements}),
        "host": sorted({p.host for p in placements}),
        "zone": sorted({p.zone for p in placements}),
    }
    for i, spec in enumerate(specs):
        unit = TARGET_UNIT[spec.kind]
        if unit and spec.target not in names[unit]:
            raise SpecError(
                f"[{i}].target",
                f"{spec.kind.value} needs one of the fleet's {unit}s {names[unit]}, "
                f"got {spec.target!r}",
            )


def failure_timeline(  # noqa: PLR0912 (one branch per failure kind)
    specs: Sequence[FailureSpec], placements: Sequence[ReplicaPlacement], *, start_s: float
) -> list[FailureAction]:
    """All actions of `specs` on the fleet, in time order (ties keep the specs' order)."""
    check_targets(specs, placements)
    actions: list[tuple[float, int, FailureAction]] = []

    def add(at_s: float, action: FailureAction) -> None:
        actions.append((at_s, len(actions), action))

    for spec in specs:
        replicas: tuple[str, ...]
        at = start_s + spec.at_s
        end = None if spec.duration_s is None else at + spec.duration_s
        match spec.kind:
            case FailureKind.REPLICA_CRASH:
                replicas = (spec.target,)
                add(at, FailureAction(at, ActionKind.CRASH, replicas, "replica crash"))
                if end is not None:
                    add(end, FailureAction(end, ActionKind.START, replicas, "restart"))
            case FailureKind.HOST_LOSS | FailureKind.ZONE_LOSS:
                unit = "host" if spec.kind is FailureKind.HOST_LOSS else "zone"
                replicas = tuple(p.replica for p in placements if getattr(p, unit) == spec.target)
                detail = f"{unit} {spec.target} lost"
                add(at, FailureAction(at, ActionKind.LOSE_HOST, replicas, detail))
                if end is not None:
                    add(
                        end,
                        FailureAction(
                            end,
                            ActionKind.START,
                            replicas,
                            f"{unit} {spec.target} replaced",
                            needs_registry=True,
                        ),
                    )
            case FailureKind.SLOW_REPLICA:
                replicas = (spec.target,)
                add(
                    at,
                    FailureAction(
                        at, ActionKind.SLOW, replicas, f"step time x{spec.factor:g}", spec.factor
                    ),
                )
                if end is not None:
                    add(end, FailureAction(end, ActionKind.RESTORE_SPEED, replicas, "speed back"))
            case FailureKind.ERROR_BURST:
                replicas = (spec.target,)
                add(
                    at,
                    FailureAction(
                        at,
                        ActionKind.ERRORS_ON,
                        replicas,
                        f"{spec.error_ratio:.0%} of requests fail",
                        spec.error_ratio,
                    ),
                )
                if end is not None:
                    add(end, FailureAction(end, ActionKind.ERRORS_OFF, replicas, "errors over"))
            case FailureKind.REGISTRY_OUTAGE:
                add(at, FailureAction(at, ActionKind.REGISTRY_DOWN, (), "artifact registry down"))
                if end is not None:
                    add(end, FailureAction(end, ActionKind.REGISTRY_UP, (), "artifact registry up"))
            case FailureKind.ROLLOUT:
                replicas = (spec.target,)
                detail = f"rollout to {spec.version}, step time x{spec.factor:g}"
                add(
                    at,
                    FailureAction(
                        at, ActionKind.ROLL_OUT, replicas, detail, spec.factor, version=spec.version
                    ),
                )
                if end is not None:
                    add(end, FailureAction(end, ActionKind.ROLL_OUT, replicas, "rollback"))
            case FailureKind.KV_SQUEEZE:
                replicas = (spec.target,)
                detail = f"usable KV blocks / {spec.factor:g}"
                add(at, FailureAction(at, ActionKind.SQUEEZE_KV, replicas, detail, spec.factor))
                if end is not None:
                    add(end, FailureAction(end, ActionKind.SQUEEZE_KV, replicas, "KV blocks back"))
    return [action for _, _, action in sorted(actions, key=lambda item: (item[0], item[1]))]
