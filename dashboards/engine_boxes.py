"""Engine boxes: the scheduler (queue, preemptions), the replicas (up from their scrapes,
health findings) and the KV tier (usage, prefix-cache hit rate, KV from beyond the GPU), from
the scraped engines' minute frames, the scrapes and the fleet-health findings.

A preemption is a full KV pool evicting running requests, so any is `degraded`; the other
thresholds are starting points a reader checks against the number printed beside each state.
"""

from __future__ import annotations

import polars as pl

from servewatch.dashboards.box_signal import (
    Box,
    BoxFrames,
    BoxSignal,
    BoxState,
    engine_scrapes,
    finding_text,
    findings_of,
    has_rows,
    listed,
    verdict,
)
from servewatch.dashboards.panel import natural_order
from servewatch.health.finding import FindingKind
from servewatch.pipeline.prompt_token_sources import SourceCounter

# A replica-minute "has a queue" when its mean waiting requests reach this.
QUEUED_REQUESTS = 1.0
QUEUED_MINUTES_DEGRADED_RATIO = 0.05
KV_USAGE_DEGRADED_RATIO = 0.95
REPLICA_KINDS = (
    FindingKind.SLOW_REPLICA,
    FindingKind.ROLLOUT_REGRESSION,
    FindingKind.ERROR_BURST,
    FindingKind.HOST_LOSS,
    FindingKind.ZONE_LOSS,
    FindingKind.STARTUP_DEPENDENCY,
    FindingKind.DEPENDENCY,
)


# -- scheduler ------------------------------------------------------------------------------------


def scheduler_signals(frames: BoxFrames) -> list[BoxSignal]:
    box, rows = Box.SCHEDULER, frames.scheduler_state
    if not has_rows(rows):
        why = "needs vLLM's num_requests_waiting and num_preemptions (servewatch scrape or run)"
        return [
            BoxSignal(box, "queue", BoxState.NO_SIGNAL, "-", why),
            BoxSignal(box, "preemptions", BoxState.NO_SIGNAL, "-", why),
        ]
    assert rows is not None
    waiting = rows.filter(pl.col("waiting_requests").is_not_null())
    queued = waiting.filter(pl.col("waiting_requests") >= QUEUED_REQUESTS)
    ratio = queued.height / waiting.height if waiting.height else 0.0
    value = f"{queued.height:,} of {waiting.height:,} replica-minutes ({ratio:.1%}) had a queue"
    if not queued.is_empty():
        peak = queued.sort("waiting_requests", descending=True).row(0, named=True)
        value += (
            f"; longest {peak['waiting_requests']:.1f} waiting on {peak['replica']} at "
            f"{peak['minute_ts']:%H:%M}"
        )
    signals = [
        BoxSignal(
            box,
            "queue",
            verdict(ratio > QUEUED_MINUTES_DEGRADED_RATIO),
            value,
            f"replica-minutes whose mean num_requests_waiting reached {QUEUED_REQUESTS:g} / "
            f"all replica-minutes; degraded above {QUEUED_MINUTES_DEGRADED_RATIO:.0%}",
        )
    ]
    if "preemptions" not in rows.columns or rows["preemptions"].null_count() == rows.height:
        signals.append(
            BoxSignal(
                box,
                "preemptions",
                BoxState.NO_SIGNAL,
                "-",
                "needs vLLM's num_preemptions_total counter",
            )
        )
        return signals
    by_replica = (
        rows.group_by("replica")
        .agg(pl.col("preemptions").sum())
        .filter(pl.col("preemptions") > 0)
        .sort("preemptions", "replica", descending=[True, False])
    )
    total = float(by_replica["preemptions"].sum())
    named = listed([f"{r['replica']} {r['preemptions']:,.0f}" for r in by_replica.to_dicts()])
    signals.append(
        BoxSignal(
            box,
            "preemptions",
            verdict(total > 0),
            f"{total:,.0f}" + (f": {named}" if named else ""),
            "increase of num_preemptions_total over the window; any is degraded (the KV pool "
            "filled and running requests were evicted)",
        )
    )
    return signals


# -- replicas -------------------------------------------------------------------------------------


def replica_signals(frames: BoxFrames) -> list[BoxSignal]:
    box = Box.REPLICAS
    signals = []
    scrapes = engine_scrapes(frames)
    if scrapes is None:
        signals.append(
            BoxSignal(
                box,
                "up",
                BoxState.NO_SIGNAL,
                "-",
                "no engine target was scraped in the window (servewatch scrape or run)",
            )
        )
    else:
        last = scrapes.group_by("replica").agg(pl.col("ok").sort_by("ts").last())
        down = natural_order(last.filter(~pl.col("ok"))["replica"].to_list())
        value = f"{last.height - len(down)} of {last.height} up at the end of the window"
        signals.append(
            BoxSignal(
                box,
                "up",
                verdict(bool(down)),
                value + (f"; down: {listed(down)}" if down else ""),
                "a replica is up when its last scrape in the window answered; degraded when "
                "any is down",
            )
        )
    if frames.findings is None:
        signals.append(
            BoxSignal(
                box,
                "health findings",
                BoxState.NO_SIGNAL,
                "-",
                "the fleet-health detectors were not run (servewatch health)",
            )
        )
        return signals
    found = findings_of(frames, REPLICA_KINDS)
    kinds = ", ".join(k.value for k in REPLICA_KINDS)
    signals.append(
        BoxSignal(
            box,
            "health findings",
            verdict(bool(found)),
            f"{len(found)}" + (f": {finding_text(found)}" if found else ""),
            f"findings of the fleet-health detectors ({kinds}); degraded when any",
        )
    )
    return signals


