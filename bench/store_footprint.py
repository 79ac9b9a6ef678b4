"""Bytes on disk per stored sample: servewatch's store against a Prometheus TSDB block.

Input: a day (`--quick`: 3 h) of a 12-replica emulated fleet (3 zones x 2 hosts x 2 replicas,
one DCGM exporter per host) recorded in fixture mode at a 15 s scrape interval, diurnal
arrivals averaging 6 req/s (the request rate changes the values, not the sample count, and a
lower rate keeps the recording affordable). The fixture is recorded once and cached.

- servewatch: every page ingested into a fresh store with `ingest_pages` in replay-sized
  batches (closed 2 h blocks are compacted as the ingest moves on), then the head compacted
  (`Store.compact_points`), as promtool writes whole blocks; bytes = the store file after close
  (DuckDB checkpoints on close), samples = rows of `points`. The target is judged on the
  file, which is what the disk holds. Also shown: the blocks DuckDB counts as used
  (`pragma_database_size`: total less free blocks, which it keeps for later writes), the file
  before the head is compacted, and a Parquet (zstd) export of the same points.
- peer: the same samples (series labels plus `job` and `instance`, millisecond timestamps,
  in time order) written as OpenMetrics text and turned into TSDB blocks by
  `promtool tsdb create-blocks-from openmetrics --max-block-duration=24h` (18 h blocks, what a
  default Prometheus compacts a day into); bytes = chunks + index + meta.json + tombstones,
  samples = `numSamples` of the blocks' meta.json.

Target (issue 4): servewatch at most 2x Prometheus's bytes per sample (ratio >= 0.5).
Figures are bytes per 1,000 samples, so the whole-number report keeps three decimals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from itertools import islice
from pathlib import Path

import duckdb
import polars as pl

from bench.report import Comparison
from servewatch.collectors.fixture.folder import iter_fixture_pages, open_fixture
from servewatch.collectors.fixture.replay import PAGES_PER_BATCH
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec
from servewatch.store import Store

CACHE = Path(os.environ.get("SERVEWATCH_BENCH_CACHE", Path.home() / ".cache" / "servewatch-bench"))
START_S = 1_795_046_400.0  # 2026-11-18T00:00:00Z
SEED = 1
SCRAPE_INTERVAL_S = 15.0
RATE_RPS = 6.0
PROMTOOL = "promtool"
PER = 1000  # figures are bytes per PER samples
TEXT_ROWS_PER_CHUNK = 1_000_000


def fleet_config() -> FleetConfig:
    base = FleetConfig.default()
    return replace(
        base,
        topology=TopologySpec(zones=("zone-a", "zone-b", "zone-c"), hosts_per_zone=2),
        workload=replace(
            base.workload, arrival=ArrivalSpec(kind=ArrivalKind.DIURNAL, rate_rps=RATE_RPS)
        ),
    )


def fixture(hours: float) -> Path:
    """The recorded fleet (cached): `hours` from START_S at SCRAPE_INTERVAL_S."""
    folder = CACHE / f"fleet12_{hours:g}h_{SCRAPE_INTERVAL_S:g}s_{RATE_RPS:g}rps_{SEED}"
    if (folder / "manifest.json").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    config = fleet_config()
    record_fleet(
        config,
        partial,
        start_s=START_S,
        end_s=START_S + hours * 3600,
        scrape_interval_s=SCRAPE_INTERVAL_S,
        seed=SEED,
        description="bench store_footprint",
    )
    partial.rename(folder)
    return folder


@dataclass(frozen=True)
class Footprint:
    samples: int
    bytes: int

    @property
    def per_thousand(self) -> float:
        return self.bytes / self.samples * PER


@dataclass(frozen=True)
class StoreFootprint:
    compacted: Footprint
    used: Footprint
    head_open: Footprint
    parquet: Footprint
    ingest_s: float
    free_blocks: int
    total_blocks: int


def servewatch_store(folder: Path, work: Path) -> StoreFootprint:
    db = work / "store.duckdb"
    recorded = open_fixture(folder)
    started = time.perf_counter()
    with Store.open(db) as store:
        pages = iter_fixture_pages(recorded)
        while batch := tuple(islice(pages, PAGES_PER_BATCH)):
            ingest_pages(batch, store=store)
        ingest_s = time.perf_counter() - started
        samples = store.count("points")
    head_open = Footprint(samples, db.stat().st_size)
    with Store.open(db) as store:
        last = store.points_range()
        assert last is not None
        store.compact_points(before=last[1] + timedelta(days=1))
    compacted = Footprint(samples, db.stat().st_size)
    parquet = work / "points.parquet"
    con = duckdb.connect(str(db), read_only=True)
    try:
        block_size, total_blocks, free_blocks = con.execute(
            "SELECT block_size, total_blocks, free_blocks FROM pragma_database_size()"
        ).fetchall()[0]
        # The export a user would make: millisecond times, series order within 2 h blocks.
        con.execute(
            "COPY (SELECT series_id, CAST(ts AS TIMESTAMP_MS) AS ts, value FROM points "
            "ORDER BY time_bucket(INTERVAL 2 HOUR, ts), series_id, ts) "
            f"TO '{parquet}' (FORMAT parquet, COMPRESSION zstd)"
        )
    finally:
        con.close()
    return StoreFootprint(
        compacted=compacted,
        used=Footprint(samples, (total_blocks - free_blocks) * block_size),
        head_open=head_open,
        parquet=Footprint(samples, parquet.stat().st_size),
        ingest_s=ingest_s,
        free_blocks=free_blocks,
        total_blocks=total_blocks,
    )


def openmetrics_text(db: Path, out: Path) -> int:
    """The store's samples as OpenMetrics text with timestamps, in time order; returns how
    many sample lines were written (samples without a value are left out, as Prometheus
    cannot hold them)."""
    with Store.open(db) as store:
        series = (
            store.read_series()
            .join(store.read_targets().select("target_id", "kind"), on="target_id", how="left")
            .collect()
        )
        span = store.points_range()
        assert span is not None
        names = {
            row["series_id"]: _series_text(
                row["metric"], row["labels"], row["kind"], row["target_id"]
            )
            for row in series.iter_rows(named=True)
        }
        prefix = pl.DataFrame(
            {"series_id": list(names), "prefix": list(names.values())},
            schema={"series_id": pl.Int32, "prefix": pl.String},
        )
        written = 0
        window = timedelta(minutes=30)
        with out.open("w", encoding="utf-8") as stream:
            at = span[0]
            while at <= span[1]:
                points = store.read_points(from_ts=at, to_ts=at + window).filter(
                    pl.col("value").is_not_null()
                )
                lines = (
                    points.join(prefix.lazy(), on="series_id", how="inner")
                    .sort("ts", "series_id")
                    .select(
                        line=pl.concat_str(
                            "prefix",
                            pl.lit(" "),
                            pl.col("value").cast(pl.String),
                            pl.lit(" "),
                            (pl.col("ts").dt.epoch("ms") // 1000).cast(pl.String),
                            pl.lit("."),
                            (pl.col("ts").dt.epoch("ms") % 1000).cast(pl.String).str.zfill(3),
                        )
                    )
                    .collect()
                )
                if lines.height:
                    stream.write("\n".join(lines.get_column("line").to_list()))
                    stream.write("\n")
                written += lines.height
                at += window
            stream.write("# EOF\n")
    return written


def _series_text(metric: str, labels_json: str, kind: str | None, target_id: str) -> str:
    labels: dict[str, str] = json.loads(labels_json)
    labels = {**labels, "job": kind or "servewatch", "instance": target_id}
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
    return f"{metric}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_blocks(text: Path, work: Path) -> Footprint:
    blocks = work / "tsdb"
    blocks.mkdir()
    subprocess.run(
        [
            PROMTOOL,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
            "--quiet",
            str(text),
            str(blocks),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    samples = 0
    size = 0
    for meta in blocks.glob("*/meta.json"):
        samples += int(json.loads(meta.read_text())["stats"]["numSamples"])
        size += sum(path.stat().st_size for path in meta.parent.rglob("*") if path.is_file())
    return Footprint(samples, size)


def run(*, quick: bool = False) -> list[Comparison]:
    if shutil.which(PROMTOOL) is None:
        raise RuntimeError(f"{PROMTOOL} is not on PATH; the peer of this benchmark needs it")
    hours = 3.0 if quick else 24.0
    folder = fixture(hours)
    with tempfile.TemporaryDirectory(prefix="servewatch-footprint-") as tmp:
        work = Path(tmp)
        ours = servewatch_store(folder, work)
        text = work / "samples.om.txt"
        openmetrics_text(work / "store.duckdb", text)
        peer = prometheus_blocks(text, work)
    what = f"{hours:g} h of a 12-replica fleet at {SCRAPE_INTERVAL_S:g} s"
    peer_label = f"Prometheus TSDB blocks ({peer.samples:,} samples)"
    unit = f"bytes/{PER:,} samples"
    return [
        Comparison(
            benchmark=f"bytes on disk per sample, {what} (target: ratio >= 0.5)",
            unit=unit,
            ours_label=f"servewatch store, compacted ({ours.compacted.samples:,} samples)",
            ours=ours.compacted.per_thousand,
            peer_label=peer_label,
            peer=peer.per_thousand,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"bytes per sample, {what}, DuckDB's used blocks only",
            unit=unit,
            ours_label=(
                f"servewatch store less its {ours.free_blocks} free of {ours.total_blocks} blocks"
            ),
            ours=ours.used.per_thousand,
            peer_label=peer_label,
            peer=peer.per_thousand,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"bytes on disk per sample, {what}, last blocks not yet compacted",
            unit=unit,
            ours_label=f"servewatch store as ingested ({ours.ingest_s:.0f} s ingest)",
            ours=ours.head_open.per_thousand,
            peer_label=peer_label,
            peer=peer.per_thousand,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"bytes on disk per sample, {what}, as an export",
            unit=unit,
            ours_label="servewatch points as Parquet (zstd)",
            ours=ours.parquet.per_thousand,
            peer_label=peer_label,
            peer=peer.per_thousand,
            higher_is_better=False,
        ),
    ]
