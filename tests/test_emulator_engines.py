"""The emulator's engine page shapes (SGLang, TensorRT-LLM, TGI, llama.cpp) and mixed fleets.

Each shape is held against the page built from that engine's upstream metric definitions
(fixtures/samples/*_upstream-definitions.txt): the same families with the same types, and
pages both parsers read without a complaint. The same records fed to a vLLM page and to an
engine's page must say the same TTFT, queue time, token counts and cache hits wherever the
engine reports them.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.emulator.engine_pages import EnginePagesObserver, replica_metrics
from servewatch.emulator.fixture_writer import iter_pages, read_manifest, record_fleet
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    FleetConfig,
    FleetConfigError,
    PoolSpec,
    TopologySpec,
    fleet_config_from_mapping,
)
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.records import (
    EngineKind,
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.vllm_metrics import (
    EMULATED_GAUGE,
    EngineSettings,
    ReplicaMetrics,
    render_vllm_page,
)
from tests.conftest import FIXTURES

T0 = 1_795_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SETTINGS = EngineSettings(max_model_len=8192, block_size=16, num_gpu_blocks=4000)
STATE = ReplicaState("r", up=True, running=7, waiting=3, kv_usage_ratio=0.4, busy_ratio=0.6,
                     tokens_per_s=850.0)  # fmt: skip
SAMPLES = {
    EngineKind.SGLANG: "sglang_upstream-definitions.txt",
    EngineKind.TRTLLM: "trtllm_upstream-definitions.txt",
    EngineKind.TRTLLM_DYNAMO: "trtllm_dynamo_upstream-definitions.txt",
    EngineKind.TGI: "tgi_upstream-definitions.txt",
    EngineKind.LLAMACPP: "llamacpp_upstream-definitions.txt",
}
ENGINES = tuple(SAMPLES)


def request(
    i: int,
    *,
    queue_s: float,
    prefill_s: float,
    decode_s: float,
    prompt: int,
    cached: int,
    completion: int,
    reason: FinishedReason = FinishedReason.STOP,
    preemptions: int = 0,
) -> FinishedRequest:
    return FinishedRequest(
        "r", f"req-{i}", None, None, T0 + i, queue_s, prefill_s, decode_s, prompt, cached,
        completion, 1024, reason, preemptions,
    )  # fmt: skip


# Successful requests of every kind a page must count: short and long, cached and not, one
# output token (no TPOT), a preempted one, one cut by max_tokens.
OK_REQUESTS = (
    request(0, queue_s=0.01, prefill_s=0.08, decode_s=1.9, prompt=600, cached=320, completion=120),
    request(1, queue_s=0.40, prefill_s=0.30, decode_s=9.0, prompt=5200, cached=0, completion=700,
            reason=FinishedReason.LENGTH),
    request(2, queue_s=0.00, prefill_s=0.05, decode_s=0.0, prompt=90, cached=64, completion=1),
    request(3, queue_s=2.50, prefill_s=0.12, decode_s=3.3, prompt=1500, cached=1488, completion=210,
            preemptions=2),
)  # fmt: skip
FAILED_REQUESTS = (
    request(4, queue_s=0.0, prefill_s=0.0, decode_s=0.0, prompt=300, cached=0, completion=0,
            reason=FinishedReason.ERROR),
    request(5, queue_s=0.2, prefill_s=0.1, decode_s=0.4, prompt=800, cached=16, completion=9,
            reason=FinishedReason.ABORT),
)  # fmt: skip
STEPS = (
    EngineSteps("r", T0, step_s=0.021, iterations=400, decode_seqs=6, prefill_tokens=0),
    EngineSteps("r", T0 + 9, step_s=0.064, iterations=3, decode_seqs=4, prefill_tokens=2048),
    EngineSteps("r", T0 + 10, step_s=0.018, iterations=250, decode_seqs=2, prefill_tokens=0),
)


def fed(engine: EngineKind, requests: tuple[FinishedRequest, ...]) -> str:
    metrics = replica_metrics(engine, model_name=MODEL, created_s=T0, settings=SETTINGS, gpus=2)
    for record in requests:
        metrics.observe_request(record)
    for steps in STEPS:
        metrics.observe_steps(steps)
    return metrics.page(STATE).decode()


def vllm_fed(requests: tuple[FinishedRequest, ...]) -> str:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0, settings=SETTINGS)
    for record in requests:
        metrics.observe_request(record)
    for steps in STEPS:
        metrics.observe_steps(steps)
    return render_vllm_page(metrics, STATE).decode()


def family_set(text: str) -> set[tuple[str, str]]:
    return {(f.name, f.type) for f in text_string_to_metric_families(text)}


def sample_value(text: str, name: str, **labels: str) -> float:
    """The sum of the page's samples named `name` (as written) whose labels include `labels`."""
    page = parse_exposition(text)
    found = [
        value
        for metric, label_text, value in zip(page.metric, page.labels, page.value, strict=True)
        if metric == name and all(json.loads(label_text).get(k) == v for k, v in labels.items())
    ]
    assert found, f"no sample {name} {labels} on the page"
    return math.fsum(found)


