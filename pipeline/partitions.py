"""Compacted request partitions: how a request's end time names its hourly Parquet partition,
what a compaction manifest holds, and the fingerprints that tell a changed file or partition.

Pure: names, parsing and comparisons. Reading and writing files happen at the edges
(`collectors.traces.compact`, `store.partitions`).

A partition is one UTC hour of request completions (`end_ts`), in Hive layout
`date=YYYY-MM-DD/hour=HH/` below the partitions folder, holding one file
(`PARTITION_FILE`). Keying by the end time means a minute of the rollups lies in exactly one
partition, so a partition's minutes are recomputed from that partition alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson

PARTITION_FILE = "requests.parquet"
MANIFEST_FILE = "_manifest.json"
MANIFEST_VERSION = 1
HOUR = timedelta(hours=1)
_PARTITION = re.compile(r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})")


class PartitionNameError(ValueError):
    """A folder below the partitions folder is not a `date=YYYY-MM-DD/hour=HH` partition."""


def partition_of(end_ts: datetime) -> str:
    """The partition (relative folder) of a request that ended at `end_ts` (naive UTC)."""
    return f"date={end_ts:%Y-%m-%d}/hour={end_ts:%H}"


def partition_hour(partition: str) -> datetime:
    """The first instant of a partition's hour (naive UTC)."""
    found = _PARTITION.fullmatch(partition)
    if found is None:
        raise PartitionNameError(
            f"not a partition: {partition!r}; allowed: date=YYYY-MM-DD/hour=HH"
        )
    try:
        day = datetime.strptime(found.group(1), "%Y-%m-%d")
    except ValueError as exc:
        raise PartitionNameError(f"not a partition: {partition!r}: {exc}") from exc
    hour = int(found.group(2))
    if hour > 23:
        raise PartitionNameError(f"not a partition: {partition!r}: hour {hour} is past 23")
    return day + timedelta(hours=hour)


def hour_minutes(hour_start: datetime) -> list[datetime]:
    """The 60 minutes of the hour starting at `hour_start`."""
    return [hour_start + timedelta(minutes=m) for m in range(60)]


@dataclass(frozen=True, order=True)
class FileState:
    """What tells whether a file changed: its name (or path), size and modification time."""

    name: str
    size_bytes: int
    mtime_ns: int


def fingerprint(files: Iterable[FileState], *, computed_as: str = "") -> str:
    """A short hash of a set of files (order does not matter) and of how their contents are
    used (`computed_as`: a rollup's version or its SLO criteria)."""
    text = "\n".join(
        [computed_as, *(f"{f.name}\t{f.size_bytes}\t{f.mtime_ns}" for f in sorted(files))]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Manifest:
    """The input files a partitions folder holds the spans of, by path, as they were read."""

    files: Mapping[str, FileState]

    def pending(self, found: Iterable[FileState]) -> list[FileState]:
        """The files of `found` not compacted yet or changed since (another size or mtime: a
        Collector appends to its current file), in `found`'s order."""
        return [f for f in found if self.files.get(f.name) != f]

    def with_files(self, read: Iterable[FileState]) -> Manifest:
        return Manifest({**self.files, **{f.name: f for f in read}})


EMPTY_MANIFEST = Manifest({})


class ManifestError(ValueError):
    """A manifest file is not what `manifest_json` writes."""


def manifest_json(manifest: Manifest) -> bytes:
    """The manifest as JSON, keys sorted: the same manifest gives the same bytes."""
    doc = {
        "version": MANIFEST_VERSION,
        "inputs": {
            name: {"size_bytes": f.size_bytes, "mtime_ns": f.mtime_ns}
            for name, f in sorted(manifest.files.items())
        },
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def parse_manifest(text: bytes, *, where: str) -> Manifest:
    """A manifest as `manifest_json` wrote it; anything else is a ManifestError naming `where`."""
    expected = '{"version": 1, "inputs": {PATH: {"size_bytes": N, "mtime_ns": N}}}'
    try:
        doc = orjson.loads(text)
        version = doc.get("version")
        inputs = doc["inputs"]
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ManifestError(
            f"{where}: not a compaction manifest ({exc}); expected {expected}"
        ) from exc
    if version != MANIFEST_VERSION:
        raise ManifestError(
            f"{where}: manifest version {version!r}; this servewatch reads version "
            f"{MANIFEST_VERSION}"
        )
    try:
        return Manifest(
            {
                name: FileState(name, int(entry["size_bytes"]), int(entry["mtime_ns"]))
                for name, entry in inputs.items()
            }
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ManifestError(
            f"{where}: a malformed input entry ({exc}); expected {expected}"
        ) from exc
