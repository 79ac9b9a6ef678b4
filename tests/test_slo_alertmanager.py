"""Notifications: payloads over httpx.MockTransport, then a real Alertmanager (Debian 0.25)
on 127.0.0.1 that takes servewatch's alerts, lists them, resolves them, and tells its own
webhook receiver once per state change."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from servewatch.slo.alert_state import AlertChange, AlertKey, AlertState, InMemoryAlertStateStore
from servewatch.slo.alerting import step
from servewatch.slo.alertmanager import AlertmanagerNotifier, WebhookNotifier
from servewatch.slo.counter_windows import SAMPLES_COLUMNS, present_at
from servewatch.slo.notification import NotificationError, webhook_message
from servewatch.slo.spec import AvailabilitySli, SliSource, SloSpec
from servewatch.slo.windows import BurnWindow, Severity, default_burn_windows
from tests.conftest import free_port, require_program

AT = datetime(2026, 11, 18, 12, 0)
KEY = AlertKey("chat", Severity.PAGE, 3600, 300)
LABELS = (("pool", "chat"), ("team", "inference"))


def change(state: AlertState, *, at: datetime = AT) -> AlertChange:
    return AlertChange(KEY, state, at, AT - timedelta(minutes=3), 16.7, 200.0, 14.4, 0.0235, LABELS)


class Recorder:
    """An httpx.MockTransport handler that keeps requests and answers with `status`."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[httpx.Request] = []
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, json=[] if request.method == "GET" else None)

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests]


def test_alertmanager_payload_for_changes_and_refreshes() -> None:
    recorder = Recorder()
    notifier = AlertmanagerNotifier(
        httpx.Client(transport=httpx.MockTransport(recorder)), url="http://am:9093/"
    )
    other = AlertChange(
        AlertKey("chat", Severity.TICKET, 86400, 7200),
        AlertState.FIRING,
        AT,
        AT,
        4.0,
        5.0,
        3.0,
        0.1,
    )
    notifier.notify(
        [change(AlertState.RESOLVED), change(AlertState.PENDING)], firing=[other], at=AT
    )
    (request,) = recorder.requests
    assert (request.method, str(request.url)) == ("POST", "http://am:9093/api/v2/alerts")
    resolved, ticket = json.loads(request.content)  # ordered by SLO and window
    assert resolved["labels"] == {
        "alertname": "SLOErrorBudgetBurn",
        "slo": "chat",
        "severity": "page",
        "window": "1h",
        "short_window": "5m",
        "pool": "chat",
        "team": "inference",
    }
    assert (resolved["startsAt"], resolved["endsAt"]) == (
        "2026-11-18T11:57:00.000Z",
        "2026-11-18T12:00:00.000Z",
    )
    assert ticket["endsAt"] == "2026-11-18T12:04:00.000Z"  # re-sent: valid four minutes ahead
    assert ticket["annotations"]["long_burn_rate"] == "4"
    assert resolved["annotations"]["budget_consumed"] == "2.4%"
    notifier.notify([change(AlertState.PENDING)], firing=[], at=AT)
    assert len(recorder.requests) == 1  # pending alerts are not sent


@pytest.mark.parametrize(
    ("transport", "message"),
    [
        (
            httpx.MockTransport(Recorder(status=400)),
            r"POST http://am:9093/api/v2/alerts answered 400",
        ),
        (
            httpx.MockTransport(
                lambda request: (_ for _ in ()).throw(
                    httpx.ConnectError("refused", request=request)
                )
            ),
            r"Alertmanager POST http://am:9093/api/v2/alerts failed: refused",
        ),
    ],
)
def test_alertmanager_failures_raise_notification_error(
    transport: httpx.MockTransport, message: str
) -> None:
    notifier = AlertmanagerNotifier(httpx.Client(transport=transport), url="http://am:9093")
    with pytest.raises(NotificationError, match=message):
        notifier.notify([change(AlertState.FIRING)], firing=[], at=AT)


def test_webhook_gets_one_message_per_firing_or_resolved_change() -> None:
    recorder = Recorder()
    notifier = WebhookNotifier(
        httpx.Client(transport=httpx.MockTransport(recorder)), url="http://hook/x"
    )
    notifier.notify(
        [change(AlertState.PENDING), change(AlertState.FIRING)],
        firing=[change(AlertState.FIRING)],
        at=AT,
    )
    notifier.notify([change(AlertState.RESOLVED, at=AT + timedelta(minutes=9))], firing=[], at=AT)
    fired, resolved = recorder.bodies()
    assert (fired["status"], resolved["status"]) == ("firing", "resolved")
    assert fired["version"] == "4"
    assert fired["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert resolved["alerts"][0]["endsAt"] == "2026-11-18T12:09:00.000Z"
    assert resolved["commonLabels"]["severity"] == "page"
    assert fired["commonAnnotations"]["short_burn_rate"] == "200"
    with pytest.raises(ValueError, match="only firing and resolved"):
        webhook_message(change(AlertState.INACTIVE))


def test_webhook_failures_name_each_change() -> None:
    notifier = WebhookNotifier(
        httpx.Client(transport=httpx.MockTransport(Recorder(status=503))), url="http://hook/x"
    )
    with pytest.raises(
        NotificationError, match=r"webhook http://hook/x failed for: chat firing: HTTP 503"
    ):
        notifier.notify([change(AlertState.FIRING)], firing=[], at=AT)


# -- a real Alertmanager ---------------------------------------------------------------------


@dataclass
class Alertmanager:
    url: str
    received: list[dict[str, Any]]


def poll(check: Any, *, deadline_s: float, what: str) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    program = require_program("prometheus-alertmanager")
    received: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        f"""
route:
  receiver: hook
  group_by: [slo, window]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:{hook.server_address[1]}/hook
        send_resolved: true
""",
        encoding="utf-8",
    )
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            program,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"alertmanager exited: {(tmp_path / 'alertmanager.log').read_text()}")
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        poll(ready, deadline_s=15, what="alertmanager to be ready")
        yield Alertmanager(url, received)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        hook.shutdown()
        hook.server_close()


