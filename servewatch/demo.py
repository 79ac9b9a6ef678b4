"""The demo: replay a recorded fixture into a fresh store and report its SLIs.

This is the walking skeleton's demo; later issues extend it to an emulated day and a live phase.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.trace_ingest import IngestReport
from pipeline.request_sli import GoodputLimits
from pipeline.store import Store
from servewatch.sli_report import build_sli_report

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURE = REPO_ROOT / "fixtures" / "vllm_spans_small"
# The demo's SLO: interactive chat, as in `vllm bench serve --goodput ttft:500 tpot:50`.
DEMO_LIMITS = GoodputLimits(ttft_s=0.5, tpot_s=0.05)
TRACE_PATTERNS = ("*.jsonl", "*.jsonl.gz", "*.json", "*.json.gz")


class DemoError(Exception):
    """The demo cannot run as asked (missing fixture, unusable output folder)."""


@dataclass(frozen=True)
class DemoResult:
    db: Path
    sli_path: Path
    ingest: IngestReport
    sli: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return {
            "db": str(self.db),
            "sli_report": str(self.sli_path),
            "ingested_requests": self.ingest.new_requests,
            "rejected": len(self.ingest.rejects),
            "sli": self.sli,
        }


def trace_files(fixture: Path) -> list[Path]:
    files = sorted({p for pattern in TRACE_PATTERNS for p in fixture.glob(pattern)})
    if not files:
        raise DemoError(
            f"no trace files in {fixture}: expected files matching {', '.join(TRACE_PATTERNS)}"
        )
    return files


def run_demo(
    *,
    out: Path,
    fixture: Path | None,
    progress: Callable[[Store, list[Path]], IngestReport],
) -> DemoResult:
    fixture = fixture or DEFAULT_FIXTURE
    if not fixture.is_dir():
        raise DemoError(f"fixture folder {fixture} does not exist")
    files = trace_files(fixture)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create output folder {out}: {exc}") from exc
    db = out / "servewatch.duckdb"
    # A fresh store every run, so the demo shows what the fixture alone yields.
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    with Store.open(db) as store:
        ingest = progress(store, files)
        sli = build_sli_report(store, limits=DEMO_LIMITS)
    sli_path = out / "sli.json"
    sli_path.write_text(json.dumps(sli, indent=2) + "\n", encoding="utf-8")
    return DemoResult(db=db, sli_path=sli_path, ingest=ingest, sli=sli)