@pytest.fixture(scope="module")
def pages() -> dict[EngineKind, str]:
    return {engine: fed(engine, OK_REQUESTS + FAILED_REQUESTS) for engine in ENGINES}


# -- page shapes ---------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.value)
def test_the_upstream_definition_pages_parse_cleanly(engine: EngineKind) -> None:
    text = (FIXTURES / "samples" / SAMPLES[engine]).read_text(encoding="utf-8")
    assert list(text_string_to_metric_families(text))
    parsed = parse_exposition(text)
    assert parsed.errors == []
    assert len(parsed) > 0


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.value)
def test_page_parses_with_both_parsers(pages: dict[EngineKind, str], engine: EngineKind) -> None:
    text = pages[engine]
    families = list(text_string_to_metric_families(text))
    parsed = parse_exposition(text)
    assert parsed.errors == []
    samples = sum(len(f.samples) for f in families)
    created = sum(1 for f in families for s in f.samples if s.name.endswith("_created"))
    assert len(parsed) + parsed.skipped_created == samples
    assert parsed.skipped_created == created


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.value)
def test_page_has_the_family_set_of_the_engine(
    pages: dict[EngineKind, str], engine: EngineKind
) -> None:
    sample = (FIXTURES / "samples" / SAMPLES[engine]).read_text(encoding="utf-8")
    assert family_set(pages[engine]) == family_set(sample) | {(EMULATED_GAUGE, "gauge")}


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.value)
def test_histogram_buckets_are_cumulative_and_end_at_the_count(
    pages: dict[EngineKind, str], engine: EngineKind
) -> None:
    checked = 0
    for family in text_string_to_metric_families(pages[engine]):
        if family.type != "histogram":
            continue
        buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        counts: dict[tuple[tuple[str, str], ...], float] = {}
        for s in family.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name.endswith("_bucket"):
                buckets[key].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[key] = s.value
        for key, series in buckets.items():
            bounds = [bound for bound, _ in series]
            values = [value for _, value in series]
            assert bounds == sorted(bounds), (family.name, key)
            assert bounds[-1] == math.inf, (family.name, key)
            assert values == sorted(values), (family.name, key)
            assert values[-1] == counts[key], (family.name, key)
            checked += 1
    # llama.cpp has no histograms; every other engine has several.
    assert (checked == 0) == (engine is EngineKind.LLAMACPP)


