"""Sharded collection: which targets one of several collectors scrapes.

Several collectors split one target list as Prometheus' `hashmod` relabelling does: each target
belongs to shard `md5(address)[-8:] as big-endian uint64 % count`, so it is scraped (and stored)
by exactly one collector, and a servewatch shard agrees with a Prometheus shard of the same
modulus over the same addresses (`prometheus/model/relabel/relabel.go`, `case HashMod`). The
address is the target's `__address__`: the `host:port` of its URL as written. Selection is pure:
the callers decide when to resolve targets and what to scrape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from servewatch.collectors.scrape.targets import Target

SHARD_FORM = '"INDEX/COUNT", whole numbers with 0 <= INDEX < COUNT (e.g. "0/3")'
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def shard_of(address: str, modulus: int) -> int:
    """The shard of `address` among `modulus` shards, exactly as Prometheus' hashmod: the MD5
    digest's last 8 bytes read as a big-endian uint64, modulo `modulus`."""
    if modulus < 1:
        raise ValueError(f"modulus must be a whole number >= 1, got {modulus!r}")
    digest = hashlib.md5(address.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def target_address(target: Target) -> str:
    """A target's `__address__`: the `host:port` of its URL as written (no user info), which is
    what a file_sd entry lists and what Prometheus hashes by default."""
    netloc = urlsplit(target.url).netloc
    return netloc.rpartition("@")[2]


@dataclass(frozen=True)
class Shard:
    """One shard of `count`: shard `index` (0-based) scrapes the targets `shard_of` gives it.
    The default, 0/1, owns every target."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(f"must be {SHARD_FORM}, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """A shard from `"INDEX/COUNT"`; ValueError saying what is allowed otherwise."""
        match = _SHARD.fullmatch(text)
        if match is None:
            raise ValueError(f"must be {SHARD_FORM}, got {text!r}")
        return cls(index=int(match.group(1)), count=int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, target: Target) -> bool:
        # One shard owns everything without hashing: the unsharded path stays as it was.
        return self.count == 1 or shard_of(target_address(target), self.count) == self.index


@dataclass(frozen=True)
class ShardSelection:
    """What a shard kept of the targets listed to every shard."""

    shard: Shard
    kept: tuple[Target, ...]
    listed: int

    def summary(self) -> str:
        return f"shard {self.shard}: {len(self.kept)} of {self.listed} listed targets"

    def to_json(self) -> dict[str, int | str]:
        return {
            "shard": str(self.shard),
            "index": self.shard.index,
            "count": self.shard.count,
            "targets_kept": len(self.kept),
            "targets_listed": self.listed,
        }


def select_shard(targets: Iterable[Target], shard: Shard) -> ShardSelection:
    """The targets `shard` scrapes, in their listed order, and how many were listed."""
    listed = list(targets)
    return ShardSelection(
        shard=shard, kept=tuple(t for t in listed if shard.owns(t)), listed=len(listed)
    )
