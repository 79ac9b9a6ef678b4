"""Points in time as users type them: ISO 8601 (naive means UTC) or Unix seconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta


def parse_instant(text: str) -> datetime:
    """Parse `text` to a naive UTC datetime; ValueError says what forms are allowed."""
    value = text.strip()
    try:
        return datetime.fromtimestamp(float(value), tz=UTC).replace(tzinfo=None)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"{text!r} is not a time: use ISO 8601 such as 2026-11-18T10:15:00Z "
            "(no zone means UTC) or Unix seconds such as 1795000000"
        ) from exc
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed


def format_instant(moment: datetime | None) -> str | None:
    """A naive UTC datetime as ISO 8601 with a Z, for JSON output."""
    return None if moment is None else moment.isoformat() + "Z"


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """A duration like 30s, 5m, 1h or 7d (Prometheus style, one unit)."""
    match = _DURATION.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"{text!r} is not a duration: use a positive number with one unit of ms, s, m, h, d "
            "such as 5m"
        )
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
