"""`servewatch.toml`: the one configuration file, loaded into typed, validated settings.

Every validation error names the file and the dotted path of the bad field, what was found and
what is allowed. Unknown keys are errors too: a misspelt option silently ignored is worse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servewatch.collectors.metrics.drop_rules import DropRuleError, DropRules
from servewatch.collectors.scrape.shards import SHARD_FORM, Shard
from servewatch.collectors.scrape.targets import (
    TARGET_FIELDS,
    Target,
    TargetError,
    check_scrape_url,
    gpu_count,
    gpu_uuid_list,
    target_from_labels,
)
from servewatch.collectors.traces.receiver import ReceiverConfig
from servewatch.collectors.traces.request_spans import SpanMapping
from servewatch.slo.fields import Fields, read_toml


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where and why."""


@dataclass(frozen=True)
class ScrapeSettings:
    interval_s: float = 15.0
    timeout_s: float = 10.0
    keep_uncatalogued: bool = True
    drop: DropRules = field(default_factory=DropRules)  # families not to store
    failing_after: int = 3  # failed scrapes in a row before a target counts as failing
    shard: Shard = field(default_factory=Shard)  # which targets this collector scrapes


@dataclass(frozen=True)
class SloSettings:
    files: tuple[Path, ...] = ()
    alertmanager_url: str | None = None
    webhook_url: str | None = None


@dataclass(frozen=True)
class JobSettings:
    """Optional service jobs: report export every N minutes, a daily recommendation."""

    report_dir: Path | None = None
    report_every_minutes: float = 15.0
    requirement: Path | None = None
    recommend_at_utc: str = "06:00"


@dataclass(frozen=True)
class ApiSettings:
    """The `run` service's page, API and /metrics: with a token, 401 without it (not /healthz)."""

    bearer_token: str | None = None


@dataclass(frozen=True)
class Config:
    source: Path | None
    store_path: Path = Path("servewatch.duckdb")
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    targets: tuple[Target, ...] = ()
    file_sd: tuple[Path, ...] = ()
    otlp: ReceiverConfig = field(default_factory=ReceiverConfig)
    slo: SloSettings = field(default_factory=SloSettings)
    jobs: JobSettings = field(default_factory=JobSettings)
    api: ApiSettings = field(default_factory=ApiSettings)


class _Section(Fields):
    """A TOML table of `servewatch.toml` being read."""

    error = ConfigError
    mapping_word = "table"
    key_word = "setting"


