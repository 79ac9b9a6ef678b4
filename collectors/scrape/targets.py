"""Scrape targets: what to scrape and which replica, host and zone each one speaks for.

Targets come inline from the config or from Prometheus `file_sd` files (JSON or YAML lists of
`{"targets": ["host:port", ...], "labels": {...}}`). Labels servewatch reads: `kind` (vllm,
dcgm, sglang, trtllm, tgi, llamacpp, or auto, the default: told from each page), `replica`,
`host`, `zone`, `model`, `pool`, `gpus`, `gpu_uuids` (the UUIDs of the replica's GPUs, comma
separated: what its CUDA_VISIBLE_DEVICES names, for replicas that share a host without
Kubernetes' pod mapping), `pod` and `namespace` (which name the replica `<namespace>/<pod>`),
and Prometheus's own `__scheme__`, `__metrics_path__`, `__scrape_interval__` and
`__scrape_timeout__` (a target's own interval and timeout, as Prometheus durations such as
`30s` or `1m`, or numbers of seconds). A file that stops parsing keeps its last good list in
use, as Prometheus does, and the error is reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import polars as pl
import yaml

from servewatch.pipeline.tables import TARGETS_SCHEMA


class TargetKind(Enum):
    """What serves a target's page; AUTO: told from each page's families (`page_kind`)."""

    VLLM = "vllm"
    DCGM = "dcgm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TGI = "tgi"
    LLAMACPP = "llamacpp"
    GATEWAY = "gateway"  # an inference gateway's endpoint picker (EPP)
    AUTO = "auto"


class TargetError(ValueError):
    """A target definition is not usable; the message names the file or field."""


@dataclass(frozen=True)
class Target:
    target_id: str
    kind: TargetKind
    url: str
    replica: str | None = None
    host: str | None = None
    zone: str | None = None
    model: str | None = None
    pool: str | None = None
    gpus: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    interval_s: float | None = None  # None: the configured scrape interval
    timeout_s: float | None = None  # None: the configured scrape timeout


# What a target says of itself: its config fields and file_sd labels alike.
TARGET_FIELDS = (
    "kind",
    "replica",
    "host",
    "zone",
    "model",
    "pool",
    "gpus",
    "gpu_uuids",
    "pod",
    "namespace",
)

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
_DURATION_UNITS_S = (3600.0, 60.0, 1.0, 0.001)


def duration_s(value: object, *, where: str) -> float:
    """Seconds from a number or a Prometheus duration (`15s`, `1m30s`, `500ms`); positive."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value and (match := _DURATION.fullmatch(value)):
        seconds = sum(
            float(part) * unit
            for part, unit in zip(match.groups(), _DURATION_UNITS_S, strict=True)
            if part
        )
    if seconds is None or not seconds > 0:
        raise TargetError(
            f"{where}: must be a positive number of seconds or a duration such as 15s, 1m or "
            f"500ms, got {value!r}"
        )
    return seconds


def gpu_count(value: object) -> int:
    """A positive whole number of GPUs, from a config number or a label string."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value)
    else:
        count = 0
    if count <= 0:
        raise ValueError(f"must be a positive whole number, got {value!r}")
    return count


def gpu_uuid_list(value: object) -> tuple[str, ...]:
    """GPU UUIDs from a config list of strings or a comma-separated label string, in the form
    `nvidia-smi -L` and dcgm-exporter's `UUID` label show (`GPU-` and hex groups)."""
    if isinstance(value, str):
        items: list[object] = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(  # noqa: TRY004 (callers report every bad value as a ValueError)
            f"must be a list of GPU UUIDs or a comma-separated string, got {value!r}"
        )
    uuids: list[str] = []
    for item in items:
        if not isinstance(item, str) or _GPU_UUID.fullmatch(item) is None:
            raise ValueError(
                f"must hold GPU UUIDs such as GPU-5d1c2a3b-0f2e-4b6a-9c1d-2e3f4a5b6c7d "
                f"(`nvidia-smi -L` lists them), got {item!r}"
            )
        uuids.append(item)
    return tuple(uuids)


_GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*")


def check_scrape_url(url: str) -> None:
    """Raise ValueError unless `url` can be scraped: http or https, with a host."""
    try:
        parts = urlsplit(url)
        usable = parts.scheme in {"http", "https"} and bool(parts.hostname)
        parts.port  # noqa: B018 (raises ValueError on a port out of range)
    except ValueError:
        usable = False
    if not usable:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {url!r}")


