"""Delivering alert notifications over HTTP: to Alertmanager's v2 API, or to a webhook URL.

The only module of `slo/` that touches the network; it takes an injected `httpx.Client`, so
callers choose timeouts and transport and tests substitute a `MockTransport`.

Alertmanager gets each change once, and every firing alert again at each evaluation with an
end time a few minutes ahead, as Prometheus does: Alertmanager deduplicates the re-sends (its
receivers hear once per change) and, should servewatch stop, resolves the alert by itself.
A webhook gets exactly one message per firing or resolved change, and no re-sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from servewatch.slo.alert_state import AlertChange
from servewatch.slo.notification import (
    DEFAULT_VALID_FOR_S,
    NOTIFIED_STATES,
    NotificationError,
    postable_alert,
    webhook_message,
)


@dataclass(frozen=True)
class ReceivedAlert:
    """An alert as Alertmanager holds it (`GET /api/v2/alerts`)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str
    state: str


class AlertmanagerNotifier:
    def __init__(
        self, client: httpx.Client, *, url: str, valid_for_s: float = DEFAULT_VALID_FOR_S
    ) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.valid_for_s = valid_for_s

    def notify(
        self, changes: Sequence[AlertChange], *, firing: Sequence[AlertChange], at: datetime
    ) -> None:
        sent = {c.key: c for c in firing}
        sent.update({c.key: c for c in changes if c.state in NOTIFIED_STATES})
        if not sent:
            return
        alerts = [
            postable_alert(change, at=at, valid_for_s=self.valid_for_s)
            for change in sorted(sent.values(), key=lambda c: c.key.sort_key())
        ]
        self._request("POST", "/api/v2/alerts", json=alerts)

    def alerts(self, *, active: bool = True, silenced: bool = True) -> list[ReceivedAlert]:
        """The alerts Alertmanager holds now; resolved ones are not listed."""
        params = {"active": str(active).lower(), "silenced": str(silenced).lower()}
        body = self._request("GET", "/api/v2/alerts", params=params).json()
        return [
            ReceivedAlert(
                labels=dict(item["labels"]),
                annotations=dict(item.get("annotations") or {}),
                starts_at=item["startsAt"],
                ends_at=item["endsAt"],
                state=item["status"]["state"],
            )
            for item in body
        ]

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        target = f"{self.url}{path}"
        try:
            response = self.client.request(method, target, **kwargs)
        except httpx.HTTPError as exc:
            raise NotificationError(f"Alertmanager {method} {target} failed: {exc}") from exc
        if response.is_error:
            raise NotificationError(
                f"Alertmanager {method} {target} answered {response.status_code}: "
                f"{response.text[:300]}"
            )
        return response


class WebhookNotifier:
    """Posts each firing or resolved change to `url` in Alertmanager's webhook format."""

    def __init__(self, client: httpx.Client, *, url: str) -> None:
        self.client = client
        self.url = url

    def notify(
        self, changes: Sequence[AlertChange], *, firing: Sequence[AlertChange], at: datetime
    ) -> None:
        del firing, at  # a webhook hears changes only
        failures: list[str] = []
        for change in changes:
            if change.state not in NOTIFIED_STATES:
                continue
            try:
                response = self.client.post(self.url, json=webhook_message(change))
            except httpx.HTTPError as exc:
                failures.append(f"{change.key.slo} {change.state.value}: {exc}")
                continue
            if response.is_error:
                failures.append(
                    f"{change.key.slo} {change.state.value}: HTTP {response.status_code}"
                )
        if failures:
            raise NotificationError(f"webhook {self.url} failed for: {'; '.join(failures)}")
