"""The command reference (docs/cli.md), generated from the commands themselves.

`python -m servewatch.cli.reference > docs/cli.md` rewrites it; a test holds the file equal to
what this prints, so every command and option is documented and nothing documented is gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from servewatch.cli import app

HEADER = """# Command reference

Every `servewatch` command and option, generated from the commands themselves
(`python -m servewatch.cli.reference > docs/cli.md`; a test holds this file to it). `--help` on
any command prints the same with the full description. Global options go before the command:
`servewatch --db fleet.duckdb sli`.
"""


def _leaves(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path, command
        return
    for name in command.list_commands(None):
        sub = subcommands[name]
        if not sub.hidden:
            yield from _leaves(sub, (*path, name))


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _options(command: Any) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            name = f"`{(param.metavar or param.name).upper()}`"
        else:
            name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        rows.append(f"| {name} | {_cell(getattr(param, 'help', None))} |")
    return rows


def reference() -> str:
    """docs/cli.md as the commands are now."""
    root = typer.main.get_command(app)
    lines = [HEADER, "## servewatch", "", _cell(root.help), "", "| option | meaning |", "|---|---|"]
    lines += _options(root)
    for path, command in _leaves(root, ()):
        lines += ["", f"## servewatch {' '.join(path)}", ""]
        lines += [_cell(command.get_short_help_str(limit=10_000)), ""]
        rows = _options(command)
        lines += ["| argument or option | meaning |", "|---|---|", *rows] if rows else []
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")  # noqa: T201 (the reference is this module's output)
