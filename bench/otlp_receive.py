"""OTLP receive throughput: protobuf export bodies through `handle_export` into a DuckDB store.

Ours: `handle_export` of each ExportTraceServiceRequest body (decode, map vLLM request spans,
build the batch) handed to the receiver's single `StoreWriter`, which writes the rows
(deduplicated on trace and span id), until everything is stored. Both sides run pinned to one
CPU core, so the writer thread shares the core with the decoding. The time runs from the first
`handle_export` until the writer has stored the last row (a fresh store per round). Peer:
opentelemetry-proto's walk of the same bodies, `ParseFromString` and a visit of every span and
attribute value, no mapping or storage. The two run in alternating rounds (5 quick, 3 full) and
the median round of each is reported, so load that comes and goes on a shared machine hits both.
Bodies (1M spans by default) hold 512 to 1,000 spans each, as the OpenTelemetry SDK's batch
processor sends them, with vLLM's `llm_request` attributes; they are generated once and cached.
"""

from __future__ import annotations

import os
import random
import statistics
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.report import Comparison
from servewatch.collectors.store_writer import StoreWriter
from servewatch.collectors.traces.receiver import PROTOBUF, ReceiverConfig, handle_export
from servewatch.store import Store

REPLICAS = 12
CACHE = Path(os.environ.get("SERVEWATCH_BENCH_CACHE", Path.home() / ".cache" / "servewatch-bench"))
_LENGTH = struct.Struct("<I")


def _kv(key: str, value: float | int | str) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.double_value = value
    return kv


def export_body(rng: random.Random, first: int, count: int, t_ns: int) -> tuple[bytes, int]:
    """One export of `count` request spans from span `first` on, after `t_ns`; and its last time."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    replica = f"vllm-{rng.randrange(REPLICAS)}"
    resource_spans.resource.attributes.extend(
        [_kv("service.name", "vllm"), _kv("servewatch.replica", replica)]
    )
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "vllm.llm_engine"
    for i in range(first, first + count):
        t_ns += rng.randrange(1, 20_000_000)
        queue, prefill = rng.expovariate(25), rng.uniform(0.02, 0.3)
        tokens = rng.randrange(1, 800)
        decode = (tokens - 1) * rng.uniform(0.01, 0.05)
        e2e = queue + prefill + decode
        span: Span = scope_spans.spans.add()
        span.trace_id = rng.getrandbits(128).to_bytes(16, "big")
        span.span_id = rng.getrandbits(64).to_bytes(8, "big")
        span.name = "llm_request"
        span.kind = Span.SPAN_KIND_SERVER
        span.start_time_unix_nano = t_ns
        span.end_time_unix_nano = t_ns + int(e2e * 1e9)
        span.attributes.extend(
            [
                _kv("gen_ai.request.id", f"cmpl-{i}"),
                _kv("gen_ai.usage.prompt_tokens", rng.randrange(10, 4000)),
                _kv("gen_ai.usage.completion_tokens", tokens),
                _kv("gen_ai.latency.time_in_queue", queue),
                _kv("gen_ai.latency.time_to_first_token", queue + prefill),
                _kv("gen_ai.latency.e2e", e2e),
                _kv("gen_ai.latency.time_in_model_prefill", prefill),
                _kv("gen_ai.latency.time_in_model_decode", decode),
                _kv("gen_ai.latency.time_in_model_inference", prefill + decode),
                _kv("gen_ai.response.model", "llama-3-8b"),
                _kv("gen_ai.request.max_tokens", 1024),
            ]
        )
    return request.SerializeToString(), t_ns


def bodies_file(n_spans: int, *, seed: int = 11) -> Path:
    """Length-prefixed protobuf export bodies holding `n_spans` request spans (cached)."""
    path = CACHE / f"otlp_export_bodies_{n_spans}_{seed}.bin"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    t_ns = 1_795_000_000 * 10**9
    partial = path.with_suffix(".partial")
    with partial.open("wb") as out:
        first = 0
        while first < n_spans:
            count = min(rng.randrange(512, 1001), n_spans - first)
            body, t_ns = export_body(rng, first, count, t_ns)
            out.write(_LENGTH.pack(len(body)))
            out.write(body)
            first += count
    partial.rename(path)
    return path


def read_bodies(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (size,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        yield data[offset : offset + size]
        offset += size


def receive_and_store(bodies: list[bytes], store: Store) -> int:
    """What the receiver and its writer do per export; returns the spans stored."""
    config = ReceiverConfig()
    with StoreWriter(store) as writer:
        for body in bodies:
            outcome = handle_export(
                body, content_type=PROTOBUF, content_encoding="", authorization=None, config=config
            )
            if outcome.status != 200 or outcome.rows is None or outcome.rejects:
                raise RuntimeError(f"export refused or partly rejected: {outcome.body[:200]!r}")
            writer.submit(outcome.rows, [])
        writer.flush()
        if writer.counters.failed_tasks:
            raise RuntimeError(f"{writer.counters.failed_tasks} store writes failed")
        return writer.counters.new_requests


def walk(bodies: list[bytes]) -> int:
    """opentelemetry-proto's decode, visiting every span and attribute value."""
    spans = 0
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans += 1
                    for kv in span.attributes:
                        kv.value.WhichOneof("value")
    return spans


def run(*, quick: bool = False) -> list[Comparison]:
    return [measure(100_000 if quick else 1_000_000)]


def measure(n_spans: int) -> Comparison:
    bodies = list(read_bodies(bodies_file(n_spans)))
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # "on one core": DuckDB's threads included
    try:
        return _measure(bodies, n_spans)
    finally:
        os.sched_setaffinity(0, cpus)


def _measure(bodies: list[bytes], n_spans: int) -> Comparison:
    ours, peer = [], []
    for _ in range(5 if n_spans <= 100_000 else 3):
        started = time.perf_counter()
        walked = walk(bodies)
        peer.append(time.perf_counter() - started)
        if walked != n_spans:
            raise RuntimeError(f"peer walked {walked} of {n_spans} spans")
        with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "bench.duckdb") as store:
            started = time.perf_counter()
            stored = receive_and_store(bodies, store)
            ours.append(time.perf_counter() - started)
        if stored != n_spans:
            raise RuntimeError(f"stored {stored} of {n_spans} spans")
    ours_s, peer_s = statistics.median(ours), statistics.median(peer)
    return Comparison(
        benchmark=f"receive {n_spans:,} vLLM request spans (OTLP/HTTP protobuf, "
        f"{len(bodies):,} exports)",
        unit="spans/s",
        ours_label="servewatch handle_export + store write (decode, map, dedup, DuckDB)",
        ours=n_spans / ours_s,
        peer_label="opentelemetry-proto ParseFromString + walk spans and attributes",
        peer=n_spans / peer_s,
    )
