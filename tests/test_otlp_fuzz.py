"""Seeded fuzzing of `handle_export`: mutated OTLP protobuf and JSON bodies never raise, always
get one of the documented statuses, and one poisoned span never costs the good ones."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from servewatch.collectors.fixture.recording import otlp_json_line
from servewatch.collectors.traces.receiver import ExportOutcome, ReceiverConfig, handle_export
from tests.protobuf_wire import varint
from tests.test_otlp_protobuf_mapping import request_body
from tests.test_otlp_receiver import make_spans

CONFIG = ReceiverConfig(max_body_bytes=100_000)
# What handle_export may answer (401 needs a token, which CONFIG does not ask for).
STATUSES = {200, 400, 413, 415}
PROTOBUF, JSON = "application/x-protobuf", "application/json"
EXTREME_NUMBERS: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    -1.5,
    1e308,
    5e-324,
    0,
    -1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    10**30,
]


def seeds() -> list[ExportTraceServiceRequest]:
    return [
        encode_spans(make_spans(6, broken=1)),
        ExportTraceServiceRequest.FromString(request_body()),
    ]


def answered(body: bytes, media: str, encoding: str = "") -> ExportOutcome:
    outcome = handle_export(
        body, content_type=media, content_encoding=encoding, authorization=None, config=CONFIG
    )
    assert outcome.status in STATUSES, (outcome.status, outcome.body[:200])
    if outcome.status == 200:
        assert outcome.rows is not None
        rows = outcome.rows
        assert rows.filter(rows["ttft_s"] > rows["e2e_s"]).height == 0
        for column in ("ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s"):
            values = [v for v in rows[column].to_list() if v is not None]
            assert all(math.isfinite(v) and v >= 0 for v in values), column
    else:
        assert outcome.rows is None
    return outcome


def mutate_bytes(rng: random.Random, body: bytes, other: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        if not data:
            data += other[:10]
        at = rng.randrange(len(data))
        kind = rng.randrange(7)
        if kind == 0:  # flip bits of a byte
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            del data[at:]
        elif kind == 2:  # splice in a piece of another body
            start = rng.randrange(len(other))
            data[at:at] = other[start : start + rng.randint(1, 64)]
        elif kind == 3:  # a varint that runs on, or one cut short
            data[at] |= 0x80 if rng.random() < 0.5 else 0
            data[at] &= 0xFF if rng.random() < 0.5 else 0x7F
        elif kind == 4:  # a huge varint (a length or a number)
            data[at:at] = varint(rng.choice([2**63, 2**64 - 1, 2**31, 1 << 40]))
        elif kind == 5:  # random bytes
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        else:  # a repeated slice
            data[at:at] = data[at : at + rng.randint(1, 200)]
    return bytes(data)


def set_attribute(rng: random.Random, span: Span) -> None:
    if not span.attributes:
        return
    value = rng.choice(span.attributes).value
    number = rng.choice(EXTREME_NUMBERS)
    kind = rng.randrange(4)
    if kind == 0 and isinstance(number, float):
        value.double_value = number
    elif kind == 1 and isinstance(number, int) and -(2**63) <= number < 2**63:
        value.int_value = number
    elif kind == 2:
        value.string_value = str(number)
    else:
        value.bool_value = bool(number)


def set_time(rng: random.Random, span: Span) -> None:
    stamp = rng.choice([0, 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
    if rng.random() < 0.5:
        span.start_time_unix_nano = stamp
    else:
        span.end_time_unix_nano = stamp


def set_ids(rng: random.Random, span: Span) -> None:
    span.trace_id = rng.randbytes(rng.choice([0, 1, 15, 16, 17]))
    span.span_id = rng.randbytes(rng.choice([0, 7, 8, 9]))


FIELD_MUTATIONS: list[Callable[[random.Random, Span], None]] = [set_attribute, set_time, set_ids]


def mutate_message(rng: random.Random, request: ExportTraceServiceRequest) -> bytes:
    mutated = ExportTraceServiceRequest()
    mutated.CopyFrom(request)
    spans = [span for rs in mutated.resource_spans for ss in rs.scope_spans for span in ss.spans]
    for _ in range(rng.randint(1, 5)):
        rng.choice(FIELD_MUTATIONS)(rng, rng.choice(spans))
    return mutated.SerializeToString()


def mutate_json(rng: random.Random, doc: Any) -> bytes:
    """A copy of `doc` with a few values (anywhere) replaced by hostile ones."""
    doc = json.loads(json.dumps(doc))
    hostile: list[Any] = [
        None,
        [],
        {},
        "",
        "NaN",
        "Infinity",
        "-5",
        str(2**64),
        str(10**400),
        -(2**70),
        1e300,
        True,
        "zz",
        {"doubleValue": "NaN"},
        {"intValue": str(10**40)},
        {"arrayValue": {"values": [{"kvlistValue": {"values": [{"key": 1}]}}]}},
    ]
    for _ in range(rng.randint(1, 4)):
        node: Any = doc
        path: list[Any] = []
        while isinstance(node, dict | list) and node and rng.random() < 0.85:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if path:
            parent, key = path[-1]
            parent[key] = json.loads(json.dumps(rng.choice(hostile)))  # a fresh copy
    return json.dumps(doc).encode()


@pytest.mark.parametrize("seed", range(4))
def test_mutated_protobuf_bodies_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    requests = seeds()
    bodies = [r.SerializeToString() for r in requests]
    for _ in range(600):
        index = rng.randrange(len(bodies))
        body = mutate_bytes(rng, bodies[index], bodies[1 - index])
        answered(body, PROTOBUF)
        answered(mutate_message(rng, requests[index]), PROTOBUF)


@pytest.mark.parametrize("seed", range(4))
def test_mutated_json_bodies_never_raise(seed: int) -> None:
    rng = random.Random(100 + seed)
    lines = [otlp_json_line(r.SerializeToString(), protobuf=True) for r in seeds()]
    docs = [json.loads(line) for line in lines]
    for _ in range(300):
        index = rng.randrange(len(lines))
        answered(mutate_bytes(rng, lines[index], lines[1 - index]), JSON)
        answered(mutate_json(rng, docs[index]), JSON)


POISONS: list[Callable[[random.Random, Span], None]] = [
    lambda rng, span: setattr(span, "end_time_unix_nano", rng.choice([2**63, 2**64 - 1])),
    lambda rng, span: setattr(span, "start_time_unix_nano", span.end_time_unix_nano + 1),
    lambda rng, span: attribute(span, "gen_ai.latency.time_to_first_token", rng),
    lambda rng, span: attribute(span, "gen_ai.latency.e2e", rng),
    lambda rng, span: attribute(span, "gen_ai.latency.time_in_queue", rng),
    lambda rng, span: attribute(span, "gen_ai.latency.time_in_model_decode", rng),
]


def attribute(span: Span, key: str, rng: random.Random) -> None:
    (entry,) = [kv for kv in span.attributes if kv.key == key]
    bad = [math.nan, math.inf, -math.inf, -0.5]
    if key == "gen_ai.latency.time_to_first_token":
        bad.append(1e6)  # after the end
    entry.value.double_value = rng.choice(bad)


@pytest.mark.parametrize("media", [PROTOBUF, JSON])
def test_one_poisoned_span_is_rejected_and_the_good_ones_kept(media: str) -> None:
    rng = random.Random(7)
    for _ in range(150):
        good = rng.randint(1, 8)
        request = encode_spans(make_spans(good + 1))
        spans = request.resource_spans[0].scope_spans[0].spans
        poisoned = spans[rng.randrange(len(spans))]
        rng.choice(POISONS)(rng, poisoned)
        body = request.SerializeToString()
        if media == JSON:
            body = otlp_json_line(body, protobuf=True)
        outcome = answered(body, media)
        assert outcome.status == 200
        assert outcome.rows is not None
        assert outcome.rows.height == good
        assert poisoned.span_id.hex() not in outcome.rows["span_id"].to_list()
        assert len(outcome.rejects) == 1
