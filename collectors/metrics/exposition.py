"""Prometheus exposition pages (text format 0.0.4 and OpenMetrics 1.0) parsed into columns.

This module owns the exposition grammar: what a sample line, a label set, a value, a timestamp
and a metadata line (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) may look like, and the columnar
form a page takes on its way to the store: parallel lists of metric name, canonical labels
(sorted-key JSON, see `canonical_labels`), value and timestamp in milliseconds.

A malformed line never costs the rest of the page: it becomes a `LineError` with its 1-based
line number and every well-formed sample is still returned. That holds for anything a line can
hold: a number out of range (a value past a 64-bit float, a timestamp outside the years 1 to
9999), a second sample for a series and time the page already gave, and bytes that are not
UTF-8, which `page_text` keeps as lone surrogates so that they cost only the lines that hold
them. `_created` samples are counted and left out, because they hold a creation time, not a
measurement.

Speed: a page is first read by a fast path that cuts lines with `str` methods only and checks
names, label sets and values in bulk, parsing each distinct series key and label set once
(`SeriesCache`), and reading a page's values in one call where they are plain JSON floats.
Any page the fast path cannot vouch for is read again, line by line, by
`parse_sample_line`, the reference grammar, which also words the errors and numbers the lines;
both paths give the same result for any page the fast path accepts.

Size: over 500 lines on purpose: one grammar, with a fast path for well-formed pages and a line-
by-line path for the rest that must agree sample for sample; the differential and fuzz tests
hold the two together.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import TypeVar

import orjson
import polars as pl

NAME_PATTERN = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME_PATTERN = r"[a-zA-Z_][a-zA-Z0-9_]*"
CREATED_SUFFIX = "_created"
_T = TypeVar("_T")

SAMPLES_SCHEMA = pl.Schema(
    {
        "metric": pl.String(),
        "labels": pl.String(),
        "value": pl.Float64(),
        "timestamp_ms": pl.Int64(),
    }
)

_NAME_RE = re.compile(NAME_PATTERN)
_LABEL_NAME_RE = re.compile(LABEL_NAME_PATTERN)
# A quoted label value: any escaped character, otherwise anything but a quote or backslash.
_QUOTED = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_QUOTED_RAW = r'"([^"\\]*+(?:\\.[^"\\]*+)*+)"'
# Whitespace around tokens is tolerated, as Prometheus's own text parser does.
_PAIR_TEXT = LABEL_NAME_PATTERN + r"[ \t]*+=[ \t]*+" + _QUOTED
_PAIR_FIND_RE = re.compile("(" + LABEL_NAME_PATTERN + r")[ \t]*+=[ \t]*+" + _QUOTED_RAW)
# A whole well-formed label set, checked in one call; pairs are then read with findall.
_LABEL_SET_RE = re.compile(
    r"[ \t]*+(?:" + _PAIR_TEXT + r"[ \t]*+,[ \t]*+)*+(?:" + _PAIR_TEXT + r"[ \t]*+)?+"
)
# One pair and what ends it, a comma or the end of the set: the stepwise (error) path.
_PAIR_RE = re.compile(
    r"[ \t]*+(" + LABEL_NAME_PATTERN + r")[ \t]*+=[ \t]*+" + _QUOTED_RAW + r"[ \t]*+(,|$)"
)
_LABEL_ESCAPE_RE = re.compile(r'\\([\\"n])')
_TEXT_HELP_ESCAPE_RE = re.compile(r"\\([\\n])")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
# A label set from `{` to its `}`: braces inside quoted values do not end it.
_BLOCK_RE = re.compile(r'\{((?:[^"}]++|' + _QUOTED + r")*+)\}")
_VALUE_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf(?:inity)?|nan))"
)
_TEXT_TIMESTAMP_RE = re.compile(r"-?[0-9]+")
_OM_TIMESTAMP_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

VALUE_RULE = "a decimal or exponent number, NaN, +Inf or -Inf"
# Sample times the store and every reader can represent: naive datetimes, years 1 to 9999.
_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
MIN_TIMESTAMP_MS = (datetime.min - _EPOCH) // _MS
MAX_TIMESTAMP_MS = (datetime.max - _EPOCH) // _MS
TIMESTAMP_RULE = "a time in the years 1 to 9999"
# Bytes that are not UTF-8, as `page_text` keeps them (surrogateescape): U+DC80 to U+DCFF.
_UNDECODED_RE = re.compile("[\udc80-\udcff]")


class ExpositionFormat(Enum):
    """The two exposition formats; values are the media types a scraper sends in Accept."""

    TEXT = "text/plain; version=0.0.4"
    OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class MetricType(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    SUMMARY = "summary"
    UNTYPED = "untyped"
    UNKNOWN = "unknown"
    GAUGEHISTOGRAM = "gaugehistogram"
    STATESET = "stateset"
    INFO = "info"


_TYPES = {t.value: t for t in MetricType}
_TYPE_RULE = ", ".join(sorted(_TYPES))
# Which sample-name suffixes belong to a family of which type (`family_of`).
_SUFFIX_TYPES: tuple[tuple[str, frozenset[MetricType]], ...] = (
    ("_total", frozenset({MetricType.COUNTER})),
    ("_bucket", frozenset({MetricType.HISTOGRAM, MetricType.GAUGEHISTOGRAM})),
    ("_count", frozenset({MetricType.HISTOGRAM, MetricType.SUMMARY})),
    ("_sum", frozenset({MetricType.HISTOGRAM, MetricType.SUMMARY})),
    ("_gcount", frozenset({MetricType.GAUGEHISTOGRAM})),
    ("_gsum", frozenset({MetricType.GAUGEHISTOGRAM})),
    ("_info", frozenset({MetricType.INFO})),
    (CREATED_SUFFIX, frozenset({MetricType.COUNTER, MetricType.HISTOGRAM, MetricType.SUMMARY})),
)


@dataclass(frozen=True, slots=True)
class Family:
    """What a page's metadata lines said about one metric family; None where it said nothing."""

    name: str
    type: MetricType | None = None
    help: str | None = None
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that could not be read: its 1-based number, what was wrong, and the line."""

    line: int
    message: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class ExpositionLineError(ValueError):
    """One line breaks the exposition grammar; the message says what and what is allowed."""


class LabelSetError(ExpositionLineError):
    """A label set breaks the grammar; `offset` is where, 0-based within the label-set text."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at column {offset + 1} of the label set")
        self.reason = reason
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Sample:
    metric: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ParsedPage:
    """One page as columns (index i of each list is one sample), plus what the page declared.

    `labels` holds canonical JSON strings (`canonical_labels`); `timestamp_ms` is None for
    samples the page gave no timestamp. `errors` lists the lines that were left out.
    """

    format: ExpositionFormat
    metric: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    timestamp_ms: list[int | None] = field(default_factory=list)
    families: dict[str, Family] = field(default_factory=dict)
    errors: list[LineError] = field(default_factory=list)
    skipped_created: int = 0

    def __len__(self) -> int:
        return len(self.metric)

    def frame(self) -> pl.DataFrame:
        """The samples as a DataFrame with `SAMPLES_SCHEMA`."""
        return pl.DataFrame(
            {
                "metric": self.metric,
                "labels": self.labels,
                "value": self.value,
                "timestamp_ms": self.timestamp_ms,
            },
            schema=SAMPLES_SCHEMA,
        )

    def family_of(self, metric: str) -> Family | None:
        """The declared family a sample name belongs to (`x_bucket` to histogram `x`), if any."""
        family = self.families.get(metric)
        if family is not None:
            return family
        for suffix, types in _SUFFIX_TYPES:
            if metric.endswith(suffix):
                family = self.families.get(metric[: -len(suffix)])
                if family is not None and family.type in types:
                    return family
        return None


