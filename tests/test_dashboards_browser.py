"""The exported report in a real browser: Debian's headless Chromium, networking disabled,
driven over the Chrome DevTools Protocol on a pipe (so nothing listens on any port).

Checks: every chart draws one SVG, the console stays clean, nothing is fetched, and label
values that look like markup are shown as text and never run. Screenshots are kept under
test-artifacts/dashboards/.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servewatch.dashboards.export import ReportFiles, chart_specs, spec_json, write_report
from servewatch.dashboards.report import ReportInputs, build_report
from tests.conftest import REPO_ROOT, require_program
from tests.test_dashboards import SLUGS, fixture_inputs, fixture_report, positional

ARTIFACTS = REPO_ROOT / "test-artifacts" / "dashboards"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)
WIDTH_PX = 1100
TIMEOUT_S = 60.0
# Resolves once the page's bootstrap has embedded every chart (or failed to).
CHARTS_DONE_JS = """
new Promise((resolve) => {
  const check = () => document.body && document.body.dataset.charts === "done"
    ? resolve(true) : setTimeout(check, 50);
  check();
})
"""
CHART_STATE_JS = """
JSON.stringify(Array.from(document.querySelectorAll("div.chart")).map((div) => ({
  id: div.id,
  rendered: div.dataset.rendered,
  drawings: div.querySelectorAll("svg.marks, canvas.marks").length,
  texts: Array.from(div.querySelectorAll("svg text")).map((t) => t.textContent),
})))
"""


class DevTools:
    """A Chromium child speaking CDP on fds 3 (commands in) and 4 (replies out)."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def wire_pipes() -> None:
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4),
            # Only two dup2 calls run between fork and exec: no lock is taken there.
            preexec_fn=wire_pipes,  # noqa: PLW1509
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True)
            self.process.wait(timeout=10)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(timeout=10)
        finally:
            os.close(self._commands)
            os.close(self._replies)

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, browser: bool = False
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if not browser:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._receive(deadline, waiting_for=method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
            self.events.append(reply)

    def wait_for(self, event: str) -> dict[str, Any]:
        for seen in self.events:
            if seen.get("method") == event:
                return seen
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._receive(deadline, waiting_for=event)
            self.events.append(message)
            if message.get("method") == event:
                return message

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def _receive(self, deadline: float, *, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._replies], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"Chromium sent nothing for {TIMEOUT_S:.0f} s ({waiting_for})")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe ({waiting_for})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def messages(self, *methods: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("method") in methods]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    chromium = require_program("chromium")
    devtools = DevTools(chromium, tmp_path / "profile")
    try:
        attach_offline_page(devtools, width_px=WIDTH_PX)
        yield devtools
    finally:
        devtools.close()