# -- KV tier --------------------------------------------------------------------------------------


def kv_tier_signals(frames: BoxFrames) -> list[BoxSignal]:
    box, usage = Box.KV_TIER, frames.kv_cache_usage
    signals = []
    usage = None if usage is None else usage.filter(pl.col("kv_cache_usage_ratio").is_not_null())
    pressure = findings_of(frames, (FindingKind.KV_PRESSURE,))
    if usage is None or usage.is_empty():
        signals.append(
            BoxSignal(
                box,
                "KV-cache usage",
                BoxState.NO_SIGNAL,
                "-",
                "needs vLLM's kv_cache_usage_perc gauge",
            )
        )
    else:
        peak = usage.sort("kv_cache_usage_ratio", descending=True).row(0, named=True)
        mean = float(usage["kv_cache_usage_ratio"].mean())  # type: ignore[arg-type]
        value = (
            f"mean {mean:.0%}, highest minute {peak['kv_cache_usage_ratio']:.0%} on "
            f"{peak['replica']} at {peak['minute_ts']:%H:%M}"
        )
        if pressure:
            value += f"; KV pressure: {finding_text(pressure)}"
        signals.append(
            BoxSignal(
                box,
                "KV-cache usage",
                verdict(peak["kv_cache_usage_ratio"] >= KV_USAGE_DEGRADED_RATIO or bool(pressure)),
                value,
                "minute means of kv_cache_usage_perc per replica; degraded when one reaches "
                f"{KV_USAGE_DEGRADED_RATIO:.0%} or the KV-pressure detector found pressure",
            )
        )
    prefix = frames.prefix_cache
    if not has_rows(prefix):
        signals.append(
            BoxSignal(
                box,
                "prefix-cache hit rate",
                BoxState.NO_SIGNAL,
                "-",
                "needs vLLM's prefix_cache_hits and prefix_cache_queries counters",
            )
        )
    else:
        assert prefix is not None
        queries = float(prefix["queries_tokens"].sum())
        hits = float(prefix["hits_tokens"].sum())
        signals.append(
            BoxSignal(
                box,
                "prefix-cache hit rate",
                BoxState.OK if queries > 0 else BoxState.NO_SIGNAL,
                f"{hits / queries:.1%} of {queries:,.0f} prompt tokens looked up"
                if queries > 0
                else "no prompt token was looked up",
                "prefix_cache_hits / prefix_cache_queries over the window, all replicas; no "
                "threshold of its own (it depends on how much the workload shares), its drops "
                "are the router's affinity loss",
            )
        )
    signals.append(_beyond_gpu(frames))
    return signals


def _beyond_gpu(frames: BoxFrames) -> BoxSignal:
    box, sources = Box.KV_TIER, frames.prompt_token_sources
    rows = None if sources is None else sources.filter(pl.col("tokens") > 0)
    if rows is None or rows.is_empty():
        return BoxSignal(
            box,
            "KV beyond the GPU",
            BoxState.NO_SIGNAL,
            "-",
            "the engines export no prompt tokens by source (vLLM 0.16 and later do)",
        )
    prompt = rows.filter(pl.col("counter") == SourceCounter.PROMPT.value)
    total = float(prompt["tokens"].sum())
    external = float(
        prompt.filter(pl.col("token_source") == "external_kv_transfer")["tokens"].sum()
    )
    parts = []
    if total > 0:
        parts.append(f"{external / total:.1%} of prompt tokens from a KV connector")
    cached = rows.filter(pl.col("counter") == SourceCounter.CACHED.value)
    tiers = cached.group_by("token_source").agg(pl.col("tokens").sum())
    cached_total = float(tiers["tokens"].sum())
    if cached_total > 0:
        named = ", ".join(
            f"{r['token_source']} {r['tokens'] / cached_total:.0%}"
            for r in tiers.sort("tokens", "token_source", descending=[True, False]).to_dicts()
        )
        parts.append(f"cached tokens by tier: {named}")
    return BoxSignal(
        box,
        "KV beyond the GPU",
        BoxState.OK,
        "; ".join(parts) or "-",
        "prompt_tokens_by_source{source=external_kv_transfer} / all prompt tokens, and "
        "prompt_tokens_cached_by_source by tier, over the window; no threshold",
    )
