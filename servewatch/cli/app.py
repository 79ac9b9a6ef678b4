"""The command line's shared parts: the app and its groups, the global options, and the
helpers every command uses to open the store, read a window and fail with the right code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from servewatch import __version__
from servewatch.collectors.metrics.ingest import MetricIngestReport
from servewatch.collectors.scrape.shards import Shard
from servewatch.collectors.service_api import (
    TOKEN_ENV,
    Params,
    ServiceApiError,
    fetch_document,
    fetch_window,
)
from servewatch.collectors.traces.ingest import IngestReport
from servewatch.config import Config, ConfigError, load_config
from servewatch.pipeline.instants import parse_instant
from servewatch.pipeline.window import Window, WindowQuery
from servewatch.pipeline.window_union import union_windows
from servewatch.render import (
    err_console,
    labelled,
)
from servewatch.store import (
    Holder,
    SchemaTooNewError,
    Store,
    StoreBusyError,
    StoreError,
    StoreMissingError,
    StorePathError,
    damage_error,
)

EXIT_FAILURE = 1


EXIT_BAD_INPUT = 2


DEFAULT_DB = Path("servewatch.duckdb")

T = TypeVar("T")


# The order `servewatch --help` lists commands in: data in, answers out, capacity, services.
# Each module of this package registers its own commands; their import order is isort's.
COMMAND_ORDER = (
    "ingest",
    "replay",
    "record",
    "scrape",
    "import",
    "compact",
    "rollup",
    "sli",
    "slo",
    "alerts",
    "rules",
    "health",
    "report",
    "export",
    "size",
    "recommend",
    "drill",
    "run",
    "status",
    "emulate",
    "demo",
)


class Commands(TyperGroup):
    """Lists each command with the whole first sentence of its help: click's own listing cuts
    it to fit the terminal and ends it with "...", which loses text. Commands named in
    `COMMAND_ORDER` come in that order, any other after them as registered."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(super().list_commands(ctx))
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [
            (name, command.get_short_help_str(limit=sys.maxsize))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="servewatch",
    cls=Commands,
    help="Observability, SLOs and capacity for fleets of vLLM replicas.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and usage errors: wrapped at word boundaries, never cropped to the terminal,
    # and `[slo]` in a help text stays text instead of being read as rich markup.
    rich_markup_mode=None,
)


def command_group(name: str, help_text: str) -> typer.Typer:
    """A command group (`servewatch NAME ...`) listed and formatted as the root is."""
    group = typer.Typer(help=help_text, cls=Commands, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


ingest_app = command_group("ingest", "Read recorded telemetry files into the store.")
slo_app = command_group("slo", "SLOs: status, error budgets, burn rates and Prometheus rules.")
import_app = command_group("import", "Import a fleet's history from the stores it already keeps.")


@dataclass
class CliState:
    """What the global options set for one invocation. Kept on the command's context
    (`ctx.ensure_object(CliState)`), so nothing of one invocation outlives it, as module state
    would in a test runner's process; commands pass it to the helpers below."""

    dbs: tuple[Path, ...] = (DEFAULT_DB,)

    @property
    def db(self) -> Path:
        """The store a command reads or writes: the first --db (the only one, for all but the
        commands that read several)."""
        return self.dbs[0]

    @db.setter
    def db(self, path: Path) -> None:
        self.dbs = (path,)

    @property
    def stores_named(self) -> str:
        """The stores of --db, for messages."""
        return " + ".join(str(path) for path in self.dbs)

    def one_store(self) -> Path:
        """The single store of a command that reads or writes one; bad input when --db named
        several (only `sli`, `health`, `report` and `status` read the shards' stores as one)."""
        if len(self.dbs) > 1:
            raise fail(
                f"--db names {len(self.dbs)} stores ({self.stores_named}); this command reads "
                "or writes one: only `sli`, `health`, `report` and `status` read several "
                "(the stores of sharded collectors) as one",
                code=EXIT_BAD_INPUT,
            )
        return self.dbs[0]


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


FromOption = Annotated[
    str | None, typer.Option("--from", help="Start (ISO 8601 or Unix s), inclusive.")
]


ToOption = Annotated[str | None, typer.Option("--to", help="End (ISO 8601 or Unix s), exclusive.")]


VersionLabelOption = Annotated[
    str,
    typer.Option(
        "--version-label",
        help="What tells rollout versions apart: model (the served model name), or a target "
        "or series label such as pool or image.",
    ),
]


SHARD_ENV = "SERVEWATCH_SHARD"
ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        envvar=SHARD_ENV,
        metavar="I/N",
        help="Scrape only shard I of N (0 <= I < N): the targets whose address hashes to I as "
        "Prometheus' hashmod does; overrides scrape.shard of --config (env SERVEWATCH_SHARD).",
    ),
]


ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="servewatch.toml ([slo] files, store path).")
]