QUIRKS: tuple[tuple[EngineKind, str, Callable[[str], bool]], ...] = (
    (EngineKind.SGLANG, "no _created samples (multiprocess mode)", lambda t: "_created" not in t),
    (EngineKind.SGLANG, "_sum before the buckets",
     lambda t: t.index("sglang:time_to_first_token_seconds_sum")
     < t.index("sglang:time_to_first_token_seconds_bucket")),
    (EngineKind.SGLANG, "sorted labels: le before model_name",
     lambda t: 'sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name=' in t),
    (EngineKind.SGLANG, "pid on the per-process gauges",
     lambda t: bool(re.search(r'sglang:num_paused_reqs\{[^}]*pid="\d+"', t))),
    (EngineKind.TRTLLM, "_created for counters", lambda t: "trtllm_prompt_tokens_created{" in t),
    (EngineKind.TRTLLM, "engine_type and model_name labels",
     lambda t: f'trtllm_num_requests_running{{engine_type="trtllm",model_name="{MODEL}"}}' in t),
    (EngineKind.TRTLLM, "tensor parallel size from the replica's GPUs",
     lambda t: 'tp_size="2"' in t),
    (EngineKind.TRTLLM_DYNAMO, "only trtllm: families",
     lambda t: all(f.name.startswith("trtllm:") for f in text_string_to_metric_families(t)
                   if f.name != EMULATED_GAUGE)),
    (EngineKind.TGI, "counters without _total", lambda t: "tgi_request_count 6\n" in t),
    (EngineKind.TGI, "no model label", lambda t: "model" not in t.replace("model_", "")),
    (EngineKind.TGI, "Rust floats in le", lambda t: 'le="0.00015000000000000001"' in t),
    (EngineKind.TGI, "le after the other labels",
     lambda t: 'tgi_batch_forward_duration_bucket{method="decode",le="+Inf"}' in t),
    (EngineKind.LLAMACPP, "no labels", lambda t: "{" not in t),
    (EngineKind.LLAMACPP, "%g values", lambda t: "llamacpp:n_decode_total 653\n" in t),
)  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "quirk", "holds"), QUIRKS, ids=[f"{e.value}: {q}" for e, q, _ in QUIRKS]
)
def test_page_has_the_engine_exposition_quirks(
    pages: dict[EngineKind, str], engine: EngineKind, quirk: str, holds: Callable[[str], bool]
) -> None:
    assert holds(pages[engine]), quirk


def test_llamacpp_counters_past_a_million_lose_precision_as_upstream() -> None:
    many = tuple(
        request(i, queue_s=0.0, prefill_s=0.5, decode_s=1.0, prompt=243_188, cached=0,
                completion=10)
        for i in range(10)
    )  # fmt: skip
    assert "llamacpp:prompt_tokens_total 2.43188e+06\n" in fed(EngineKind.LLAMACPP, many)


# -- the same work, the same canonical quantities ------------------------------------------

