"""The scrape schedule: when each target is scraped, as pure arithmetic on epoch seconds.

A target's slots are the instants `k * interval_s + offset_s` (k whole) on the epoch clock. The
offset comes from a hash of the target's identity (and an optional seed), as Prometheus does:
a fleet's scrapes spread evenly across the interval instead of arriving together, and a target
keeps its phase across restarts, so its series stay evenly spaced. A scrape never overlaps the
next one of its target: a slot that passes while the scrape still runs is skipped and counted,
never stacked.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from servewatch.collectors.scrape.targets import Target

# Slot arithmetic in whole microseconds: float division of epoch seconds by the interval would
# put a slot a rounding error before or after itself. Not nanoseconds: a float epoch instant
# resolves only about 0.24 us, so a slot would not survive its round trip through a float.
_US = 1_000_000


def _us(seconds: float) -> int:
    return round(seconds * _US)


def offset_s(identity: str, *, interval_s: float, seed: str = "") -> float:
    """The stable phase of a target within its interval, in [0, interval_s)."""
    if not interval_s > 0:
        raise ValueError(f"scrape interval must be positive, got {interval_s!r}")
    digest = hashlib.blake2b(f"{seed}\0{identity}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") % _us(interval_s)) / _US


@dataclass(frozen=True)
class TargetSchedule:
    """One target's slots: every `interval_s` at `offset_s` past the epoch grid, each scrape
    cut off after `timeout_s` (at most the interval)."""

    interval_s: float
    timeout_s: float
    offset_s: float

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {self.interval_s!r}")
        if not 0 < self.timeout_s <= self.interval_s:
            raise ValueError(
                f"timeout_s must be positive and at most interval_s ({self.interval_s:g}), "
                f"got {self.timeout_s!r}"
            )
        if not 0 <= self.offset_s < self.interval_s:
            raise ValueError(f"offset_s must be in [0, interval_s), got {self.offset_s!r}")

    def slot_at_or_before(self, t_s: float) -> float:
        """The latest slot not after `t_s`."""
        interval, offset = _us(self.interval_s), _us(self.offset_s)
        return (((_us(t_s) - offset) // interval) * interval + offset) / _US

    def slot_after(self, t_s: float) -> float:
        """The first slot strictly after `t_s`."""
        return self.slot_at_or_before(t_s) + self.interval_s

    def slot_at_or_after(self, t_s: float) -> float:
        """The first slot not before `t_s`."""
        before = self.slot_at_or_before(t_s)
        return before if _us(before) == _us(t_s) else before + self.interval_s

    def slots_between(self, after_s: float, until_s: float) -> int:
        """How many slots lie in (after_s, until_s]."""
        if until_s <= after_s:
            return 0
        interval = _us(self.interval_s)
        last = _us(self.slot_at_or_before(until_s))
        first = _us(self.slot_after(after_s))
        return 0 if last < first else (last - first) // interval + 1


def schedule_for(
    target: Target, *, interval_s: float, timeout_s: float, seed: str = ""
) -> TargetSchedule:
    """A target's schedule: its own interval and timeout where it sets them, else the defaults;
    a timeout longer than the interval is cut to the interval, so scrapes cannot overlap."""
    interval = target.interval_s or interval_s
    timeout = min(target.timeout_s or timeout_s, interval)
    return TargetSchedule(
        interval_s=interval,
        timeout_s=timeout,
        offset_s=offset_s(target.target_id, interval_s=interval, seed=seed),
    )


@dataclass(frozen=True)
class NextSlot:
    """Where a target's schedule goes after a scrape: the slot to scrape next and how many
    slots passed while the scrape (or a late wake-up) was still in the way."""

    slot_s: float
    skipped: int


def next_after_scrape(schedule: TargetSchedule, *, slot_s: float, finished_s: float) -> NextSlot:
    """The next slot after a scrape scheduled at `slot_s` that finished at `finished_s`: the
    first slot after the finish; any slot in between is skipped (a slot falling exactly at the
    finish counts as still occupied)."""
    next_slot = schedule.slot_after(max(slot_s, finished_s))
    return NextSlot(slot_s=next_slot, skipped=schedule.slots_between(slot_s, finished_s))


def catch_up(schedule: TargetSchedule, *, slot_s: float, woke_s: float) -> NextSlot:
    """The slot to serve on waking at `woke_s` for `slot_s`: the latest slot not after the
    wake-up, so a wake-up more than an interval late scrapes once, not once per missed slot."""
    if woke_s < slot_s:
        return NextSlot(slot_s=slot_s, skipped=0)
    latest = schedule.slot_at_or_before(woke_s)
    return NextSlot(slot_s=latest, skipped=schedule.slots_between(slot_s, latest))


def lag_s(*, slot_s: float, started_s: float) -> float:
    """Scrape lag: how late the scrape started against its slot (never negative)."""
    return max(0.0, started_s - slot_s)
