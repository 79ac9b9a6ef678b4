"""The compiled OTLP column decoder: where it is built, when it loads, and the frame it fills.

`otlp_columns.c` walks an ExportTraceServiceRequest's wire format once and fills the request
columns directly; it takes only bodies it can prove plain (every field known and well formed,
every request span mappable) and answers None for the rest, which the reference path (protobuf's
parse, the flat reader, `RequestRows.add_request`) then decodes, maps and refuses exactly as
before. So the compiled path changes speed, never output: `tests/test_otlp_columns.py` compares
the two on the fuzz corpus and generated bodies.

Like the emulator's compiled modules (`emulator/native.py`), the build never lands in the source
tree: `python -m servewatch.collectors.traces native build` (run by `make native`) compiles
the C source with the interpreter's compiler into `<sys.prefix>/servewatch-native-otlp/<key>/`,
keyed by the source's hash and the interpreter's tag, and the receiver loads it only when a
build for the source as it is now exists. Without one (a fresh clone, no compiler) everything
runs as pure Python. `SERVEWATCH_NATIVE=0` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from servewatch.collectors.traces.request_spans import (
    COMPLETION_TOKENS_KEYS,
    DIMENSIONS,
    ERROR_TYPE_KEY,
    LATENCY_KEYS,
    MAX_TOKENS_KEY,
    PROMPT_TOKENS_KEYS,
    REQUEST_ID_KEY,
    SpanMapping,
)
from servewatch.pipeline.tables import REQUESTS_SCHEMA, TIMESTAMP

if TYPE_CHECKING:
    from collections.abc import Sequence

SOURCE = Path(__file__).resolve().with_name("otlp_columns.c")
MODULE = "_otlp_columns"  # the C module's own name (its PyInit function)
DISABLE_ENV = "SERVEWATCH_NATIVE"  # "0": pure Python even when a build exists, as the emulator
DIR_ENV = "SERVEWATCH_NATIVE_DIR"
_FORMAT = 1
# The attribute keys the C decoder reads by position (its K_* enum), before the dimension keys.
FIXED_KEYS = (
    REQUEST_ID_KEY,
    ERROR_TYPE_KEY,
    *LATENCY_KEYS.values(),
    *PROMPT_TOKENS_KEYS,
    *COMPLETION_TOKENS_KEYS,
    MAX_TOKENS_KEY,
)
# Compiler flags, part of a build's key: -O3 decodes a span in 0.44 us against 0.51 at -O2.
_CFLAGS = ("-O3", "-fPIC", "-shared", "-Wall")


class OtlpNativeBuildError(RuntimeError):
    """The C decoder could not be compiled; the receiver runs as pure Python."""


def native_root() -> Path:
    configured = os.environ.get(DIR_ENV)
    base = Path(configured) if configured else Path(sys.prefix) / "servewatch-native"
    # A sibling of the emulator's builds: that build folder keeps only its own current build.
    return base.with_name(base.name + "-otlp")


def source_key(source: Path = SOURCE) -> str:
    digest = hashlib.sha256()
    digest.update(f"{_FORMAT}:{sys.implementation.cache_tag}:{' '.join(_CFLAGS)}\0".encode())
    digest.update(source.read_bytes())
    return digest.hexdigest()[:20]


def _extension_name() -> str:
    return MODULE + importlib.machinery.EXTENSION_SUFFIXES[0]


def build(*, root: Path | None = None) -> Path:
    """Compile the decoder into `<root>/<key>/`, returning its path (at once when built)."""
    root = root or native_root()
    key = source_key()
    target = root / key / _extension_name()
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
        staged = Path(tmp) / key
        staged.mkdir()
        command = [
            *compiler,
            *_CFLAGS,
            f"-I{include}",
            str(SOURCE),
            "-o",
            str(staged / _extension_name()),
        ]
        try:
            result = subprocess.run(  # noqa: S603 (the interpreter's compiler, fixed arguments)
                command, capture_output=True, text=True, check=False
            )
        except OSError as exc:
            raise OtlpNativeBuildError(f"cannot run the compiler {compiler[0]}: {exc}") from exc
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise OtlpNativeBuildError(f"{compiler[0]} exited with {result.returncode}:\n{tail}")
        try:
            staged.rename(root / key)
        except OSError:
            if not target.is_file():
                raise
    for old in root.iterdir():
        # Builds of other sources never load again (the key guards them): drop them.
        if old.is_dir() and old.name != key and not old.name.startswith(".build-"):
            shutil.rmtree(old, ignore_errors=True)
    return target


@dataclass(frozen=True)
class NativeStatus:
    active: bool
    reason: str


_loading = threading.Lock()


def _loaded() -> tuple[ModuleType | None, NativeStatus]:
    # Receiver threads ask at once on the first exports: the extension is loaded once.
    with _loading:
        return _load()


@functools.cache
def _load() -> tuple[ModuleType | None, NativeStatus]:
    if os.environ.get(DISABLE_ENV) == "0":
        return None, NativeStatus(False, f"{DISABLE_ENV}=0")
    try:
        path = native_root() / source_key() / _extension_name()
        if not path.is_file():
            return None, NativeStatus(False, "no build for this source (make native)")
        spec = importlib.util.spec_from_file_location(f"{__package__}.{MODULE}", path)
        if spec is None or spec.loader is None:
            return None, NativeStatus(False, f"{path}: not loadable")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError) as exc:
        return None, NativeStatus(False, f"build unusable: {exc}")
    return module, NativeStatus(True, f"compiled ({path})")


def status() -> NativeStatus:
    return _loaded()[1]


def reload() -> NativeStatus:
    """Look for a build again (after `build()` in this process)."""
    with _loading:
        _load.cache_clear()
    return status()


def describe() -> str:
    return f"OTLP decoder: {status().reason}"


@dataclass(frozen=True, slots=True)
class Columns:
    """One plain body's request rows as the C decoder returns them (Arrow buffer layouts)."""

    spans: int
    rows: int
    resources: list[bytes | None]  # per ResourceSpans: its encoded Resource, if sent
    # per distinct (ResourceSpans, span-level dimension values): index and (key, str | None)s
    combos: list[tuple[int, tuple[tuple[str, str | None], ...]]]
    combo_ids: bytes
    trace_id: tuple[bytes, bytes]
    span_id: tuple[bytes, bytes]
    request_id: tuple[bytes, bytes, bytes]
    error_type: tuple[bytes, bytes, bytes]
    ok: bytes
    counts: tuple[tuple[bytes, bytes], ...]  # prompt, completion, max tokens
    latency_valid: tuple[bytes, ...]  # in LATENCY_KEYS order
    latency_data: tuple[bytes, ...]
    # Span times in microseconds: the decoder takes only times from 1 ns to below 2^63 ns, so
    # its division truncates as RequestRows' cast from nanoseconds does.
    start_us: bytes
    end_us: bytes


