"""The panels of servewatch's Grafana dashboard, as data: each panel's title, row, unit, PromQL
queries over the user's Prometheus, and the servewatch figure each query shows.

The vLLM row follows the panels of vLLM's own example dashboard
(`examples/online_serving/prometheus_grafana/grafana.json`), the GPU row those of NVIDIA's
dcgm-exporter dashboard (grafana.com 12239, `grafana/dcgm-exporter-dashboard.json`), joined to
the selected replicas by pod; the SLO and capacity rows read the gauges `servewatch run`
exposes on `/metrics`. Each query is written the way servewatch computes the same number
(`pipeline/metric_sli.py`): quantiles as `histogram_quantile(q, sum by (le) (rate(x_bucket)))`,
gauges as their time-average over the interval combined over a replica's series by the
signal's aggregation (power and memory add up, ratios average, temperatures take the hottest),
DCGM units scaled to servewatch's (MHz to Hz, MiB to bytes, % to ratio).

Queries hold placeholders the builder fills from the dashboard's labels
(`grafana.DashboardLabels`): `{vllm}` the matchers of the pool, model and replica variables
on vLLM series, `{replica}` the labels that name a replica (and join its GPUs), `{replicas}`
the selected replicas as a vector to join DCGM series with, `{pool}` and `{slo}` the pool and
SLO variables' matchers. `$__rate_interval` and `$__range` are Grafana's own.

Size: over 500 lines on purpose: every panel of the dashboard is listed here, in one place,
with the servewatch figure it shows, so that a reader (and the test that checks every panel
against a real Prometheus) finds them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Replaced by the builder with the legend of the dashboard's replica labels.
REPLICA_LEGEND = "{{namespace}}/{{pod}}"


class PanelRow(Enum):
    """The dashboard's rows, top to bottom."""

    SLO = "SLOs and error budgets"
    CAPACITY = "Capacity"
    VLLM = "vLLM"
    GPU = "GPUs (DCGM, joined to replicas by pod)"


class PanelKind(Enum):
    """Grafana panel types the dashboard uses."""

    TIMESERIES = "timeseries"
    HEATMAP = "heatmap"
    STAT = "stat"


@dataclass(frozen=True)
class PanelQuery:
    """One query of a panel: PromQL with placeholders, its legend, and the servewatch figure it
    shows (where servewatch reports the same number: an `sli --source histograms` field, a
    library SLI, or a gauge of `servewatch run`'s /metrics)."""

    expr: str
    legend: str
    figure: str


@dataclass(frozen=True)
class GrafanaPanel:
    title: str
    row: PanelRow
    kind: PanelKind
    unit: str  # a Grafana unit id
    description: str
    queries: tuple[PanelQuery, ...]
    width: int = 12  # of Grafana's 24 columns
    height: int = 8


def _quantiles(metric: str, stem: str) -> tuple[PanelQuery, ...]:
    """p99/p95/p90/p50 of a latency histogram and its mean, as vLLM's dashboard draws them."""
    quantiles = tuple(
        PanelQuery(
            expr=(
                f"histogram_quantile({q}, sum by (le) "
                f"(rate({metric}_bucket{{{{{{vllm}}}}}}[$__rate_interval])))"
            ),
            legend=f"p{p}",
            figure=f"sli histograms: {stem}_s.p{p}",
        )
        for p, q in ((99, 0.99), (95, 0.95), (90, 0.9), (50, 0.5))
    )
    mean = PanelQuery(
        expr=(
            f"sum(rate({metric}_sum{{{{{{vllm}}}}}}[$__rate_interval]))"
            f" / sum(rate({metric}_count{{{{{{vllm}}}}}}[$__rate_interval]))"
        ),
        legend="mean",
        figure=f"sli library: {stem} sum / count",
    )
    return (*quantiles, mean)


def _latency(title: str, metric: str, stem: str, description: str) -> GrafanaPanel:
    queries = _quantiles(metric, stem)
    return GrafanaPanel(title, PanelRow.VLLM, PanelKind.TIMESERIES, "s", description, queries)


