"""Seeded fuzzing of the exposition path over mutated real captures (fixtures/samples).

Each case is a real capture damaged the ways pages are damaged in the field and by hostile
targets: flipped and inserted bytes (many not UTF-8), cut and repeated lines, lines spliced
from another capture, numbers replaced by extreme spellings (1e400, 2^63, 30-digit integers,
NaN, -0), and truncation. For every case:
- nothing raises, in the parser (both formats), the batch frame, or the store's ingest;
- every line that prometheus_client's text parser accepts on its own is kept with the same
  value, unless the exposition grammar or a documented rule of ours refuses it: a name or
  label name outside the grammar (the peer takes any text before the braces as a name), a
  number with non-ASCII digits or digit separators (which Python's float() reads), text
  between the value and the timestamp (which the peer skips), control characters and
  Unicode blanks (which the peer's str.split() takes as blanks); or a rule of ours: a finite
  number past a 64-bit float, a timestamp outside the years 1 to 9999, a repeat of a series
  and time given earlier in the page, or a `_created` sample (never stored).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as peer_text_families

from servewatch.collectors.metrics.exposition import (
    CREATED_SUFFIX,
    LABEL_NAME_PATTERN,
    NAME_PATTERN,
    canonical_labels,
    page_text,
    parse_exposition,
)
from servewatch.collectors.metrics.exposition_batch import parse_expositions
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.store import Store
from tests.conftest import FIXTURES

# The pages built from engines' metric definitions are twenty times the size of the real
# captures; their first lines hold every trait of their format at a twentieth of the cost.
DEFINITION_PAGE_LINES = 150


def capture(path: Path) -> bytes:
    data = path.read_bytes()
    if path.stem.endswith("_upstream-definitions"):
        return b"".join(data.splitlines(keepends=True)[:DEFINITION_PAGE_LINES])
    return data


CAPTURES = tuple(capture(path) for path in sorted((FIXTURES / "samples").glob("*.txt")))
CASES = 3000
SEED = 20261201
EXTREME_NUMBERS = (
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"170141183460469231731687303715884105727",
    b"NaN",
    b"+Inf",
    b"-0",
    b"0x1A",
    b"1_000",
    b"\xd9\xa3",  # an Arabic-Indic digit three: float() takes it, the grammar does not
)
NOISE = (b"\xff", b"\xfe", b"\xc3", b"\xe9", b"\x00", b"{", b"}", b'"', b"\\", b"#", b" ", b"\n")


def mutate(rng: random.Random, page: bytes) -> bytes:
    lines = page.split(b"\n")
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(8)
        at = rng.randrange(len(lines))
        line = lines[at]
        if kind == 0 and line:  # flip a byte
            i = rng.randrange(len(line))
            lines[at] = line[:i] + bytes([rng.randrange(256)]) + line[i + 1 :]
        elif kind == 1:  # insert noise
            i = rng.randrange(len(line) + 1)
            lines[at] = line[:i] + rng.choice(NOISE) + line[i:]
        elif kind == 2:  # cut a line
            del lines[at]
        elif kind == 3:  # repeat a line
            lines.insert(at, line)
        elif kind == 4:  # a line from another capture
            other = rng.choice(CAPTURES).split(b"\n")
            lines.insert(at, rng.choice(other))
        elif kind == 5 and b" " in line and not line.startswith(b"#"):  # an extreme value
            head, _, _ = line.rpartition(b" ")
            lines[at] = head + b" " + rng.choice(EXTREME_NUMBERS)
        elif kind == 6 and b" " in line and not line.startswith(b"#"):  # an extreme timestamp
            lines[at] = line + b" " + rng.choice(EXTREME_NUMBERS)
        elif kind == 7:  # truncate the page
            lines = lines[: at + 1]
            lines[-1] = lines[-1][: rng.randrange(len(lines[-1]) + 1)]
        if not lines:
            lines = [b""]
    return b"\n".join(lines)


def cases() -> Iterator[bytes]:
    rng = random.Random(SEED)
    for _ in range(CASES):
        yield mutate(rng, rng.choice(CAPTURES))


def same(value: float) -> float | str:
    """A value as compared: NaN equals NaN; -0 equals 0, since the peer reads `-0` as the
    integer 0 (we keep -0.0, as Prometheus does)."""
    return "NaN" if math.isnan(value) else float(value)


_NAME_RE = re.compile(NAME_PATTERN)
_LABEL_NAME_RE = re.compile(LABEL_NAME_PATTERN)
_CONTROL_RE = re.compile(
    r"[\x00-\x08\x0a-\x1f\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
)
_MIN_MS = (datetime.min - datetime(1970, 1, 1)) // timedelta(milliseconds=1)
_MAX_MS = (datetime.max - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


def peer_sample(line: bytes) -> tuple[str, str, float, int | None] | None:
    """The sample prometheus_client reads from `line` alone, where our rules keep it too."""
    try:
        text = line.decode("utf-8")
        families = list(peer_text_families(text + "\n"))
    except Exception:  # noqa: BLE001 (any refusal of the peer's means: not comparable)
        return None
    if _CONTROL_RE.search(text):
        return None  # str.split() takes \x0b, \x0c and \x1c-\x1f as blanks; the grammar does not
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1 or text.lstrip().startswith("#"):
        return None
    sample = samples[0]
    if _NAME_RE.fullmatch(sample.name) is None or not all(
        _LABEL_NAME_RE.fullmatch(name) for name in sample.labels
    ):
        return None  # the peer takes any text before the braces as a name; Prometheus does not
    tokens = text.rsplit("}", 1)[-1].split() if "}" in text else text.split()[1:]
    if len(tokens) > 2:
        return None  # the peer skips text between the value and the timestamp
    if not all(token.isascii() and "_" not in token for token in tokens):
        return None  # float() takes non-ASCII digits and digit separators; the grammar does not
    if math.isinf(sample.value) and "inf" not in tokens[0].lower():
        return None  # a finite number past a float: a line error of ours, as in Prometheus
    timestamp_ms = None
    if len(tokens) == 2:
        try:
            timestamp_ms = int(tokens[1])
        except ValueError:
            return None  # the peer reads a float timestamp; the text format has integers
        if not _MIN_MS <= timestamp_ms <= _MAX_MS:
            return None
    if sample.name.endswith(CREATED_SUFFIX):
        return None
    return sample.name, canonical_labels(sample.labels), sample.value, timestamp_ms


def test_mutated_captures_never_raise_and_keep_every_line_the_peer_accepts() -> None:
    compared = 0
    for body in cases():
        text = page_text(body)
        parse_exposition(text)  # the format as the page declares it: must not raise
        page = parse_exposition(text, openmetrics=False)
        kept = set(
            zip(page.metric, page.labels, map(same, page.value), page.timestamp_ms, strict=True)
        )
        seen: set[tuple[str, str, int | None]] = set()
        for line in body.split(b"\n"):
            sample = peer_sample(line)
            if sample is None:
                continue
            name, labels, value, timestamp_ms = sample
            if (name, labels, timestamp_ms) in seen:
                continue  # a repeat: the first is kept, this one is a line error
            seen.add((name, labels, timestamp_ms))
            assert (name, labels, same(value), timestamp_ms) in kept, (line, body)
            compared += 1
    assert compared > CASES * 10  # the oracle compared real lines, not only damaged ones


@pytest.mark.parametrize("batch", [0, 1, 2])
def test_mutated_captures_in_batches_are_stored_without_raising(batch: int) -> None:
    # Forty pages a batch, each its own target, as a scrape round is; then again, idempotent.
    bodies = list(cases())[batch * 40 : (batch + 1) * 40]
    at = datetime(2026, 11, 29, 12, 0, 0)
    texts = [page_text(b) for b in bodies]
    assert parse_expositions(texts).samples.height >= 0
    pages = [
        Page(Target(target_id=f"t{i}", kind=TargetKind.VLLM, url="file:x"), at, text)
        for i, text in enumerate(texts)
    ]
    with Store.open(":memory:") as store:
        first = ingest_pages(pages, store=store, keep_uncatalogued=True)
        again = ingest_pages(pages, store=store, keep_uncatalogued=True)
        assert first.new_scrapes == len(pages)
        assert (again.new_scrapes, again.new_points) == (0, 0)
        assert not [r for r in first.failed_scrapes if "could not be read" in r.message]
