"""Exposition parsing: prometheus_client as the differential oracle (captures and generated
pages), round trips through generate_latest, the line grammar as oracle of the fast path, a
bad-input table checked against promtool's line numbers, and the batched form."""

from __future__ import annotations

import math
import random
import struct
import subprocess
from collections import Counter as Multiset
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, Summary
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as peer_openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as peer_text_families
from prometheus_client.samples import Timestamp

from servewatch.collectors.metrics.exposition import (
    SAMPLES_SCHEMA,
    ExpositionFormat,
    ExpositionLineError,
    Family,
    MetricType,
    ParsedPage,
    SeriesCache,
    canonical_labels,
    detect_format,
    parse_declaration,
    parse_exposition,
    parse_sample_line,
)
from servewatch.collectors.metrics.exposition_batch import BATCH_SCHEMA, parse_expositions
from tests.conftest import require_program

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "samples"

Row = tuple[str, str, Any, int | None]


def value_key(value: float) -> Any:
    """NaN never equals itself; compare it by name."""
    return "NaN" if math.isnan(value) else float(value)


def ours(page: ParsedPage) -> Multiset[Row]:
    return Multiset(
        zip(
            page.metric,
            page.labels,
            map(value_key, page.value),
            page.timestamp_ms,
            strict=True,
        )
    )


def snapshot(page: ParsedPage) -> tuple[Any, ...]:
    """Everything a page result holds, in order, with NaN comparable."""
    values = [value_key(value) for value in page.value]
    return (page.metric, page.labels, values, page.timestamp_ms, page.errors, page.families)


def peer_timestamp_ms(timestamp: Any) -> int | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, Timestamp):
        return timestamp.sec * 1000 + timestamp.nsec // 1_000_000
    return round(float(timestamp) * 1000)


def peer_rows(families: Iterable[Any], *, renamed: frozenset[str] = frozenset()) -> Multiset[Row]:
    return Multiset(
        (
            s.name.removesuffix("_total") if family.name in renamed else s.name,
            canonical_labels(s.labels),
            value_key(s.value),
            peer_timestamp_ms(s.timestamp),
        )
        for family in families
        for s in family.samples
        if not s.name.endswith("_created")
    )


def peer_text(text: str) -> Multiset[Row]:
    families = list(peer_text_families(text))
    # prometheus_client's text parser appends `_total` to the samples of a counter declared
    # without it (its OpenMetrics-style model); Prometheus stores names as exposed, as we do.
    renamed = frozenset(
        family.name
        for family in families
        if family.type == "counter" and f"# TYPE {family.name} counter" in text
    )
    return peer_rows(families, renamed=renamed)


def peer_openmetrics(text: str) -> Multiset[Row]:
    return peer_rows(peer_openmetrics_families(text))  # type: ignore[no-untyped-call]


def openmetrics_text(registry: CollectorRegistry) -> str:
    page: bytes = generate_openmetrics(registry)  # type: ignore[no-untyped-call]
    return page.decode()


def registry_rows(registry: CollectorRegistry) -> Multiset[Row]:
    return peer_rows(registry.collect())


# --- captures ---------------------------------------------------------------------------


def capture_files() -> list[Path]:
    files = sorted(SAMPLES_DIR.glob("*.txt"))
    if not files:
        pytest.skip(f"no captures in {SAMPLES_DIR}")
    return files