@pytest.mark.slow
def test_real_alertmanager_fires_lists_and_resolves_our_alert(alertmanager: Alertmanager) -> None:
    # Windows of 12 and 1 minutes, so that firing and resolving both happen by the real clock
    # Alertmanager judges end times with: the page fires at the last whole minute before now
    # (one bad minute) and resolves at now (the 1 m window is clean again).
    spec = SloSpec(
        "chat",
        AvailabilitySli(),
        0.999,
        30 * 86400,
        (BurnWindow(Severity.PAGE, long_window_s=720, short_window_s=60, budget_ratio=0.02),),
        scope=(("pool", "chat"),),
    )
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    fire_at = now - timedelta(minutes=1)
    rows = [
        {
            "minute_ts": fire_at - timedelta(minutes=m),
            "slo": "chat",
            "pool": "chat",
            "good": 0 if m == 1 else 600,
            "total": 600,
        }
        for m in range(1, 30)
    ] + [{"minute_ts": fire_at, "slo": "chat", "pool": "chat", "good": 600, "total": 600}]
    minutes = pl.LazyFrame(rows)
    states = InMemoryAlertStateStore()
    with httpx.Client(timeout=5) as client:
        notifier = AlertmanagerNotifier(client, url=alertmanager.url)
        fired = step(minutes, specs=[spec], at=fire_at, states=states, notifier=notifier)
        assert [c.state for c in fired.changes] == [AlertState.FIRING]
        assert fired.notification_error is None
        (listed,) = notifier.alerts()
        assert listed.state == "active"
        assert listed.labels == {
            "alertname": "SLOErrorBudgetBurn",
            "slo": "chat",
            "severity": "page",
            "window": "12m",
            "short_window": "1m",
            "pool": "chat",
        }
        assert listed.annotations["long_burn_rate"] == "83.3"  # 1 bad minute in 12: 8.3 % / 0.1 %
        assert listed.annotations["short_burn_rate"] == "1e+03"
        # 600 bad of 17,400 is 3.4 %: 34 times the 0.1 % budget of the (young) period.
        assert listed.annotations["budget_consumed"] == "3448.3%"
        again = step(minutes, specs=[spec], at=fire_at, states=states, notifier=notifier)
        assert again.changes == ()  # a re-send of the firing alert, not a change

        resolved = step(minutes, specs=[spec], at=now, states=states, notifier=notifier)
        assert [c.state for c in resolved.changes] == [AlertState.RESOLVED]
        poll(lambda: notifier.alerts() == [], deadline_s=10, what="the alert to resolve")

    def told() -> list[str]:
        return [message["status"] for message in alertmanager.received]

    poll(lambda: told() == ["firing", "resolved"], deadline_s=10, what="both notifications")
    time.sleep(1.5)  # two more group intervals: no repeated notification arrives
    assert told() == ["firing", "resolved"]
    firing = alertmanager.received[0]["alerts"][0]
    assert firing["labels"]["slo"] == "chat"
    assert firing["annotations"]["summary"].startswith("SLO chat: error budget burning 83.3x")


@pytest.mark.slow
def test_real_alertmanager_expires_an_alert_whose_evaluations_stop(
    alertmanager: Alertmanager,
) -> None:
    # An absent-data alert (a 99.99 % SLO's has no `for`) fires once and is never re-sent, as
    # when servewatch stops: Alertmanager resolves it by itself at its endsAt and tells the
    # receiver, though servewatch never sent a resolution.
    spec = SloSpec(
        "chat",
        AvailabilitySli(SliSource.METRICS),
        0.9999,
        30 * 86400,
        default_burn_windows(),
    )
    wall = datetime.now(UTC).replace(tzinfo=None)
    at = wall.replace(second=0, microsecond=0)
    minutes = pl.LazyFrame(
        {"minute_ts": [at - timedelta(minutes=1)], "slo": ["chat"], "good": [0], "total": [0]}
    )
    nothing = pl.LazyFrame(schema=dict.fromkeys(SAMPLES_COLUMNS, pl.String())).with_columns(
        pl.col("ts").cast(pl.Datetime("us")), pl.col("value").cast(pl.Float64())
    )
    presence = present_at(nothing, instants=[at], slos=["chat"])
    # Valid until three seconds from now; the evaluation instant is the minute's start.
    valid_for_s = (wall - at).total_seconds() + 3
    with httpx.Client(timeout=5) as client:
        notifier = AlertmanagerNotifier(client, url=alertmanager.url, valid_for_s=valid_for_s)
        fired = step(
            minutes,
            specs=[spec],
            at=at,
            states=InMemoryAlertStateStore(),
            notifier=notifier,
            presence=presence,
        )
        assert [(c.key.slo, c.state) for c in fired.changes] == [("chat", AlertState.FIRING)]
        (listed,) = notifier.alerts()
        assert listed.labels == {"alertname": "SLOMetricAbsent", "slo": "chat", "severity": "page"}
        assert listed.ends_at.startswith((at + timedelta(seconds=valid_for_s)).isoformat()[:19])
        poll(lambda: notifier.alerts() == [], deadline_s=15, what="the alert to expire")

    def told() -> list[str]:
        return [message["status"] for message in alertmanager.received]

    poll(lambda: told() == ["firing", "resolved"], deadline_s=10, what="both notifications")
    resolved = alertmanager.received[1]["alerts"][0]
    assert resolved["labels"]["alertname"] == "SLOMetricAbsent"
