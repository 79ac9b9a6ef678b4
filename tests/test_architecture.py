"""The floors: imports run downward only, and only the store holds SQL connections.

Every room installs below the one top-level name `servewatch` (`servewatch.pipeline`, ...); the
shell is the rest of `servewatch/`. A room is named here by its folder at the top of the tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SHELL = "servewatch"
# The floors, bottom up: a module may import from the floors below its own (and from its own
# room), never from its floor or above. The emulator imports nothing of the project; capacity/
# drives it as a simulator.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"pipeline", "emulator"}),
    frozenset({"store", "health"}),
    frozenset({"collectors", "slo", "dashboards"}),
    frozenset({"capacity"}),
    frozenset({SHELL}),
)
ALLOWED: dict[str, set[str]] = {
    room: set().union(*FLOORS[:level]) for level, floor in enumerate(FLOORS) for room in floor
}
ROOMS = set(ALLOWED) - {SHELL}
NETWORK_MODULES = {"httpx", "socket", "http", "urllib", "requests", "aiohttp"}
NETWORK_ALLOWED = {"collectors", "emulator", SHELL}
# The design gives slo/ the Alertmanager notification: that one module may speak HTTP, through
# an injected client.
NETWORK_MODULES_ALLOWED = {REPO_ROOT / "slo" / "alertmanager.py"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def project_imports(path: Path) -> set[str]:
    """The rooms (or the shell) a file imports, and the outside top-level names it imports."""
    names: set[str] = set()
    for module in imported_modules(path):
        parts = module.split(".")
        if parts[0] == SHELL:
            names.add(parts[1] if len(parts) > 1 and parts[1] in ROOMS else SHELL)
        else:
            names.add(parts[0])
    return names


def package_files(package: str) -> list[Path]:
    if package == SHELL:  # the shell's own modules, not the rooms linked below it
        return sorted(
            path
            for path in (REPO_ROOT / SHELL).rglob("*.py")
            if path.relative_to(REPO_ROOT / SHELL).parts[0] not in ROOMS
        )
    return sorted((REPO_ROOT / package).rglob("*.py"))


def test_every_room_is_installed_below_servewatch() -> None:
    for room in ROOMS:
        link = REPO_ROOT / SHELL / room
        assert link.is_symlink(), f"{link} should link to ../{room}"
        assert link.resolve() == (REPO_ROOT / room).resolve()


@pytest.mark.parametrize("folder", sorted([*ALLOWED, "tests", "bench", "fixtures"]))
def test_no_room_is_imported_by_a_top_level_name(folder: str) -> None:
    # From the top of the tree `import pipeline` would still resolve, as a second copy of
    # every module beside `servewatch.pipeline`.
    for path in package_files(folder):
        top = {module.split(".")[0] for module in imported_modules(path)}
        assert not top & ROOMS, f"{path.relative_to(REPO_ROOT)} imports {sorted(top & ROOMS)}"


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
            if package == "store":
                continue
            assert "duckdb" not in project_imports(path), f"{path} imports duckdb"


@pytest.mark.parametrize("package", sorted(set(ALLOWED) - NETWORK_ALLOWED))
def test_analytics_packages_do_not_touch_the_network(package: str) -> None:
    for path in package_files(package):
        if path in NETWORK_MODULES_ALLOWED:
            continue
        used = project_imports(path) & NETWORK_MODULES
        assert not used, f"{path.relative_to(REPO_ROOT)} imports {sorted(used)}"


MAX_MODULE_LINES = 520  # about 500: a few lines of slack, not a second budget


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_module_over_500_lines_says_why(package: str) -> None:
    for path in package_files(package):
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert "Size: over 500 lines on purpose:" in doc, (
            f"{path.relative_to(REPO_ROOT)} has {lines} lines: split it, or say in its "
            "docstring why it is one module (a paragraph starting 'Size: over 500 lines on "
            "purpose:')"
        )
