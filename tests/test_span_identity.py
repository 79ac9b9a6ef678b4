"""Span identity: the replica a request span speaks for, the target it matches, its model and
its LoRA adapter, by table."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.traces.otlp_json import Span
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping
from servewatch.collectors.traces.span_identity import (
    SpanIdentity,
    TargetDirectory,
    TargetLabels,
    resolve_replica,
)

BASE = "llama-8b"
POD_TARGET = TargetLabels(replica="vllm-pod-0", host="node-a", model=BASE, pool="chat")
SOLO = TargetLabels(replica="vllm-solo", host="node-b", model=BASE, zone="zone-b")
SHARED_A = TargetLabels(replica="vllm-c0", host="node-c", model=BASE)
SHARED_B = TargetLabels(replica="vllm-c1", host="node-c", model="qwen-7b")
SHARED_C = TargetLabels(replica="vllm-c2", host="node-c", model="qwen-7b")
NAMED_HOST = TargetLabels(replica="node-d", host="node-d", model=BASE)
DIRECTORY = TargetDirectory.of([POD_TARGET, SOLO, SHARED_A, SHARED_B, SHARED_C, NAMED_HOST])


@pytest.mark.parametrize(
    ("named", "host", "process", "model", "per_process", "expected"),
    [
        # A named replica (pod) is itself, matched to its target when one has that replica.
        ("vllm-pod-0", "node-x", "11", None, False, SpanIdentity("vllm-pod-0", POD_TARGET)),
        ("pod-unknown", "node-a", "11", None, False, SpanIdentity("pod-unknown")),
        # A host one engine target serves is that target's replica, whatever the process.
        (None, "node-b", "11", None, False, SpanIdentity("vllm-solo", SOLO)),
        (None, "node-b", "12", None, True, SpanIdentity("vllm-solo", SOLO)),
        (None, "node-d", None, None, False, SpanIdentity("node-d", NAMED_HOST)),
        # Several targets on a host: told apart by model, else by process id.
        (None, "node-c", "11", BASE, False, SpanIdentity("vllm-c0", SHARED_A)),
        (None, "node-c", "11", "qwen-7b", False, SpanIdentity("node-c/11")),
        (None, "node-c", "11", None, False, SpanIdentity("node-c/11")),
        (None, "node-c", None, None, False, SpanIdentity("node-c")),
        # A host without targets: itself, or per process when configured so.
        (None, "node-z", "11", None, False, SpanIdentity("node-z")),
        (None, "node-z", "11", None, True, SpanIdentity("node-z/11")),
        (None, None, "11", None, False, SpanIdentity(None)),
    ],
)
def test_resolve_replica(
    named: str | None,
    host: str | None,
    process: str | None,
    model: str | None,
    per_process: bool,
    expected: SpanIdentity,
) -> None:
    got = resolve_replica(
        named=named,
        host=host,
        process=process,
        model=model,
        per_process=per_process,
        directory=DIRECTORY,
    )
    assert got == expected


# Targets that speak for pods name their replica `<namespace>/<pod>` (targets.py).
POD_IN_SERVING = TargetLabels(replica="serving/vllm-0", host="node-p", model=BASE)
POD_IN_BATCH = TargetLabels(replica="batch/vllm-0", host="node-q", model=BASE)
POD_ALONE = TargetLabels(replica="serving/vllm-1", host="node-p", model=BASE)
PODS = TargetDirectory.of([POD_IN_SERVING, POD_IN_BATCH, POD_ALONE])


@pytest.mark.parametrize(
    ("named", "namespace", "expected"),
    [
        ("vllm-0", "serving", SpanIdentity("serving/vllm-0", POD_IN_SERVING)),
        ("vllm-0", "batch", SpanIdentity("batch/vllm-0", POD_IN_BATCH)),
        # the namespace names the pod even where no target speaks for it
        ("vllm-9", "serving", SpanIdentity("serving/vllm-9")),
        # without a namespace: the one pod target of that name, if there is one only
        ("vllm-1", None, SpanIdentity("serving/vllm-1", POD_ALONE)),
        ("vllm-0", None, SpanIdentity("vllm-0")),
        # a target named as the pod itself wins
        ("serving/vllm-0", "other", SpanIdentity("serving/vllm-0", POD_IN_SERVING)),
    ],
)
def test_a_pod_name_matches_the_pod_target_of_its_namespace(
    named: str, namespace: str | None, expected: SpanIdentity
) -> None:
    got = resolve_replica(
        named=named,
        namespace=namespace,
        host="node-p",
        process="7",
        model=None,
        per_process=False,
        directory=PODS,
    )
    assert got == expected


def test_directories_leave_gpu_exporters_out() -> None:
    targets = [
        Target("a", TargetKind.VLLM, "http://a/metrics", replica="r0", host="h"),
        Target("b", TargetKind.DCGM, "http://b/metrics", replica="r0-gpu", host="h"),
    ]
    for directory in (
        TargetDirectory.from_targets(targets),
        TargetDirectory.from_frame(
            pl.DataFrame(
                {
                    "kind": ["vllm", "dcgm"],
                    "replica": ["r0", "r0-gpu"],
                    "host": ["h", "h"],
                    "zone": [None, None],
                    "model": [None, None],
                    "pool": [None, None],
                }
            )
        ),
    ):
        assert set(directory.by_replica) == {"r0"}
        assert [t.replica for t in directory.by_host["h"]] == ["r0"]


SDK_RESOURCE = {
    "service.name": "vllm",
    "service.instance.id": "6c1f8f3e-9a52-4d1b-8d5e-3f1d2c4b5a69",  # the SDK's random UUID
    "vllm.process_id": "4711",
    "telemetry.sdk.name": "opentelemetry",
}
LATENCIES = {
    "gen_ai.latency.time_to_first_token": 0.1,
    "gen_ai.latency.e2e": 0.5,
    "gen_ai.usage.completion_tokens": 10,
}


def row(
    resource: dict[str, Any],
    span: dict[str, Any] | None = None,
    *,
    mapping: SpanMapping | None = None,
    directory: TargetDirectory = DIRECTORY,
) -> dict[str, Any]:
    rows = RequestRows(mapping=mapping or SpanMapping(), targets=directory)
    rows.add(
        Span(
            trace_id="ab" * 16,
            span_id="cd" * 8,
            name="llm_request",
            kind=2,
            start_unix_ns=1_795_000_000 * 10**9,
            end_unix_ns=1_795_000_001 * 10**9,
            status_code=0,
            attributes=LATENCIES | (span or {}),
            resource=resource,
        ),
        source="test",
    )
    return rows.to_frame().row(0, named=True)


@pytest.mark.parametrize(
    ("resource", "span", "mapping", "expected"),
    [
        # The SDK's instance id is never the replica unless configured; the pod is.
        (
            SDK_RESOURCE | {"k8s.pod.name": "vllm-pod-0"},
            {},
            SpanMapping(),
            {"replica": "vllm-pod-0", "host": "node-a", "model": BASE, "pool": "chat"},
        ),
        (SDK_RESOURCE, {}, SpanMapping(), {"replica": None, "model": None}),
        (
            SDK_RESOURCE,
            {},
            SpanMapping(replica_keys=("service.instance.id",)),
            {"replica": SDK_RESOURCE["service.instance.id"]},
        ),
        (
            SDK_RESOURCE,
            {},
            SpanMapping(fallback_replica_keys=("service.name",), default_model="m"),
            {"replica": "vllm", "model": "m", "adapter": None},
        ),
        # host.name alone: the one target of its host; several: the process id too.
        (SDK_RESOURCE | {"host.name": "node-b"}, {}, SpanMapping(), {"replica": "vllm-solo"}),
        (
            SDK_RESOURCE | {"host.name": "node-b"},
            {},
            SpanMapping(),
            {"zone": "zone-b", "model": BASE},
        ),
        (SDK_RESOURCE | {"host.name": "node-c"}, {}, SpanMapping(), {"replica": "node-c/4711"}),
        # The model: span, resource, target, configuration; an adapter when not the base.
        (
            SDK_RESOURCE | {"k8s.pod.name": "vllm-pod-0"},
            {"gen_ai.response.model": "sql-lora"},
            SpanMapping(),
            {"model": "sql-lora", "adapter": "sql-lora"},
        ),
        (
            SDK_RESOURCE | {"k8s.pod.name": "vllm-pod-0"},
            {"gen_ai.response.model": BASE},
            SpanMapping(),
            {"model": BASE, "adapter": None},
        ),
        (
            SDK_RESOURCE | {"k8s.pod.name": "unlisted", "gen_ai.request.model": "sql-lora"},
            {},
            SpanMapping(default_model=BASE),
            {"model": "sql-lora", "adapter": "sql-lora"},
        ),
        (
            SDK_RESOURCE | {"k8s.pod.name": "unlisted"},
            {"gen_ai.response.model": "sql-lora"},
            SpanMapping(),
            {"model": "sql-lora", "adapter": None},  # no base model known: nothing to tell
        ),
        (
            SDK_RESOURCE | {"k8s.pod.name": "vllm-pod-0"},
            {"servewatch.adapter": "gw-named"},
            SpanMapping(),
            {"model": BASE, "adapter": "gw-named"},
        ),
        (
            SDK_RESOURCE | {"k8s.pod.name": "vllm-pod-0"},
            {"lora.name": "gw-named"},
            SpanMapping(adapter_keys=("lora.name",)),
            {"adapter": "gw-named"},
        ),
        # A gateway naming the replica on the span: matched to that replica's target.
        (
            {"service.name": "gateway", "host.name": "gw-host"},
            {"servewatch.replica": "vllm-pod-0"},
            SpanMapping(),
            {"replica": "vllm-pod-0", "host": "gw-host", "pool": "chat", "model": BASE},
        ),
        (
            {"service.name": "gateway"},
            {"servewatch.replica": "vllm-pod-0", "gen_ai.request.model": "sql-lora"},
            SpanMapping(),
            {"replica": "vllm-pod-0", "model": "sql-lora", "adapter": "sql-lora"},
        ),
    ],
)
def test_request_rows_take_identity_model_and_adapter(
    resource: dict[str, Any],
    span: dict[str, Any],
    mapping: SpanMapping,
    expected: dict[str, Any],
) -> None:
    got = row(resource, span, mapping=mapping)
    assert {key: got[key] for key in expected} == expected