# (engine, engine sample and labels, vLLM sample): quantities both pages must agree on.
CANONICAL: tuple[tuple[EngineKind, str, dict[str, str], str], ...] = (
    *(
        (engine, name, {}, vllm)
        for engine, names in (
            (EngineKind.SGLANG, ("sglang:num_running_reqs", "sglang:num_queue_reqs",
                                 "sglang:token_usage")),
            (EngineKind.TRTLLM, ("trtllm_num_requests_running", "trtllm_num_requests_waiting",
                                 "trtllm_kv_cache_utilization")),
            (EngineKind.TGI, ("tgi_batch_current_size", "tgi_queue_size", None)),
            (EngineKind.LLAMACPP, ("llamacpp:requests_processing", "llamacpp:requests_deferred",
                                   None)),
        )
        for name, vllm in zip(names, ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                      "vllm:kv_cache_usage_perc"), strict=True)
        if name is not None
    ),
    *(
        (engine, f"{prefix}{name}{suffix}", {}, f"vllm:{vllm}{suffix}")
        for engine, prefix, pairs in (
            (EngineKind.SGLANG, "sglang:", (
                ("time_to_first_token_seconds", "time_to_first_token_seconds"),
                ("inter_token_latency_seconds", "inter_token_latency_seconds"),
                ("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
                ("queue_time_seconds", "request_queue_time_seconds"),
                ("prompt_tokens_histogram", "request_prompt_tokens"),
                ("generation_tokens_histogram", "request_generation_tokens"),
            )),
            *(
                (engine, prefix, (
                    ("time_to_first_token_seconds", "time_to_first_token_seconds"),
                    ("time_per_output_token_seconds", "request_time_per_output_token_seconds"),
                    ("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
                    ("request_queue_time_seconds", "request_queue_time_seconds"),
                ))
                for engine, prefix in (
                    (EngineKind.TRTLLM, "trtllm_"), (EngineKind.TRTLLM_DYNAMO, "trtllm:")
                )
            ),
            (EngineKind.TRTLLM, "trtllm_", (
                ("request_prefill_time_seconds", "request_prefill_time_seconds"),
                ("request_decode_time_seconds", "request_decode_time_seconds"),
                ("request_inference_time_seconds", "request_inference_time_seconds"),
            )),
            (EngineKind.TGI, "tgi_", (
                ("request_duration", "e2e_request_latency_seconds"),
                ("request_queue_duration", "request_queue_time_seconds"),
                ("request_inference_duration", "request_inference_time_seconds"),
                ("request_input_length", "request_prompt_tokens"),
                ("request_generated_tokens", "request_generation_tokens"),
            )),
        )
        for name, vllm in pairs
        for suffix in ("_sum", "_count")
    ),
    (EngineKind.SGLANG, "sglang:per_stage_req_latency_seconds_sum", {"stage": "prefill_forward"},
     "vllm:request_prefill_time_seconds_sum"),
    (EngineKind.SGLANG, "sglang:per_stage_req_latency_seconds_sum", {"stage": "decode_forward"},
     "vllm:request_decode_time_seconds_sum"),
    (EngineKind.SGLANG, "sglang:prompt_tokens_total", {}, "vllm:prompt_tokens_total"),
    (EngineKind.SGLANG, "sglang:generation_tokens_total", {}, "vllm:generation_tokens_total"),
    (EngineKind.SGLANG, "sglang:cached_tokens_total", {}, "vllm:prefix_cache_hits_total"),
    (EngineKind.SGLANG, "sglang:num_requests_total", {}, "vllm:request_success_total"),
    (EngineKind.SGLANG, "sglang:num_retracted_requests_total", {}, "vllm:num_preemptions_total"),
    (EngineKind.TRTLLM, "trtllm_prompt_tokens_total", {}, "vllm:prompt_tokens_total"),
    (EngineKind.TRTLLM, "trtllm_generation_tokens_total", {}, "vllm:generation_tokens_total"),
    (EngineKind.TRTLLM, "trtllm_prompt_cached_tokens_total", {}, "vllm:prefix_cache_hits_total"),
    (EngineKind.TRTLLM, "trtllm_request_success_total", {}, "vllm:request_success_total"),
    (EngineKind.TRTLLM_DYNAMO, "trtllm:request_success_total", {},
     "vllm:request_success_total"),
    (EngineKind.TGI, "tgi_request_success", {}, "vllm:request_success_total"),
    (EngineKind.LLAMACPP, "llamacpp:tokens_predicted_total", {}, "vllm:generation_tokens_total"),
    (EngineKind.LLAMACPP, "llamacpp:prompt_tokens_total", {},
     "vllm:prompt_tokens_by_source_total"),  # local_compute: below
)  # fmt: skip


@pytest.fixture(scope="module")
def vllm_page() -> str:
    return vllm_fed(OK_REQUESTS)


@pytest.mark.parametrize(
    ("engine", "name", "labels", "vllm"),
    CANONICAL,
    ids=[f"{e.value}:{n}{'|'.join(lb.values())}" for e, n, lb, _ in CANONICAL],
)
def test_engine_page_says_what_the_vllm_page_of_the_same_work_says(
    vllm_page: str, engine: EngineKind, name: str, labels: dict[str, str], vllm: str
) -> None:
    page = fed(engine, OK_REQUESTS)
    vllm_labels = {"source": "local_compute"} if vllm.endswith("by_source_total") else {}
    expected = sample_value(vllm_page, vllm, **vllm_labels)
    assert sample_value(page, name, **labels) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("engine", "name"),
    [(EngineKind.SGLANG, "sglang:cache_hit_rate"), (EngineKind.TRTLLM, "trtllm_kv_cache_hit_rate")],
)
def test_hit_rate_gauges_are_the_vllm_hits_over_queries(
    vllm_page: str, engine: EngineKind, name: str
) -> None:
    rate = sample_value(vllm_page, "vllm:prefix_cache_hits_total") / sample_value(
        vllm_page, "vllm:prefix_cache_queries_total"
    )
    assert sample_value(fed(engine, OK_REQUESTS), name) == pytest.approx(rate)


def test_engines_leave_out_what_they_do_not_measure(pages: dict[EngineKind, str]) -> None:
    tgi = {name for name, _ in family_set(pages[EngineKind.TGI])}
    assert not [n for n in tgi if "first_token" in n or "kv_cache" in n or "usage" in n]
    llamacpp = family_set(pages[EngineKind.LLAMACPP])
    assert {kind for _, kind in llamacpp} == {"counter", "gauge"}