class SeriesCache:
    """Series keys, label sets and metadata already read, so each distinct one is parsed once.

    A page repeats its label sets (every histogram shares its `le` sets, every series of a
    replica its model and engine labels); the pages of replicas serving one model, and the
    scrapes of one target, repeat whole series keys (the text before the value) and metadata.
    Sharing a cache across the pages of a batch, or across the scrapes of a target, saves that
    work. It is cleared when it grows past `max_entries`, so churning series cannot grow it
    without bound.
    """

    __slots__ = (
        "blocks",
        "created",
        "families",
        "malformed",
        "max_entries",
        "respelled",
        "series_labels",
        "series_names",
        "spellings",
    )

    def __init__(self, *, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        # Series key ('name{labels', the text before the closing brace) -> canonical labels
        # and -> metric name, for well-formed keys; malformed keys are only remembered.
        self.series_labels: dict[str, str] = {}
        self.series_names: dict[str, str] = {}
        self.malformed: set[str] = set()
        self.created: set[str] = set()  # the keys of `_created` samples
        # Series (name and canonical labels) -> the first key spelling it; keys that spell a
        # series another key spells too (label order, spacing), which one page could repeat.
        self.spellings: dict[tuple[str, str], str] = {}
        self.respelled: set[str] = set()
        self.blocks: dict[str, str | None] = {}  # label-set text -> canonical labels or None
        # All metadata lines of a page, joined, (prefixed by format) -> the families declared.
        self.families: dict[str, dict[str, Family]] = {}

    def trim(self) -> None:
        size = len(self.series_labels) + len(self.malformed) + len(self.blocks)
        if size + len(self.families) > self.max_entries:
            for table in (self.series_labels, self.series_names, self.blocks, self.families):
                table.clear()
            self.spellings.clear()
            for keys in (self.malformed, self.created, self.respelled):
                keys.clear()


def canonical_labels(labels: Mapping[str, str]) -> str:
    """The store's spelling of a label set: compact JSON, keys sorted, UTF-8 unescaped."""
    return orjson.dumps(labels, option=orjson.OPT_SORT_KEYS).decode()


def _unescape_label_value(raw: str) -> str:
    # Only \\, \" and \n are escapes; any other backslash stays as written, as in Prometheus.
    return _LABEL_ESCAPE_RE.sub(lambda m: _UNESCAPED[m.group(1)], raw)


def parse_labels(block: str) -> dict[str, str]:
    """The label set written between `{` and `}` (braces excluded), values unescaped.

    Raises ExpositionLineError naming the offending label and the column within `block`.
    """
    if _LABEL_SET_RE.fullmatch(block) is None:
        return _parse_labels_stepwise(block)  # raises, saying where and why
    pairs = _PAIR_FIND_RE.findall(block)
    labels = dict(pairs)
    if len(labels) != len(pairs) or "__name__" in labels:
        return _parse_labels_stepwise(block)
    if "\\" in block:
        return {
            name: _unescape_label_value(raw) if "\\" in raw else raw for name, raw in labels.items()
        }
    return labels


def _parse_labels_stepwise(block: str) -> dict[str, str]:
    """parse_labels one pair at a time, to say precisely what is wrong where."""
    labels: dict[str, str] = {}
    pos, end = 0, len(block)
    while pos < end:
        match = _PAIR_RE.match(block, pos)
        if match is None:
            if not block[pos:].strip():
                break
            raise _label_problem(block, pos)
        name, raw, separator = match.groups()
        at = match.start(1)
        if name in labels:
            raise LabelSetError(f"label {name!r} appears twice in one label set", at)
        if name == "__name__":
            raise LabelSetError("the metric name must precede the braces, not be __name__", at)
        labels[name] = _unescape_label_value(raw) if "\\" in raw else raw
        pos = match.end()
        if not separator:
            break
    return labels


def _label_problem(block: str, pos: int) -> LabelSetError:
    """Why the label pair starting at `pos` does not parse (the error path only)."""
    rest = block[pos:].lstrip(" \t")
    at = len(block) - len(rest)
    name = _LABEL_NAME_RE.match(rest)
    if name is None:
        return LabelSetError(
            f"expected a label name matching {LABEL_NAME_PATTERN}, found {rest[:1]!r}", at
        )
    label = name.group()
    after = rest[name.end() :].lstrip(" \t")
    at = len(block) - len(after)
    if not after.startswith("="):
        return LabelSetError(f"expected '=' after label name {label!r}", at)
    value = after[1:].lstrip(" \t")
    at = len(block) - len(value)
    if not value.startswith('"'):
        return LabelSetError(f"the value of label {label!r} must be in double quotes", at)
    closed = re.match(_QUOTED, value)
    if closed is None:
        return LabelSetError(f"the value of label {label!r} has no closing quote", at)
    at += closed.end()
    return LabelSetError(f"expected ',' or '}}' after the value of label {label!r}", at)


def page_text(content: bytes | bytearray | memoryview) -> str:
    """A page's bytes as text: UTF-8, with any byte that is not UTF-8 kept as a lone surrogate
    (surrogateescape), so the parser can refuse just the lines that hold one and the bytes
    can be written back unchanged (`page_bytes`). Decoded straight from any buffer (a view
    on received bytes included), without a copy of the bytes first."""
    return str(content, "utf-8", "surrogateescape")


def page_bytes(text: str) -> bytes:
    """The bytes a page's text came from (`page_text`)."""
    return text.encode("utf-8", "surrogateescape")


def _check_decoded(line: str) -> None:
    """Refuse a line that holds bytes that are not UTF-8 (`page_text`)."""
    found = None if line.isascii() else _UNDECODED_RE.search(line)
    if found is not None:
        byte = ord(found.group()) - 0xDC00
        raise ExpositionLineError(
            f"byte 0x{byte:02x} at column {found.start() + 1} is not UTF-8 text"
        )


def _check_first(
    seen: dict[tuple[str, str, int | None], int], sample: Sample, labels: str, line: int
) -> None:
    """Refuse a second sample for a series and time (`seen` maps them to their first line),
    as Prometheus refuses duplicate samples; the first one is kept."""
    first = seen.setdefault((sample.metric, labels, sample.timestamp_ms), line)
    if first != line:
        raise ExpositionLineError(
            f"duplicate sample: line {first} already gave {sample.metric}{labels} a value "
            "at this time; the first is kept"
        )


def parse_value(token: str) -> float:
    """A sample value: decimal or exponent notation, NaN, +Inf, -Inf (any case)."""
    if _VALUE_RE.fullmatch(token) is None:
        raise ExpositionLineError(f"value {token!r} is not a number: allowed is {VALUE_RULE}")
    value = float(token)
    if math.isinf(value) and "i" not in token.lower():
        # As Prometheus refuses it: a finite number too large for a float is no measurement.
        raise ExpositionLineError(f"value {token!r} is out of the range of a 64-bit float")
    return value


def parse_timestamp_ms(token: str, *, openmetrics: bool) -> int:
    """A sample timestamp in milliseconds: text format writes integer milliseconds, OpenMetrics
    seconds with an optional fraction (rounded here to the nearest millisecond)."""
    if openmetrics:
        if _OM_TIMESTAMP_RE.fullmatch(token) is None:
            raise ExpositionLineError(
                f"timestamp {token!r} is not a number of seconds (OpenMetrics timestamps are "
                "decimal seconds such as 1700000000.123)"
            )
        seconds = float(token)
        timestamp_ms = round(seconds * 1000) if math.isfinite(seconds) else None
    else:
        if _TEXT_TIMESTAMP_RE.fullmatch(token) is None:
            raise ExpositionLineError(
                f"timestamp {token!r} is not an integer: text format timestamps are "
                "milliseconds since the epoch"
            )
        # A digit string of any length is an int; only its range can be wrong.
        timestamp_ms = int(token) if len(token) < 24 else None
    if timestamp_ms is None or not MIN_TIMESTAMP_MS <= timestamp_ms <= MAX_TIMESTAMP_MS:
        raise ExpositionLineError(
            f"timestamp {token!r} is out of range: allowed is {TIMESTAMP_RULE}"
        )
    return timestamp_ms


def _split_exemplar(rest: str) -> str:
    """The value part of an OpenMetrics sample; an exemplar after ` # ` is checked, dropped."""
    value_part, _, exemplar = rest.partition("#")
    text = exemplar.strip()
    block = _BLOCK_RE.match(text)
    tokens = text[block.end() :].split() if block else []
    if block is None or not 1 <= len(tokens) <= 2:
        raise ExpositionLineError(
            "malformed exemplar: expected '# {labels} value [timestamp]' after the value"
        )
    try:
        parse_labels(block.group(1))
        parse_value(tokens[0])
        if len(tokens) == 2:
            parse_timestamp_ms(tokens[1], openmetrics=True)
    except ExpositionLineError as exc:
        raise ExpositionLineError(f"malformed exemplar: {exc}") from exc
    return value_part


def parse_sample_line(line: str, *, openmetrics: bool = False) -> Sample:
    """One sample line, by the reference grammar; raises ExpositionLineError if malformed."""
    text = line.strip()
    indent = len(line) - len(line.lstrip())
    name_match = _NAME_RE.match(text)
    if name_match is None:
        if text.startswith("{"):
            raise ExpositionLineError("the line has no metric name before '{'")
        raise ExpositionLineError(
            f"expected a metric name matching {NAME_PATTERN}, found {text[:1]!r}"
        )
    name = name_match.group()
    pos = name_match.end()
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    labels: dict[str, str] = {}
    if text.startswith("{", pos):
        block = _BLOCK_RE.match(text, pos)
        if block is None:
            raise ExpositionLineError(_unclosed_block(text, pos, indent))
        try:
            labels = parse_labels(block.group(1))
        except LabelSetError as exc:
            column = indent + pos + 2 + exc.offset  # 1-based, past the '{'
            raise ExpositionLineError(f"{exc.reason} at column {column}") from exc
        pos = block.end()
    elif pos == name_match.end() and pos < len(text):
        raise ExpositionLineError(
            f"metric name {name!r} is followed by {text[pos]!r} at column {indent + pos + 1}: "
            f"names match {NAME_PATTERN}"
        )
    rest = text[pos:]
    if openmetrics and "#" in rest:
        rest = _split_exemplar(rest)
    tokens = rest.split()
    if not tokens:
        raise ExpositionLineError(f"sample {name!r} has no value")
    if len(tokens) > 2:
        raise ExpositionLineError(
            f"unexpected {tokens[2]!r} after the timestamp: a sample is "
            "'name{labels} value [timestamp]'"
        )
    value = parse_value(tokens[0])
    timestamp_ms = (
        parse_timestamp_ms(tokens[1], openmetrics=openmetrics) if len(tokens) == 2 else None
    )
    return Sample(name, labels, value, timestamp_ms)


def _unclosed_block(text: str, pos: int, indent: int) -> str:
    quotes = 0
    escaped = False
    for char in text[pos:]:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = quotes % 2 == 1
        elif char == '"':
            quotes += 1
    column = indent + pos + 1
    if quotes % 2:
        return f"a label value in the label set opened at column {column} has no closing quote"
    return f"the label set opened at column {column} has no closing '}}'"


def detect_format(text: str) -> ExpositionFormat:
    """OpenMetrics if the page ends with the `# EOF` line that format requires, else text."""
    tail = text.rstrip()
    if tail == "# EOF" or tail.endswith("\n# EOF"):
        return ExpositionFormat.OPENMETRICS
    return ExpositionFormat.TEXT


# A metadata line as (keyword, metric name, text): TYPE carries the type, HELP the unescaped
# help, UNIT the unit; ("EOF", "", "") is the OpenMetrics end marker.
Declaration = tuple[str, str, str]
_EOF: Declaration = ("EOF", "", "")


def parse_declaration(line: str, *, openmetrics: bool) -> Declaration | None:
    """A `#` line as a Declaration, or None for a plain comment.

    Raises ExpositionLineError for a HELP, TYPE or UNIT line that is malformed.
    """
    parts = line.split(None, 3)
    if len(parts) < 2 or parts[0] != "#":
        return None
    keyword = parts[1]
    if keyword == "EOF" and len(parts) == 2:
        return _EOF
    if keyword not in {"HELP", "TYPE"} and not (openmetrics and keyword == "UNIT"):
        return None
    if len(parts) < 3:
        raise ExpositionLineError(f"# {keyword} line names no metric")
    name = parts[2]
    if _NAME_RE.fullmatch(name) is None:
        raise ExpositionLineError(
            f"# {keyword} names {name!r}, which is not a metric name ({NAME_PATTERN})"
        )
    text = parts[3].strip() if len(parts) == 4 else ""
    if keyword == "TYPE" and text not in _TYPES:
        raise ExpositionLineError(f"# TYPE {name} gives type {text!r}; allowed are {_TYPE_RULE}")
    if keyword == "HELP" and "\\" in text:
        pattern = _LABEL_ESCAPE_RE if openmetrics else _TEXT_HELP_ESCAPE_RE
        text = pattern.sub(lambda m: _UNESCAPED[m.group(1)], text)
    return keyword, name, text


class _Families:
    """The families a page declares, gathered from its declarations in page order."""

    __slots__ = ("declared",)

    def __init__(self) -> None:
        self.declared: dict[str, dict[str, str]] = {}

    def add(self, declaration: Declaration) -> None:
        keyword, name, text = declaration
        fields = self.declared.setdefault(name, {})
        if keyword == "TYPE" and "TYPE" in fields:
            raise ExpositionLineError(f"second # TYPE line for {name}; the first one is kept")
        fields[keyword] = text

    def families(self) -> dict[str, Family]:
        return {
            name: Family(
                name,
                _TYPES[fields["TYPE"]] if "TYPE" in fields else None,
                fields.get("HELP"),
                fields.get("UNIT"),
            )
            for name, fields in self.declared.items()
        }


def parse_exposition(
    text: str, *, openmetrics: bool | None = None, cache: SeriesCache | None = None
) -> ParsedPage:
    """Parse one page. `openmetrics=None` decides by the page (`detect_format`).

    Never raises for bad input: malformed lines are reported in `errors` and skipped. A cache
    shared between calls makes repeated series cheaper; results are the same without it.
    """
    fmt = detect_format(text) if openmetrics is None else _format(openmetrics)
    cache = SeriesCache() if cache is None else cache
    page = None if _undecoded(text) else _fast_page(text, fmt, cache)
    if page is None:
        page = _careful_page(text, fmt)
    cache.trim()
    return page


def _format(openmetrics: bool) -> ExpositionFormat:
    return ExpositionFormat.OPENMETRICS if openmetrics else ExpositionFormat.TEXT


@dataclass(frozen=True, slots=True)
class PageShape:
    """A page's text but its values: its lines, each sample line only up to its last space
    (`heads`), the others whole (`fixed`), and which sample lines' last tokens are the values
    the parser reads (every sample's but `_created` ones)."""

    format: ExpositionFormat
    lines: int
    fixed: Callable[[list[str]], tuple[str, ...]]
    fixed_lines: tuple[str, ...]
    samples: Callable[[list[str]], tuple[str, ...]]
    heads: list[str]
    read: Callable[[list[str]], tuple[str, ...]]


def page_shape(text: str, *, openmetrics: bool | None = None) -> PageShape | None:
    """The shape of `text`, or None for a page no later page could share values alone with
    (bytes that were not UTF-8). `shaped_values` reads a later page of the same shape."""
    fmt = detect_format(text) if openmetrics is None else _format(openmetrics)
    if _undecoded(text):
        return None
    lines = text.split("\n")
    fixed: list[int] = []
    samples: list[int] = []
    read: list[int] = []
    heads: list[str] = []
    for index, line in enumerate(lines):
        if not line or line[0] == "#" or " " not in line:
            fixed.append(index)
            continue
        head = line.rpartition(" ")[0]
        if not head.partition("{")[0].endswith(CREATED_SUFFIX):
            read.append(len(samples))
        samples.append(index)
        heads.append(head)
    fixed_lines = picker(fixed)(lines)
    return PageShape(
        fmt, len(lines), picker(fixed), fixed_lines, picker(samples), heads, picker(read)
    )


def picker(indices: Sequence[int]) -> Callable[[Sequence[_T]], tuple[_T, ...]]:
    """A function picking the items at `indices` of a list, in one C call
    (`operator.itemgetter`), always as a tuple: how a page's shape picks its lines."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        only = indices[0]
        return lambda items: (items[only],)
    return lambda _items: ()


def shaped_values(
    text: str, shape: PageShape, *, openmetrics: bool | None = None
) -> list[float] | None:
    """The values `parse_exposition` reads from `text` (finite or NaN, without timestamps), in
    page order, if `text` has `shape`; else None.

    Such a page is the shape's page with other last tokens on its sample lines, none holding a
    `}` (which would move where the parser cuts a line's series key); so it has the same `#`
    lines and series keys, and the values the parser reads are those tokens read by `_values`,
    the fast path's own reading (a space before a value changes nothing there)."""
    fmt = detect_format(text) if openmetrics is None else _format(openmetrics)
    tokens = _shaped_tokens(text, shape) if fmt is shape.format else None
    openmetrics_page = fmt is ExpositionFormat.OPENMETRICS
    columns = (
        None if tokens is None else _values(list(shape.read(tokens)), openmetrics=openmetrics_page)
    )
    if columns is None:
        return None
    values, timestamps = columns
    if timestamps.count(None) != len(timestamps) or math.inf in values or -math.inf in values:
        return None
    return values


def _shaped_tokens(text: str, shape: PageShape) -> list[str] | None:
    """The last tokens of `text`'s sample lines if it has `shape` and none holds a `}`."""
    if _undecoded(text):
        return None
    lines = text.split("\n")
    if len(lines) != shape.lines or shape.fixed(lines) != shape.fixed_lines:
        return None
    cut = [line.rpartition(" ") for line in shape.samples(lines)]
    if [head for head, _, _ in cut] != shape.heads:
        return None
    tokens = [token for _, _, token in cut]
    return None if "}" in "".join(tokens) else tokens


def _undecoded(text: str) -> bool:
    """Whether the page holds bytes that were not UTF-8 (`page_text`'s lone surrogates)."""
    return not text.isascii() and _UNDECODED_RE.search(text) is not None


def _cut_page(text: str, fmt: ExpositionFormat) -> tuple[list[str], list[str], list[str]] | None:
    """The fast path's first step: the page's `#` lines, and its sample lines cut into series
    keys and the rest (`_cut_samples`); None if an OpenMetrics page's end is not plain."""
    if fmt is ExpositionFormat.OPENMETRICS:
        body, eof, tail = text.rpartition("# EOF")
        if not eof or tail.strip() or not (body == "" or body.endswith("\n")):
            return None
        text = body
    lines = list(filter(None, text.split("\n")))
    rows = _cut_samples([line for line in lines if line[0] != "#"])
    if rows is None:
        return None
    return [line for line in lines if line[0] == "#"], *rows


def _fast_page(text: str, fmt: ExpositionFormat, cache: SeriesCache) -> ParsedPage | None:
    """The page if every line is plainly well formed, else None (the careful path decides)."""
    openmetrics = fmt is ExpositionFormat.OPENMETRICS
    cut = _cut_page(text, fmt)
    if cut is None:
        return None
    comments, keys, rests = cut
    families = _fast_families(comments, openmetrics=openmetrics, cache=cache)
    if families is None:
        return None
    distinct = set(keys)
    _learn_series(distinct.difference(cache.series_labels, cache.malformed), cache)
    if not distinct.isdisjoint(cache.malformed):
        return None
    # A series given twice (or under two spellings of one label set) may be a duplicate
    # sample; the careful path decides, by time, and names the line.
    if len(distinct) < len(keys) or not distinct.isdisjoint(cache.respelled):
        return None
    skipped = 0
    created = distinct & cache.created
    if created:
        keep = list(map(operator.not_, map(created.__contains__, keys)))
        skipped = len(keys) - sum(keep)
        keys = list(itertools.compress(keys, keep))
        rests = list(itertools.compress(rests, keep))
    columns = _values(rests, openmetrics=openmetrics)
    # An infinite value may be a finite number out of range: the careful path tells which.
    if columns is None or math.inf in columns[0] or -math.inf in columns[0]:
        return None
    return ParsedPage(
        format=fmt,
        metric=list(map(cache.series_names.__getitem__, keys)),
        labels=list(map(cache.series_labels.__getitem__, keys)),
        value=columns[0],
        timestamp_ms=columns[1],
        families=families,
        skipped_created=skipped,
    )


def _fast_families(
    comments: list[str], *, openmetrics: bool, cache: SeriesCache
) -> dict[str, Family] | None:
    """The families the page declares; None if a metadata line is malformed or misplaced."""
    key = ("1" if openmetrics else "0") + "\n".join(comments)
    known = cache.families.get(key)
    if known is not None:
        return dict(known)
    families = _Families()
    try:
        for comment in comments:
            declaration = parse_declaration(comment, openmetrics=openmetrics)
            if declaration is _EOF:
                if openmetrics:
                    return None  # an EOF before the end of the page
            elif declaration is not None:
                families.add(declaration)
    except ExpositionLineError:
        return None
    found = families.families()
    cache.families[key] = found
    return dict(found)


def _cut_samples(samples: list[str]) -> tuple[list[str], list[str]] | None:
    """Each sample line cut into its series key (up to the last `}`) and the rest.

    An exemplar or a stray brace ends up inside the key, which then does not parse, and the
    careful path takes over. A line without labels gets the key 'name{', as if it had `{}`.
    """
    if not samples:
        return [], []
    heads, closed, tails = zip(*[line.rpartition("}") for line in samples], strict=True)
    keys, rests = list(heads), list(tails)
    if "" in closed:  # samples without labels: 'name value [timestamp]'
        for i in [i for i, brace in enumerate(closed) if not brace]:
            name, _, rest = rests[i].partition(" ")
            if "{" in name:
                return None
            keys[i], rests[i] = name + "{", rest
    return keys, rests


def _learn_series(keys: set[str], cache: SeriesCache) -> None:
    """Parse series keys not seen before; each distinct label set and name is checked once."""
    if not keys:
        return
    new = list(keys)
    names, braces, blocks = zip(*[key.partition("{") for key in new], strict=True)
    known_blocks = cache.blocks
    for block in set(blocks).difference(known_blocks):
        try:
            known_blocks[block] = canonical_labels(parse_labels(block))
        except (ExpositionLineError, orjson.JSONEncodeError):
            known_blocks[block] = None
    labels = list(map(known_blocks.__getitem__, blocks))
    distinct_names = set(names)
    bad_names = {name for name in distinct_names if _NAME_RE.fullmatch(name) is None}
    if bad_names or None in labels or "" in braces:
        good = [
            label is not None and brace != "" and name not in bad_names
            for name, brace, label in zip(names, braces, labels, strict=True)
        ]
        cache.malformed.update(itertools.compress(new, map(operator.not_, good)))
        new = list(itertools.compress(new, good))
        names = tuple(itertools.compress(names, good))
        labels = list(itertools.compress(labels, good))
    cache.series_labels.update(zip(new, labels, strict=True))  # type: ignore[arg-type]
    cache.series_names.update(zip(new, names, strict=True))
    spellings = cache.spellings
    for key, series in zip(new, zip(names, labels, strict=True), strict=True):
        first = spellings.setdefault(series, key)  # type: ignore[arg-type]
        if first != key:
            cache.respelled.update((first, key))
    created = {name for name in distinct_names if name.endswith(CREATED_SUFFIX)}
    if created:
        cache.created.update(key for key, name in zip(new, names, strict=True) if name in created)


def _values(rests: list[str], *, openmetrics: bool) -> tuple[list[float], list[int | None]] | None:
    """Values and timestamps of the text after each label set, or None if any is unusual."""
    joined = "".join(rests)
    # float() would also take digit separators and non-ASCII digits; the grammar does not.
    if "_" in joined or not joined.isascii() or (openmetrics and "#" in joined):
        return None
    no_timestamps: list[int | None] = [None] * len(rests)
    if "," not in joined:
        floats = _json_floats(rests)
        if floats is not None:
            return floats, no_timestamps
    try:
        # A page without timestamps: float() reads ' 12.5' whole, in one C loop.
        return list(map(float, rests)), no_timestamps
    except ValueError:
        pass
    values: list[float] = []
    timestamps: list[int | None] = []
    for rest in rests:
        tokens = rest.split()
        try:
            if len(tokens) == 1:
                values.append(float(tokens[0]))
                timestamps.append(None)
            elif len(tokens) == 2:
                values.append(float(tokens[0]))
                timestamps.append(parse_timestamp_ms(tokens[1], openmetrics=openmetrics))
            else:
                return None
        except ValueError:  # ExpositionLineError included
            return None
    return values, timestamps


def _json_floats(rests: list[str]) -> list[float] | None:
    """The values read as one JSON array (a page's values without commas, one each), or None
    unless every one is a JSON number with a fraction or an exponent, as exporters write
    floats. Such a number means the same in JSON as in the exposition grammar, and both
    parsers round it correctly, so the floats are float()'s, bit for bit; reading them in one
    call costs about a sixth of a float() call each. Anything else is left to float(): JSON's
    integers (its `-0` is 0), NaN and Inf, a leading `+` or `.`, a timestamp after the value."""
    if not rests:
        return None
    try:
        values = orjson.loads("[" + ",".join(rests) + "]")
    except orjson.JSONDecodeError:  # also a number too large for a float
        return None
    if len(values) != len(rests) or set(map(type, values)) != {float}:
        return None
    floats: list[float] = values
    return floats


def _careful_page(text: str, fmt: ExpositionFormat) -> ParsedPage:
    """Every line by the reference grammar, with line numbers; slower, never wrong-footed."""
    openmetrics = fmt is ExpositionFormat.OPENMETRICS
    page = ParsedPage(format=fmt)
    families = _Families()
    skipped = 0
    eof_line = 0
    seen: dict[tuple[str, str, int | None], int] = {}  # series and time -> first line
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if eof_line:
            ignored = sum(1 for rest in lines[number - 1 :] if rest.strip())
            message = (
                f"text after '# EOF' (line {eof_line}) is not part of the page; "
                f"{ignored} line(s) ignored"
            )
            page.errors.append(LineError(number, message, line))
            break
        try:
            _check_decoded(line)
            if stripped.startswith("#"):
                declaration = parse_declaration(stripped, openmetrics=openmetrics)
                if declaration is _EOF and openmetrics:
                    eof_line = number
                elif declaration is not None and declaration is not _EOF:
                    families.add(declaration)
                continue
            sample = parse_sample_line(line, openmetrics=openmetrics)
            labels = canonical_labels(sample.labels)
            if sample.metric.endswith(CREATED_SUFFIX):
                skipped += 1
                continue
            _check_first(seen, sample, labels, number)
        except ExpositionLineError as exc:
            page.errors.append(LineError(number, str(exc), line))
            continue
        except orjson.JSONEncodeError as exc:
            message = f"a label value is not valid Unicode text ({exc})"
            page.errors.append(LineError(number, message, line))
            continue
        page.metric.append(sample.metric)
        page.labels.append(labels)
        page.value.append(sample.value)
        page.timestamp_ms.append(sample.timestamp_ms)
    if openmetrics and not eof_line:
        last = max((n for n, line in enumerate(lines, start=1) if line.strip()), default=0)
        message = "the page ends without '# EOF', which OpenMetrics requires: it may be truncated"
        page.errors.append(LineError(last + 1, message, ""))
    page.families.update(families.families())
    return ParsedPage(
        format=fmt,
        metric=page.metric,
        labels=page.labels,
        value=page.value,
        timestamp_ms=page.timestamp_ms,
        families=page.families,
        errors=page.errors,
        skipped_created=skipped,
    )