@pytest.mark.parametrize("path", capture_files(), ids=lambda p: p.name)
def test_captures_match_prometheus_client(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    page = parse_exposition(text)
    assert page.errors == []
    assert page.format is ExpositionFormat.TEXT
    assert ours(page) == peer_text(text)
    created_lines = sum(1 for line in text.splitlines() if line.split("{")[0].endswith("_created"))
    assert page.skipped_created == created_lines
    assert len(page) > 0


def test_vllm_capture_keeps_families_and_drops_created() -> None:
    path = SAMPLES_DIR / "vllm_metrics_production-stack-issue-617.txt"
    if not path.exists():
        pytest.skip(f"{path} missing")
    page = parse_exposition(path.read_text(encoding="utf-8"))
    assert page.skipped_created == 5
    assert not any(name.endswith("_created") for name in page.metric)
    family = page.family_of("vllm:request_generation_tokens_bucket")
    assert family is not None
    assert family.type is MetricType.HISTOGRAM
    assert family.help == "Number of generation tokens processed."
    assert page.families["vllm:kv_cache_usage_perc"].type is MetricType.GAUGE


# --- generated text pages against prometheus_client's text parser ----------------------

LABEL_VALUE_CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])
SPECIAL_VALUE_CHARS = st.sampled_from(["\\", '"', "\n", "{", "}", ",", "=", "#", " ", "\t"])
label_values = st.text(alphabet=st.one_of(LABEL_VALUE_CHARS, SPECIAL_VALUE_CHARS), max_size=10)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,6}", fullmatch=True).filter(
    lambda name: not name.startswith("__") and name != "le" and name != "quantile"
)
label_sets = st.dictionaries(label_names, label_values, max_size=4)
FAMILY_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum")
base_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,10}", fullmatch=True).filter(
    lambda name: not name.endswith(FAMILY_SUFFIXES)
)
# prometheus_client's OpenMetrics writer turns ':' into '_' in sample names but not in TYPE
# lines, so its pages with colons do not parse back even with its own parser.
openmetrics_base_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda name: not name.endswith(FAMILY_SUFFIXES)
)
finite = st.floats(allow_nan=False, allow_infinity=False)
any_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
)
text_timestamps = st.one_of(st.none(), st.integers(min_value=-(10**9), max_value=4 * 10**12))