FAILURES: tuple[tuple[EngineKind, str, dict[str, str], float], ...] = (
    (EngineKind.SGLANG, "sglang:num_requests_total", {}, 6),
    (EngineKind.SGLANG, "sglang:num_aborted_requests_total", {}, 1),
    (EngineKind.TRTLLM, "trtllm_request_success_total", {}, 4),
    (EngineKind.TRTLLM, "trtllm_request_error_total", {"http_code": "500"}, 1),
    (EngineKind.TRTLLM, "trtllm_num_requests_completed_total", {}, 6),
    (EngineKind.TGI, "tgi_request_count", {}, 6),
    (EngineKind.TGI, "tgi_request_success", {}, 4),
    (EngineKind.TGI, "tgi_request_failure", {"err": "generation"}, 1),
    (EngineKind.TGI, "tgi_request_failure", {"err": "dropped"}, 1),
    (EngineKind.TGI, "tgi_request_duration_count", {}, 4),
    (EngineKind.TGI, "tgi_request_input_length_count", {}, 6),
)


@pytest.mark.parametrize(("engine", "name", "labels", "expected"), FAILURES)
def test_failed_requests_are_counted_where_the_engine_counts_them(
    pages: dict[EngineKind, str],
    engine: EngineKind,
    name: str,
    labels: dict[str, str],
    expected: float,
) -> None:
    assert sample_value(pages[engine], name, **labels) == expected


def test_a_restart_starts_the_counters_again() -> None:
    placement = ReplicaPlacement(
        "sglang-0", "host-0", "zone-a", MODEL, "p", 1, engine=EngineKind.SGLANG
    )
    observer = EnginePagesObserver([placement], started_s=T0, settings=SETTINGS)
    observer.request_finished(
        FinishedRequest("sglang-0", "a", None, None, T0, 0.1, 0.1, 1.0, 100, 0, 10, 64,
                        FinishedReason.STOP)
    )  # fmt: skip
    before = observer.page("sglang-0")
    assert before is not None
    assert sample_value(before.decode(), "sglang:num_requests_total") == 1
    observer.replica_event(ReplicaEvent("sglang-0", T0 + 5, ReplicaEventKind.CRASHED))
    assert observer.page("sglang-0") is None
    observer.replica_event(ReplicaEvent("sglang-0", T0 + 9, ReplicaEventKind.STARTED))
    after = observer.page("sglang-0")
    assert after is not None
    assert sample_value(after.decode(), "sglang:num_requests_total") == 0
    with pytest.raises(KeyError, match="sglang-9"):
        observer.engine_steps(EngineSteps("sglang-9", T0, 0.01, 1, 1, 0))


def test_vllm_replicas_are_not_taken_by_the_engine_pages() -> None:
    placement = ReplicaPlacement("vllm-0", "host-0", "zone-a", MODEL, "p", 1)
    with pytest.raises(ValueError, match="vllm-0"):
        EnginePagesObserver([placement], started_s=T0)


# -- fleet configuration --------------------------------------------------------------------

MIXED_TOML = {
    "topology": {"zones": ["zone-a", "zone-b", "zone-c"], "replicas_per_host": 2},
    "pools": [
        {"name": "chat", "engine": "vllm", "replicas": 1},
        {"name": "chat-sglang", "engine": "sglang", "replicas": 1},
        {"name": "batch", "engine": "tgi", "replicas": 1, "model": "org/other-model"},
        {"name": "trt", "engine": "trtllm", "replicas": 1},
        {"name": "trt-old", "engine": "trtllm_dynamo", "replicas": 1},
        {"name": "edge", "engine": "llamacpp", "replicas": 1},
    ],
    "workload": {"arrival": {"rate_rps": 8.0}},
}