def _relative(base: Path | None, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() or base is None else base.parent / path


def _listen(section: _Section, key: str, default: tuple[str, int]) -> tuple[str, int]:
    text = section.text(key)
    if text is None:
        return default
    host, _, port_text = text.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        example = f"127.0.0.1:{default[1]}"
        raise section.fail(key, f"must be HOST:PORT such as {example}, got {text!r}")
    return host, int(port_text)


# RFC 6750 b64token (token68), what a client may send after "Bearer ": 1+ token characters,
# then = padding.
_TOKEN68 = re.compile(r"([A-Za-z0-9._~+/-]*)=*")


def _bearer_token(section: _Section) -> str | None:
    """A bearer token (OTLP's, the API's), refused unless every client can send it in a
    header; the error says where the token goes wrong, never what it is."""
    token = section.text("bearer_token")
    if token is None:
        return None
    valid = _TOKEN68.match(token)
    assert valid is not None  # every part of the pattern may match nothing
    if valid.group(1) and valid.end() == len(token):
        return token
    at = valid.end() if valid.group(1) else 0
    raise section.fail(
        "bearer_token",
        "must be printable ASCII in RFC 6750 token form (letters, digits, - . _ ~ + /, then "
        f"optional = padding); character {at + 1} is not allowed there",
    )


def _target(section: _Section, scrape: ScrapeSettings) -> Target:
    """One inline [[targets]] entry; `interval_s` and `timeout_s` override the scrape settings
    for this target (a timeout longer than the target's interval is refused)."""
    labels = {k: section.raw(k) for k in TARGET_FIELDS}
    url = section.text("url")
    if url is None:
        raise section.fail("url", "is required (the target's /metrics URL)")
    interval_s = section.positive_number("interval_s", default=0.0) or None
    timeout_s = section.positive_number("timeout_s", default=0.0) or None
    if timeout_s is not None and timeout_s > (interval_s or scrape.interval_s):
        raise section.fail(
            "timeout_s",
            f"must not exceed the target's interval ({interval_s or scrape.interval_s:g} s)",
        )
    labels["__scrape_interval__"] = interval_s
    labels["__scrape_timeout__"] = timeout_s
    section.done()
    # Checked here too, so that the error names the field (target_from_labels names labels).
    try:
        check_scrape_url(url)
    except ValueError as exc:
        raise section.fail("url", str(exc)) from exc
    try:
        if labels["gpus"] is not None:
            gpu_count(labels["gpus"])
    except ValueError as exc:
        raise section.fail("gpus", str(exc)) from exc
    try:
        if labels["gpu_uuids"] is not None:
            gpu_uuid_list(labels["gpu_uuids"])
    except ValueError as exc:
        raise section.fail("gpu_uuids", str(exc)) from exc
    try:
        return target_from_labels(url, labels, where=f"{section.where}: {section.path}")
    except TargetError as exc:
        raise ConfigError(str(exc)) from exc


def _drop_rules(section: _Section) -> DropRules:
    try:
        return DropRules.parse(section.strings("drop") or (), where=f"{section.where}: scrape.drop")
    except DropRuleError as exc:
        raise ConfigError(str(exc)) from exc


def _shard(section: _Section) -> Shard:
    value = section.raw("shard")
    if value is None:
        return Shard()
    if not isinstance(value, str):
        raise section.fail("shard", f"must be a string {SHARD_FORM}, got {value!r}")
    try:
        return Shard.parse(value)
    except ValueError as exc:
        raise section.fail("shard", str(exc)) from exc


def parse_config(data: Mapping[str, Any], *, source: Path | None) -> Config:
    where = str(source) if source else "configuration"
    root = _Section(data, where=where)

    store = root.table("store")
    store_path = _relative(source, store.text("path") or "servewatch.duckdb")
    store.done()

    scrape_section = root.table("scrape")
    scrape = ScrapeSettings(
        interval_s=scrape_section.positive_number("interval_s", default=15.0),
        timeout_s=scrape_section.positive_number("timeout_s", default=10.0),
        keep_uncatalogued=scrape_section.flag("keep_uncatalogued", default=True),
        drop=_drop_rules(scrape_section),
        failing_after=scrape_section.whole("failing_after", default=3, minimum=1),
        shard=_shard(scrape_section),
    )
    scrape_section.done()
    if scrape.timeout_s > scrape.interval_s:
        raise scrape_section.fail("timeout_s", "must not exceed scrape.interval_s")

    targets = [_target(section, scrape) for section in root.items("targets")]

    file_sd = []
    for section in root.items("file_sd"):
        path = section.text("path")
        if path is None:
            raise section.fail("path", "is required (a Prometheus file_sd JSON or YAML file)")
        file_sd.append(_relative(source, path))
        section.done()

    otlp_section = root.table("otlp")
    defaults = ReceiverConfig()
    host, port = _listen(otlp_section, "listen", (defaults.host, defaults.port))
    grpc_host, grpc_port = _listen(
        otlp_section, "grpc_listen", (defaults.grpc_host, defaults.grpc_port)
    )
    mapping_section = otlp_section.table("mapping")
    mapping_defaults = SpanMapping()
    mapping = SpanMapping(
        span_name=mapping_section.text("span_name") or mapping_defaults.span_name,
        replica_keys=mapping_section.strings("replica_keys") or mapping_defaults.replica_keys,
        host_keys=mapping_section.strings("host_keys") or mapping_defaults.host_keys,
        process_keys=mapping_section.strings("process_keys") or mapping_defaults.process_keys,
        namespace_keys=mapping_section.strings("namespace_keys") or mapping_defaults.namespace_keys,
        fallback_replica_keys=mapping_section.strings("fallback_replica_keys")
        or mapping_defaults.fallback_replica_keys,
        replica_per_process=mapping_section.flag(
            "replica_per_process", default=mapping_defaults.replica_per_process
        ),
        zone_keys=mapping_section.strings("zone_keys") or mapping_defaults.zone_keys,
        model_keys=mapping_section.strings("model_keys") or mapping_defaults.model_keys,
        pool_keys=mapping_section.strings("pool_keys") or mapping_defaults.pool_keys,
        tenant_keys=mapping_section.strings("tenant_keys") or mapping_defaults.tenant_keys,
        conversation_keys=mapping_section.strings("conversation_keys")
        or mapping_defaults.conversation_keys,
        adapter_keys=mapping_section.strings("adapter_keys") or mapping_defaults.adapter_keys,
        default_model=mapping_section.text("default_model") or mapping_defaults.default_model,
    )
    mapping_section.done()
    otlp = ReceiverConfig(
        host=host,
        port=port,
        max_body_bytes=otlp_section.positive_whole(
            "max_body_bytes", default=defaults.max_body_bytes
        ),
        bearer_token=_bearer_token(otlp_section),
        mapping=mapping,
        read_timeout_s=otlp_section.positive_number(
            "read_timeout_s", default=defaults.read_timeout_s
        ),
        max_connections=otlp_section.positive_whole(
            "max_connections", default=defaults.max_connections
        ),
        commit_timeout_s=otlp_section.positive_number(
            "commit_timeout_s", default=defaults.commit_timeout_s
        ),
        grpc_enabled=otlp_section.flag("grpc", default=defaults.grpc_enabled),
        grpc_host=grpc_host,
        grpc_port=grpc_port,
    )
    otlp_section.done()

    slo_section = root.table("slo")
    slo = SloSettings(
        files=tuple(_relative(source, f) for f in slo_section.strings("files") or ()),
        alertmanager_url=slo_section.text("alertmanager_url"),
        webhook_url=slo_section.text("webhook_url"),
    )
    slo_section.done()

    jobs_section = root.table("jobs")
    report_dir = jobs_section.text("report_dir")
    requirement = jobs_section.text("requirement")
    recommend_at = jobs_section.text("recommend_at_utc") or "06:00"
    hour, _, minute = recommend_at.partition(":")
    if not (hour.isdigit() and minute.isdigit() and int(hour) < 24 and int(minute) < 60):
        raise jobs_section.fail("recommend_at_utc", f"must be HH:MM, got {recommend_at!r}")
    jobs = JobSettings(
        report_dir=None if report_dir is None else _relative(source, report_dir),
        report_every_minutes=jobs_section.positive_number("report_every_minutes", default=15.0),
        requirement=None if requirement is None else _relative(source, requirement),
        recommend_at_utc=recommend_at,
    )
    jobs_section.done()
    api_section = root.table("api")
    api = ApiSettings(bearer_token=_bearer_token(api_section))
    api_section.done()
    root.done()
    return Config(
        source=source,
        store_path=store_path,
        scrape=scrape,
        targets=tuple(targets),
        file_sd=tuple(file_sd),
        otlp=otlp,
        slo=slo,
        jobs=jobs,
        api=api,
    )


def load_config(path: Path, *, shard: Shard | None = None) -> Config:
    """The file's configuration; `shard` (the `--shard` option) in place of `scrape.shard`."""
    config = parse_config(read_toml(path, error=ConfigError), source=path)
    return config if shard is None else replace(config, scrape=replace(config.scrape, shard=shard))
