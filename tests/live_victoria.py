"""Test helpers: a single-node VictoriaMetrics scraping a live emulated fleet, and vmalert
evaluating rule files against it and writing what it records back into it.

VictoriaMetrics itself evaluates no rules: vmalert queries it (`-datasource.url`) at every
evaluation and remote-writes the results (`-remoteWrite.url`). Both listen on free 127.0.0.1
ports, keep their data under the test's directory and stop when their context ends.

Flags that matter for comparing values: `-search.latencyOffset=0s` (by default the newest
30 s are hidden from queries, so a rule would read half a minute late), `-search.disableCache`
(a cached rollup over recent data could answer an older result), and vmalert's
`-remoteWrite.flushInterval` (5 s by default), shortened so recorded series appear soon.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port, require_program
from tests.live_prometheus import served


@contextmanager
def running_victoria_metrics(
    workdir: Path, jobs: list[dict[str, Any]], *, scrape_interval_s: float = 1.0
) -> Iterator[httpx.Client]:
    """A VictoriaMetrics on a free 127.0.0.1 port scraping `jobs` (Prometheus scrape configs);
    the client's base URL is its Prometheus-compatible API root."""
    binary = require_program("victoria-metrics")
    interval_ms = round(scrape_interval_s * 1000)
    config = {
        "global": {
            "scrape_interval": f"{interval_ms}ms",
            "scrape_timeout": f"{interval_ms * 9 // 10}ms",
        },
        "scrape_configs": jobs,
    }
    config_path = workdir / "victoria-scrape.yml"
    config_path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    port = free_port()
    argv = [
        binary,
        f"-storageDataPath={workdir / 'victoria-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-promscrape.config={config_path}",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-retentionPeriod=1d",
        "-loggerLevel=WARN",
    ]
    with served("victoria-metrics", argv, port=port, ready_path="/health", workdir=workdir) as vm:
        yield vm


@contextmanager
def running_vmalert(
    workdir: Path,
    victoria: httpx.Client,
    rule_files: Sequence[Path],
    *,
    evaluation_interval_s: float = 1.0,
) -> Iterator[httpx.Client]:
    """vmalert on a free 127.0.0.1 port evaluating `rule_files` against the VictoriaMetrics
    `victoria` talks to and remote-writing the recorded series into it; the client's base URL
    is vmalert's own API (`/api/v1/rules`)."""
    binary = require_program("vmalert")
    port = free_port()
    datasource = str(victoria.base_url).rstrip("/")
    argv = [
        binary,
        *(f"-rule={path}" for path in rule_files),
        f"-datasource.url={datasource}",
        f"-remoteWrite.url={datasource}",
        "-remoteWrite.flushInterval=200ms",
        f"-evaluationInterval={round(evaluation_interval_s * 1000)}ms",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]
    with served("vmalert", argv, port=port, ready_path="/health", workdir=workdir) as client:
        yield client


def vmalert_rules(client: httpx.Client) -> list[dict[str, Any]]:
    """Every rule vmalert has loaded, as its `/api/v1/rules` lists them (name, query, health,
    lastError, ...), group by group."""
    body = client.get("/api/v1/rules").json()
    assert body["status"] == "success", body
    return [rule for group in body["data"]["groups"] for rule in group["rules"]]
