"""The design's floors: imports run downward only, and only the store holds SQL connections."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

# What each package may import from the project (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "pipeline": set(),
    "collectors": {"pipeline"},
    "slo": {"pipeline"},
    "dashboards": {"pipeline"},
    "capacity": {"slo", "pipeline", "emulator"},  # capacity/ drives the emulator as a simulator
    "emulator": set(),
    "servewatch": {"collectors", "pipeline", "slo", "capacity", "dashboards", "emulator"},
}
NETWORK_MODULES = {"httpx", "socket", "http", "urllib", "requests", "aiohttp"}
NETWORK_ALLOWED = {"collectors", "emulator", "servewatch"}
# The design gives slo/ the Alertmanager notification: that one module may speak HTTP, through
# an injected client.
NETWORK_MODULES_ALLOWED = {REPO_ROOT / "slo" / "alertmanager.py"}


def project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def package_files(package: str) -> list[Path]:
    return sorted((REPO_ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_downward_only(package: str) -> None:
    project = set(ALLOWED)
    for path in package_files(package):
        used = project_imports(path) & project
        wrong = used - ALLOWED[package] - {package}
        assert not wrong, f"{path.relative_to(REPO_ROOT)} imports {sorted(wrong)} (floor rule)"


def test_only_the_store_opens_sql_connections() -> None:
    for package in ALLOWED:
        for path in package_files(package):
            if path == REPO_ROOT / "pipeline" / "store.py":
                continue
            assert "duckdb" not in project_imports(path), f"{path} imports duckdb"


@pytest.mark.parametrize("package", sorted(set(ALLOWED) - NETWORK_ALLOWED))
def test_analytics_packages_do_not_touch_the_network(package: str) -> None:
    for path in package_files(package):
        if path in NETWORK_MODULES_ALLOWED:
            continue
        used = project_imports(path) & NETWORK_MODULES
        assert not used, f"{path.relative_to(REPO_ROOT)} imports {sorted(used)}"
