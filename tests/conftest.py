"""Shared test helpers: stores, the CLI runner, golden files and external programs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.store import Store

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="Rewrite expected outputs of fixture cases instead of comparing against them.",
    )


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