def target_from_labels(address: str, labels: Mapping[str, Any], *, where: str) -> Target:
    """One target from an address (`host:port` or a full URL) and its labels."""
    kind_text = labels.get("kind") or TargetKind.AUTO.value
    try:
        kind = TargetKind(kind_text)
    except ValueError as exc:
        allowed = ", ".join(k.value for k in TargetKind)
        raise TargetError(f"{where}: label kind is {kind_text!r}; allowed: {allowed}") from exc
    if not isinstance(address, str) or not address:
        raise TargetError(f"{where}: target address must be a non-empty string, got {address!r}")
    if "://" in address:
        url = address
    else:
        scheme = str(labels.get("__scheme__", "http"))
        path = str(labels.get("__metrics_path__", "/metrics"))
        url = f"{scheme}://{address}{path if path.startswith('/') else '/' + path}"
    try:
        check_scrape_url(url)
    except ValueError as exc:
        raise TargetError(f"{where}: target URL {exc}") from exc
    gpus_value = labels.get("gpus")
    try:
        gpus = None if gpus_value is None else gpu_count(gpus_value)
    except ValueError as exc:
        raise TargetError(f"{where}: label gpus {exc}") from exc
    uuids_value = labels.get("gpu_uuids")
    try:
        gpu_uuids = () if uuids_value in (None, "") else gpu_uuid_list(uuids_value)
    except ValueError as exc:
        raise TargetError(f"{where}: label gpu_uuids {exc}") from exc

    def text(name: str) -> str | None:
        value = labels.get(name)
        return None if value is None or value == "" else str(value)

    def seconds(name: str) -> float | None:
        value = labels.get(name)
        return None if value is None or value == "" else duration_s(value, where=f"{where}: {name}")

    interval_s = seconds("__scrape_interval__")
    timeout_s = seconds("__scrape_timeout__")
    if interval_s is not None and timeout_s is not None and timeout_s > interval_s:
        raise TargetError(
            f"{where}: __scrape_timeout__ ({timeout_s:g} s) must not exceed "
            f"__scrape_interval__ ({interval_s:g} s)"
        )

    return Target(
        target_id=url,
        kind=kind,
        url=url,
        replica=_replica(
            text("replica"), pod=text("pod"), namespace=text("namespace"), where=where
        ),
        host=text("host"),
        zone=text("zone"),
        model=text("model"),
        pool=text("pool"),
        gpus=gpus,
        gpu_uuids=gpu_uuids,
        interval_s=interval_s,
        timeout_s=timeout_s,
    )


def _replica(
    replica: str | None, *, pod: str | None, namespace: str | None, where: str
) -> str | None:
    """The replica a target speaks for. Labels `pod` and `namespace` name it
    `<namespace>/<pod>`, the form in which the store keeps a replica's pod for matching GPUs
    that dcgm-exporter's Kubernetes mapping labels with it (pipeline/gpu_attribution.py)."""
    if pod is None and namespace is None:
        return replica
    if pod is None or namespace is None:
        given, missing = ("pod", "namespace") if pod is not None else ("namespace", "pod")
        raise TargetError(
            f"{where}: label {given} needs label {missing} too: a pod is named within its namespace"
        )
    named = f"{namespace}/{pod}"
    if replica is not None and replica != named:
        raise TargetError(
            f"{where}: label replica {replica!r} contradicts labels pod and namespace, which "
            f"name the replica {named!r}; give one or the other"
        )
    return named


def parse_file_sd(text: str, *, source: str) -> list[Target]:
    """Targets of one file_sd document (JSON, or YAML, which is a superset)."""
    try:
        doc = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise TargetError(
            f"{source}: not valid {'JSON' if source.endswith('.json') else 'YAML'}: {exc}"
        ) from exc
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise TargetError(f"{source}: expected a list of target groups, got {type(doc).__name__}")
    targets: list[Target] = []
    for g, group in enumerate(doc):
        where = f"{source}: [{g}]"
        if not isinstance(group, dict):
            raise TargetError(f"{where}: expected an object with targets and labels")
        addresses = group.get("targets")
        labels = group.get("labels") or {}
        if not isinstance(addresses, list):
            raise TargetError(f"{where}.targets: expected a list of addresses")
        if not isinstance(labels, dict):
            raise TargetError(f"{where}.labels: expected an object")
        targets.extend(
            target_from_labels(address, labels, where=f"{where}.targets[{i}]")
            for i, address in enumerate(addresses)
        )
    return targets


@dataclass
class FileSdSource:
    """One file_sd file, re-read when it changes; the last good target list survives errors."""

    path: Path
    targets: list[Target] = field(default_factory=list)
    error: str | None = None
    _mtime_ns: int | None = None

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when the target list changed."""
        try:
            mtime_ns = self.path.stat().st_mtime_ns
            if mtime_ns == self._mtime_ns:
                return False
            text = self.path.read_text(encoding="utf-8")
            fresh = parse_file_sd(text, source=str(self.path))
        except OSError as exc:
            self.error = f"{self.path}: cannot read: {exc.strerror or exc}"
            return False
        except TargetError as exc:
            self._mtime_ns = mtime_ns
            self.error = str(exc)
            return False
        self._mtime_ns = mtime_ns
        self.error = None
        changed = fresh != self.targets
        self.targets = fresh
        return changed


def merge_targets(groups: Sequence[Sequence[Target]]) -> list[Target]:
    """All targets, first definition of each target id winning, in a stable order."""
    seen: dict[str, Target] = {}
    for group in groups:
        for target in group:
            seen.setdefault(target.target_id, target)
    return list(seen.values())


def targets_frame(seen: Iterable[tuple[Target, datetime, datetime]]) -> pl.DataFrame:
    """`targets` rows (TARGETS_SCHEMA) for targets with the first and last time they were
    seen in a batch; the store merges the seen times with what it holds."""
    return pl.DataFrame(
        [
            (
                t.target_id,
                t.kind.value,
                t.url,
                t.replica,
                t.host,
                t.zone,
                t.model,
                t.pool,
                t.gpus,
                first,
                last,
                list(t.gpu_uuids) or None,
            )
            for t, first, last in seen
        ],
        schema=TARGETS_SCHEMA,
        orient="row",
    )