def test_pools_name_each_replica_after_its_engine() -> None:
    config = fleet_config_from_mapping(MIXED_TOML, source="fleet.toml")
    got = [(p.replica, p.pool, p.engine, p.model, p.host) for p in config.placements()]
    assert got == [
        ("vllm-0", "chat", EngineKind.VLLM, MODEL, "host-0"),
        ("sglang-1", "chat-sglang", EngineKind.SGLANG, MODEL, "host-0"),
        ("tgi-2", "batch", EngineKind.TGI, "org/other-model", "host-1"),
        ("trtllm-3", "trt", EngineKind.TRTLLM, MODEL, "host-1"),
        ("trtllm-dynamo-4", "trt-old", EngineKind.TRTLLM_DYNAMO, MODEL, "host-2"),
        ("llamacpp-5", "edge", EngineKind.LLAMACPP, MODEL, "host-2"),
    ]


def test_without_pools_every_replica_runs_vllm_in_the_one_pool() -> None:
    placements = FleetConfig.default().placements()
    assert {(p.engine, p.pool) for p in placements} == {(EngineKind.VLLM, "default")}
    assert [p.replica for p in placements] == [f"vllm-{i}" for i in range(6)]


BAD_POOLS: tuple[tuple[object, str], ...] = (
    ([{"name": "a", "replicas": 2}], "pools: hold 2 replicas in all, but the topology has 6"),
    ([{"name": "a", "replicas": 3}, {"name": "a", "replicas": 3}], "pools: pool names must be"),
    ([{"name": "a", "replicas": 6, "engine": "ollama"}], "pools[0].engine: must be one of"),
    ([{"replicas": 6}], "pools[0].name: is required"),
    ([{"name": "a", "replicas": 0}], "pools[0].replicas: must be >= 1"),
    ([{"name": "a", "replicas": 6, "gpus": 2}], "pools[0].gpus: unknown key"),
    ([{"name": "a", "replicas": 6, "model": ""}], "pools[0].model: must not be empty"),
)


@pytest.mark.parametrize(("pools", "message"), BAD_POOLS)
def test_bad_pools_are_named_at_their_path(pools: object, message: str) -> None:
    with pytest.raises(FleetConfigError, match=re.escape(message)):
        fleet_config_from_mapping({"pools": pools}, source="fleet.toml")


def test_pool_and_pools_together_are_refused() -> None:
    doc = {"pool": "x", "pools": [{"name": "a", "replicas": 6}]}
    with pytest.raises(FleetConfigError, match=r"fleet.toml: pool: .*give one or the other"):
        fleet_config_from_mapping(doc, source="fleet.toml")


def test_failures_target_the_renamed_replicas() -> None:
    config = FleetConfig(
        topology=TopologySpec(zones=("z",), hosts_per_zone=1, replicas_per_host=2),
        pools=(PoolSpec("a", 1), PoolSpec("b", 1, EngineKind.SGLANG)),
    )
    assert [p.replica for p in config.placements()] == ["vllm-0", "sglang-1"]
    with pytest.raises(FleetConfigError, match="failures"):
        fleet_config_from_mapping(
            {
                "topology": {"zones": ["z"], "replicas_per_host": 2},
                "pools": [
                    {"name": "a", "replicas": 1},
                    {"name": "b", "replicas": 1, "engine": "sglang"},
                ],
                "failures": [{"kind": "replica_crash", "at_s": 5.0, "target": "vllm-1"}],
            },
            source="fleet.toml",
        )


# -- a mixed fleet, live and recorded -------------------------------------------------------

PREFIXES = {
    "vllm": "vllm:",
    "sglang": "sglang:",
    "tgi": "tgi_",
    "trtllm": "trtllm",
    "llamacpp": "llamacpp:",
}


@pytest.fixture
def mixed_live() -> Iterator[tuple[LiveFleetServer, FleetConfig]]:
    config = fleet_config_from_mapping(MIXED_TOML, source="fleet.toml")
    server = LiveFleetServer(config.placements(), started_s=T0)
    simulation = FleetSimulation(config, observer=server, seed=7, start_s=T0)
    simulation.run_until(T0 + 120.0)
    server.update(T0 + 120.0, simulation.states())
    server.start()
    yield server, config
    server.stop()


