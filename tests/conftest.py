"""Shared test helpers: stores, the CLI runner, golden files and external programs."""

from __future__ import annotations

import os
import random
import shutil
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.store import Store

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="Rewrite expected outputs of fixture cases instead of comparing against them.",
    )
    parser.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        help="Run the tests in an order shuffled by this seed, to show none depends on another.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("--shuffle-seed")
    if seed is not None:
        random.Random(seed).shuffle(items)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle-seed")
    return None if seed is None else f"test order shuffled with --shuffle-seed {seed}"


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def store() -> Iterator[Store]:
    with Store.open(":memory:") as opened:
        yield opened


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def require_program(name: str) -> str:
    """Path of an external program a test needs.

    Missing on a developer's machine: the test is skipped with the reason. Missing under CI
    (environment variable CI set): the test fails, so CI can never pass by skipping.
    """
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}, and CI must run this test")
        pytest.skip(message)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


SAMPLE_PAGE = (FIXTURES / "samples" / "vllm_metrics_production-stack-issue-617.txt").read_bytes()


@contextmanager
def serving_pages(pages: Mapping[str, bytes]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering GET `path` with `pages[path]` as a text
    exposition page; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def endpoint() -> Iterator[str]:
    """A real /metrics endpoint on 127.0.0.1 serving the captured vLLM page."""
    with serving_pages({"/metrics": SAMPLE_PAGE}) as base_url:
        yield f"{base_url}/metrics"


def stored_tables(db: Path | str) -> dict[str, pl.DataFrame]:
    """Every ingested table of the store at `db` (requests without their ingest time), for
    comparing a store before and after a second ingest of the same input."""
    with Store.open(db) as store:
        return {
            "targets": store.read_targets().collect(),
            "scrapes": store.read_scrapes().collect(),
            "series": store.read_series().collect(),
            "points": store.read_points().collect(),
            "requests": store.read_requests().collect().drop("ingested_ts"),
            "unknown_families": store.read_unknown_families().collect(),
        }