def _gpu(
    title: str,
    field: str,
    *,
    combine: str,
    scale: str,
    unit: str,
    figure: str,
    description: str,
) -> GrafanaPanel:
    """A dcgm-exporter field per replica: each GPU's time-average, combined over the replica's
    GPUs, kept for the selected replicas only (GPUs serving no replica are left out, as
    servewatch leaves them out)."""
    expr = (
        f"{combine} by ({{replica}}) (avg_over_time({field}[$__rate_interval])){scale}"
        " and on ({replica}) {replicas}"
    )
    query = PanelQuery(expr=expr, legend=REPLICA_LEGEND, figure=figure)
    return GrafanaPanel(title, PanelRow.GPU, PanelKind.TIMESERIES, unit, description, (query,))


def _gauge(name: str, matchers: str, legend: str) -> PanelQuery:
    """A gauge of `servewatch run`'s /metrics as it is (`matchers` a placeholder or none)."""
    expr = f"{name}{{{{{matchers}}}}}" if matchers else name
    return PanelQuery(expr=expr, legend=legend, figure=f"run /metrics: {name}")


PANELS: tuple[GrafanaPanel, ...] = (
    # -- SLOs: the gauges of `servewatch run` ----------------------------------------------
    GrafanaPanel(
        "SLO attainment",
        PanelRow.SLO,
        PanelKind.TIMESERIES,
        "percentunit",
        "Share of good events over each SLO's window as servewatch evaluates it, and the same "
        "share over the dashboard's time range from servewatch's good and total event counters.",
        (
            _gauge("servewatch_slo_attainment_ratio", "{slo}", "{{slo}}"),
            PanelQuery(
                expr=(
                    "sum by (slo) (increase(servewatch_slo_good_events_total{{{slo}}}[$__range]))"
                    " / sum by (slo) (increase(servewatch_slo_events_total{{{slo}}}[$__range]))"
                ),
                legend="{{slo}} over the range",
                figure="run /metrics: servewatch_slo_good_events_total / events_total",
            ),
        ),
    ),
    GrafanaPanel(
        "Error budget remaining",
        PanelRow.SLO,
        PanelKind.STAT,
        "percentunit",
        "Share of each SLO's error budget left over its period: 1 untouched, 0 spent, below 0 "
        "overspent.",
        (_gauge("servewatch_slo_budget_remaining_ratio", "{slo}", "{{slo}}"),),
        width=6,
    ),
    GrafanaPanel(
        "Burn rate per alert window",
        PanelRow.SLO,
        PanelKind.TIMESERIES,
        "none",
        "How fast each SLO spends its budget over each alert window: 1 spends exactly the "
        "budget over the period; the burn-rate alerts fire above their thresholds.",
        (_gauge("servewatch_slo_burn_rate", "{slo}", "{{slo}} {{window}}"),),
        width=6,
    ),
    GrafanaPanel(
        "SLO events",
        PanelRow.SLO,
        PanelKind.TIMESERIES,
        "reqps",
        "Events counted against each SLO per second, all and good (trace-based SLOs included).",
        (
            PanelQuery(
                expr="sum by (slo) (rate(servewatch_slo_events_total{{{slo}}}[$__rate_interval]))",
                legend="{{slo}} all",
                figure="run /metrics: servewatch_slo_events_total",
            ),
            PanelQuery(
                expr=(
                    "sum by (slo) "
                    "(rate(servewatch_slo_good_events_total{{{slo}}}[$__rate_interval]))"
                ),
                legend="{{slo}} good",
                figure="run /metrics: servewatch_slo_good_events_total",
            ),
        ),
    ),
    GrafanaPanel(
        "Active findings",
        PanelRow.SLO,
        PanelKind.STAT,
        "none",
        "Fleet-health findings servewatch holds open, by failure mode (docs/health.md).",
        (_gauge("servewatch_findings_active", "", "{{mode}}"),),
    ),
    # -- capacity ------------------------------------------------------------------------
    GrafanaPanel(
        "Recommended and serving replicas",
        PanelRow.CAPACITY,
        PanelKind.TIMESERIES,
        "none",
        "The replicas servewatch recommends per pool (after the named failure) against the "
        "replicas serving now.",
        (
            _gauge("servewatch_pool_recommended_replicas", "{pool}", "{{pool}} recommended"),
            PanelQuery(
                expr=(
                    "count by (pool) "
                    "(group by (pool, {replica}) (vllm:num_requests_running{{{vllm}}}))"
                ),
                legend="{{pool}} serving",
                figure="sli histograms: replicas per pool",
            ),
        ),
    ),
    GrafanaPanel(
        "Capacity at SLO against demand",
        PanelRow.CAPACITY,
        PanelKind.TIMESERIES,
        "reqps",
        "Requests per second each pool carries while holding its SLO (low, mid and high of the "
        "interval) against the requests it finishes per second.",
        (
            _gauge("servewatch_pool_capacity_rps", "{pool}", "{{pool}} capacity {{bound}}"),
            PanelQuery(
                expr=(
                    "sum by (pool) (rate(vllm:request_success_total{{{vllm}}}[$__rate_interval]))"
                ),
                legend="{{pool}} finished",
                figure="sli histograms: finish_reasons summed / window",
            ),
        ),
    ),
    GrafanaPanel(
        "Headroom",
        PanelRow.CAPACITY,
        PanelKind.STAT,
        "percentunit",
        "Share of each pool's capacity at SLO still free.",
        (_gauge("servewatch_pool_headroom_ratio", "{pool}", "{{pool}}"),),
        width=8,
    ),
    GrafanaPanel(
        "Queue depth (autoscaling signal)",
        PanelRow.CAPACITY,
        PanelKind.TIMESERIES,
        "none",
        "Requests waiting per pool, as servewatch hands it to an autoscaler.",
        (_gauge("servewatch_pool_queue_depth", "{pool}", "{{pool}}"),),
        width=8,
    ),
    GrafanaPanel(
        "KV-cache pressure (autoscaling signal)",
        PanelRow.CAPACITY,
        PanelKind.TIMESERIES,
        "percentunit",
        "KV-cache usage per pool, as servewatch hands it to an autoscaler.",
        (_gauge("servewatch_pool_kv_usage_ratio", "{pool}", "{{pool}}"),),
        width=8,
    ),
    # -- vLLM ------------------------------------------------------------------------------
    _latency(
        "E2E request latency",
        "vllm:e2e_request_latency_seconds",
        "e2e",
        "Arrival at the frontend to the last token, from vLLM's histogram.",
    ),
    _latency(
        "Time to first token",
        "vllm:time_to_first_token_seconds",
        "ttft",
        "Arrival at the frontend to the first token, from vLLM's histogram.",
    ),
    _latency(
        "Inter-token latency",
        "vllm:inter_token_latency_seconds",
        "itl",
        "Time between two tokens of a request, one sample per decode step (vLLM's former "
        "time_per_output_token histogram).",
    ),
    _latency(
        "Time per output token (per request)",
        "vllm:request_time_per_output_token_seconds",
        "tpot",
        "Each request's decode time / (output tokens - 1), vLLM's TPOT.",
    ),
    GrafanaPanel(
        "Token throughput",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "none",
        "Prompt and generated tokens per second.",
        (
            PanelQuery(
                expr="sum(rate(vllm:prompt_tokens_total{{{vllm}}}[$__rate_interval]))",
                legend="prompt tokens/s",
                figure="sli histograms: prompt_tokens_per_s",
            ),
            PanelQuery(
                expr="sum(rate(vllm:generation_tokens_total{{{vllm}}}[$__rate_interval]))",
                legend="generation tokens/s",
                figure="sli histograms: generation_tokens_per_s",
            ),
        ),
    ),
    GrafanaPanel(
        "Scheduler state",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "none",
        "Requests running and waiting (time-averaged over the interval), and preemptions.",
        (
            PanelQuery(
                expr=("sum(avg_over_time(vllm:num_requests_running{{{vllm}}}[$__rate_interval]))"),
                legend="running",
                figure="sli histograms: requests_running.mean",
            ),
            PanelQuery(
                expr=("sum(avg_over_time(vllm:num_requests_waiting{{{vllm}}}[$__rate_interval]))"),
                legend="waiting",
                figure="sli histograms: requests_waiting.mean",
            ),
            PanelQuery(
                expr="sum(increase(vllm:num_preemptions_total{{{vllm}}}[$__rate_interval]))",
                legend="preemptions",
                figure="sli histograms: preemptions",
            ),
        ),
    ),
    GrafanaPanel(
        "KV-cache usage",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "percentunit",
        "Share of KV-cache blocks in use per replica (time-averaged over the interval).",
        (
            PanelQuery(
                expr=(
                    "avg by ({replica}) "
                    "(avg_over_time(vllm:kv_cache_usage_perc{{{vllm}}}[$__rate_interval]))"
                ),
                legend=REPLICA_LEGEND,
                figure="sli histograms by replica: kv_cache_usage_ratio.mean",
            ),
        ),
    ),
    GrafanaPanel(
        "Prefix-cache hit rate",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "percentunit",
        "Prompt tokens found in the prefix cache over those looked up, over the interval "
        "(never the lifetime ratio).",
        (
            PanelQuery(
                expr=(
                    "sum(increase(vllm:prefix_cache_hits_total{{{vllm}}}[$__rate_interval]))"
                    " / sum(increase(vllm:prefix_cache_queries_total{{{vllm}}}[$__rate_interval]))"
                ),
                legend="hit rate",
                figure="sli histograms: prefix_cache_hit_ratio",
            ),
        ),
    ),
    GrafanaPanel(
        "Finish reasons",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "none",
        "Requests finished in the interval, by vLLM's finished_reason (stop, length, abort, "
        "error).",
        (
            PanelQuery(
                expr=(
                    "sum by (finished_reason) "
                    "(increase(vllm:request_success_total{{{vllm}}}[$__rate_interval]))"
                ),
                legend="{{finished_reason}}",
                figure="sli histograms: finish_reasons",
            ),
        ),
    ),
    GrafanaPanel(
        "Request phases",
        PanelRow.VLLM,
        PanelKind.TIMESERIES,
        "s",
        "Mean seconds a request spends queued, in prefill and in decode.",
        tuple(
            PanelQuery(
                expr=(
                    f"sum(rate(vllm:request_{phase}_time_seconds_sum{{{{{{vllm}}}}}}"
                    "[$__rate_interval])) / "
                    f"sum(rate(vllm:request_{phase}_time_seconds_count{{{{{{vllm}}}}}}"
                    "[$__rate_interval]))"
                ),
                legend=phase,
                figure=f"sli library: {phase} sum / count",
            )
            for phase in ("queue", "prefill", "decode")
        ),
    ),
    GrafanaPanel(
        "Request prompt length",
        PanelRow.VLLM,
        PanelKind.HEATMAP,
        "none",
        "Requests per prompt-length bucket (tokens) in each interval; the buckets are vLLM's "
        "(1-2-5 up to the model's length), so lengths are known to a bucket, no finer.",
        (
            PanelQuery(
                expr=(
                    "sum by (le) "
                    "(increase(vllm:request_prompt_tokens_bucket{{{vllm}}}[$__rate_interval]))"
                ),
                legend="{{le}}",
                figure="sli library: request_prompt_tokens bucket increases",
            ),
        ),
    ),
    GrafanaPanel(
        "Request generation length",
        PanelRow.VLLM,
        PanelKind.HEATMAP,
        "none",
        "Requests per output-length bucket (tokens) in each interval, at the same bucket "
        "resolution.",
        (
            PanelQuery(
                expr=(
                    "sum by (le) "
                    "(increase(vllm:request_generation_tokens_bucket{{{vllm}}}[$__rate_interval]))"
                ),
                legend="{{le}}",
                figure="sli library: request_generation_tokens bucket increases",
            ),
        ),
    ),
    # -- GPUs: dcgm-exporter, joined to replicas by pod -----------------------------------
    _gpu(
        "GPU utilisation",
        "DCGM_FI_DEV_GPU_UTIL",
        combine="avg",
        scale=" * 0.01",
        unit="percentunit",
        figure="sli histograms by replica: gpu_util_ratio.mean",
        description=(
            "Share of time a kernel ran, mean over the replica's GPUs. It reads near 100% "
            "under any batching: a poor load signal; tensor activity says more."
        ),
    ),
    _gpu(
        "Tensor core activity",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        combine="avg",
        scale="",
        unit="percentunit",
        figure="sli library by replica: gpu_tensor_active_ratio",
        description="Share of cycles the tensor pipe is busy, mean over the replica's GPUs.",
    ),
    _gpu(
        "GPU power",
        "DCGM_FI_DEV_POWER_USAGE",
        combine="sum",
        scale="",
        unit="watt",
        figure="sli histograms by replica: gpu_power_w.mean",
        description="Power drawn by the replica's GPUs (their sum, not the host's).",
    ),
    _gpu(
        "GPU temperature",
        "DCGM_FI_DEV_GPU_TEMP",
        combine="max",
        scale="",
        unit="celsius",
        figure="sli histograms by replica: gpu_temperature_c.mean",
        description="Temperature of the replica's hottest GPU.",
    ),
    _gpu(
        "GPU SM clock",
        "DCGM_FI_DEV_SM_CLOCK",
        combine="avg",
        scale=" * 1000000",
        unit="hertz",
        figure="sli library by replica: gpu_sm_clock_hz",
        description="SM clock, mean over the replica's GPUs.",
    ),
    _gpu(
        "GPU framebuffer used",
        "DCGM_FI_DEV_FB_USED",
        combine="sum",
        scale=" * 1048576",
        unit="bytes",
        figure="sli histograms by replica: gpu_fb_used_bytes.mean",
        description=(
            "Framebuffer memory used by the replica's GPUs. vLLM reserves its share at "
            "start-up, so this shows fit, not load."
        ),
    ),
    _gpu(
        "GPU framebuffer free",
        "DCGM_FI_DEV_FB_FREE",
        combine="sum",
        scale=" * 1048576",
        unit="bytes",
        figure="sli library by replica: gpu_fb_free_bytes",
        description="Framebuffer memory left free on the replica's GPUs.",
    ),
    GrafanaPanel(
        "GPU XID errors",
        PanelRow.GPU,
        PanelKind.TIMESERIES,
        "none",
        "The last XID error a replica's GPUs reported (0: none), highest over the interval. "
        "48, 63, 64, 74, 79, 94 and 95 mean the GPU must be drained.",
        (
            PanelQuery(
                expr=(
                    "max by ({replica}) (max_over_time(DCGM_FI_DEV_XID_ERRORS[$__rate_interval]))"
                    " and on ({replica}) {replicas}"
                ),
                legend=REPLICA_LEGEND,
                figure="sli library by replica: gpu_last_xid max",
            ),
        ),
    ),
    GrafanaPanel(
        "GPU power total",
        PanelRow.GPU,
        PanelKind.STAT,
        "watt",
        "Power drawn by all the selected replicas' GPUs.",
        (
            PanelQuery(
                expr=(
                    "sum(sum by ({replica}) "
                    "(avg_over_time(DCGM_FI_DEV_POWER_USAGE[$__rate_interval]))"
                    " and on ({replica}) {replicas})"
                ),
                legend="total",
                figure="sli histograms: gpu_power_w.mean",
            ),
        ),
        width=6,
    ),
    GrafanaPanel(
        "Hottest GPU",
        PanelRow.GPU,
        PanelKind.STAT,
        "celsius",
        "Temperature of the hottest GPU among the selected replicas'.",
        (
            PanelQuery(
                expr=(
                    "max(max by ({replica}) "
                    "(avg_over_time(DCGM_FI_DEV_GPU_TEMP[$__rate_interval]))"
                    " and on ({replica}) {replicas})"
                ),
                legend="hottest",
                figure="sli histograms: gpu_temperature_c.mean",
            ),
        ),
        width=6,
    ),
)