SloOption = Annotated[
    list[Path] | None,
    typer.Option("--slo", help="SLO spec file (servewatch, Sloth or OpenSLO); repeatable."),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"servewatch {__version__}")
        raise typer.Exit


DB_ENV = "SERVEWATCH_DB"


@app.callback()
def main_options(
    ctx: typer.Context,
    dbs: Annotated[
        list[Path] | None,
        typer.Option(
            "--db",
            help="DuckDB store file (env SERVEWATCH_DB). Commands that store data (ingest, "
            "replay, scrape, run) create it when missing; the others refuse a missing one. "
            "Repeat it to read the stores of sharded collectors as one (sli, health, report, "
            "status).",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Observability, SLOs and capacity for fleets of vLLM replicas."""
    # The variable names one store, read whole: a path may hold spaces.
    chosen = dbs or [Path(os.environ.get(DB_ENV) or DEFAULT_DB)]
    ctx.obj = CliState(dbs=tuple(chosen))


def fail(message: str, *, code: int = EXIT_FAILURE) -> typer.Exit:
    err_console.print(labelled("error:", message, style="bold red"))
    return typer.Exit(code)


def store_failure(exc: StoreError) -> typer.Exit:
    """A store that cannot be opened: bad input when the path or version is wrong."""
    if isinstance(exc, StoreMissingError):
        message = f"{exc}; `servewatch ingest` or `servewatch run` creates one"
        return fail(message, code=EXIT_BAD_INPUT)
    if isinstance(exc, SchemaTooNewError | StorePathError):
        return fail(str(exc), code=EXIT_BAD_INPUT)
    return fail(str(exc))


@contextmanager
def open_store(
    state: CliState, *, create: bool = False, read_only: bool = False
) -> Iterator[Store]:
    """The store at --db for one command. Only commands that store data create a missing one;
    reading commands open it `read_only` and write nothing; damage DuckDB finds while the
    command runs is one line and exit 1, as at open."""
    try:
        store = Store.open(state.one_store(), create=create, read_only=read_only)
    except StoreError as exc:
        raise store_failure(exc) from exc
    with _damage_is_one_line(store):
        yield store


@contextmanager
def _damage_is_one_line(store: Store) -> Iterator[None]:
    with store:
        try:
            yield
        except Exception as exc:
            damaged = damage_error(store.path, exc)
            if damaged is None:
                raise
            raise fail(str(damaged)) from exc


def _held_by(db: Path, exc: StoreBusyError) -> Holder:
    """The service holding the store, once the user is told the answer comes from it; a
    holder that serves no API (or left no note) ends the command with the refusal."""
    holder = exc.holder
    if holder is None or holder.api_url is None:
        raise store_failure(exc) from exc
    err_console.print(
        labelled(
            "note:",
            f"{db} is held by `{holder.command}` (PID {holder.pid}): reading it "
            f"through {holder.api_url}",
        )
    )
    return holder


def _api_token() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


def read_window(state: CliState, query: WindowQuery) -> Window:
    """The window of the store at --db, opened read-only; while a `servewatch run` holds the
    store, the same window read by it, through its local API. Several stores (sharded
    collectors') are each read so and joined into one window (`pipeline.window_union`)."""
    return union_windows([_read_store_window(db, query) for db in state.dbs])


def _read_store_window(db: Path, query: WindowQuery) -> Window:
    return _read_or_ask(
        db,
        lambda store: store.read_query(query),
        lambda api_url: fetch_window(api_url, query, token=_api_token()),
    )


def _read_or_ask(db: Path, read: Callable[[Store], T], ask: Callable[[str], T]) -> T:
    """`read` of the store at `db` opened read-only; while a `servewatch run` holds it,
    `ask`ed of that service's local API (its URL), once the user is told so."""
    try:
        store = Store.open(db, create=False, read_only=True)
    except StoreBusyError as exc:
        holder = _held_by(db, exc)
        assert holder.api_url is not None
        try:
            return ask(holder.api_url)
        except ServiceApiError as api_exc:
            raise fail(f"{exc}; asked instead, {api_exc}") from api_exc
    except StoreError as exc:
        raise store_failure(exc) from exc
    with _damage_is_one_line(store):
        return read(store)


def read_answer(
    state: CliState,
    read: Callable[[Store], dict[str, Any]],
    *,
    path: str,
    params: Params | None = None,
) -> dict[str, Any]:
    """A reading command's JSON document, computed by `read` on the store at --db opened
    read-only; while a `servewatch run` holds the store, the same document answered by it at
    `path` of its local API (`collectors.service_api`)."""
    return store_answer(state.one_store(), read, path=path, params=params)


def store_answer(
    db: Path,
    read: Callable[[Store], dict[str, Any]],
    *,
    path: str,
    params: Params | None = None,
) -> dict[str, Any]:
    """`read_answer` for the store at `db`, one of several a command reads."""
    return _read_or_ask(
        db, read, lambda api_url: fetch_document(api_url, path, params, token=_api_token())
    )


def instant(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise fail(f"{option}: {exc}", code=EXIT_BAD_INPUT) from exc


def limit_s(value_ms: float | None, option: str) -> float | None:
    if value_ms is None:
        return None
    if not value_ms > 0:
        raise fail(f"{option} must be a positive number of milliseconds, got {value_ms}", code=2)
    return value_ms / 1000.0


def write_file(path: Path, text: str, *, what: str) -> None:
    """Write an --out file; a folder or an unwritable path is a usage error."""
    if path.is_dir():
        raise fail(f"--out {path}: is a folder; give {what}'s path", code=EXIT_BAD_INPUT)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise fail(
            f"--out {path}: cannot write: {exc.strerror or exc}", code=EXIT_BAD_INPUT
        ) from exc


def shard_or_fail(text: str | None) -> Shard | None:
    """The `--shard` option (or SERVEWATCH_SHARD) as a shard; None when not given."""
    if text is None:
        return None
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise fail(f"--shard ({SHARD_ENV}): {exc}", code=EXIT_BAD_INPUT) from exc


def load_config_or_fail(path: Path, *, shard: Shard | None = None) -> Config:
    try:
        return load_config(path, shard=shard)
    except ConfigError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc


def ingest_json(report: IngestReport) -> dict[str, Any]:
    return {
        "files": report.files,
        "spans": report.spans,
        "request_spans": report.request_spans,
        "other_spans": report.other_spans,
        "new_requests": report.new_requests,
        "duplicate_requests": report.duplicate_requests,
        "rejected": len(report.rejects),
        "rejects": [asdict(r) for r in report.rejects],
    }


def metric_json(report: MetricIngestReport) -> dict[str, Any]:
    return {
        "pages": report.pages,
        "new_scrapes": report.new_scrapes,
        "new_points": report.new_points,
        "stored_samples": report.stored_samples,
        "unknown_samples": report.unknown_samples,
        "dropped_samples": report.dropped_samples,
        "malformed_lines": [asdict(r) for r in report.line_errors],
        "failed_scrapes": [asdict(r) for r in report.failed_scrapes],
    }
