"""Steady pages: a page stored from its target's memory stores exactly what the full path would.

The oracle is the same ingest with no memory: each of its batches runs on a thread of its own,
and the memory (like the parser's caches) is per thread. Every case is a run of batches whose
values move, with pages whose shape moves, malformed lines, timestamps, infinite values and
other pages the memory must not take between them; both stores must hold the same tables and
each batch must report the same counts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.collectors.metrics.drop_rules import DropRules
from servewatch.collectors.metrics.exposition import page_shape, parse_exposition, shaped_values
from servewatch.collectors.metrics.ingest import NO_DROP, MetricIngestReport, ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.metrics.steady_pages import LEARN_EVERY
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.store import Store
from tests.conftest import FIXTURES

SAMPLES = FIXTURES / "samples"
T0 = datetime(2026, 12, 7, 12, 0, 0)
VLLM = (SAMPLES / "vllm_metrics_production-stack-issue-617.txt").read_text()
DCGM = (SAMPLES / "dcgm_aicr-h100-vllm.txt").read_text()
SGLANG = (SAMPLES / "sglang_upstream-definitions.txt").read_text()
# Unlabelled samples, a _created sample, a NaN and an integer among labelled ones.
PLAIN = (
    "# HELP process_cpu_seconds_total CPU time.\n"
    "# TYPE process_cpu_seconds_total counter\n"
    "process_cpu_seconds_total 12.5\n"
    "# HELP vllm:num_requests_running Running.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
    "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0\n'
    'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9\n'
    "# HELP vllm:kv_cache_usage_perc KV use.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
)


def moved(text: str, rng: random.Random, *, odd: Sequence[str] = ()) -> str:
    """`text` with every sample's value replaced; `odd` values are drawn now and then."""
    lines = []
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            head, _, _ = line.rpartition(" ")
            choices = [
                f"{rng.uniform(0, 1e6):.6g}",
                repr(rng.uniform(-5, 5)),
                str(rng.randrange(0, 10**9)),
                "0",
                "-0.0",
                "NaN",
                f"{rng.uniform(0, 1):.3e}",
                *odd,
            ]
            lines.append(f"{head} {rng.choice(choices)}")
        else:
            lines.append(line)
    return "\n".join(lines)


def _tables(store: Store) -> dict[str, pl.DataFrame]:
    return {
        "targets": store.read_targets().collect(),
        "scrapes": store.read_scrapes().collect(),
        "series": store.read_series().collect(),
        "points": store.read_points().collect(),
        "unknown_families": store.read_unknown_families().collect(),
        "ingest_errors": store.read_ingest_errors().collect().drop("recorded_ts").sort(pl.all()),
    }


def _counts(report: MetricIngestReport) -> dict[str, object]:
    fields = asdict(report)
    fields.pop("steady_pages")
    return fields


def _same_as_without_memory(
    batches: Sequence[Sequence[Page]],
    *,
    keep_uncatalogued: bool = True,
    drop: DropRules = NO_DROP,
) -> int:
    """Ingest `batches` with the memory and without, assert equal results, and return how many
    pages were stored from memory. The memory lives on one thread for the whole run (a fresh
    one, so no other test's pages are remembered); the oracle's batches each get a new thread."""

    def ingest(batch: Sequence[Page], store: Store) -> MetricIngestReport:
        return ingest_pages(batch, store=store, keep_uncatalogued=keep_uncatalogued, drop=drop)

    steady = 0
    with (
        Store.open(":memory:") as ours,
        Store.open(":memory:") as oracle,
        ThreadPoolExecutor(max_workers=1) as remembering,
    ):
        for batch in batches:
            mine = remembering.submit(ingest, batch, ours).result()
            with ThreadPoolExecutor(max_workers=1) as forgetting:
                theirs = forgetting.submit(ingest, batch, oracle).result()
            assert theirs.steady_pages == 0
            assert _counts(mine) == _counts(theirs)
            steady += mine.steady_pages
        mine_tables, their_tables = _tables(ours), _tables(oracle)
    for name, frame in their_tables.items():
        assert mine_tables[name].equals(frame), name  # exact, and nulls equal nulls
    return steady


def _targets(kind: TargetKind, name: str, count: int = 2) -> list[Target]:
    return [
        Target(f"{name}-{i}", kind, f"http://127.0.0.1:{9000 + i}/metrics") for i in range(count)
    ]


def _rounds(targets: Sequence[Target], texts: Sequence[str]) -> list[list[Page]]:
    """One batch per text: every target's page of that text at that round's time."""
    return [
        [Page(t, T0 + timedelta(seconds=15 * k), text) for t in targets]
        for k, text in enumerate(texts)
    ]


