"""The docs name what exists: every table and column of docs/schema.md is in the store and
every one of the store is there; docs/cli.md is the command reference as the commands are."""

from __future__ import annotations

import re

from servewatch.cli.reference import reference
from servewatch.store import Store
from servewatch.store.migrations import LATEST_VERSION
from tests.conftest import REPO_ROOT

SCHEMA_DOC = REPO_ROOT / "docs" / "schema.md"


def documented_tables() -> dict[str, set[str]]:
    """Table name -> columns, from each `## name` section's `| column | type | meaning |` table
    (a cell may name several columns, comma-separated)."""
    tables: dict[str, set[str]] = {}
    current: str | None = None
    for line in SCHEMA_DOC.read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"## (\w+)", line)
        if heading:
            current = heading.group(1)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None or not line.startswith("|") or cells[0] in {"column", "---"}:
            continue
        tables.setdefault(current, set()).update(
            name.strip().strip("`") for name in cells[0].split(",")
        )
    return tables


def test_every_table_and_column_of_the_store_is_documented_and_no_other() -> None:
    with Store.open(":memory:") as store:
        stored = {table: set(columns) for table, columns in store.tables().items()}
    documented = documented_tables()
    assert sorted(documented) == sorted(stored)
    for table, columns in stored.items():
        assert documented[table] == columns, table


def test_the_schema_doc_names_the_current_version() -> None:
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    assert f"Current version: **{LATEST_VERSION}**" in text


def test_the_command_reference_is_the_commands() -> None:
    on_file = (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert on_file == reference(), (
        "docs/cli.md is out of date: python -m servewatch.cli.reference > docs/cli.md"
    )
