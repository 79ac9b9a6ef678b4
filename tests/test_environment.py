"""The programs later tests drive are present: skipped on a developer machine, failed in CI."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import require_program


@pytest.mark.parametrize(
    ("program", "args"),
    [
        ("prometheus", ["--version"]),
        ("promtool", ["--version"]),
        ("prometheus-alertmanager", ["--version"]),
        ("amtool", ["--version"]),
        ("chromium", ["--version"]),
        ("chromedriver", ["--version"]),
    ],
)
def test_external_program_runs(program: str, args: list[str]) -> None:
    path = require_program(program)
    result = subprocess.run([path, *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).strip()
