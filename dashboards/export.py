"""Export: a report written to a folder: report.html, and per chart PNG, SVG and Vega-Lite JSON.

    DIR/report.html                 self-contained page (see report_page)
    DIR/charts/<slug>.vl.json       the chart's Vega-Lite spec, data inline
    DIR/charts/<slug>.png, .svg     the same chart rendered by vl-convert (offline)

The spec is taken from each chart once and every output is made from that one dict, so the
page, the images and the JSON cannot disagree. vl-convert renders in its own engine and
releases the interpreter while it does, so images are rendered on a few threads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vl_convert

from servewatch.dashboards.capacity_answer import answer_html
from servewatch.dashboards.replica_table import replica_table_html
from servewatch.dashboards.report import Report, Section
from servewatch.dashboards.report_page import PageChart, render_page
from servewatch.dashboards.slo_verdict import verdicts_html

CHARTS_FOLDER = "charts"
PNG_SCALE = 2.0
RENDER_THREADS = 4


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    specs: tuple[Path, ...]
    pngs: tuple[Path, ...]
    svgs: tuple[Path, ...]

    @property
    def html_bytes(self) -> int:
        return self.html.stat().st_size


def chart_specs(report: Report) -> dict[str, dict[str, Any]]:
    """Vega-Lite spec of every chart by slug (validated against the Vega-Lite schema)."""
    return {chart.slug: chart.chart.to_dict() for chart in report.charts}


def spec_json(spec: Mapping[str, Any]) -> str:
    """A spec as the .vl.json files hold it: stable key order, no NaN."""
    return json.dumps(spec, indent=1, sort_keys=True, allow_nan=False) + "\n"


def answers(report: Report) -> list[tuple[str, str]]:
    """The sections that open with an answer, in page order: SLO verdicts, the capacity
    answer, the replica table (each only when the report has it)."""
    lead: list[tuple[str, str]] = []
    if report.verdicts:
        lead.append((Section.VERDICT.value, verdicts_html(report.verdicts)))
    if report.capacity_answer is not None:
        lead.append((Section.CAPACITY.value, answer_html(report.capacity_answer)))
    if report.replicas is not None:
        table = replica_table_html(report.replicas, objective_ratio=report.replica_objective_ratio)
        lead.append((Section.REPLICAS.value, table))
    return lead


def report_html(report: Report, specs: Mapping[str, Mapping[str, Any]]) -> str:
    return render_page(
        title=report.title,
        facts=report.facts,
        charts=[PageChart(c.slug, c.section.value, c.title, specs[c.slug]) for c in report.charts],
        omitted=report.omitted,
        files_folder=CHARTS_FOLDER,
        lead=answers(report),
    )


def _render(spec: Mapping[str, Any], png: Path, svg: Path, scale: float) -> None:
    try:
        png.write_bytes(vl_convert.vegalite_to_png(dict(spec), scale=scale))
        svg.write_text(vl_convert.vegalite_to_svg(dict(spec)), encoding="utf-8")
    except ValueError as exc:
        raise ValueError(f"rendering {png.stem} with vl-convert failed: {exc}") from exc


def write_report(
    report: Report, folder: Path, *, images: bool = True, png_scale: float = PNG_SCALE
) -> ReportFiles:
    """Write the report into `folder` (created if missing; files of the same names replaced)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"report folder {folder} exists and is not a directory")
    charts_dir = folder / CHARTS_FOLDER
    charts_dir.mkdir(parents=True, exist_ok=True)
    specs = chart_specs(report)
    spec_paths = []
    for slug, spec in specs.items():
        path = charts_dir / f"{slug}.vl.json"
        path.write_text(spec_json(spec), encoding="utf-8")
        spec_paths.append(path)
    html = folder / "report.html"
    html.write_text(report_html(report, specs), encoding="utf-8")
    pngs = tuple(charts_dir / f"{slug}.png" for slug in specs)
    svgs = tuple(charts_dir / f"{slug}.svg" for slug in specs)
    if images:
        with ThreadPoolExecutor(max_workers=RENDER_THREADS) as pool:
            jobs = [
                pool.submit(_render, spec, png, svg, png_scale)
                for spec, png, svg in zip(specs.values(), pngs, svgs, strict=True)
            ]
            for job in jobs:
                job.result()
    return ReportFiles(
        html=html,
        specs=tuple(spec_paths),
        pngs=pngs if images else (),
        svgs=svgs if images else (),
    )