@functools.lru_cache(maxsize=8)  # one per mapping in use
def _keys(mapping: SpanMapping) -> tuple[tuple[bytes, ...], tuple[str, ...]] | None:
    """The keys the decoder reads for `mapping`, as bytes and as text; None when the mapping
    reads a key in two roles (the reference path then maps every span)."""
    dimension_keys = tuple(dict.fromkeys(k for keys in mapping.dimension_keys for k in keys))
    keys = (*FIXED_KEYS, *dimension_keys)
    if len(set(keys)) < len(keys) or len(keys) > 64:
        return None
    return tuple(k.encode() for k in keys), keys


def decode(body: bytes, mapping: SpanMapping) -> Columns | None:
    """The body's request rows when the compiled decoder is loaded and the body is plain."""
    module = _loaded()[0]
    keys = _keys(mapping)
    if module is None or keys is None:
        return None
    found: Any = module.decode(body, mapping.span_name.encode(), keys[0], len(FIXED_KEYS))
    if found is None:
        return None
    spans, rows, resources, combos, *buffers = found
    names = keys[1]
    combos = [(index, tuple((names[k], value) for k, value in values)) for index, values in combos]
    return Columns(spans, rows, resources, combos, *buffers)


_ARROW_KINDS = {
    pl.String(): pa.large_string(),
    TIMESTAMP: pa.timestamp("us"),
    pl.Boolean(): pa.bool_(),
    pl.Int64(): pa.int64(),
    pl.Float64(): pa.float64(),
}
_ARROW_TYPES = {name: _ARROW_KINDS[dtype] for name, dtype in REQUESTS_SCHEMA.items()}
_ARROW_SCHEMA = pa.schema(list(_ARROW_TYPES.items()))


