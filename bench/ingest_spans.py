"""Trace ingest throughput: `servewatch ingest traces` against opentelemetry-proto decoding.

Ours: decode OTLP/JSON lines, map vLLM request spans, write them to a fresh DuckDB store.
Peer: `google.protobuf.json_format.Parse` of the same lines into opentelemetry-proto's
ExportTraceServiceRequest, decoding only (no mapping, no storage).
The input (1M spans by default, 500 per line as a Collector batch) is generated once and cached.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.report import Comparison
from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.store import Store

SPANS_PER_LINE = 500
CACHE = Path(os.environ.get("SERVEWATCH_BENCH_CACHE", Path.home() / ".cache" / "servewatch-bench"))


def _attr(key: str, value: float | int | str) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"doubleValue": value}}


def spans_file(n_spans: int, *, seed: int = 7) -> Path:
    """An OTLP JSON-lines file of `n_spans` vLLM request spans over 12 replicas (cached)."""
    path = CACHE / f"llm_request_spans_{n_spans}_{seed}.jsonl"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    t_ns = 1_795_000_000 * 10**9
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as out:
        for start in range(0, n_spans, SPANS_PER_LINE):
            replica = f"vllm-{(start // SPANS_PER_LINE) % 12}"
            spans = []
            for i in range(min(SPANS_PER_LINE, n_spans - start)):
                t_ns += rng.randrange(1, 20_000_000)
                queue, prefill = rng.expovariate(25), rng.uniform(0.02, 0.3)
                tokens = rng.randrange(1, 800)
                decode = (tokens - 1) * rng.uniform(0.01, 0.05)
                e2e = queue + prefill + decode
                spans.append(
                    {
                        "traceId": f"{rng.getrandbits(128):032x}",
                        "spanId": f"{rng.getrandbits(64):016x}",
                        "name": "llm_request",
                        "kind": 2,
                        "startTimeUnixNano": str(t_ns),
                        "endTimeUnixNano": str(t_ns + int(e2e * 1e9)),
                        "attributes": [
                            _attr("gen_ai.request.id", f"cmpl-{start + i}"),
                            _attr("gen_ai.usage.prompt_tokens", rng.randrange(10, 4000)),
                            _attr("gen_ai.usage.completion_tokens", tokens),
                            _attr("gen_ai.latency.time_in_queue", queue),
                            _attr("gen_ai.latency.time_to_first_token", queue + prefill),
                            _attr("gen_ai.latency.e2e", e2e),
                            _attr("gen_ai.latency.time_in_model_prefill", prefill),
                            _attr("gen_ai.latency.time_in_model_decode", decode),
                            _attr("gen_ai.latency.time_in_model_inference", prefill + decode),
                            _attr("gen_ai.request.max_tokens", 1024),
                        ],
                        "status": {},
                    }
                )
            resource = {"attributes": [_attr("servewatch.replica", replica)]}
            doc = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")
    partial.rename(path)
    return path


def run(*, quick: bool = False) -> list[Comparison]:
    return [measure(100_000 if quick else 1_000_000)]


def measure(n_spans: int) -> Comparison:
    path = spans_file(n_spans)
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "bench.duckdb") as store:
        started = time.perf_counter()
        report = ingest_trace_files([path], store=store)
        ours_s = time.perf_counter() - started
    if report.new_requests != n_spans:
        raise RuntimeError(
            f"ingested {report.new_requests} of {n_spans} spans: {report.rejects[:3]}"
        )

    started = time.perf_counter()
    decoded = 0
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            message = ExportTraceServiceRequest()
            json_format.Parse(line, message)
            decoded += sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
    peer_s = time.perf_counter() - started
    if decoded != n_spans:
        raise RuntimeError(f"peer decoded {decoded} of {n_spans} spans")
    return Comparison(
        benchmark=f"ingest {n_spans:,} vLLM request spans (OTLP/JSON lines)",
        unit="spans/s",
        ours_label="servewatch ingest (decode + map + DuckDB write)",
        ours=n_spans / ours_s,
        peer_label="opentelemetry-proto json_format.Parse (decode only)",
        peer=n_spans / peer_s,
    )
