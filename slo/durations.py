"""Durations as SLO files and Prometheus write them (5m, 1h, 3d, 4w), held as whole seconds."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(\d+)(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Largest first, without weeks: Prometheus users read "28d" and "7d" more easily than "4w".
_FORMAT_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration_s(text: str) -> int:
    """Seconds in `text`, one positive whole number and one unit of s, m, h, d or w."""
    match = _DURATION.match(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"{text!r} is not a duration: use a positive whole number and one unit of "
            "s, m, h, d or w, such as 5m, 1h or 28d"
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def format_duration(seconds: int) -> str:
    """The shortest exact spelling: 300 -> 5m, 259200 -> 3d, 90 -> 90s."""
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {seconds} s")
    for unit, size in _FORMAT_UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("unreachable: every whole number of seconds divides by 1")