def _array(rows: int, kind: pa.DataType, buffers: Sequence[bytes | None]) -> pa.Array:
    """An Arrow array of `rows` from (validity or None, then offsets and/or data) buffers."""
    return pa.Array.from_buffers(
        kind, rows, [None if b is None else pa.py_buffer(b) for b in buffers]
    )


def request_frame(
    columns: Columns, dimension_rows: Sequence[tuple[object, ...]], source: str
) -> pl.DataFrame:
    """The rows as RequestRows frames them; `dimension_rows[i]` is combo i's dimensions and
    emulated flag (DIMENSIONS order, then emulated). Built as one Arrow table and handed to
    Polars at once: a Series per column costs more than the columns' data here."""
    n = columns.rows
    text, int64, float64 = pa.large_string(), pa.int64(), pa.float64()
    combo_ids = _array(n, pa.uint32(), [None, columns.combo_ids])
    built = {
        "trace_id": _array(n, text, [None, *columns.trace_id]),
        "span_id": _array(n, text, [None, *columns.span_id]),
        "request_id": _array(n, text, columns.request_id),
        "error_type": _array(n, text, columns.error_type),
        "ok": _array(n, pa.bool_(), [None, columns.ok]),
        "arrival_ts": _array(n, pa.timestamp("us"), [None, columns.start_us]),
        "end_ts": _array(n, pa.timestamp("us"), [None, columns.end_us]),
        "source": pa.repeat(pa.scalar(source, text), n),
        "ingested_ts": pa.nulls(n, pa.timestamp("us")),
    }
    for name, (valid, data) in zip(
        ("prompt_tokens", "completion_tokens", "max_tokens"), columns.counts, strict=True
    ):
        built[name] = _array(n, int64, [valid, data])
    for name, valid, data in zip(
        LATENCY_KEYS, columns.latency_valid, columns.latency_data, strict=True
    ):
        built[name] = _array(n, float64, [valid, data])
    for position, name in enumerate((*DIMENSIONS, "emulated")):
        kind = _ARROW_TYPES[name]
        if len(dimension_rows) == 1:  # the usual export: one resource, no span-level names
            built[name] = pa.repeat(pa.scalar(dimension_rows[0][position], kind), n)
        else:
            built[name] = pa.array([row[position] for row in dimension_rows], kind).take(combo_ids)
    frame = pl.from_arrow(pa.Table.from_pydict(built, schema=_ARROW_SCHEMA))
    assert isinstance(frame, pl.DataFrame)  # a table makes a frame
    return frame


def main(argv: list[str]) -> int:
    """`native build|status` of `python -m servewatch.collectors.traces`."""
    if argv == ["build"]:
        try:
            path = build()
        except (OtlpNativeBuildError, OSError) as exc:
            sys.stdout.write(
                f"OTLP decoder: build failed, the receiver runs as pure Python: {exc}\n"
            )
            return 1
        sys.stdout.write(f"OTLP decoder: compiled into {path}\n")
        return 0
    if argv == ["status"]:
        sys.stdout.write(describe() + "\n")
        return 0
    sys.stderr.write("usage: python -m servewatch.collectors.traces native build|status\n")
    return 2