def spell_value(value: float, rng: random.Random) -> str:
    """One of the spellings a real exporter may use for a value."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return rng.choice(["NaN", "nan", "NAN"])
    if math.isinf(value):
        sign = "-" if value < 0 else rng.choice(["+", ""])
        return sign + rng.choice(["Inf", "inf", "Infinity"])
    return rng.choice([repr(value), f"{value:.17g}", f"{value:e}"])


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class GeneratedFamily:
    kind: str
    name: str
    series: tuple[dict[str, str], ...]
    values: tuple[Any, ...]
    timestamp_ms: int | None
    help_line: bool
    type_line: bool
    with_created: bool


@st.composite
def generated_families(draw: st.DrawFn, index: int) -> GeneratedFamily:
    kind = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped"]))
    name = f"f{index}_{draw(base_names)}"
    series = tuple(draw(st.lists(label_sets, min_size=1, max_size=3, unique_by=canonical_labels)))
    values = tuple(draw(any_value) for _ in range(len(series) * 6))
    return GeneratedFamily(
        kind=kind,
        name=name,
        series=series,
        values=values,
        timestamp_ms=draw(text_timestamps),
        help_line=draw(st.booleans()),
        type_line=draw(st.booleans()),
        with_created=kind in {"counter", "histogram", "summary"} and draw(st.booleans()),
    )


def family_samples(family: GeneratedFamily) -> Iterator[tuple[str, dict[str, str], Any]]:
    values = iter(family.values)
    for labels in family.series:
        if family.kind == "counter":
            yield f"{family.name}_total", labels, next(values)
        elif family.kind == "histogram":
            for le in ("0.5", "1.0", "+Inf"):
                yield f"{family.name}_bucket", {**labels, "le": le}, next(values)
            yield f"{family.name}_count", labels, next(values)
            yield f"{family.name}_sum", labels, next(values)
        elif family.kind == "summary":
            yield family.name, {**labels, "quantile": "0.99"}, next(values)
            yield f"{family.name}_count", labels, next(values)
            yield f"{family.name}_sum", labels, next(values)
        else:
            yield family.name, labels, next(values)


def render_text(families: list[GeneratedFamily], seed: int) -> tuple[str, int]:
    """A text-format page in the varied spellings exporters and hand edits produce, and the
    number of `_created` samples on it."""
    rng = random.Random(seed)
    out: list[str] = []
    created = 0
    for family in families:
        declared = f"{family.name}_total" if family.kind == "counter" else family.name
        if family.help_line:
            out.append(f"# HELP {declared} help for {family.name} \\\\ with \\n escapes")
        if family.type_line:
            out.append(f"# TYPE {declared} {family.kind}")
        if rng.random() < 0.2:
            out.append("# a plain comment")
        for name, labels, value in family_samples(family):
            out.append(render_sample(name, labels, value, family.timestamp_ms, rng))
        if family.with_created:
            out.append(f"# TYPE {family.name}_created gauge")
            for labels in family.series:
                out.append(render_sample(f"{family.name}_created", labels, 1.7e9, None, rng))
                created += 1
        if rng.random() < 0.2:
            out.append("")
    return "\n".join(out) + rng.choice(["\n", "", "\n\n"]), created


def render_sample(
    name: str, labels: dict[str, str], value: Any, timestamp_ms: int | None, rng: random.Random
) -> str:
    items = list(labels.items())
    rng.shuffle(items)
    equals = rng.choice(["=", "=", " = "])
    pairs = [f'{key}{equals}"{escape_label_value(text)}"' for key, text in items]
    block = ""
    if pairs or rng.random() < 0.3:
        joined = rng.choice([",", ",", ", "]).join(pairs)
        trailing = "," if pairs and rng.random() < 0.2 else ""
        block = rng.choice(["", "", " "]) + "{" + joined + trailing + "}"
    gap = rng.choice([" ", " ", "  ", "\t"])
    line = f"{name}{block}{gap}{spell_value(value, rng)}"
    if timestamp_ms is not None:
        line += f"{gap}{timestamp_ms}"
    return line


text_pages = st.integers(min_value=1, max_value=5).flatmap(
    lambda n: st.tuples(
        st.tuples(*(generated_families(i) for i in range(n))), st.integers(0, 2**32)
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated=text_pages)
def test_generated_text_pages_match_prometheus_client(
    generated: tuple[tuple[GeneratedFamily, ...], int],
) -> None:
    families, seed = generated
    text, created = render_text(list(families), seed)
    page = parse_exposition(text)
    assert page.errors == []
    assert page.skipped_created == created
    assert ours(page) == peer_text(text)


# --- generated OpenMetrics pages against prometheus_client's OpenMetrics parser ---------


class FamiliesCollector:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


@st.composite
def openmetrics_families(draw: st.DrawFn, index: int) -> Metric:
    kind = draw(st.sampled_from(["gauge", "counter", "histogram", "unknown"]))
    name = f"f{index}_{draw(openmetrics_base_names)}"
    keys = sorted(draw(st.sets(label_names, max_size=3)))
    rows = draw(
        st.lists(st.tuples(*[label_values] * len(keys)), min_size=1, max_size=3, unique=True)
    )
    seconds = draw(st.one_of(st.none(), st.integers(0, 4 * 10**12).map(lambda ms: ms / 1000)))
    family: Metric
    if kind == "gauge":
        family = GaugeMetricFamily(name, "gauge help", labels=keys)
        for row in rows:
            family.add_metric(list(row), draw(st.floats()), timestamp=seconds)
    elif kind == "counter":
        family = CounterMetricFamily(name, "counter help", labels=keys)
        totals = st.floats(min_value=0, allow_nan=False)
        for row in rows:
            created = draw(st.one_of(st.none(), st.floats(0, 2e9)))
            family.add_metric(list(row), draw(totals), created=created, timestamp=seconds)
    elif kind == "histogram":
        family = HistogramMetricFamily(name, "histogram help", labels=keys)
        for row in rows:
            counts = sorted(draw(st.lists(st.integers(0, 10**6), min_size=3, max_size=3)))
            buckets = list(zip(["0.25", "1.0", "+Inf"], map(float, counts), strict=True))
            family.add_metric(list(row), buckets, draw(finite.map(abs)), timestamp=seconds)
    else:
        family = Metric(name, "unknown help", "unknown")
        for row in rows:
            labels = dict(zip(keys, row, strict=True))
            family.add_sample(name, labels, draw(st.floats()), timestamp=seconds)
    return family


openmetrics_pages = st.integers(min_value=1, max_value=4).flatmap(
    lambda n: st.tuples(*(openmetrics_families(i) for i in range(n)))
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families=openmetrics_pages)
def test_generated_openmetrics_pages_match_prometheus_client(families: tuple[Metric, ...]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FamiliesCollector(list(families)))
    text = openmetrics_text(registry)
    page = parse_exposition(text)
    assert page.format is ExpositionFormat.OPENMETRICS
    assert page.errors == []
    assert ours(page) == peer_openmetrics(text)
    for family in families:
        assert page.families[family.name].type is MetricType(family.type)


# --- round trip through prometheus_client's exposition --------------------------------


@settings(max_examples=30, deadline=None)
@given(
    label=label_values,
    observations=st.lists(st.floats(0, 1e4), min_size=1, max_size=20),
    gauge=st.floats(),
)
def test_round_trip_from_a_registry_in_both_formats(
    label: str, observations: list[float], gauge: float
) -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "served", ["model_name"], registry=registry)
    latency = Histogram(
        "latency_seconds", "e2e", ["model_name"], buckets=(0.1, 1, 10), registry=registry
    )
    sizes = Summary("sizes", "bytes", ["model_name"], registry=registry)
    Gauge("queue", "waiting", ["model_name"], registry=registry).labels(label).set(gauge)
    Info("build", "version", registry=registry).info({"version": label})
    Enum("state", "phase", states=["up", label + "x"], registry=registry).state("up")
    for seconds in observations:
        requests.labels(label).inc(seconds)
        latency.labels(label).observe(seconds)
        sizes.labels(label).observe(seconds)
    expected = registry_rows(registry)

    text_page = parse_exposition(generate_latest(registry).decode())
    openmetrics_page = parse_exposition(openmetrics_text(registry))

    assert text_page.format is ExpositionFormat.TEXT
    assert openmetrics_page.format is ExpositionFormat.OPENMETRICS
    for page in (text_page, openmetrics_page):
        assert page.errors == []
        assert ours(page) == expected
        assert page.skipped_created == 3  # counter, histogram and summary, one series each
    assert openmetrics_page.families["build"].type is MetricType.INFO
    assert openmetrics_page.families["state"].type is MetricType.STATESET
    assert text_page.family_of("latency_seconds_bucket") == Family(
        "latency_seconds", MetricType.HISTOGRAM, "e2e"
    )


# --- the fast path against the line grammar -------------------------------------------


def reference_parse(text: str) -> tuple[Multiset[Row], list[int], int]:
    """Brute force: every text-format line through the line grammar, one at a time."""
    rows: Multiset[Row] = Multiset()
    error_lines: list[int] = []
    typed: set[str] = set()
    created = 0
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            if stripped.startswith("#"):
                declaration = parse_declaration(stripped, openmetrics=False)
                if declaration and declaration[0] == "TYPE":
                    if declaration[1] in typed:
                        error_lines.append(number)
                    typed.add(declaration[1])
                continue
            sample = parse_sample_line(stripped)
        except ExpositionLineError:
            error_lines.append(number)
            continue
        if sample.metric.endswith("_created"):
            created += 1
            continue
        labels = canonical_labels(sample.labels)
        rows[(sample.metric, labels, value_key(sample.value), sample.timestamp_ms)] += 1
    return rows, error_lines, created


JUNK = st.sampled_from(
    ["{", "}", '"', "\\", " ", "\t", "#", ",", "=", "_", "x", "1", ".", "é", "# EOF", "\r"]
)


@st.composite
def damaged_pages(draw: st.DrawFn) -> str:
    families, seed = draw(text_pages)
    text, _ = render_text(list(families), seed)
    lines = text.split("\n")
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        cut = draw(st.integers(0, len(line)))
        action = draw(st.sampled_from(["insert", "delete", "newline"]))
        if action == "insert":
            lines[at] = line[:cut] + draw(JUNK) + line[cut:]
        elif action == "delete":
            lines[at] = line[:cut] + line[cut + 1 :]
        else:
            lines.insert(at, "".join(draw(st.lists(JUNK, max_size=4))))
    return "\n".join(lines)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=damaged_pages())
def test_fast_path_agrees_with_the_line_grammar_on_damaged_pages(text: str) -> None:
    page = parse_exposition(text, openmetrics=False)
    rows, error_lines, created = reference_parse(text)
    assert ours(page) == rows
    assert [error.line for error in page.errors] == error_lines
    assert page.skipped_created == created


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=damaged_pages(), second=damaged_pages())
def test_a_shared_cache_changes_nothing(first: str, second: str) -> None:
    cache = SeriesCache()
    for text in (first, second, first):
        shared = parse_exposition(text, openmetrics=False, cache=cache)
        fresh = parse_exposition(text, openmetrics=False)
        assert snapshot(shared) == snapshot(fresh)


def test_cache_is_cleared_past_its_bound() -> None:
    cache = SeriesCache(max_entries=10)
    text = "\n".join(f'm{{i="{i}"}} {i}' for i in range(50))
    assert len(parse_exposition(text, cache=cache)) == 50
    assert cache.series_labels == {}
    assert cache.blocks == {}


# --- bad input ------------------------------------------------------------------------

GOOD_BEFORE = [
    "# HELP vllm:num_requests_running Number of requests running.",
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{engine="0",model_name="m"} 3',
]
GOOD_AFTER = [
    'vllm:num_requests_waiting{engine="0",model_name="m"} 1',
    "process_cpu_seconds_total 12.5",
]
GOOD_ROWS = Multiset(
    [
        ("vllm:num_requests_running", '{"engine":"0","model_name":"m"}', 3.0, None),
        ("vllm:num_requests_waiting", '{"engine":"0","model_name":"m"}', 1.0, None),
        ("process_cpu_seconds_total", "{}", 12.5, None),
    ]
)

# (malformed line, part of our message, whether Go's expfmt parser rejects it too)
BAD_LINES = [
    ('vllm:kv{engine="0"}', "has no value", True),
    ('vllm:kv{engine="0"} 1.2.3', "is not a number", True),
    ("vllm:kv 1_000", "is not a number", True),
    ("vllm:kv abc", "is not a number", True),
    ("vllm:kv 0x10", "is not a number", True),
    ("1vllm 3", "expected a metric name", True),
    ("vllm-kv 3", "is followed by '-'", True),
    ('{engine="0"} 3', "no metric name", True),
    ('vllm:kv{engine="0" 3', "no closing '}'", True),
    ('vllm:kv{engine="0} 3', "no closing quote", True),
    ("vllm:kv{engine=0} 3", "must be in double quotes", True),
    ('vllm:kv{1engine="0"} 3', "expected a label name", True),
    ('vllm:kv{engine "0"} 3', "expected '='", True),
    ('vllm:kv{engine="0" model="m"} 3', "expected ',' or '}'", True),
    ('vllm:kv{engine="0",,model="m"} 3', "expected a label name", True),
    ('vllm:kv{engine="0",engine="1"} 3', "appears twice", True),
    ('vllm:kv{__name__="x"} 3', "__name__", True),
    ("vllm:kv 3 12.5", "not an integer", True),
    ("vllm:kv 3 100 200", "unexpected '200'", True),
    ('vllm:kv{a="b"} 3 # {trace_id="x"} 1', "unexpected", True),
    ("# TYPE vllm:kv bogus", "allowed are", True),
    ("# HELP 1bad some help", "not a metric name", True),
    ("# TYPE vllm:num_requests_running gauge", "second # TYPE", True),
    ("# TYPE vllm:kv", "allowed are", False),
]


def page_with(bad_line: str) -> str:
    return "\n".join([*GOOD_BEFORE, bad_line, *GOOD_AFTER]) + "\n"


@pytest.mark.parametrize(("bad_line", "message", "go_rejects"), BAD_LINES)
def test_bad_line_is_reported_by_number_and_the_rest_kept(
    bad_line: str, message: str, go_rejects: bool
) -> None:
    page = parse_exposition(page_with(bad_line))
    (error,) = page.errors
    assert error.line == 4
    assert error.text == bad_line
    assert message in error.message
    assert str(error).startswith("line 4: ")
    assert ours(page) == GOOD_ROWS
    assert page.families["vllm:num_requests_running"].type is MetricType.GAUGE


def promtool_parse_error(promtool: str, text: str) -> str:
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    return output[output.index("parsing error") :].strip() if "parsing error" in output else ""


def test_promtool_rejects_the_same_lines() -> None:
    """Go's own text parser, as promtool runs it, stops at the same line for each bad kind,
    and accepts the lenient spellings we say it accepts."""
    promtool = require_program("promtool")
    for bad_line, _, go_rejects in BAD_LINES:
        error = promtool_parse_error(promtool, page_with(bad_line))
        assert error.startswith("parsing error in line 4:") == go_rejects, (bad_line, error)
    for line, go_accepts in LENIENT_LINES:
        error = promtool_parse_error(promtool, page_with(line))
        assert (error == "") == go_accepts, (line, error)


@pytest.mark.parametrize(
    ("line", "column", "char"),
    [
        ("vllm:kv{engine=0} 3", 16, "0"),
        ("  vllm:kv{engine=0} 3", 18, "0"),
        ('vllm:kv{engine="0" model="m"} 3', 19, " "),
        ('vllm:kv { engine = "0", 1x="m"} 3', 25, "1"),
        ("vllm-kv 3", 5, "-"),
    ],
)
def test_error_columns_point_into_the_line(line: str, column: int, char: str) -> None:
    (error,) = parse_exposition(line).errors
    assert f"at column {column}" in error.message
    assert line[column - 1] == char


# (line, whether Go's parser accepts it too): what we take beyond Go is only whitespace.
LENIENT_LINES = [
    ('vllm:kv{a="b",} 3', True),
    ('vllm:kv {a="b"} 3', True),
    ('vllm:kv{a = "b"} 3', True),
    ('vllm:kv{ a="b" } 3', True),
    ('vllm:kv{a="b"}3', True),
    ("  vllm:kv 3", True),
    ("vllm:kv\t3", True),
    ("vllm:kv 3 ", False),
    ('vllm:kv{a="b"} 3\r', False),
]


@pytest.mark.parametrize("line", [line for line, _ in LENIENT_LINES])
def test_lenient_spellings_are_read(line: str) -> None:
    page = parse_exposition(line + "\n")
    assert page.errors == []
    assert page.value == [3.0]
    assert page.labels[0] in {'{"a":"b"}', "{}"}


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("NaN", math.nan),
        ("nan", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("Inf", math.inf),
        ("-Infinity", -math.inf),
        ("1e5", 1e5),
        ("-1.5E-3", -1.5e-3),
        (".5", 0.5),
        ("1.", 1.0),
        ("1.7537953269352946e+09", 1.7537953269352946e09),
        ("12345678901234567890", 1.2345678901234567e19),
    ],
)
def test_value_spellings(spelling: str, expected: float) -> None:
    (value,) = parse_exposition(f"m {spelling}\n").value
    assert value_key(value) == value_key(expected)


def bits(values: Iterable[float]) -> list[bytes]:
    """Floats by their bytes: -0.0 differs from 0.0, and a NaN equals a NaN."""
    return [struct.pack("<d", v) for v in values]


VALUE_SPELLINGS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"{v:.25e}"),
    st.builds(
        lambda digits, exponent: f"{digits[0]}.{digits[1:] or '0'}e{exponent}",
        st.text("0123456789", min_size=1, max_size=40),
        st.integers(-340, 320),
    ),
    st.sampled_from(
        ["-0.0", "-0", "0", "7", "+1.5", "01.5", ".5", "5.", "1e400", "-1e400", "NaN", "+Inf"]
    ),
)


@settings(max_examples=200, deadline=None)
@given(spellings=st.lists(VALUE_SPELLINGS, min_size=1, max_size=30))
def test_a_page_of_values_reads_as_float_reads_each(spellings: list[str]) -> None:
    # Pages whose values are all JSON floats are read in one call; the others value by value.
    # A finite spelling past a float's range is a line error, as in Prometheus.
    text = "".join(f'm{{i="{i}"}} {spelling}\n' for i, spelling in enumerate(spellings))
    page = parse_exposition(text, openmetrics=False)
    kept = [
        (i, float(s))
        for i, s in enumerate(spellings)
        if not (math.isinf(float(s)) and "inf" not in s.lower())
    ]
    assert page.labels == [f'{{"i":"{i}"}}' for i, _ in kept]
    assert bits(page.value) == bits(value for _, value in kept)
    assert [e.line for e in page.errors] == [
        i + 1 for i in range(len(spellings)) if i not in dict(kept)
    ]


def test_label_escapes_are_undone_and_unknown_escapes_kept() -> None:
    page = parse_exposition('m{a="x\\\\y\\"z\\nw",b="\\\\n",c="\\t"} 1\n')
    assert page.errors == []
    assert page.labels == [canonical_labels({"a": 'x\\y"z\nw', "b": "\\n", "c": "\\t"})]


def test_canonical_labels_sort_keys_and_keep_unicode() -> None:
    assert canonical_labels({"b": "é", "a": '"'}) == '{"a":"\\"","b":"é"}'
    assert canonical_labels({}) == "{}"


# --- OpenMetrics specifics ------------------------------------------------------------


def test_openmetrics_timestamps_are_seconds_and_exemplars_are_dropped() -> None:
    text = (
        "# TYPE reqs counter\n"
        "# UNIT reqs requests\n"
        'reqs_total{a="b"} 3 1700000000.123 # {trace_id="ab"} 1.0 1700000000.1\n'
        "reqs_created 1700000000.0\n"
        "# EOF\n"
    )
    page = parse_exposition(text)
    assert page.format is ExpositionFormat.OPENMETRICS
    assert page.errors == []
    assert (page.metric, page.value, page.timestamp_ms) == (
        ["reqs_total"],
        [3.0],
        [1_700_000_000_123],
    )
    assert page.skipped_created == 1
    assert page.families["reqs"] == Family("reqs", MetricType.COUNTER, None, "requests")
    assert page.family_of("reqs_total") == page.families["reqs"]


@pytest.mark.parametrize(
    ("text", "line", "message", "kept"),
    [
        ("a 1\n# EOF\nb 2\nc 3\n", 3, "after '# EOF'", 1),
        ("a 1\nb 2\n", 3, "without '# EOF'", 2),
        ("a 1\nb 1 soon\n# EOF\n", 2, "seconds", 1),
        ('a 1 # {t="x" 1\nb 2\n# EOF\n', 1, "malformed exemplar", 1),
        ('a 1 # {t="x"} one\nb 2\n# EOF\n', 1, "is not a number", 1),
    ],
)
def test_openmetrics_structure_errors(text: str, line: int, message: str, kept: int) -> None:
    page = parse_exposition(text, openmetrics=True)
    (error,) = page.errors
    assert (error.line, len(page)) == (line, kept)
    assert message in error.message


def test_format_detection() -> None:
    assert detect_format("a 1\n# EOF\n") is ExpositionFormat.OPENMETRICS
    assert detect_format("# EOF") is ExpositionFormat.OPENMETRICS
    assert detect_format("a 1\n") is ExpositionFormat.TEXT
    assert detect_format("a 1 # EOF\n") is ExpositionFormat.TEXT
    # A text page's timestamps are milliseconds, an OpenMetrics page's seconds.
    assert parse_exposition("a 1 1500\n").timestamp_ms == [1500]
    assert parse_exposition("a 1 1500\n# EOF\n").timestamp_ms == [1_500_000]


def test_empty_and_comment_only_pages() -> None:
    for text in ("", "\n\n", "# just a comment\n", "# HELP a only help\n"):
        page = parse_exposition(text)
        assert (len(page), page.errors) == (0, [])
    assert parse_exposition("# HELP a only help\n").families["a"] == Family("a", None, "only help")


# --- output shapes and the batch ------------------------------------------------------


def vllm_page(replica: int, model: str) -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "running", labels, registry=registry).labels(model, "0").set(
        replica
    )
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "ttft",
        labels,
        buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5),
        registry=registry,
    )
    for i in range(replica + 1):
        ttft.labels(model, "0").observe(0.01 * i)
    return generate_latest(registry).decode()


def test_frame_has_the_samples_schema() -> None:
    page = parse_exposition(vllm_page(1, "m"))
    frame = page.frame()
    assert frame.schema == SAMPLES_SCHEMA
    assert frame.height == len(page)
    assert frame["labels"].str.json_decode().struct.field("model_name").unique().to_list() == ["m"]


def test_batch_equals_pages_parsed_one_by_one() -> None:
    pages = [vllm_page(i, "m" if i < 3 else "other") for i in range(5)]
    pages[2] = pages[2].replace("vllm:num_requests_running{", "vllm:num requests{", 1)
    batch = parse_expositions(pages)
    assert batch.samples.schema == BATCH_SCHEMA
    expected = pl.concat(
        [
            parse_exposition(text)
            .frame()
            .select(pl.lit(i, dtype=pl.UInt32).alias("page"), pl.all())
            for i, text in enumerate(pages)
        ]
    )
    assert batch.samples.equals(expected)
    assert [len(page.errors) for page in batch.pages] == [0, 0, 1, 0, 0]
    (error,) = batch.pages[2].errors
    assert (error.line, error.text) == (3, 'vllm:num requests{engine="0",model_name="m"} 2.0')
    assert "is not a number" in error.message


def test_batch_formats_per_page() -> None:
    batch = parse_expositions(["a 1 5\n", "a 1 5\n# EOF\n"], openmetrics=[False, True])
    assert batch.samples["timestamp_ms"].to_list() == [5, 5000]
    with pytest.raises(ValueError, match="one per page"):
        parse_expositions(["a 1\n"], openmetrics=[True, False])