def test_a_mixed_fleet_serves_each_replica_in_its_engine_shape(
    mixed_live: tuple[LiveFleetServer, FleetConfig],
) -> None:
    server, _ = mixed_live
    engine_targets = [t for t in server.targets if t.kind.value != "dcgm"]
    assert [t.target_id for t in engine_targets] == [
        "vllm/vllm-0",
        "sglang/sglang-1",
        "tgi/tgi-2",
        "trtllm/trtllm-3",
        "trtllm/trtllm-dynamo-4",
        "llamacpp/llamacpp-5",
    ]
    served: dict[str, float] = {}
    with httpx.Client(timeout=5) as client:
        for target in engine_targets:
            response = client.get(target.url)
            assert response.status_code == 200, target.url
            text = response.text
            assert parse_exposition(text).errors == []
            names = {f.name for f in text_string_to_metric_families(text)} - {EMULATED_GAUGE}
            assert all(n.startswith(PREFIXES[target.kind.value]) for n in names), target.url
            served[target.name] = len({n for n in names if not n.endswith("_created")})
            # Every engine also answers on /metrics, whatever its own path.
            plain = client.get(f"http://{target.address}/metrics")
            assert plain.status_code == 200
    assert server.targets[3].url.endswith("/prometheus/metrics")
    assert {t.url.rsplit(":", 1)[1].split("/", 1)[1] for t in engine_targets} == {
        "metrics",
        "prometheus/metrics",
    }
    # The old Dynamo page has TensorRT-LLM's first five families only.
    assert served["trtllm-dynamo-4"] == 5  # and their _created gauges
    sd = {g["labels"]["replica"]: g["labels"] for g in server.file_sd() if "replica" in g["labels"]}
    assert sd["trtllm-3"]["__metrics_path__"] == "/prometheus/metrics"
    assert sd["sglang-1"]["job"] == "sglang"
    assert "__metrics_path__" not in sd["sglang-1"]


def test_a_mixed_fleet_serves_work_on_every_engine(
    mixed_live: tuple[LiveFleetServer, FleetConfig],
) -> None:
    server, _ = mixed_live
    counts = {
        "vllm-0": ("vllm:request_success_total", {}),
        "sglang-1": ("sglang:num_requests_total", {}),
        "tgi-2": ("tgi_request_count", {}),
        "trtllm-3": ("trtllm_num_requests_completed_total", {}),
        "trtllm-dynamo-4": ("trtllm:time_to_first_token_seconds_count", {}),
        "llamacpp-5": ("llamacpp:tokens_predicted_total", {}),
    }
    with httpx.Client(timeout=5) as client:
        for target in server.targets:
            if target.name not in counts:
                continue
            name, labels = counts[target.name]
            assert sample_value(client.get(target.url).text, name, **labels) > 0, target.name


def test_a_mixed_fleet_records_pages_under_each_target_kind(tmp_path: Path) -> None:
    config = fleet_config_from_mapping(MIXED_TOML, source="fleet.toml")
    folder = tmp_path / "fixture"
    manifest = record_fleet(config, folder, start_s=T0, end_s=T0 + 180.0, scrape_interval_s=60.0)
    targets = {t["id"]: t for t in manifest["targets"]}
    assert targets["trtllm/trtllm-dynamo-4"]["engine"] == "trtllm_dynamo"
    assert targets["trtllm/trtllm-dynamo-4"]["kind"] == "trtllm"
    assert "engine" not in targets["vllm/vllm-0"]
    assert targets["tgi/tgi-2"]["labels"]["replica"] == "tgi-2"
    assert targets["tgi/tgi-2"]["pool"] == "batch"
    assert read_manifest(folder)["targets"] == manifest["targets"]
    for target_id, target in targets.items():
        pages = list(iter_pages(folder, target_id))
        assert len(pages) == 4, target_id
        kind = target["kind"]
        if kind == "dcgm":
            continue
        text = pages[-1][1].decode()
        names = {f.name for f in text_string_to_metric_families(text)} - {EMULATED_GAUGE}
        assert all(n.startswith(PREFIXES[kind]) for n in names), target_id
    last = gzip.decompress(
        sorted((folder / "pages" / "sglang" / "sglang-1").iterdir())[-1].read_bytes()
    ).decode()
    assert sample_value(last, "sglang:num_requests_total") > 0
    assert json.loads((folder / "manifest.json").read_text())["emulated"] is True
