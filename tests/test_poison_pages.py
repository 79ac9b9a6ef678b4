"""A poison page costs its own bad lines, never its good lines or another page of the batch.

The poison page is the captured vLLM page with three bad lines spliced in: a text-format
timestamp of 2^63 ms, a value of 1e400 (past a 64-bit float), and a byte that is not UTF-8.
Every other line of it, and every other page of the batch, must be stored as if they were
not there; the scrape row says which lines were left out and why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.metrics.drop_rules import DropRules
from servewatch.collectors.metrics.exposition import page_text
from servewatch.collectors.metrics.ingest import MetricIngestReport, ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.scraper import scrape_targets
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.store_writer import StoreWriter
from servewatch.scraping import PageBatcher, page_of
from servewatch.store import Store
from tests.conftest import SAMPLE_PAGE, serving_pages

POISON_LINES = (
    b'vllm:num_requests_running{engine="9"} 1 9223372036854775808\n',
    b'vllm:num_requests_waiting{engine="9"} 1e400\n',
    b'vllm:num_requests_swapped{engine="9",note="caf\xe9"} 2\n',
)
REASONS = (
    "timestamp '9223372036854775808' is out of range",
    "value '1e400' is out of the range of a 64-bit float",
    "byte 0xe9 at column",
)


def poisoned(page: bytes) -> tuple[bytes, list[int]]:
    """`page` with the poison lines spread through it, and their 1-based line numbers."""
    lines = page.splitlines(keepends=True)
    numbers = []
    for n, bad in enumerate(POISON_LINES):
        at = (n + 1) * len(lines) // (len(POISON_LINES) + 1)
        lines.insert(at, bad)
        numbers.append(at + 1)
    return b"".join(lines), numbers


POISON_PAGE, POISON_LINE_NUMBERS = poisoned(SAMPLE_PAGE)
PAGES = {"/good-a": SAMPLE_PAGE, "/poison": POISON_PAGE, "/good-b": SAMPLE_PAGE}


@pytest.fixture
def base_url() -> Iterator[str]:
    with serving_pages(PAGES) as url:
        yield url


def stored_per_target(store: Store) -> dict[str, int]:
    frame = (
        store.read_scrapes()
        .group_by("target_id")
        .agg(pl.col("samples").sum())
        .sort("target_id")
        .collect()
    )
    return dict(frame.iter_rows())


def assert_poison_costs_only_its_lines(store: Store, *, poison: str, good: list[str]) -> None:
    samples = stored_per_target(store)
    assert samples[poison] > 0
    for target in good:
        # The poison page is the good page plus three bad lines: the same samples stored.
        assert samples[target] == samples[poison]
    row = store.read_scrapes().filter(pl.col("target_id") == poison).collect().row(0, named=True)
    assert row["ok"] is False
    for number, reason in zip(POISON_LINE_NUMBERS, REASONS, strict=True):
        assert f"line {number}: {reason}" in row["error"]
    errors = store.read_ingest_errors().filter(pl.col("source") == poison).collect()
    assert errors.height == len(POISON_LINES)
    others = store.read_scrapes().filter(pl.col("target_id") != poison).collect()
    assert others.get_column("ok").all()


def test_scrape_once_stores_every_good_line_and_every_other_page(
    base_url: str, tmp_path: Path, runner: CliRunner
) -> None:
    config = tmp_path / "servewatch.toml"
    targets = "".join(
        f'[[targets]]\nkind = "vllm"\nurl = "{base_url}{path}"\nreplica = "{path[1:]}"\n\n'
        for path in PAGES
    )
    config.write_text(
        f'[store]\npath = "fleet.duckdb"\n\n[scrape]\ninterval_s = 15\n\n{targets}',
        encoding="utf-8",
    )
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once", "--json"])
    assert result.exit_code == 0, result.output
    (round_,) = json.loads(result.stdout)["rounds"]
    assert round_["pages"] == 3
    with Store.open(tmp_path / "fleet.duckdb") as store:
        ids = dict(store.read_targets().select("replica", "target_id").collect().iter_rows())
        assert_poison_costs_only_its_lines(
            store, poison=ids["poison"], good=[ids["good-a"], ids["good-b"]]
        )


def test_the_services_batch_path_stores_every_good_line_and_every_other_page(
    base_url: str,
) -> None:
    targets = [
        Target(target_id=path[1:], kind=TargetKind.VLLM, url=base_url + path, replica=path[1:])
        for path in PAGES
    ]

    async def scrape() -> list[Page]:
        async with httpx.AsyncClient() as client:
            return [page_of(r) for r in await scrape_targets(targets, client=client, timeout_s=5)]

    pages = asyncio.run(scrape())
    reports: list[MetricIngestReport] = []
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        batcher = PageBatcher(
            writer,
            keep_uncatalogued=lambda: False,
            drop=DropRules,
            on_report=reports.append,
            max_delay_s=60,
        )
        for page in pages:
            batcher.add(page)
        batcher.close()
        writer.flush()
        assert writer.counters.failed_tasks == 0
        assert [r.pages for r in reports] == [3]  # one batch held all three pages
        assert_poison_costs_only_its_lines(store, poison="poison", good=["good-a", "good-b"])


class _Unreadable(str):
    """A page whose reading fails in a way no parser rule foresees."""

    __slots__ = ()

    def isascii(self) -> bool:
        raise RuntimeError("the page's text cannot be examined")


def test_a_page_that_fails_unforeseen_becomes_its_own_failed_scrape(store: Store) -> None:
    at = datetime(2026, 11, 29, 12, 0, 0)
    pages = [
        Page(Target(target_id=name, kind=TargetKind.VLLM, url="file:x"), at, body)
        for name, body in (
            ("good-a", page_text(SAMPLE_PAGE)),
            ("broken", _Unreadable(page_text(SAMPLE_PAGE))),
            ("good-b", page_text(SAMPLE_PAGE)),
        )
    ]
    report = ingest_pages(pages, store=store)
    samples = stored_per_target(store)
    assert samples["good-a"] == samples["good-b"] > 0
    assert samples["broken"] == 0
    (failed,) = report.failed_scrapes
    assert failed.source == "broken"
    assert failed.message == (
        "the page could not be read: RuntimeError: the page's text cannot be examined"
    )
    scrape = store.read_scrapes().filter(pl.col("target_id") == "broken").collect()
    assert scrape.get_column("error").to_list() == [failed.message]
    assert store.read_ingest_errors().collect().get_column("source").to_list() == ["broken"]


def test_a_page_ingested_again_under_another_time_stores_each_sample_once(store: Store) -> None:
    # Samples with their own timestamps are the same samples whenever the page is ingested.
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3 1764590000000\n'
        'vllm:num_requests_running{engine="1"} 4 1764590000000\n'
    )
    target = Target(target_id="vllm-0", kind=TargetKind.VLLM, url="file:x")
    points = []
    for minute in range(3):
        report = ingest_pages([Page(target, datetime(2025, 12, 1, 12, minute), page)], store=store)
        points.append(report.new_points)
    assert points == [2, 0, 0]
    assert store.read_points().collect().height == 2


def test_a_second_value_for_a_series_in_one_page_is_a_line_error(store: Store) -> None:
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3\n'
        'vllm:num_requests_running{engine="0"} 5\n'
    )
    target = Target(target_id="vllm-0", kind=TargetKind.VLLM, url="file:x")
    report = ingest_pages([Page(target, datetime(2025, 12, 1, 12), page)], store=store)
    assert report.new_points == 1
    (error,) = report.line_errors
    assert error.location.endswith("line 3")
    assert error.message.startswith("duplicate sample: line 2 already gave")
    (row,) = store.read_scrapes().collect().iter_rows(named=True)
    assert row["ok"] is False
    assert store.read_points().collect().get_column("value").to_list() == [3.0]
