"""`servewatch status`: each store's collector, alive and scraping, and the shards together."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from servewatch.answers import DEFAULT_STALE_AFTER_S, StoreVerdict, status_answer
from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    CliState,
    JsonOption,
    app,
    fail,
    store_answer,
)
from servewatch.collectors.service_api import STATUS_PATH
from servewatch.pipeline.instants import parse_duration, parse_instant
from servewatch.render import out_console, print_json
from servewatch.store import utc_now


def _stale_after_s(text: str) -> float:
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise fail(f"--stale-after: {exc}", code=EXIT_BAD_INPUT) from exc


def shards_status(stores: list[dict[str, Any]]) -> dict[str, Any]:
    """The stores together: targets scraped lately by more than one of them (collectors whose
    shard settings disagree, or two collectors given one shard), and whether all is well."""
    scrapers = Counter(t for store in stores for t in store.get("scraped_target_ids", []))
    both = sorted(t for t, n in scrapers.items() if n > 1)
    well = {StoreVerdict.OK.value, StoreVerdict.EMPTY.value}
    return {
        "stores": stores,
        "targets_scraped": len(scrapers),
        "targets_scraped_twice": both,
        "ok": not both and all(s["verdict"] in well for s in stores),
    }


@app.command()
def status(
    ctx: typer.Context,
    stale_after: Annotated[
        str,
        typer.Option(
            "--stale-after",
            help="A store whose collector stored no scrape for this long is stale (5m, 90s).",
        ),
    ] = f"{DEFAULT_STALE_AFTER_S:.0f}s",
    as_json: JsonOption = False,
) -> None:
    """Each store's collector: the targets it scraped lately, which of them failed their last
    scrape, what it stored last, and a verdict: ok, degraded (some targets failing), stale (no
    scrape within --stale-after: the collector stopped) or empty (no targets). Repeat --db to
    check the stores of sharded collectors together: a target scraped lately by two of them is
    named (their shard settings disagree). A store held by `servewatch run` is asked through
    its local API, which adds the collector's shard and /healthz.

    Exits 0 when every store is ok or empty and no target is scraped twice, 1 otherwise.
    """
    state = ctx.ensure_object(CliState)
    stale_after_s = _stale_after_s(stale_after)
    now = utc_now()
    stores = [
        {"store": str(db)}
        | store_answer(
            db,
            lambda store: status_answer(store, stale_after_s=stale_after_s, now=now),
            path=STATUS_PATH,
            params={"stale_after_s": [repr(stale_after_s)]},
        )
        for db in state.dbs
    ]
    document = shards_status(stores)
    if as_json:
        print_json(document)
    else:
        out_console.print(_table(document, now=now))
        for store in stores:
            for target in store["targets_failing"]:
                out_console.print(
                    f"{store['store']}: {target['target_id']} failing: {target['error']}",
                    highlight=False,
                )
        for target_id in document["targets_scraped_twice"]:
            out_console.print(f"{target_id} is scraped by more than one store", highlight=False)
    if not document["ok"]:
        raise typer.Exit(EXIT_FAILURE)


def _ago(text: str | None, now: datetime) -> str:
    if text is None:
        return "never"
    age = now - parse_instant(text)
    return f"{age.total_seconds():.0f} s ago"


def _table(document: dict[str, Any], *, now: datetime) -> Table:
    table = Table(title=None if len(document["stores"]) < 2 else "stores of one fleet")
    for column in ("store", "shard", "verdict", "targets", "failing", "last scrape"):
        table.add_column(column, overflow="fold")
    for store in document["stores"]:
        shard = (store.get("collector") or {}).get("shard")
        table.add_row(
            Path(store["store"]).name,
            "-" if shard is None else shard["shard"],
            store["verdict"],
            f"{store['targets_scraped']} of {store['targets']}",
            str(len(store["targets_failing"])),
            _ago(store["last_scrape"], now),
        )
    return table
