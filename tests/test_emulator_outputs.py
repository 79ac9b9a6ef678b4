"""Emulated fleet outputs: vLLM pages, DCGM pages, request spans, fixture folders, live endpoints.

Driven by hand-made simulation records (FinishedRequest / EngineSteps / ReplicaEvent), so every
expected number is known in advance.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.collectors.store_writer import TraceCommit
from servewatch.collectors.traces.ingest import Reject
from servewatch.collectors.traces.otlp_json import read_trace_file
from servewatch.collectors.traces.receiver import OtlpHttpReceiver, ReceiverConfig
from servewatch.collectors.traces.request_spans import RequestRows
from servewatch.emulator.dcgm_metrics import DcgmObserver, GpuSpec, gpu_activity, host_gpus
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fixture_writer import (
    FixtureError,
    FixtureWriter,
    iter_pages,
    read_manifest,
    record_fixture,
    scrape_times,
)
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.records import (
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.span_output import jsonl_span_output, otlp_http_span_output
from servewatch.emulator.vllm_metrics import (
    EngineSettings,
    ReplicaMetrics,
    VllmMetricsObserver,
    encode_families,
    render_vllm_page,
)
from servewatch.pipeline.promql import histogram_quantile

T0 = 1_795_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLACEMENTS = (
    ReplicaPlacement("vllm-0", "host-a", "zone-1", MODEL, "chat", 1),
    ReplicaPlacement("vllm-1", "host-a", "zone-1", MODEL, "chat", 1),
    ReplicaPlacement("vllm-2", "host-b", "zone-2", MODEL, "chat", 2),
)

# REFERENCE section 1, typed out here rather than imported, so a wrong constant fails.
TTFT_LE = (
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
TOKEN_LE = "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80"
REQUEST_LE = "0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680"
ITERATION_LE = "1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384"
DCGM_DEFAULT_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
}  # fmt: skip
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}


def request(
    replica: str,
    n: int,
    *,
    arrival_s: float,
    prompt: int = 100,
    completion: int = 16,
    queue_s: float = 0.02,
    prefill_s: float = 0.05,
    decode_s: float = 0.3,
    cached: int = 0,
    reason: FinishedReason = FinishedReason.LENGTH,
    tenant: str | None = None,
) -> FinishedRequest:
    return FinishedRequest(
        replica=replica,
        request_id=f"cmpl-{replica}-{n}",
        conversation_id=None,
        tenant=tenant,
        arrival_s=arrival_s,
        queue_s=queue_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        max_tokens=completion,
        finished_reason=reason,
    )


def sequential_run(
    replica: str, *, n: int, prompt: int, max_tokens: int, start_s: float = T0
) -> Iterator[EngineSteps | FinishedRequest]:
    """vLLM's metrics-test workload: n requests one after another, each generating max_tokens.

    Per request: one prefill step (first token), then max_tokens - 1 decode steps.
    """
    step_s = 0.02
    t = start_s
    for i in range(n):
        yield EngineSteps(replica, t, step_s, 1, 0, prompt)
        yield EngineSteps(replica, t + step_s, step_s, max_tokens - 1, 1, 0)
        yield request(
            replica,
            i,
            arrival_s=t,
            prompt=prompt,
            completion=max_tokens,
            queue_s=0.0,
            prefill_s=step_s,
            decode_s=step_s * (max_tokens - 1),
        )
        t += step_s * max_tokens + 0.01


def feed(observer: object, records: object) -> None:
    for record in records:  # type: ignore[attr-defined]
        if isinstance(record, FinishedRequest):
            observer.request_finished(record)  # type: ignore[attr-defined]
        elif isinstance(record, EngineSteps):
            observer.engine_steps(record)  # type: ignore[attr-defined]
        else:
            observer.replica_event(record)  # type: ignore[attr-defined]


def samples(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a page, parsed by prometheus-client: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(page.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(page_samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    matches = [
        v
        for (n, lab), v in page_samples.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    ]
    assert len(matches) == 1, f"{name} {labels}: {len(matches)} samples"
    return float(matches[0])


def total(page_samples: dict, name: str) -> float:  # type: ignore[type-arg]
    return sum(v for (n, _), v in page_samples.items() if n == name)


def bucket_bounds(page_samples: dict, name: str) -> list[str]:  # type: ignore[type-arg]
    return [dict(lab)["le"] for (n, lab) in page_samples if n == f"{name}_bucket"]


def as_le(spaced: str) -> list[str]:
    return [*(repr(float(x)) for x in spaced.split()), "+Inf"]


# vLLM pages


def test_vllm_invariants_hold_for_sequential_requests() -> None:
    n, prompt, max_tokens = 7, 120, 12
    observer = VllmMetricsObserver(PLACEMENTS, started_s=T0)
    feed(observer, sequential_run("vllm-0", n=n, prompt=prompt, max_tokens=max_tokens))
    page = observer.page("vllm-0")
    assert page is not None
    got = samples(page)

    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ):
        assert value(got, f"{name}_count") == n, name
        assert value(got, f"{name}_bucket", le="+Inf") == n, name
    assert value(got, "vllm:inter_token_latency_seconds_count") == n * (max_tokens - 1)
    assert value(got, "vllm:prompt_tokens_total") == n * prompt
    assert value(got, "vllm:generation_tokens_total") == n * max_tokens
    assert total(got, "vllm:request_success_total") == n
    assert value(got, "vllm:request_success_total", finished_reason="length") == n
    assert value(got, "vllm:request_time_per_output_token_seconds_count") == n
    assert value(got, "vllm:iteration_tokens_total_count") == n * max_tokens
    assert value(got, "vllm:iteration_tokens_total_sum") == n * (prompt + max_tokens - 1)
    assert value(got, "vllm:inter_token_latency_seconds_sum") == pytest.approx(
        n * (max_tokens - 1) * 0.02
    )
    # 0.02 s steps: every inter-token observation falls in the (0.01, 0.025] bucket.
    assert value(got, "vllm:inter_token_latency_seconds_bucket", le="0.01") == 0
    assert value(got, "vllm:inter_token_latency_seconds_bucket", le="0.025") == n * (max_tokens - 1)
    # The other replicas saw nothing.
    other = observer.page("vllm-1")
    assert other is not None
    assert value(samples(other), "vllm:time_to_first_token_seconds_count") == 0


def test_default_buckets_are_vllms() -> None:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0, settings=EngineSettings())
    got = samples(render_vllm_page(metrics, None))
    assert bucket_bounds(got, "vllm:time_to_first_token_seconds") == as_le(TTFT_LE)
    assert bucket_bounds(got, "vllm:inter_token_latency_seconds") == as_le(TOKEN_LE)
    assert bucket_bounds(got, "vllm:request_time_per_output_token_seconds") == as_le(TOKEN_LE)
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
    ):
        assert bucket_bounds(got, name) == as_le(REQUEST_LE), name
    assert bucket_bounds(got, "vllm:iteration_tokens_total") == as_le(ITERATION_LE)
    # 1-2-5 up to max_model_len (32768 by default).
    assert bucket_bounds(got, "vllm:request_prompt_tokens")[-2:] == ["20000.0", "+Inf"]


def test_page_names_labels_created_and_emulation_marker() -> None:
    observer = VllmMetricsObserver(PLACEMENTS, started_s=T0)
    feed(observer, sequential_run("vllm-1", n=2, prompt=10, max_tokens=3))
    page = observer.page("vllm-1")
    assert page is not None
    text = page.decode()
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert "# TYPE vllm:prompt_tokens_created gauge" in text
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
            "vllm:cache_config_info"} <= names  # fmt: skip
    for family in families:
        assert family.name.startswith(("vllm:", "servewatch_")), family.name
        for s in family.samples:
            if family.name in {"vllm:cache_config_info", "servewatch_emulated"}:
                continue
            assert s.labels["model_name"] == MODEL, s
            assert s.labels["engine"] == "0", s
            if s.name.endswith("_created"):
                assert s.value == T0, s
    got = samples(page)
    assert value(got, "servewatch_emulated") == 1
    assert value(got, "vllm:cache_config_info", block_size="16", engine="0") == 1
    # Counters and histograms both carry single-process `_created` samples.
    assert value(got, "vllm:generation_tokens_created") == T0
    assert value(got, "vllm:time_to_first_token_seconds_created") == T0
    # The project's own exposition parser reads every line.
    parsed = parse_exposition(text)
    assert parsed.errors == []
    assert len(parsed) > 250


finished_requests = st.builds(
    lambda q, p, d, prompt, cached, completion, reason, pre: FinishedRequest(
        "vllm-0", "r", None, None, T0, q, p, d, prompt, min(cached, prompt), completion,
        max(completion, 1), reason, pre,
    ),
    st.floats(0, 100), st.floats(0, 10), st.floats(0, 1000), st.integers(1, 40000),
    st.integers(0, 40000), st.integers(0, 5000), st.sampled_from(FinishedReason),
    st.integers(0, 3),
)  # fmt: skip
engine_steps = st.builds(
    lambda step_s, iterations, seqs, prefill: EngineSteps(
        "vllm-0", T0, step_s, iterations, seqs, prefill
    ),
    st.floats(0.001, 100), st.integers(0, 10**6), st.integers(0, 512), st.integers(0, 8192),
)  # fmt: skip
states = st.builds(
    lambda running, waiting, kv: ReplicaState("vllm-0", True, running, waiting, kv, 0.5, 10.0),
    st.integers(0, 512),
    st.integers(0, 10**4),
    st.floats(0, 1),
)


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(st.one_of(finished_requests, engine_steps), max_size=30),
    state=st.one_of(st.none(), states),
    created_s=st.floats(1e9, 2e9),
)
def test_fast_page_is_prometheus_clients_encoding(
    records: list[FinishedRequest | EngineSteps], state: ReplicaState | None, created_s: float
) -> None:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=created_s, settings=EngineSettings())
    for record in records:
        if isinstance(record, FinishedRequest):
            metrics.observe_request(record)
        else:
            metrics.observe_steps(record)
    assert render_vllm_page(metrics, state) == encode_families(metrics.families(state))


def test_live_registry_serves_the_same_page() -> None:
    observer = VllmMetricsObserver(PLACEMENTS, started_s=T0)
    feed(observer, sequential_run("vllm-2", n=3, prompt=50, max_tokens=5))
    observer.set_states([ReplicaState("vllm-2", True, 4, 2, 0.31, 0.9, 500.0)])
    assert generate_latest(observer.registry("vllm-2")) == observer.page("vllm-2")
    got = samples(generate_latest(observer.registry("vllm-2")))
    assert value(got, "vllm:num_requests_running") == 4
    assert value(got, "vllm:num_requests_waiting") == 2
    assert value(got, "vllm:kv_cache_usage_perc") == 0.31


def test_restart_resets_counters_and_created() -> None:
    observer = VllmMetricsObserver(PLACEMENTS, started_s=T0)
    feed(observer, sequential_run("vllm-0", n=4, prompt=10, max_tokens=3))
    observer.replica_event(ReplicaEvent("vllm-0", T0 + 100, ReplicaEventKind.CRASHED))
    assert observer.page("vllm-0") is None
    assert not observer.is_up("vllm-0")
    observer.replica_event(ReplicaEvent("vllm-0", T0 + 200, ReplicaEventKind.STARTED))
    page = observer.page("vllm-0")
    assert page is not None
    got = samples(page)
    assert value(got, "vllm:prompt_tokens_total") == 0
    assert value(got, "vllm:time_to_first_token_seconds_count") == 0
    assert value(got, "vllm:prompt_tokens_created") == T0 + 200
    feed(observer, sequential_run("vllm-0", n=1, prompt=10, max_tokens=3, start_s=T0 + 300))
    assert value(samples(observer.page("vllm-0") or b""), "vllm:prompt_tokens_total") == 10


def test_failed_requests_and_prefix_cache_counts() -> None:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0, settings=EngineSettings())
    metrics.observe_request(request("vllm-0", 0, arrival_s=T0, prompt=1000, cached=640))
    metrics.observe_request(
        request("vllm-0", 1, arrival_s=T0, completion=0, reason=FinishedReason.ERROR)
    )
    metrics.observe_request(request("vllm-0", 2, arrival_s=T0, completion=1))
    got = samples(render_vllm_page(metrics, None))
    assert value(got, "vllm:prefix_cache_queries_total") == 1200
    assert value(got, "vllm:prefix_cache_hits_total") == 640
    assert value(got, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 640
    assert value(got, "vllm:request_success_total", finished_reason="error") == 1
    # No token, no TTFT; a single token, no per-request TPOT.
    assert value(got, "vllm:time_to_first_token_seconds_count") == 2
    assert value(got, "vllm:request_time_per_output_token_seconds_count") == 1
    assert value(got, "vllm:e2e_request_latency_seconds_count") == 3


def test_unknown_replica_is_named() -> None:
    observer = VllmMetricsObserver(PLACEMENTS, started_s=T0)
    with pytest.raises(KeyError, match="vllm-9"):
        observer.request_finished(request("vllm-9", 0, arrival_s=T0))


# DCGM pages


def dcgm_samples(page: bytes) -> list[tuple[str, dict[str, str], float]]:
    # The project's parser keeps sample names as written (prometheus-client's adds `_total`
    # to counters that lack it, as DCGM's do).
    parsed = parse_exposition(page.decode())
    assert parsed.errors == []
    return [
        (name, json.loads(labels), v)
        for name, labels, v in zip(parsed.metric, parsed.labels, parsed.value, strict=True)
    ]


def busy(replica: str, running: int) -> ReplicaState:
    return ReplicaState(replica, True, running, 0, 0.4, 0.95, 2000.0)


def idle(replica: str) -> ReplicaState:
    return ReplicaState(replica, True, 0, 0, 0.0, 0.0, 0.0)


def gpu_field(page: bytes, field: str, gpu: str) -> float:
    (v,) = [v for n, lab, v in dcgm_samples(page) if n == field and lab["gpu"] == gpu]
    return v


def test_dcgm_page_has_default_fields_labels_and_a_gpu_per_replica_gpu() -> None:
    dcgm = DcgmObserver(PLACEMENTS, started_s=T0)
    page_a, page_b = dcgm.page("host-a"), dcgm.page("host-b")
    assert page_a is not None
    assert page_b is not None
    for page, host, gpus in ((page_a, "host-a", 2), (page_b, "host-b", 2)):
        got = dcgm_samples(page)
        fields = {n for n, _, _ in got} - {"servewatch_emulated"}
        assert fields == DCGM_DEFAULT_FIELDS
        per_gpu = [lab for n, lab, _ in got if n == "DCGM_FI_DEV_GPU_TEMP"]
        assert len(per_gpu) == gpus
        for labels in per_gpu:
            assert set(labels) >= DCGM_LABELS
            assert labels["Hostname"] == host
            assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert labels["device"] == f"nvidia{labels['gpu']}"
        assert len({lab["UUID"] for lab in per_gpu}) == gpus
        assert ("servewatch_emulated", {}, 1.0) in got
        assert parse_exposition(page.decode()).errors == []
    # vllm-2 runs tensor-parallel over both GPUs of host-b.
    assert [g.replica for g in dcgm.gpus["host-b"]] == ["vllm-2", "vllm-2"]
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in page_a.decode()
    assert 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID=' in page_a.decode()


def test_dcgm_values_follow_load() -> None:
    dcgm = DcgmObserver(PLACEMENTS, started_s=T0)
    dcgm.sample(T0 + 60, [idle("vllm-0"), busy("vllm-1", 8), busy("vllm-2", 200)])
    page = dcgm.page("host-a")
    assert page is not None
    idle_power = gpu_field(page, "DCGM_FI_DEV_POWER_USAGE", "0")
    busy_power = gpu_field(page, "DCGM_FI_DEV_POWER_USAGE", "1")
    assert busy_power > idle_power + 100
    assert gpu_field(page, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1") > gpu_field(
        page, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0"
    )
    assert gpu_field(page, "DCGM_FI_DEV_GPU_UTIL", "1") >= 99
    assert gpu_field(page, "DCGM_FI_DEV_GPU_UTIL", "0") == 0
    # FB_USED shows fit, not load: the same on the idle and the busy GPU.
    assert gpu_field(page, "DCGM_FI_DEV_FB_USED", "0") == gpu_field(
        page, "DCGM_FI_DEV_FB_USED", "1"
    )
    assert gpu_field(page, "DCGM_FI_DEV_FB_USED", "0") > 70_000
    # A bigger batch draws more power at the same duty cycle.
    assert gpu_activity(busy("x", 200)) > gpu_activity(busy("x", 8))
    host_b = dcgm.page("host-b") or b""
    assert gpu_field(host_b, "DCGM_FI_DEV_POWER_USAGE", "0") > busy_power

    energy_before = gpu_field(page, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "1")
    dcgm.sample(T0 + 120, [idle("vllm-0"), busy("vllm-1", 8), busy("vllm-2", 200)])
    energy_after = gpu_field(
        dcgm.page("host-a") or b"", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "1"
    )
    # 60 s at the busy power, in millijoules (rounded to whole mJ on the page).
    assert energy_after - energy_before == pytest.approx(busy_power * 60 * 1000, abs=2)
    # NVLink traffic accumulates only for the tensor-parallel replica.
    assert gpu_field(dcgm.page("host-b") or b"", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "0") > 0
    assert gpu_field(dcgm.page("host-a") or b"", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "1") == 0


def test_dcgm_crash_frees_memory_and_host_loss_removes_the_page() -> None:
    dcgm = DcgmObserver(PLACEMENTS, started_s=T0)
    dcgm.replica_event(ReplicaEvent("vllm-1", T0 + 5, ReplicaEventKind.CRASHED))
    page = dcgm.page("host-a") or b""
    assert gpu_field(page, "DCGM_FI_DEV_FB_USED", "1") == 0
    assert gpu_field(page, "DCGM_FI_DEV_FB_USED", "0") > 70_000
    dcgm.replica_event(ReplicaEvent("vllm-2", T0 + 6, ReplicaEventKind.HOST_LOST))
    assert dcgm.page("host-b") is None
    assert dcgm.page("host-a") is not None
    dcgm.replica_event(ReplicaEvent("vllm-2", T0 + 600, ReplicaEventKind.STARTED))
    assert dcgm.page("host-b") is not None


def test_gpu_spec_and_placement_errors_name_the_value() -> None:
    bad = ReplicaPlacement("vllm-x", "host-x", "zone-1", MODEL, "chat", 0)
    with pytest.raises(ValueError, match=r"vllm-x.*gpus=0"):
        DcgmObserver([bad], started_s=T0)
    page = DcgmObserver(PLACEMENTS[:1], started_s=T0, spec=GpuSpec(model_name="Tesla T4")).page(
        "host-a"
    )
    assert 'modelName="Tesla T4"' in (page or b"").decode()


# Spans


def span_rows(path: Path) -> list[dict[str, object]]:
    rows = RequestRows()
    for chunk in read_trace_file(path):
        assert chunk.decoded.errors == []
        for span in chunk.decoded.spans:
            rows.add(span, source=str(path))
    return rows.to_frame().to_dicts()


def test_spans_as_otlp_json_lines_are_read_by_ingest(tmp_path: Path) -> None:
    stream = io.StringIO()
    spans = jsonl_span_output(PLACEMENTS, stream, seed=7, spans_per_line=2)
    spans.request_finished(request("vllm-0", 0, arrival_s=T0, tenant="acme"))
    spans.request_finished(
        request("vllm-2", 1, arrival_s=T0 + 1, completion=0, reason=FinishedReason.ERROR)
    )
    spans.request_finished(request("vllm-1", 2, arrival_s=T0 + 2, prompt=300))
    spans.shutdown()
    path = tmp_path / "spans.jsonl"
    path.write_text(stream.getvalue(), encoding="utf-8")
    assert len(stream.getvalue().splitlines()) == 2  # two spans per line

    rows = {row["request_id"]: row for row in span_rows(path)}
    assert set(rows) == {"cmpl-vllm-0-0", "cmpl-vllm-2-1", "cmpl-vllm-1-2"}
    first = rows["cmpl-vllm-0-0"]
    assert (first["replica"], first["host"], first["zone"], first["pool"]) == (
        "vllm-0", "host-a", "zone-1", "chat",
    )  # fmt: skip
    assert first["emulated"] is True
    assert first["model"] == MODEL
    assert first["tenant"] == "acme"
    assert first["ok"] is True
    assert first["ttft_s"] == pytest.approx(0.07)
    assert first["e2e_s"] == pytest.approx(0.37)
    assert first["completion_tokens"] == 16
    failed = rows["cmpl-vllm-2-1"]
    assert failed["ok"] is False
    assert failed["error_type"] == "error"
    assert rows["cmpl-vllm-1-2"]["prompt_tokens"] == 300


def test_seeded_span_output_is_reproducible_and_restart_changes_process_id() -> None:
    def run() -> str:
        stream = io.StringIO()
        spans = jsonl_span_output(PLACEMENTS, stream, seed=11)
        spans.request_finished(request("vllm-0", 0, arrival_s=T0))
        spans.replica_event(ReplicaEvent("vllm-0", T0 + 5, ReplicaEventKind.STARTED))
        spans.request_finished(request("vllm-0", 1, arrival_s=T0 + 10))
        spans.shutdown()
        return stream.getvalue()

    first = run()
    assert first == run()
    doc = json.loads(first)
    pids = [
        attr["value"]["intValue"]
        for rs in doc["resourceSpans"]
        for attr in rs["resource"]["attributes"]
        if attr["key"] == "vllm.process_id"
    ]
    assert len(pids) == 2
    assert len(set(pids)) == 2


class FrameSink:
    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.rejects: list[Reject] = []
        self.lock = threading.Lock()

    def submit(self, rows: object, rejects: list[Reject]) -> TraceCommit:
        with self.lock:
            self.rows.extend(rows.to_dicts())  # type: ignore[attr-defined]
            self.rejects.extend(rejects)
        return TraceCommit.committed()


def test_spans_reach_an_otlp_http_receiver() -> None:
    sink = FrameSink()
    receiver = OtlpHttpReceiver(ReceiverConfig(port=0), sink)
    receiver.start()
    try:
        spans = otlp_http_span_output(PLACEMENTS, endpoint=receiver.endpoint)
        for i in range(25):
            spans.request_finished(request(PLACEMENTS[i % 3].replica, i, arrival_s=T0 + i))
        # The exporter posts synchronously on flush, and the receiver hands the batch to its
        # sink before it answers, so every row is there once flush returns.
        assert spans.flush()
        spans.shutdown()
    finally:
        receiver.stop()
    assert sink.rejects == []
    assert len(sink.rows) == 25
    assert {row["replica"] for row in sink.rows} == {"vllm-0", "vllm-1", "vllm-2"}
    assert all(row["emulated"] for row in sink.rows)


def test_otlp_endpoint_must_be_a_url() -> None:
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:4318"):
        otlp_http_span_output(PLACEMENTS, endpoint="127.0.0.1:4318")


# Fixture folders


def test_fixture_folder_round_trips(tmp_path: Path) -> None:
    folder = tmp_path / "fixture"
    writer = FixtureWriter(folder, PLACEMENTS, start_s=T0, scrape_interval_s=15.0, seed=3)
    writer.scrape(T0, [idle(p.replica) for p in PLACEMENTS])
    feed(writer, sequential_run("vllm-0", n=3, prompt=40, max_tokens=4, start_s=T0 + 1))
    writer.request_finished(request("vllm-2", 9, arrival_s=T0 + 2, tenant="t1"))
    writer.scrape(T0 + 15, [busy("vllm-0", 3), idle("vllm-1"), busy("vllm-2", 1)])
    writer.replica_event(ReplicaEvent("vllm-1", T0 + 20, ReplicaEventKind.CRASHED, "oom"))
    writer.replica_event(ReplicaEvent("vllm-2", T0 + 21, ReplicaEventKind.HOST_LOST))
    writer.scrape(T0 + 30, [busy("vllm-0", 3)])
    manifest = writer.close(end_s=T0 + 30, ground_truth={"capacity_rps": 4.2}, description="t")

    assert read_manifest(folder) == manifest
    assert manifest["emulated"] is True
    assert manifest["time_range"]["start"] == "2026-11-18T11:06:40Z"
    assert manifest["ground_truth"] == {"capacity_rps": 4.2}
    assert [e["kind"] for e in manifest["events"]] == ["crashed", "host_lost"]
    assert manifest["events"][0]["host"] == "host-a"
    targets = {t["id"]: t for t in manifest["targets"]}
    assert set(targets) == {
        "vllm/vllm-0",
        "vllm/vllm-1",
        "vllm/vllm-2",
        "dcgm/host-a",
        "dcgm/host-b",
    }
    assert targets["vllm/vllm-2"]["labels"] == {
        "replica": "vllm-2",
        "host": "host-b",
        "zone": "zone-2",
    }
    assert targets["dcgm/host-a"]["replicas"] == ["vllm-0", "vllm-1"]

    times = {tid: [t for t, _ in iter_pages(folder, tid)] for tid in targets}
    assert times["vllm/vllm-0"] == [T0, T0 + 15, T0 + 30]
    assert times["vllm/vllm-1"] == [T0, T0 + 15]  # crashed before the third scrape
    assert times["vllm/vllm-2"] == [T0, T0 + 15]  # its host was lost
    assert times["dcgm/host-b"] == [T0, T0 + 15]
    assert times["dcgm/host-a"] == [T0, T0 + 15, T0 + 30]
    assert manifest["pages"]["count"] == sum(len(v) for v in times.values())

    last_page = list(iter_pages(folder, "vllm/vllm-0"))[-1][1]
    got = samples(last_page)
    assert value(got, "vllm:time_to_first_token_seconds_count") == 3
    assert value(got, "vllm:num_requests_running") == 3
    assert value(got, "servewatch_emulated") == 1
    assert (folder / "pages/vllm/vllm-0/1795000030000.prom.gz").read_bytes()[:2] == b"\x1f\x8b"

    rows = span_rows(folder / "spans.jsonl.gz")
    assert manifest["spans"]["count"] == len(rows) == 4
    assert all(row["emulated"] for row in rows)


def test_fixture_writer_refuses_bad_input(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(FixtureError, match="not empty"):
        FixtureWriter(tmp_path / "used", PLACEMENTS, start_s=T0)
    bad = ReplicaPlacement("vllm 0/..", "host-a", "zone-1", MODEL, "chat", 1)
    with pytest.raises(FixtureError, match="cannot name a page folder"):
        FixtureWriter(tmp_path / "new", [bad], start_s=T0)
    writer = FixtureWriter(tmp_path / "ok", PLACEMENTS, start_s=T0)
    writer.scrape(T0 + 60, [])
    with pytest.raises(FixtureError, match="must increase"):
        writer.scrape(T0 + 60, [])
    with pytest.raises(FixtureError, match="no manifest"):
        read_manifest(tmp_path / "used")


class ScriptedSimulation:
    """Plays a fixed list of records in time order, as a simulation would report them."""

    def __init__(self, observer: object, records: list[FinishedRequest | EngineSteps]) -> None:
        self.observer = observer
        self.pending = sorted(records, key=self.time_of)
        self.now_s = T0

    @staticmethod
    def time_of(record: FinishedRequest | EngineSteps) -> float:
        if isinstance(record, FinishedRequest):
            return record.arrival_s + record.e2e_s
        return record.start_s

    def run_until(self, t_s: float) -> None:
        while self.pending and self.time_of(self.pending[0]) <= t_s:
            feed(self.observer, [self.pending.pop(0)])
        self.now_s = t_s

    def states(self) -> dict[str, ReplicaState]:
        return {p.replica: busy(p.replica, 2) for p in PLACEMENTS}


def test_record_fixture_scrapes_every_interval(tmp_path: Path) -> None:
    writer = FixtureWriter(tmp_path / "f", PLACEMENTS, start_s=T0, scrape_interval_s=60.0)
    records = [request(PLACEMENTS[i % 3].replica, i, arrival_s=T0 + 10 * i) for i in range(30)]
    sim = ScriptedSimulation(writer, list(records))
    manifest = record_fixture(sim, writer, end_s=T0 + 300)
    assert manifest["pages"]["scrapes"] == 6
    assert scrape_times(T0, T0 + 300, 60.0) == [T0 + 60 * k for k in range(6)]
    counts = [
        value(samples(page), "vllm:e2e_request_latency_seconds_count")
        for _, page in iter_pages(tmp_path / "f", "vllm/vllm-0")
    ]
    assert counts == [0, 2, 4, 6, 8, 10]


# Live endpoints


@pytest.fixture
def live() -> Iterator[LiveFleetServer]:
    server = LiveFleetServer(PLACEMENTS, started_s=T0)
    server.start()
    yield server
    server.stop()


def test_live_endpoints_serve_pages_and_stop_answering_when_down(live: LiveFleetServer) -> None:
    targets = {t.target_id: t for t in live.targets}
    assert set(targets) == {
        "vllm/vllm-0",
        "vllm/vllm-1",
        "vllm/vllm-2",
        "dcgm/host-a",
        "dcgm/host-b",
    }
    assert all(t.address.startswith("127.0.0.1:") and t.port > 0 for t in targets.values())
    feed(live, sequential_run("vllm-0", n=2, prompt=10, max_tokens=4))
    with httpx.Client(timeout=5) as client:
        response = client.get(targets["vllm/vllm-0"].url)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert response.headers.get("content-encoding") == "gzip"  # httpx asks for gzip
        assert value(samples(response.content), "vllm:prompt_tokens_total") == 20
        dcgm_page = client.get(targets["dcgm/host-a"].url)
        assert dcgm_page.status_code == 200
        assert "DCGM_FI_DEV_POWER_USAGE" in dcgm_page.text
        assert client.get(targets["vllm/vllm-0"].url.replace("/metrics", "/x")).status_code == 404

        live.replica_event(ReplicaEvent("vllm-0", T0 + 5, ReplicaEventKind.CRASHED))
        with pytest.raises(httpx.ConnectError):
            client.get(targets["vllm/vllm-0"].url)
        live.replica_event(ReplicaEvent("vllm-0", T0 + 9, ReplicaEventKind.STARTED))
        restarted = client.get(targets["vllm/vllm-0"].url)
        assert restarted.status_code == 200
        assert value(samples(restarted.content), "vllm:prompt_tokens_total") == 0

        live.replica_event(ReplicaEvent("vllm-2", T0 + 10, ReplicaEventKind.HOST_LOST))
        for target_id in ("vllm/vllm-2", "dcgm/host-b"):
            with pytest.raises(httpx.ConnectError):
                client.get(targets[target_id].url)
        assert client.get(targets["vllm/vllm-1"].url).status_code == 200
    group = live.file_sd()[0]
    own_gpus = [d.uuid for d in host_gpus(PLACEMENTS)["host-a"] if d.replica == "vllm-0"]
    assert own_gpus
    assert group == {
        "targets": [targets["vllm/vllm-0"].address],
        "labels": {
            "job": "vllm",
            "replica": "vllm-0",
            "host": "host-a",
            "zone": "zone-1",
            "gpu_uuids": ",".join(own_gpus),
        },
    }


def test_live_server_rejects_ports_for_unknown_targets() -> None:
    with pytest.raises(ValueError, match="vllm/nope"):
        LiveFleetServer(PLACEMENTS, started_s=T0, ports={"vllm/nope": 9000})


def test_run_live_keeps_endpoints_current() -> None:
    server = LiveFleetServer(PLACEMENTS, started_s=time.time())
    now = time.time()
    records = [request("vllm-1", i, arrival_s=now - 5 + 0.1 * i) for i in range(5)]
    sim = ScriptedSimulation(server, list(records))
    stop = threading.Event()
    server.start()
    runner = threading.Thread(
        target=run_live, args=(sim, server), kwargs={"clock": time.time, "wait": stop.wait}
    )
    runner.start()
    try:
        url = next(t.url for t in server.targets if t.name == "vllm-1")
        deadline = time.monotonic() + 10
        count = 0.0
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                count = value(
                    samples(client.get(url).content), "vllm:e2e_request_latency_seconds_count"
                )
                if count == 5:
                    break
                time.sleep(0.05)
            running = value(samples(client.get(url).content), "vllm:num_requests_running")
    finally:
        stop.set()
        runner.join()
        server.stop()
    assert count == 5
    assert running == 2
    assert not math.isnan(running)


def test_page_sizes_stay_small() -> None:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0, settings=EngineSettings())
    page = render_vllm_page(metrics, None)
    # About the size of a real vLLM V1 page; gzip keeps a day of fixture pages small.
    assert 20_000 < len(page) < 80_000
    assert len(gzip.compress(page)) < 6_000


# The fleet simulation end to end


def test_fixture_of_a_simulated_fleet_agrees_with_its_spans(tmp_path: Path) -> None:
    config = dataclasses.replace(
        FleetConfig.default(),
        failures=(
            FailureSpec(FailureKind.HOST_LOSS, at_s=270.0, target="host-2"),
            FailureSpec(
                FailureKind.ERROR_BURST, at_s=100.0, target="vllm-1", duration_s=60, error_ratio=0.5
            ),
        ),
    )
    folder = tmp_path / "fleet"
    engine = EngineSettings.from_engine(config.engine)
    writer = FixtureWriter(
        folder, config.placements(), start_s=T0, scrape_interval_s=60.0, engine=engine
    )
    simulation = FleetSimulation(config, observer=writer, seed=3, start_s=T0)
    manifest = record_fixture(simulation, writer, end_s=T0 + 600, ground_truth={"note": "x"})

    rows = span_rows(folder / "spans.jsonl.gz")
    assert len(rows) == manifest["spans"]["count"] > 1000
    lost = {"vllm-4", "vllm-5"}
    kinds = [(e["kind"], e["replica"]) for e in manifest["events"]]
    assert kinds.count(("started", "vllm-0")) == 1
    assert {r for k, r in kinds if k == "host_lost"} == lost
    failed = [row for row in rows if not row["ok"]]
    assert failed
    assert all(row["error_type"] == "error" for row in failed)

    fleet_buckets: dict[float, float] = {}
    ttfts: list[float] = []
    for placement in config.placements():
        pages = list(iter_pages(folder, f"vllm/{placement.replica}"))
        if placement.replica in lost:
            assert [t for t, _ in pages] == [T0 + 60 * k for k in range(5)]  # none after 270 s
            continue
        assert len(pages) == 11
        got = samples(pages[-1][1])
        config_info = value(
            got,
            "vllm:cache_config_info",
            num_gpu_blocks=str(config.engine.num_gpu_blocks),
            block_size=str(config.engine.block_size_tokens),
        )
        assert config_info == 1
        mine = [row for row in rows if row["replica"] == placement.replica]
        assert total(got, "vllm:request_success_total") == len(mine)
        assert value(got, "vllm:request_success_total", finished_reason="error") == sum(
            1 for r in mine if not r["ok"]
        )
        assert value(got, "vllm:prompt_tokens_total") == sum(r["prompt_tokens"] for r in mine)
        assert value(got, "vllm:generation_tokens_total") == sum(
            r["completion_tokens"] for r in mine
        )
        assert value(got, "vllm:time_to_first_token_seconds_count") == sum(
            1 for r in mine if r["completion_tokens"] >= 1
        )
        # Every finished request's decode iterations were observed (running ones add more).
        assert value(got, "vllm:inter_token_latency_seconds_count") >= sum(
            r["completion_tokens"] - 1 for r in mine if r["completion_tokens"] >= 1
        )
        for (name, labels), v in got.items():
            if name == "vllm:time_to_first_token_seconds_bucket":
                le = float(dict(labels)["le"])
                fleet_buckets[le] = fleet_buckets.get(le, 0.0) + v
        ttfts.extend(r["ttft_s"] for r in mine if r["completion_tokens"] >= 1)

    # Traces and metrics agree: TTFT p95 from the spans and from the summed histogram differ
    # by no more than the width of the bucket the histogram's estimate falls in.
    from_histogram = histogram_quantile(0.95, sorted(fleet_buckets.items()))
    from_spans = float(pl.Series(ttfts).quantile(0.95, interpolation="linear") or math.nan)
    bounds = sorted(fleet_buckets)
    upper = next(b for b in bounds if b >= from_histogram)
    lower = max([0.0, *(b for b in bounds if b < upper)])
    assert abs(from_histogram - from_spans) <= upper - lower
    assert [t for t, _ in iter_pages(folder, "dcgm/host-2")][-1] == T0 + 240
    assert len(list(iter_pages(folder, "dcgm/host-0"))) == 11
