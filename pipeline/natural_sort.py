"""Natural sort: labels in the order people count them (vllm-2 before vllm-10).

One key for every ordering of replica, host, pool, model and SLO names, so the report's
tables and charts and the command line's tables list the same fleet in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_DIGITS = re.compile(r"(\d+)")


def natural_key(label: str | None) -> tuple[tuple[int, int | str], ...]:
    """Sort key of a label: runs of digits compare as numbers, the rest as text; no label
    (None) sorts last."""
    if label is None:
        return ((2, ""),)
    parts = _DIGITS.split(label)
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in parts)


def natural_order(labels: Iterable[str]) -> list[str]:
    """Distinct labels in natural order."""
    return sorted(set(labels), key=natural_key)