def attach_offline_page(devtools: DevTools, *, width_px: int) -> None:
    """Attach to the browser's page, enable the domains the tests read, cut the network off
    (nothing may be fetched) and size the viewport."""
    targets = devtools.call("Target.getTargets", browser=True)["targetInfos"]
    page = next(t for t in targets if t["type"] == "page")
    attached = devtools.call(
        "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}, browser=True
    )
    devtools.session = attached["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        devtools.call(f"{domain}.enable")
    devtools.call(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    devtools.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": width_px, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )


def open_report(browser: DevTools, html: Path) -> list[dict[str, Any]]:
    """Load the page, wait for every chart, return each chart's state."""
    browser.call("Page.navigate", {"url": html.resolve().as_uri()})
    browser.wait_for("Page.loadEventFired")
    assert browser.evaluate(CHARTS_DONE_JS) is True
    state: list[dict[str, Any]] = json.loads(browser.evaluate(CHART_STATE_JS))
    return state


def screenshot(browser: DevTools, name: str) -> Path:
    height = browser.call("Page.getLayoutMetrics")["cssContentSize"]["height"]
    shot = browser.call(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH_PX, "height": height, "scale": 1},
        },
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def console_problems(browser: DevTools) -> list[str]:
    problems = []
    for event in browser.messages(
        "Runtime.consoleAPICalled", "Runtime.exceptionThrown", "Log.entryAdded"
    ):
        params = event["params"]
        if event["method"] == "Runtime.exceptionThrown":
            problems.append(json.dumps(params["exceptionDetails"])[:500])
        elif event["method"] == "Runtime.consoleAPICalled" and params["type"] in (
            "error",
            "warning",
            "assert",
        ):
            problems.append(" ".join(str(a.get("value")) for a in params["args"])[:500])
        elif event["method"] == "Log.entryAdded" and params["entry"]["level"] in (
            "error",
            "warning",
        ):
            problems.append(params["entry"]["text"][:500])
    return problems


def fetched_urls(browser: DevTools, page: Path) -> list[str]:
    urls = [e["params"]["request"]["url"] for e in browser.messages("Network.requestWillBeSent")]
    return [u for u in urls if u != page.resolve().as_uri()]


class Tags(HTMLParser):
    """Element names and the URLs they would load (script bodies are not parsed as tags)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.sources: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.append(tag)
        for name, value in attrs:
            if name in ("src", "srcset", "data", "poster") and value:
                self.sources.append(value)
            if name == "href" and value:
                self.hrefs.append(value)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> ReportFiles:
    return write_report(fixture_report(), tmp_path_factory.mktemp("report"))


# -- the export folder ---------------------------------------------------------------------------


@pytest.mark.slow
def test_export_writes_the_page_and_each_chart_as_png_svg_and_vega_lite(
    exported: ReportFiles,
) -> None:
    folder = exported.html.parent
    assert exported.html == folder / "report.html"
    assert [p.name for p in exported.specs] == [f"{s}.vl.json" for s in SLUGS]
    specs = chart_specs(fixture_report())
    for path in exported.specs:
        assert path.read_text(encoding="utf-8") == spec_json(
            specs[path.name.removesuffix(".vl.json")]
        )
    for png in exported.pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", png.name
        width = int.from_bytes(data[16:20], "big")
        assert width >= 1000, f"{png.name} is {width} px wide, expected a 2x render"
    for svg in exported.svgs:
        text = svg.read_text(encoding="utf-8")
        assert text.lstrip().startswith("<svg"), svg.name
        assert "<text" in text, f"{svg.name} has no text (title, axes)"
    page = exported.html.read_text(encoding="utf-8")
    tags = Tags()
    tags.feed(page)
    # Offline: nothing is loaded from anywhere; links only lead within the page or to the
    # chart files beside it.
    assert tags.sources == []
    assert "link" not in tags.names
    assert all(h.startswith(("#", "charts/")) for h in tags.hrefs), tags.hrefs
    assert tags.names.count("script") == 3
    assert "default-src 'none'" in page
    assert exported.html_bytes < 3_000_000


# -- in Chromium ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_renders_every_chart_offline_with_a_clean_console(
    exported: ReportFiles, browser: DevTools
) -> None:
    charts = open_report(browser, exported.html)
    shot = screenshot(browser, "report.png")
    assert [c["id"] for c in charts] == [f"chart-{s}" for s in SLUGS]
    specs = chart_specs(fixture_report())
    for chart in charts:
        slug = chart["id"].removeprefix("chart-")
        assert chart["rendered"] == "true", slug
        assert chart["drawings"] == 1, slug
        assert specs[slug]["title"]["text"] in chart["texts"], slug
        if any(e["type"] == "temporal" for _, e in positional(specs[slug])):
            # The time axis reads clock times inside the report window (11:00 to 12:00 UTC):
            # a scale that went wrong in the browser shows none, or other ones.
            clock = [t for t in chart["texts"] if re.fullmatch(r"\d\d:\d\d", t)]
            assert len(clock) >= 3, (slug, chart["texts"][:20])
            assert all("11:00" <= t <= "12:00" for t in clock), (slug, clock)
    assert console_problems(browser) == []
    assert fetched_urls(browser, exported.html) == []
    assert shot.stat().st_size > 50_000


HOSTILE_REPLICA = "<script>alert(1)</script>"
HOSTILE_MODEL = '<img src=x onerror="alert(2)">'
HOSTILE_SLO = "</script><script>alert(3)</script>"


def hostile_inputs() -> tuple[ReportInputs, Any, Any]:
    inputs, window, limits = fixture_inputs()

    def relabel(frame: Any, column: str, old: str, new: str) -> pl.DataFrame:
        rows = pl.DataFrame(frame)
        return rows.with_columns(
            pl.when(pl.col(column) == old).then(pl.lit(new)).otherwise(pl.col(column)).alias(column)
        )

    assert inputs.requests is not None
    assert inputs.kv_cache_usage is not None
    assert inputs.burn_rates is not None
    assert inputs.slo_minutes is not None
    requests = relabel(inputs.requests, "replica", "vllm-1", HOSTILE_REPLICA).with_columns(
        model=pl.lit(HOSTILE_MODEL)
    )
    hostile = replace(
        inputs,
        requests=requests,
        kv_cache_usage=relabel(inputs.kv_cache_usage, "replica", "vllm-1", HOSTILE_REPLICA),
        burn_rates=relabel(inputs.burn_rates, "slo", "availability", HOSTILE_SLO),
        slo_minutes=relabel(inputs.slo_minutes, "slo", "availability", HOSTILE_SLO),
    )
    return hostile, window, limits


@pytest.mark.slow
def test_label_values_show_as_text_and_never_run(tmp_path: Path, browser: DevTools) -> None:
    inputs, window, limits = hostile_inputs()
    report = build_report(inputs, title=f"fleet {HOSTILE_MODEL}", window=window, limits=limits)
    files = write_report(report, tmp_path / "hostile", images=False)
    source = files.html.read_text(encoding="utf-8")
    for payload in (HOSTILE_REPLICA, HOSTILE_MODEL, HOSTILE_SLO):
        assert payload not in source
    assert (
        tmp_path / "hostile" / "charts" / "burn-rate-script-script-alert-3-script.vl.json"
    ).exists()

    charts = open_report(browser, files.html)
    screenshot(browser, "hostile-labels.png")
    assert all(c["rendered"] == "true" and c["drawings"] == 1 for c in charts), charts
    assert browser.messages("Page.javascriptDialogOpening") == []
    assert console_problems(browser) == []
    assert fetched_urls(browser, files.html) == []
    # No element the labels describe was created; the only scripts are the page's own three.
    assert browser.evaluate("document.querySelectorAll('script').length") == 3
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    # The values are there, as text: in the header, and on the heatmap's replica axis.
    page_text = browser.evaluate("document.body.innerText")
    assert HOSTILE_MODEL in page_text
    svg_text = browser.evaluate(
        "Array.from(document.querySelectorAll('#chart-kv-cache-usage svg text'))"
        ".map((t) => t.textContent).join('\\n')"
    )
    assert HOSTILE_REPLICA in svg_text.split("\n")
    burn_title = browser.evaluate(
        "Array.from(document.querySelectorAll('#chart-burn-rate-script-script-alert-3-script "
        "svg text')).map((t) => t.textContent).join('\\n')"
    )
    assert f"Burn rate: {HOSTILE_SLO}" in burn_title
