"""Placement: where replicas sit (hosts in zones) and what survives losing one failure unit.

Replicas that share a host or a zone fail together, so surviving capacity is counted from the
layout, never from a replica count alone: losing a host removes the host with the most
replicas, losing a zone removes the zone with the most replicas (the worst case is the promise).
Candidate fleets grow a layout one host at a time into the allowed zones, always into the zone
with the fewest hosts, which is how an operator would add them; smaller fleets than today's
take hosts away one at a time, always the smallest host of the zone with the most hosts, so
the zones stay as even as they were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property


class FailureUnit(Enum):
    """The failure the fleet must survive without a replacement, within the recovery interval."""

    NONE = "none"
    REPLICA = "replica"
    HOST = "host"
    ZONE = "zone"


@dataclass(frozen=True)
class Host:
    name: str
    zone: str
    replicas: int

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"host {self.name}: replicas must be >= 0, got {self.replicas}")


@dataclass(frozen=True)
class Footprint:
    """What failure arithmetic needs of a layout: counts per zone and the largest host."""

    hosts: int
    replicas: int
    largest_host_replicas: int
    hosts_by_zone: tuple[tuple[str, int], ...]
    replicas_by_zone: tuple[tuple[str, int], ...]

    @property
    def zones(self) -> int:
        return sum(1 for _, hosts in self.hosts_by_zone if hosts > 0)

    def replicas_after_loss(self, unit: FailureUnit) -> int:
        """Replicas left after losing the worst single `unit` (all of them for NONE)."""
        if unit is FailureUnit.NONE or self.replicas == 0:
            return self.replicas
        if unit is FailureUnit.REPLICA:
            return self.replicas - 1
        if unit is FailureUnit.HOST:
            return self.replicas - self.largest_host_replicas
        return self.replicas - max(replicas for _, replicas in self.replicas_by_zone)


@dataclass(frozen=True)
class Layout:
    hosts: tuple[Host, ...] = ()

    @property
    def replicas(self) -> int:
        return sum(host.replicas for host in self.hosts)

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({host.zone for host in self.hosts}))

    def footprint(self) -> Footprint:
        return self.grown(hosts=len(self.hosts), zones=self.zones or ("",), replicas_per_host=1)

    def resized(self, *, hosts: int, zones: Sequence[str], replicas_per_host: int) -> Footprint:
        """This layout grown to `hosts` (`grown`), or with hosts taken away down to `hosts`
        (`shrunk`): every candidate fleet, smaller than today's or larger."""
        if hosts < len(self.hosts):
            return self.shrunk(hosts=hosts).footprint()
        return self.grown(hosts=hosts, zones=zones, replicas_per_host=replicas_per_host)

    def shrunk(self, *, hosts: int) -> Layout:
        """This layout with hosts taken away until `hosts` are left, in `_removal_order`."""
        if hosts < 0:
            raise ValueError(f"a layout cannot shrink to {hosts} hosts")
        removed = set(self._removal_order[: max(0, len(self.hosts) - hosts)])
        return Layout(tuple(h for i, h in enumerate(self.hosts) if i not in removed))

    @cached_property
    def _removal_order(self) -> tuple[int, ...]:
        """Indexes of the hosts in the order they are taken away: each time the host with the
        fewest replicas (then the last by name) of the zone with the most hosts (then the most
        replicas, then the last by name). Worked out once a layout, since a failure table asks
        for many smaller fleets. Fewer hosts never leave more capacity after any loss: a host
        taken away lowers the total by its replicas and any unit's loss by at most that, so a
        fleet is the smaller ones plus hosts, as the failure table's search needs."""
        kept = dict(enumerate(self.hosts))
        order: list[int] = []
        while kept:
            by_zone: dict[str, list[int]] = {}
            for index, host in kept.items():
                by_zone.setdefault(host.zone, []).append(index)
            _, fullest = max(
                by_zone.items(),
                key=lambda item: (len(item[1]), sum(kept[i].replicas for i in item[1]), item[0]),
            )
            taken = max(fullest, key=lambda i: (-kept[i].replicas, kept[i].name))
            order.append(taken)
            del kept[taken]
        return tuple(order)

    def grown(self, *, hosts: int, zones: Sequence[str], replicas_per_host: int) -> Footprint:
        """This layout with hosts added up to `hosts`, each into the emptiest of `zones`.

        Adding one host at a time to the zone with the fewest hosts (ties in the order given)
        fills zones up to a common level; that level is computed, not simulated, so a candidate
        of thousands of hosts costs no more than one of three.
        """
        if not zones:
            raise ValueError("growing a layout needs at least one zone to add hosts in")
        if hosts < len(self.hosts):
            raise ValueError(
                f"a layout of {len(self.hosts)} hosts cannot shrink to {hosts} by growing"
            )
        host_counts: Counter[str] = Counter(host.zone for host in self.hosts)
        replica_counts: Counter[str] = Counter()
        for host in self.hosts:
            replica_counts[host.zone] += host.replicas
        added = _fill_levels([host_counts[zone] for zone in zones], hosts - len(self.hosts))
        for zone, count in zip(zones, added, strict=True):
            if count == 0:
                continue
            host_counts[zone] += count
            replica_counts[zone] += count * replicas_per_host
        largest = max((host.replicas for host in self.hosts), default=0)
        if hosts > len(self.hosts):
            largest = max(largest, replicas_per_host)
        order = sorted(host_counts)
        return Footprint(
            hosts=hosts,
            replicas=self.replicas + (hosts - len(self.hosts)) * replicas_per_host,
            largest_host_replicas=largest,
            hosts_by_zone=tuple((zone, host_counts[zone]) for zone in order),
            replicas_by_zone=tuple((zone, replica_counts[zone]) for zone in order),
        )


NO_LAYOUT = Layout()


def _fill_levels(counts: list[int], extra: int) -> list[int]:
    """How many of `extra` hosts each zone gets when each goes to the zone with fewest hosts."""
    if extra <= 0:
        return [0] * len(counts)
    ranked = sorted(counts)
    # Raise the lowest zones to a common level while hosts last.
    level, left, width = ranked[0], extra, 1
    while width < len(ranked) and left >= (ranked[width] - level) * width:
        left -= (ranked[width] - level) * width
        level = ranked[width]
        width += 1
    level += left // width
    left %= width
    added = []
    for count in counts:
        share = max(0, level - count)
        # The remainder goes one each to zones at the level, in the order given.
        if count <= level and left > 0:
            share += 1
            left -= 1
        added.append(share)
    return added


def layout_from_inventory(rows: Iterable[tuple[str, str, str]]) -> Layout:
    """A layout from (replica, host, zone) rows, such as the store's targets.

    A replica listed twice is counted once; a replica cannot sit on two hosts.
    """
    host_of: dict[str, tuple[str, str]] = {}
    for replica, host, zone in rows:
        where = (host, zone)
        if host_of.setdefault(replica, where) != where:
            first_host, first_zone = host_of[replica]
            raise ValueError(
                f"replica {replica!r} is listed on {first_host!r} in {first_zone!r} and on "
                f"{host!r} in {zone!r}; a replica sits on one host"
            )
    per_host: Counter[tuple[str, str]] = Counter(host_of.values())
    zone_of: dict[str, str] = {}
    for host, zone in per_host:
        if zone_of.setdefault(host, zone) != zone:
            raise ValueError(f"host {host!r} is listed in zones {zone_of[host]!r} and {zone!r}")
    return Layout(tuple(Host(h, z, n) for (h, z), n in sorted(per_host.items())))