CASES = {
    "vllm": (TargetKind.VLLM, VLLM),
    "dcgm": (TargetKind.DCGM, DCGM),
    "sglang": (TargetKind.SGLANG, SGLANG),
    "told": (TargetKind.AUTO, VLLM),
    "plain": (TargetKind.VLLM, PLAIN),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pages_whose_values_move_are_stored_from_memory_as_the_full_path_stores_them(
    case: str,
) -> None:
    kind, text = CASES[case]
    rng = random.Random(case)
    texts = [text] + [moved(text, rng) for _ in range(5)]
    steady = _same_as_without_memory(_rounds(_targets(kind, case), texts))
    assert steady == 2 * 5  # every page after the first round


def test_pages_the_memory_must_not_take_go_the_full_way() -> None:
    rng = random.Random(7)
    added = PLAIN + 'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
    texts = [
        PLAIN,
        moved(PLAIN, rng),
        added,  # a new series: another shape
        moved(added, rng),
        added.replace("3\n", "3 1733572800000\n", 1),  # a timestamp
        moved(added, rng),
        added.replace("1234.0", "+Inf"),  # infinite: maybe a finite number out of range
        added.replace("1234.0", "12}34"),  # malformed
        added.replace("1.7e9", "x}y"),  # a _created sample cut elsewhere
        added.replace("1.7e9", "whatever"),  # a _created sample's value is not read
        added.replace("Running.", "Running now."),  # another HELP
        moved(added.replace("Running.", "Running now."), rng),
        added.replace('model_name="m"', 'model_name="n"'),
        "",
        moved(added, rng, odd=["1_000", "0x10", "1e400", "١٢"]),
        moved(added, rng),
    ]
    assert _same_as_without_memory(_rounds(_targets(TargetKind.VLLM, "moving"), texts)) > 0


@pytest.mark.parametrize(
    ("keep", "drop"),
    [
        (False, NO_DROP),
        (True, DropRules(("vllm:prompt_tokens",))),
        (False, DropRules(("process_.*",))),
    ],
)
def test_the_memory_holds_for_the_ingest_options(keep: bool, drop: DropRules) -> None:
    rng = random.Random(3)
    texts = [PLAIN, *(moved(PLAIN, rng) for _ in range(3))]
    batches = _rounds(_targets(TargetKind.VLLM, "options"), texts)
    assert _same_as_without_memory(batches, keep_uncatalogued=keep, drop=drop) == 2 * 3


def test_pages_of_one_target_in_one_batch() -> None:
    rng = random.Random(11)
    (target,) = _targets(TargetKind.VLLM, "twice", count=1)
    later = [Page(target, T0 + timedelta(seconds=s), moved(VLLM, rng)) for s in (15, 30)]
    failed = Page(target, T0 + timedelta(seconds=60), None, error="timed out after 1 s")
    again = Page(target, T0 + timedelta(seconds=75), moved(VLLM, rng))
    twice = [Page(target, T0 + timedelta(seconds=90), moved(VLLM, rng)) for _ in range(2)]
    batches = [[Page(target, T0, VLLM)], later, [failed, *later, again], [again], twice]
    assert _same_as_without_memory(batches) == 2 + 3 + 1 + 1


def test_of_two_pages_of_one_scrape_the_first_is_stored(store: Store) -> None:
    (target,) = _targets(TargetKind.VLLM, "twice", count=1)
    rng = random.Random(5)
    first, second = moved(VLLM, rng), moved(VLLM, rng)
    report = ingest_pages([Page(target, T0, first), Page(target, T0, second)], store=store)
    with Store.open(":memory:") as alone:
        assert ingest_pages([Page(target, T0, first)], store=alone).new_points == report.new_points
        assert store.read_points().collect().equals(alone.read_points().collect())
        assert store.read_scrapes().collect().equals(alone.read_scrapes().collect())


@pytest.mark.parametrize("seed", range(20))
def test_shaped_values_are_the_values_the_parser_reads(seed: int) -> None:
    rng = random.Random(seed)
    text = rng.choice([VLLM, DCGM, PLAIN])
    shape = page_shape(text)
    assert shape is not None
    page = moved(text, rng, odd=["+Inf", "1e400", "1_0"])
    values = shaped_values(page, shape)
    parsed = parse_exposition(page)
    if values is None:
        assert parsed.errors or any(abs(v) == float("inf") for v in parsed.value) or "1e400" in page
    else:
        assert not parsed.errors
        assert [repr(v) for v in values] == [repr(v) for v in parsed.value]


def test_a_page_that_moves_every_scrape_is_stored_right_and_then_remembered_again() -> None:
    rng = random.Random(17)
    moving = [moved(PLAIN.replace('model_name="m"', f'model_name="m{k}"'), rng) for k in range(20)]
    steady = [moved(PLAIN, rng) for _ in range(40)]
    batches = _rounds(_targets(TargetKind.VLLM, "moving", count=1), [*moving, *steady])
    # Learnt less often while it keeps moving, then again within LEARN_EVERY pages.
    assert _same_as_without_memory(batches) >= 40 - LEARN_EVERY - 1
