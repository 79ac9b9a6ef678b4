"""Report page: one self-contained HTML file that opens anywhere with no network.

Vega, Vega-Lite and Vega-Embed are inlined from vl-convert's bundle (the same libraries that
render the PNG and SVG files), and the chart specs travel as a JSON data block, so nothing is
fetched. Label values come from the fleet (model and replica names, SLO names) and must never
become markup: everything put in HTML is escaped, the JSON block escapes `<`, `>` and `&` so no
value can close its script element, and Vega draws labels as SVG text nodes. A Content Security
Policy backs this up: only the two scripts the page was built with (pinned by their SHA-256)
may run, Vega evaluates expressions with its interpreter (`ast`) rather than `eval`, and no request
may leave the page.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import vl_convert

# The libraries as globals, which is what the bootstrap below expects.
BUNDLE_SNIPPET = "window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;"
# The bootstrap makes tables sortable (by each cell's data-value: numbers as numbers, names in
# natural order), embeds every chart, records failures on the console, and marks the page done
# (`data-charts`) so a browser test knows when to look.
BOOTSTRAP_JS = """
(() => {
  document.querySelectorAll("table.sortable").forEach((table) => {
    const body = table.tBodies[0];
    const headers = Array.from(table.querySelectorAll("thead th"));
    headers.forEach((th, index) => {
      th.tabIndex = 0;
      const sort = () => {
        const ascending = th.getAttribute("aria-sort") !== "ascending";
        headers.forEach((h) => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        const numeric = th.dataset.sort === "number";
        const value = (row) => {
          const cell = row.children[index];
          return cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent;
        };
        const rows = Array.from(body.rows);
        rows.sort((a, b) => {
          const x = value(a);
          const y = value(b);
          if (numeric && (x === "" || y === "")) {
            return x === y ? 0 : x === "" ? 1 : -1;  // no value: last either way
          }
          const order = numeric
            ? parseFloat(x) - parseFloat(y)
            : x.localeCompare(y, "en", { numeric: true });
          return ascending ? order : -order;
        });
        rows.forEach((row) => body.appendChild(row));
      };
      th.addEventListener("click", sort);
      th.addEventListener("keydown", (event) => { if (event.key === "Enter") { sort(); } });
    });
  });
  const specs = JSON.parse(document.getElementById("servewatch-specs").textContent);
  const options = {
    renderer: "svg",
    actions: false,
    ast: true,
  };
  const runs = Object.entries(specs).map(([slug, spec]) => {
    const target = document.getElementById("chart-" + slug);
    return vegaEmbed(target, spec, options).then(
      () => { target.dataset.rendered = "true"; },
      (error) => {
        target.dataset.rendered = "failed";
        target.textContent = "This chart could not be drawn: " + error;
        console.error("chart " + slug + ": " + error);
      },
    );
  });
  Promise.all(runs).then(() => { document.body.dataset.charts = "done"; });
})();
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 980px; color: #222; }
header { border-bottom: 1px solid #ddd; margin-bottom: 16px; }
h1 { font-size: 1.5em; margin: 0 0 8px; }
h2 { font-size: 1.2em; margin-top: 32px; border-bottom: 1px solid #eee; }
table.facts { border-collapse: collapse; margin: 8px 0 16px; }
table.facts th { text-align: left; padding: 2px 16px 2px 0; font-weight: 600; }
table.facts td { padding: 2px 0; }
figure { margin: 16px 0 24px; }
figcaption { font-size: 0.85em; color: #555; }
figcaption a { color: #555; }
nav ul { columns: 2; }
.omitted { color: #555; font-size: 0.9em; }
.quiet { color: #666; font-size: 0.85em; }
table.verdicts, table.replicas { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
table.verdicts th, table.verdicts td, table.replicas th, table.replicas td {
  border-bottom: 1px solid #eee; padding: 4px 10px 4px 0; text-align: left; vertical-align: top;
}
table.replicas td { text-align: right; font-variant-numeric: tabular-nums; }
caption { caption-side: bottom; text-align: left; font-size: 0.85em; color: #555; }
tr.verdict-met td.verdict { color: #1a7f37; font-weight: 600; }
tr.verdict-missed td.verdict { color: #c0392b; font-weight: 600; }
tr.verdict-no-data td.verdict { color: #777; font-weight: 600; }
td.firing { color: #c0392b; }
table.sortable thead th { cursor: pointer; white-space: nowrap; }
table.sortable thead th[aria-sort="ascending"]::after { content: " \\25B2"; }
table.sortable thead th[aria-sort="descending"]::after { content: " \\25BC"; }
tr.bad th, tr.bad td { color: #c0392b; font-weight: 600; }
.capacity-answer .headline { font-size: 1.1em; font-weight: 600; margin: 8px 0; }
"""


@dataclass(frozen=True)
class PageChart:
    slug: str
    section: str
    title: str
    spec: Mapping[str, Any]


@functools.cache
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script (built once per process: it takes seconds)."""
    bundle = vl_convert.javascript_bundle(BUNDLE_SNIPPET)
    # Inlined as is, so it must not be able to end its own script element.
    lowered = bundle.lower()
    if "</script" in lowered or "<!--" in lowered:
        raise RuntimeError(
            f"vl-convert {version('vl-convert-python')}'s JavaScript bundle contains '</script' or "
            "'<!--' and cannot be inlined into the report page"
        )
    return bundle


def script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element whatever strings it holds."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, sort_keys=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _sha256(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def content_security_policy(scripts: Sequence[str]) -> str:
    hashes = " ".join(_sha256(s) for s in scripts)
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "img-src data:; font-src data:; base-uri 'none'; form-action 'none'"
    )


def _facts_table(facts: Sequence[tuple[str, str]]) -> str:
    if not facts:
        return ""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def _figure(chart: PageChart, *, files_folder: str | None) -> str:
    slug = html.escape(chart.slug)
    links = ""
    if files_folder is not None:
        base = f"{html.escape(files_folder)}/{slug}"
        links = (
            f' Files: <a href="{base}.png">PNG</a> · <a href="{base}.svg">SVG</a> · '
            f'<a href="{base}.vl.json">Vega-Lite JSON</a>'
        )
    return (
        f'<figure id="figure-{slug}"><div class="chart" id="chart-{slug}" '
        f'role="img" aria-label="{html.escape(chart.title)}"></div>'
        f"<figcaption>{html.escape(chart.title)}.{links}</figcaption></figure>"
    )


def _section_id(title: str) -> str:
    return "section-" + "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def render_page(
    *,
    title: str,
    facts: Sequence[tuple[str, str]],
    charts: Sequence[PageChart],
    omitted: Sequence[tuple[str, str]],
    files_folder: str | None = "charts",
    lead: Sequence[tuple[str, str]] = (),
) -> str:
    """The whole report page as one string. `lead` is (section title, HTML) for the sections
    that open with an answer (already escaped markup, built by this package), in page order
    and before the other charts' sections; a chart of such a section follows its answer."""
    bundle = vega_bundle()
    specs = {chart.slug: chart.spec for chart in charts}
    sections: dict[str, list[PageChart]] = {section: [] for section, _ in lead}
    for chart in charts:
        sections.setdefault(chart.section, []).append(chart)
    answers = dict(lead)
    toc = "".join(
        f'<li><a href="#figure-{html.escape(c.slug)}">{html.escape(c.title)}</a></li>'
        for c in charts
        if c.section not in answers
    )

    def section_html(section: str, members: Sequence[PageChart]) -> str:
        return (
            f'<section id="{_section_id(section)}"><h2>{html.escape(section)}</h2>'
            + answers.get(section, "")
            + "".join(_figure(c, files_folder=files_folder) for c in members)
            + "</section>"
        )

    # The answers open the page, under the title and the window; the facts and the detail
    # charts with their contents follow.
    answered = "".join(section_html(s, m) for s, m in sections.items() if s in answers)
    details = "".join(section_html(s, m) for s, m in sections.items() if s not in answers)
    window = [(k, v) for k, v in facts if k == "window"]
    others = [(k, v) for k, v in facts if k != "window"]
    numbers = (
        f'<section id="section-the-window"><h2>The window in numbers</h2>'
        f"{_facts_table(others)}</section>"
        if others and answers
        else _facts_table(others)
    )
    contents = (
        f"<nav><h2>Detail charts</h2><ul>{toc}</ul></nav>"
        if answers
        else (f"<nav><ul>{toc}</ul></nav>")
    )
    body = answered + numbers + contents + details
    missing = ""
    if omitted:
        items = "".join(
            f"<li>{html.escape(panel)}: {html.escape(reason)}</li>" for panel, reason in omitted
        )
        missing = f'<section class="omitted"><h2>Not shown</h2><ul>{items}</ul></section>'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" '
        f'content="{content_security_policy([bundle, BOOTSTRAP_JS])}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<script>{bundle}</script></head><body>"
        f"<header><h1>{html.escape(title)}</h1>{_facts_table(window)}</header>"
        f"{body}{missing}"
        f'<script type="application/json" id="servewatch-specs">{script_json(specs)}</script>'
        f"<script>{BOOTSTRAP_JS}</script>"
        "<noscript>The charts need JavaScript; the PNG and SVG files beside this page hold the "
        "same charts.</noscript></body></html>\n"
    )
