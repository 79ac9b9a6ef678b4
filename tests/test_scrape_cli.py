"""`servewatch scrape --once` against real local HTTP endpoints: a live page and a dead target."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from tests.conftest import FIXTURES

PAGE = (FIXTURES / "samples" / "vllm_metrics_production-stack-issue-617.txt").read_bytes()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_scrape_once_stores_the_live_page_and_records_the_dead_target(
    endpoint: str, tmp_path: Path, runner: CliRunner
) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f"""
[store]
path = "fleet.duckdb"

[scrape]
interval_s = 15
timeout_s = 2

[[targets]]
kind = "vllm"
url = "{endpoint}"
replica = "vllm-0"
host = "host-a"

[[targets]]
kind = "vllm"
url = "http://127.0.0.1:{free_port()}/metrics"
replica = "vllm-1"
""",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once", "--json"])
    assert result.exit_code == 0, result.output
    (round_,) = json.loads(result.stdout)["rounds"]
    assert round_["pages"] == 2
    assert round_["stored_samples"] > 0
    (failed,) = round_["failed_scrapes"]
    assert failed["source"] != endpoint  # the source is the dead target's id (its URL)
    assert failed["message"].startswith("ConnectError")
    assert (tmp_path / "fleet.duckdb").exists()


def test_scrape_without_targets_is_a_usage_error(tmp_path: Path, runner: CliRunner) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text("[scrape]\ninterval_s = 15\n", encoding="utf-8")
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
    assert result.exit_code == 2
    assert "no targets" in result.stderr
