"""Metric catalogues: real captures, tables of cases, and the vectorised forms
held against the scalar ones."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from servewatch.collectors.metrics.catalogue import (
    Catalogue,
    CatalogueEntry,
    CatalogueError,
    Disposition,
    SourceRule,
    disposition_counts,
    kept_rows,
    labels_json,
    unknown_family_counts,
)
from servewatch.collectors.metrics.dcgm_catalogue import (
    DCGM_CATALOGUE,
    DCGM_FIELDS,
    DcgmField,
    FieldType,
    canonical_names,
    catalogue_dcgm_frame,
)
from servewatch.collectors.metrics.gateway_catalogue import GATEWAY_FAMILIES
from servewatch.collectors.metrics.llamacpp_catalogue import LLAMACPP_FAMILIES
from servewatch.collectors.metrics.sglang_catalogue import SGLANG_FAMILIES
from servewatch.collectors.metrics.tgi_catalogue import TGI_FAMILIES
from servewatch.collectors.metrics.trtllm_catalogue import TRTLLM_FAMILIES
from servewatch.collectors.metrics.vllm_catalogue import (
    VLLM_CATALOGUE,
    VLLM_FAMILIES,
    catalogue_vllm_frame,
)
from servewatch.pipeline.signals import SIGNALS, MetricType, Signal, Source
from tests.catalogue_oracle import (
    CataloguedSample,
    RawSample,
    catalogue_dcgm,
    catalogue_vllm,
    kept,
    tally,
)
from tests.conftest import REPO_ROOT

SAMPLES = Path(os.environ.get("SERVEWATCH_SAMPLES", REPO_ROOT / "fixtures" / "samples"))
DOCS = REPO_ROOT / "docs" / "catalogues.md"
MIB = 1024 * 1024
S_ = Signal

C, U, X, S = (
    Disposition.CATALOGUED,
    Disposition.UNKNOWN,
    Disposition.CREATED,
    Disposition.SHADOWED,
)


def parse(text: str) -> list[RawSample]:
    return [
        RawSample(metric=s.name, labels=s.labels, value=s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def one(name: str, value: float = 1.0, **labels: str) -> CataloguedSample:
    catalogue = catalogue_dcgm if name.startswith("DCGM") else catalogue_vllm
    [out] = catalogue([RawSample(name, labels, value)])
    return out


def sample_file(name: str) -> Path:
    path = SAMPLES / name
    if not path.exists():
        message = f"captures not found at {SAMPLES} (set SERVEWATCH_SAMPLES)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


# -- real captures: every sample is catalogued or counted -------------------------------------

CAPTURES: dict[str, dict[tuple[Disposition, Signal | None], int]] = {
    "vllm_metrics_production-stack-issue-617.txt": {
        (X, None): 5,
        (C, Signal.PREFIX_CACHE_HITS_TOKENS): 1,  # as gpu_prefix_cache_hits_total, an alias
        (C, Signal.PREFIX_CACHE_QUERIES_TOKENS): 1,
        (C, Signal.KV_CACHE_USAGE_RATIO): 1,
        (C, Signal.REQUEST_GENERATION_TOKENS): 11,
        (C, Signal.REQUEST_PARAMS_N): 8,
    },
    "dcgm_aicr-h100-vllm.txt": {
        (C, Signal.GPU_TEMPERATURE_C): 8,
        (C, Signal.GPU_POWER_W): 8,
        (C, Signal.GPU_UTIL_RATIO): 8,
        (C, Signal.GPU_MEMORY_COPY_UTIL_RATIO): 6,
    },
    "dcgm_datadog-fixture-t4.txt": {
        **{
            (C, signal): 1
            for signal in (
                Signal.GPU_SM_CLOCK_HZ,
                Signal.GPU_MEMORY_CLOCK_HZ,
                Signal.GPU_TEMPERATURE_C,
                Signal.GPU_POWER_W,
                Signal.GPU_ENERGY_J,
                Signal.GPU_PCIE_REPLAYS,
                Signal.GPU_UTIL_RATIO,
                Signal.GPU_MEMORY_COPY_UTIL_RATIO,
                Signal.GPU_ENCODER_UTIL_RATIO,
                Signal.GPU_DECODER_UTIL_RATIO,
                Signal.GPU_LAST_XID,
                Signal.GPU_FB_FREE_BYTES,
                Signal.GPU_FB_USED_BYTES,
                Signal.GPU_NVLINK_BYTES_PER_S,
                Signal.GPU_VGPU_LICENSE_STATUS,
            )
        },
    },
}


BUILT_SUFFIX = "_upstream-definitions"


def test_the_table_covers_every_capture() -> None:
    if not SAMPLES.exists():
        sample_file("-")
    # Pages built from the other engines' definitions have their own table
    # (tests/test_engine_catalogues.py).
    captured = [p.name for p in SAMPLES.glob("*.txt") if not p.stem.endswith(BUILT_SUFFIX)]
    assert sorted(captured) == sorted(CAPTURES)


@pytest.mark.parametrize("filename", sorted(CAPTURES))
def test_every_captured_sample_is_catalogued_or_counted(filename: str) -> None:
    samples = parse(sample_file(filename).read_text(encoding="utf-8"))
    catalogue = catalogue_vllm if filename.startswith("vllm") else catalogue_dcgm
    out = catalogue(samples)
    assert len(out) == len(samples)
    assert Counter((s.disposition, s.signal) for s in out) == CAPTURES[filename]
    counts = tally(out)
    assert sum(counts.dispositions.values()) == len(samples)


def test_captured_values_arrive_in_the_signals_units() -> None:
    out = catalogue_dcgm(parse(sample_file("dcgm_datadog-fixture-t4.txt").read_text()))
    by_signal = {s.signal: s for s in out if s.signal is not None}
    assert by_signal[Signal.GPU_SM_CLOCK_HZ].value == 300e6
    assert by_signal[Signal.GPU_ENERGY_J].value == pytest.approx(128996.013)
    assert by_signal[Signal.GPU_FB_FREE_BYTES].value == 15109 * MIB
    assert by_signal[Signal.GPU_FB_FREE_BYTES].labels == {
        "DCGM_FI_PROCESS_NAME": "/usr/bin/dcgm-exporter",
        "DCGM_FI_SYSTEM_DRIVER_VERSION": "460.106.00",
        "UUID": "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
        "device": "nvidia0",
        "gpu": "0",
        "hostname": "424773df46e0",
        "modelName": "Tesla T4",
    }
    assert tally(out).unknown_families == {}


def test_captured_vllm_page_keeps_engine_and_counts_unknown_families() -> None:
    out = catalogue_vllm(parse(sample_file(next(iter(CAPTURES))).read_text()))
    hits = next(s for s in out if s.signal is Signal.PREFIX_CACHE_HITS_TOKENS)
    assert hits.metric == "vllm:prefix_cache_hits_total"
    assert hits.labels == {"engine": "0", "model_name": "zai-org/GLM-4.5"}
    assert tally(out).unknown_families == {}
    assert all(s.disposition is not C for s in out if s.exposed.endswith("_created"))


# -- vLLM: prefixes, aliases, suffixes ---------------------------------------------------------

VLLM_NAMES: list[tuple[str, Disposition, Signal | None, str]] = [
    ("vllm:kv_cache_usage_perc", C, Signal.KV_CACHE_USAGE_RATIO, "vllm:kv_cache_usage_perc"),
    ("vllm_kv_cache_usage_perc", C, Signal.KV_CACHE_USAGE_RATIO, "vllm:kv_cache_usage_perc"),
    ("vllm:gpu_cache_usage_perc", C, Signal.KV_CACHE_USAGE_RATIO, "vllm:kv_cache_usage_perc"),
    ("vllm_gpu_cache_usage_perc", C, Signal.KV_CACHE_USAGE_RATIO, "vllm:kv_cache_usage_perc"),
    (
        "vllm_gpu_prefix_cache_queries_total",
        C,
        Signal.PREFIX_CACHE_QUERIES_TOKENS,
        "vllm:prefix_cache_queries_total",
    ),
    (
        "vllm:gpu_prefix_cache_hits_total",
        C,
        Signal.PREFIX_CACHE_HITS_TOKENS,
        "vllm:prefix_cache_hits_total",
    ),
    (
        "vllm:time_per_output_token_seconds_bucket",
        C,
        Signal.INTER_TOKEN_LATENCY_S,
        "vllm:inter_token_latency_seconds_bucket",
    ),
    (
        "vllm_time_per_output_token_seconds_sum",
        C,
        Signal.INTER_TOKEN_LATENCY_S,
        "vllm:inter_token_latency_seconds_sum",
    ),
    (
        "vllm:iteration_tokens_total_bucket",
        C,
        Signal.ITERATION_TOKENS,
        "vllm:iteration_tokens_total_bucket",
    ),
    (
        "vllm_iteration_tokens_total_count",
        C,
        Signal.ITERATION_TOKENS,
        "vllm:iteration_tokens_total_count",
    ),
    ("vllm:request_success_total", C, Signal.REQUESTS_FINISHED, "vllm:request_success_total"),
    ("vllm:num_preemptions_total", C, Signal.PREEMPTIONS, "vllm:num_preemptions_total"),
    ("vllm:cache_config_info", C, Signal.CACHE_CONFIG_INFO, "vllm:cache_config_info"),
    (
        "vllm_e2e_request_latency_seconds_count",
        C,
        Signal.E2E_LATENCY_S,
        "vllm:e2e_request_latency_seconds_count",
    ),
    # a counter is read from its _total sample, a histogram from its parts
    ("vllm:prompt_tokens", U, None, "vllm:prompt_tokens"),
    ("vllm:time_to_first_token_seconds", U, None, "vllm:time_to_first_token_seconds"),
    ("vllm:num_requests_running_total", U, None, "vllm:num_requests_running_total"),
    ("vllm:prompt_tokens_created", X, None, "vllm:prompt_tokens_created"),
    (
        "vllm_time_to_first_token_seconds_created",
        X,
        None,
        "vllm_time_to_first_token_seconds_created",
    ),
    ("process_cpu_seconds_total", U, None, "process_cpu_seconds_total"),
    ("vllm-num_requests_running", U, None, "vllm-num_requests_running"),
]


@pytest.mark.parametrize(("name", "disposition", "signal", "metric"), VLLM_NAMES)
def test_vllm_names_across_prefixes_and_versions(
    name: str, disposition: Disposition, signal: Signal | None, metric: str
) -> None:
    out = one(name, 0.25, engine="0", model_name="m")
    assert (out.disposition, out.signal, out.metric, out.value) == (
        disposition,
        signal,
        metric,
        0.25,
    )
    assert out.labels == {"engine": "0", "model_name": "m"}


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("vllm:request_success_total", {"engine": "1", "finished_reason": "length"}),
        ("vllm:admission_rejections_total", {"model_name": "m", "reason": "queue_full"}),
        ("vllm:prompt_tokens_by_source_total", {"engine": "0", "source": "local_cache_hit"}),
        ("vllm:time_to_first_token_seconds_bucket", {"engine": "0", "le": "+Inf"}),
        # V0 servers: no engine label, nothing invented
        ("vllm:gpu_cache_usage_perc", {"model_name": "m"}),
        (
            "vllm:cache_config_info",
            {"block_size": "16", "gpu_memory_utilization": "0.9", "num_gpu_blocks": "27000"},
        ),
    ],
)
def test_vllm_labels_are_kept_as_exposed(name: str, labels: dict[str, str]) -> None:
    out = one(name, 1.0, **labels)
    assert out.disposition is C
    assert out.labels == labels
    assert out.source is Source.VLLM_ENGINE


def test_an_alias_beside_its_current_name_is_shadowed_not_counted_twice() -> None:
    labels = {"engine": "0", "model_name": "m"}
    page = [
        RawSample("vllm:gpu_prefix_cache_hits_total", labels, 7.0),
        RawSample("vllm:prefix_cache_hits_total", labels, 7.0),
        # same alias, other engine: no current twin on this page, so it counts
        RawSample("vllm:gpu_prefix_cache_hits_total", {**labels, "engine": "1"}, 3.0),
    ]
    out = catalogue_vllm(page)
    assert [s.disposition for s in out] == [S, C, C]
    assert [s.value for s in kept(out)] == [7.0, 3.0]


def test_router_re_exports_are_kept_apart_from_engine_metrics() -> None:
    page = [
        RawSample("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 4.0),
        RawSample("vllm:num_requests_running", {"model_name": "m", "server": "http://r0"}, 4.0),
        RawSample("vllm:gpu_cache_usage_perc", {"model_name": "m", "server": "http://r0"}, 0.5),
        RawSample("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "m"}, 0.5),
    ]
    out = catalogue_vllm(page)
    assert [s.source for s in out] == [
        Source.VLLM_ENGINE,
        Source.VLLM_ROUTER,
        Source.VLLM_ROUTER,
        Source.VLLM_ENGINE,
    ]
    # a router's alias is not the engine's twin: both are kept
    assert [s.disposition for s in out] == [C, C, C, C]


def test_unknown_families_are_counted_and_kept_only_on_request() -> None:
    page = [
        RawSample("vllm:num_requests_running", {}, 1.0),
        RawSample("vllm:some_future_family_total", {}, 2.0),
        RawSample("http_request_duration_seconds_bucket", {"le": "1"}, 3.0),
        RawSample("http_request_duration_seconds_count", {}, 3.0),
        RawSample("vllm:num_requests_running_created", {}, 1.7e9),
    ]
    out = catalogue_vllm(page)
    assert [s.exposed for s in kept(out)] == ["vllm:num_requests_running"]
    everything = kept(out, keep_unknown=True)
    assert [s.disposition for s in everything] == [C, U, U, U]
    assert all(s.signal is None for s in everything[1:])
    counts = tally(out)
    assert counts.dispositions == {C: 1, U: 3, X: 1}
    assert counts.unknown_families == {
        "vllm:some_future_family": 1,
        "http_request_duration_seconds": 2,
    }


# -- DCGM: renames, units, sentinels, clamps, labels -------------------------------------------

# (field, raw value, signal, canonical field, value): field names without "DCGM_FI_".
DCGM_UNITS: list[tuple[str, float, Signal, str, float]] = [
    ("DEV_SM_CLOCK", 1980, S_.GPU_SM_CLOCK_HZ, "DEV_SM_CLOCK_HERTZ", 1.98e9),
    ("DEV_SM_CLOCK_HERTZ", 1.98e9, S_.GPU_SM_CLOCK_HZ, "DEV_SM_CLOCK_HERTZ", 1.98e9),
    ("DEV_MEM_CLOCK", 2619, S_.GPU_MEMORY_CLOCK_HZ, "DEV_MEMORY_CLOCK_HERTZ", 2.619e9),
    (
        "DEV_TOTAL_ENERGY_CONSUMPTION",
        128996013,
        S_.GPU_ENERGY_J,
        "DEV_GPU_ENERGY_JOULES_TOTAL",
        128996.013,
    ),
    (
        "DEV_GPU_ENERGY_JOULES_TOTAL",
        128996.013,
        S_.GPU_ENERGY_J,
        "DEV_GPU_ENERGY_JOULES_TOTAL",
        128996.013,
    ),
    ("DEV_GPU_UTIL", 37, S_.GPU_UTIL_RATIO, "DEV_GPU_UTIL_RATIO", 0.37),
    ("DEV_GPU_UTIL_RATIO", 0.37, S_.GPU_UTIL_RATIO, "DEV_GPU_UTIL_RATIO", 0.37),
    ("DEV_MEM_COPY_UTIL", 12, S_.GPU_MEMORY_COPY_UTIL_RATIO, "DEV_MEMORY_UTIL_RATIO", 0.12),
    ("DEV_ENC_UTIL", 0, S_.GPU_ENCODER_UTIL_RATIO, "DEV_ENC_UTIL_RATIO", 0.0),
    ("DEV_DEC_UTIL", 5, S_.GPU_DECODER_UTIL_RATIO, "DEV_DEC_UTIL_RATIO", 0.05),
    ("DEV_FB_FREE", 15109, S_.GPU_FB_FREE_BYTES, "DEV_FB_FREE_BYTES", 15109 * MIB),
    ("DEV_FB_USED", 70000, S_.GPU_FB_USED_BYTES, "DEV_FB_USED_BYTES", 70000 * MIB),
    ("DEV_FB_USED_BYTES", 70000 * MIB, S_.GPU_FB_USED_BYTES, "DEV_FB_USED_BYTES", 70000 * MIB),
    ("DEV_FB_RESERVED", 512, S_.GPU_FB_RESERVED_BYTES, "DEV_FB_RESERVED_BYTES", 512 * MIB),
    ("DEV_FB_TOTAL", 81559, S_.GPU_FB_TOTAL_BYTES, "DEV_FB_CAPACITY_BYTES", 81559 * MIB),
    ("DEV_POWER_USAGE", 113.611, S_.GPU_POWER_W, "DEV_BOARD_POWER_WATTS", 113.611),
    ("DEV_GPU_TEMP", 30, S_.GPU_TEMPERATURE_C, "DEV_GPU_TEMP_CELSIUS", 30.0),
    ("DEV_MEMORY_TEMP_CELSIUS", 41, S_.GPU_MEMORY_TEMPERATURE_C, "DEV_MEMORY_TEMP_CELSIUS", 41.0),
    (
        "DEV_NVLINK_BANDWIDTH_TOTAL",
        1500,
        S_.GPU_NVLINK_BYTES_PER_S,
        "DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        1.5e9,
    ),
    ("DEV_PCIE_REPLAY_COUNTER", 3, S_.GPU_PCIE_REPLAYS, "DEV_PCIE_REPLAY_TOTAL", 3.0),
    ("PROF_PCIE_TX_BYTES", 2.5e9, S_.GPU_PCIE_TX_BYTES_PER_S, "PROF_PCIE_TX_BYTES", 2.5e9),
    # the last XID, not a count
    ("DEV_XID_ERRORS", 79, S_.GPU_LAST_XID, "DEV_XID_ERROR", 79.0),
    ("DEV_ROW_REMAP_FAILURE", 1, S_.GPU_ROW_REMAP_FAILED, "DEV_ROW_REMAP_FAILED", 1.0),
    (
        "PROF_GR_ENGINE_ACTIVE",
        0.42,
        S_.GPU_GRAPHICS_ACTIVE_RATIO,
        "PROF_GR_ENGINE_UTIL_RATIO",
        0.42,
    ),
    ("PROF_PIPE_TENSOR_ACTIVE", 0.3, S_.GPU_TENSOR_ACTIVE_RATIO, "PROF_TENSOR_UTIL_RATIO", 0.3),
    ("PROF_DRAM_UTIL_RATIO", 0.6, S_.GPU_DRAM_ACTIVE_RATIO, "PROF_DRAM_UTIL_RATIO", 0.6),
]


@pytest.mark.parametrize(("name", "raw", "signal", "metric", "value"), DCGM_UNITS)
def test_dcgm_names_before_and_after_4_9_normalise_to_one_unit(
    name: str, raw: float, signal: Signal, metric: str, value: float
) -> None:
    out = one("DCGM_FI_" + name, raw, gpu="0", UUID="GPU-1")
    assert (out.disposition, out.signal, out.metric) == (C, signal, "DCGM_FI_" + metric)
    assert out.value == pytest.approx(value)


DCGM_SENTINELS: list[tuple[str, float, float | None]] = [
    ("DCGM_FI_DEV_GPU_TEMP", 9223372036854775794, None),  # DCGM_INT64_NOT_SUPPORTED
    ("DCGM_FI_DEV_GPU_TEMP", 0x7FFFFFFFFFFFFFF0, None),  # DCGM_INT64_BLANK
    ("DCGM_FI_DEV_GPU_TEMP", 0x7FFFFFFFFFFFFFFF, None),
    ("DCGM_FI_DEV_GPU_TEMP", 96, 96.0),
    ("DCGM_FI_DEV_POWER_USAGE", 140737488355328.0, None),  # DCGM_FP64_BLANK
    ("DCGM_FI_DEV_POWER_USAGE", 140737488355330.0, None),
    ("DCGM_FI_DEV_POWER_USAGE", 1e14, 1e14),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", 140737488355328.0, None),
    # blank before clamping: a sentinel must not become "100 % busy"
    ("DCGM_FI_DEV_GPU_UTIL", 9223372036854775794, None),
    # an int64 field is blank only at the int64 sentinel
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 140737488355328.0, 140737488355.328),
]


@pytest.mark.parametrize(("name", "raw", "value"), DCGM_SENTINELS)
def test_dcgm_sentinels_become_null(name: str, raw: float, value: float | None) -> None:
    out = one(name, float(raw))
    assert out.disposition is C
    assert out.value == (None if value is None else pytest.approx(value))


# Every sentinel DCGM or NVML writes, by the width it is written in (dcgm_structs.h; NVML's
# "unavailable" is an unsigned 32-bit all-ones).
SENTINELS_BY_WIDTH: dict[str, tuple[float, ...]] = {
    "int32": tuple(float(0x7FFFFFF0 + i) for i in range(4)),
    "nvml": (float(0xFFFFFFFF),),
    "int64": tuple(float(0x7FFFFFFFFFFFFFF0 + i) for i in range(4)),
    "fp64": tuple(140737488355328.0 + i for i in range(4)),
}


def _arrives_in(field: DcgmField, width: str) -> bool:
    """Whether a field's sentinel can arrive in `width`: every field gets its own width's, and
    only a counter that legitimately runs through the 32-bit numbers is spared those."""
    if width == "int64":
        return field.value_type is not FieldType.FP64
    if width == "fp64":
        return field.value_type is not FieldType.INT64
    counter = SIGNALS[field.signal].kind is MetricType.COUNTER
    return not (field.value_type is FieldType.INT64 and counter)


GENERATED_BLANKS = [
    pytest.param(field.name, width, raw, id=f"{field.name}-{width}-{raw:.0f}")
    for field in DCGM_FIELDS
    for width, raws in SENTINELS_BY_WIDTH.items()
    if _arrives_in(field, width)
    for raw in raws
]


@pytest.mark.parametrize(("name", "width", "raw"), GENERATED_BLANKS)
def test_a_dcgm_blank_of_each_width_is_stored_as_null(name: str, width: str, raw: float) -> None:
    for exposed in (name, name + "_total"):
        out = one(exposed, raw)
        assert out.disposition is C, (exposed, width)
        assert out.value is None, (exposed, width, raw)


def test_every_dcgm_field_blanks_at_its_own_width_and_keeps_real_values() -> None:
    # A value just under a sentinel is a reading, not a blank, unless the field is bounded far
    # below 2**31; and a large counter passing the 32-bit numbers keeps counting.
    energy = one("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", float(0xFFFFFFFF))
    assert energy.value == pytest.approx(float(0xFFFFFFFF) * 1e-3)
    clock = one("DCGM_FI_DEV_SM_CLOCK_HERTZ", 2_147_483_000.0)
    assert clock.value == pytest.approx(2_147_483_000.0)
    assert one("DCGM_FI_DEV_GPU_TEMP", float(0x7FFFFFEF)).value == pytest.approx(0x7FFFFFEF)
    assert {f.value_type for f in DCGM_FIELDS} == set(FieldType)


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", 120, 1.0),
        ("DCGM_FI_DEV_GPU_UTIL", 100, 1.0),
        ("DCGM_FI_DEV_GPU_UTIL", -3, 0.0),
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.2, 1.0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 101, 1.0),
        # not a utilisation: no range to clamp to
        ("DCGM_FI_DEV_GPU_TEMP", 130, 130.0),
    ],
)
def test_utilisation_is_clamped_to_its_range(name: str, raw: float, value: float) -> None:
    assert one(name, raw).value == value


@pytest.mark.parametrize(
    ("labels", "canonical"),
    [
        ({"Hostname": "node-1", "gpu": "0"}, {"hostname": "node-1", "gpu": "0"}),
        ({"hostname": "node-1"}, {"hostname": "node-1"}),
        ({"DCGM_FI_DRIVER_VERSION": "580.1"}, {"DCGM_FI_SYSTEM_DRIVER_VERSION": "580.1"}),
        (
            # through Prometheus with honorLabels false: pod/namespace name the exporter
            {
                "exported_pod": "vllm-0",
                "exported_namespace": "serving",
                "pod": "dcgm-exporter-x",
                "namespace": "gpu-operator",
            },
            {"namespace": "serving", "pod": "vllm-0"},
        ),
        # a GPU no pod requested: the exporter's own pod is not its workload
        ({"exported_pod": "", "pod": "dcgm-exporter-x"}, {}),
        ({"container": "main", "pod_uid": ""}, {"container": "main"}),
        ({"err_code": "79", "err_msg": "GPU has fallen off the bus"}, None),
    ],
)
def test_dcgm_labels_across_versions(
    labels: dict[str, str], canonical: dict[str, str] | None
) -> None:
    out = one("DCGM_FI_DEV_XID_ERRORS", 79.0, **labels)
    assert out.labels == (labels if canonical is None else canonical)
    assert out.source is Source.DCGM


def test_old_and_new_dcgm_names_on_one_page_count_once() -> None:
    labels = {"UUID": "GPU-1", "hostname": "n"}
    page = [
        RawSample("DCGM_FI_DEV_FB_USED", labels, 1000.0),
        RawSample("DCGM_FI_DEV_FB_USED_BYTES", labels, 1000.0 * MIB),
    ]
    assert [s.disposition for s in catalogue_dcgm(page)] == [S, C]


# -- the tables themselves ---------------------------------------------------------------------


def test_every_signal_has_a_spec_and_every_dcgm_signal_one_current_name() -> None:
    assert set(SIGNALS) == set(Signal)
    current = Counter(f.signal for f in DCGM_FIELDS if not f.legacy)
    assert all(n == 1 for n in current.values())
    assert {f.signal for f in DCGM_FIELDS} == set(canonical_names())
    assert not {e.signal for e in VLLM_CATALOGUE.entries} & {e.signal for e in DCGM_FIELDS}


def test_a_catalogue_that_contradicts_itself_is_refused() -> None:
    entry = CatalogueEntry(exposed="a", signal=Signal.GPU_POWER_W, metric="a", family="a")
    rule = SourceRule(default=Source.DCGM)
    with pytest.raises(CatalogueError, match="sample name a twice"):
        Catalogue(name="t", entries=(entry, entry), source_rule=rule)
    with pytest.raises(CatalogueError, match="distinct targets"):
        Catalogue(
            name="t", entries=(entry,), source_rule=rule, label_renames=(("a", "b"), ("b", "c"))
        )


def test_a_frame_without_the_sample_columns_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lacks columns \['labels'\].*needs metric"):
        catalogue_vllm_frame(pl.LazyFrame({"metric": ["x"], "value": [1.0]}))


ENGINE_FAMILIES = (
    VLLM_FAMILIES,
    SGLANG_FAMILIES,
    TRTLLM_FAMILIES,
    TGI_FAMILIES,
    LLAMACPP_FAMILIES,
    GATEWAY_FAMILIES,
)


def test_the_docs_list_every_name_the_catalogues_know() -> None:
    text = DOCS.read_text(encoding="utf-8")
    names = [f.name for f in DCGM_FIELDS]
    for families in ENGINE_FAMILIES:
        names += [f.name for f in families] + [a for f in families for a in f.aliases]
    names += [s.value for s in Signal]
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/catalogues.md lacks {missing}"


# -- vectorised form agrees with the scalar one ------------------------------------------------

LABEL_KEYS = [
    "engine",
    "model_name",
    "le",
    "server",
    "Hostname",
    "hostname",
    "UUID",
    "pod",
    "exported_pod",
    "namespace",
    "exported_namespace",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_SYSTEM_DRIVER_VERSION",
    "a",
    "ab",
    "b_",
]
label_values = st.one_of(
    st.just(""),
    st.sampled_from(["0", "1", "m", "x"]),
    st.text(alphabet='ab,:"\\{}é\n', max_size=6),
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([9223372036854775794.0, 140737488355328.0, 150.0, -2.0, 0.5]),
)


def raw_samples(catalogue: Catalogue) -> st.SearchStrategy[RawSample]:
    known = [e.exposed for e in catalogue.entries]
    other = ["vllm:foo_created", "DCGM_FI_DEV_FOO", "x_total", "x_bucket", "y_count"]
    return st.builds(
        RawSample,
        metric=st.sampled_from(known + other),
        labels=st.dictionaries(st.sampled_from(LABEL_KEYS), label_values, max_size=5),
        value=values,
    )


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def check_forms_agree(catalogue: Catalogue, pages: list[list[RawSample]]) -> None:
    scalar = catalogue_vllm if catalogue is VLLM_CATALOGUE else catalogue_dcgm
    vectorised = catalogue_vllm_frame if catalogue is VLLM_CATALOGUE else catalogue_dcgm_frame
    expected = [s for page in pages for s in scalar(page)]
    frame = pl.LazyFrame(
        {
            "page": [i for i, page in enumerate(pages) for _ in page],
            "metric": [s.metric for page in pages for s in page],
            "labels": [labels_json(s.labels) for page in pages for s in page],
            "value": [float(s.value) for page in pages for s in page],
        },
        schema={"page": pl.Int64, "metric": pl.String, "labels": pl.String, "value": pl.Float64},
    )
    got = frame.pipe(vectorised, page_by=["page"]).collect().to_dicts()
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row["exposed"] == want.exposed
        assert row["disposition"] == want.disposition.value
        assert row["signal"] == (None if want.signal is None else want.signal.value)
        assert row["source"] == want.source.value
        assert row["metric"] == want.metric
        assert row["family"] == want.family
        assert row["labels"] == labels_json(want.labels)
        assert same(row["value"], want.value), (row, want)


@settings(max_examples=60, deadline=None)
@given(pages=st.lists(st.lists(raw_samples(VLLM_CATALOGUE), max_size=12), min_size=1, max_size=3))
def test_vllm_frame_agrees_with_the_scalar_catalogue(pages: list[list[RawSample]]) -> None:
    check_forms_agree(VLLM_CATALOGUE, pages)


@settings(max_examples=60, deadline=None)
@given(pages=st.lists(st.lists(raw_samples(DCGM_CATALOGUE), max_size=12), min_size=1, max_size=3))
def test_dcgm_frame_agrees_with_the_scalar_catalogue(pages: list[list[RawSample]]) -> None:
    check_forms_agree(DCGM_CATALOGUE, pages)


def test_frame_tallies_match_the_scalar_tally() -> None:
    page = [
        RawSample("vllm:num_requests_running", {"engine": "0"}, 1.0),
        RawSample("vllm:foo_total", {}, 2.0),
        RawSample("vllm:foo_created", {}, 3.0),
        RawSample("vllm:gpu_cache_usage_perc", {"engine": "0"}, 0.1),
        RawSample("vllm:kv_cache_usage_perc", {"engine": "0"}, 0.1),
    ]
    frame = pl.LazyFrame(
        {
            "metric": [s.metric for s in page],
            "labels": [labels_json(s.labels) for s in page],
            "value": [s.value for s in page],
        }
    )
    catalogued = catalogue_vllm_frame(frame).collect().lazy()
    counts = dict(disposition_counts(catalogued).collect().iter_rows())
    assert counts == {d.value: n for d, n in tally(catalogue_vllm(page)).dispositions.items()}
    assert unknown_family_counts(catalogued).collect().rows() == [("vllm:foo", 1)]
    assert kept_rows(catalogued).collect()["exposed"].to_list() == [
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ]
    assert kept_rows(catalogued, keep_unknown=True).collect().height == 3
