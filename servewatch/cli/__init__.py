"""The `servewatch` command line: a thin layer of argument parsing over the library.

Exit codes: 0 ok, 1 failure, 2 usage or bad input. Reporting commands take `--json` and then
print exactly one JSON document on stdout; progress and messages go to stderr. One module per
command group registers its commands on `app` (servewatch/cli/app.py) when imported here.
"""

from servewatch.cli import (  # noqa: F401 (imported to register their commands)
    capacity,
    compact,
    emulator,
    export,
    grafana,
    health,
    imports,
    ingest,
    report,
    rules,
    scrape,
    service,
    sli,
    slo,
    status,
)
from servewatch.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
