"""The seven boxes: each box's signals and states on small frames, the `no signal` cases, and
the page's table per box."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest

from servewatch.dashboards.box_signal import Box, BoxFrames, BoxSignal, BoxState, box_state
from servewatch.dashboards.report import ReportInputs, build_report
from servewatch.dashboards.seven_boxes import box_lines, box_signals, seven_boxes_chart
from servewatch.health.finding import Finding, FindingKind, ScopeUnit
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.tables import REQUESTS_SCHEMA, SCRAPES_SCHEMA, TARGETS_SCHEMA

T0 = datetime(2026, 11, 18, 10)
WINDOW = (T0, T0 + timedelta(hours=1))
OK, DEGRADED, NONE = BoxState.OK, BoxState.DEGRADED, BoxState.NO_SIGNAL


def signal(frames: BoxFrames, box: Box, name: str) -> BoxSignal:
    (found,) = [s for s in box_signals(frames) if s.box is box and s.signal == name]
    return found


def requests(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Traced requests: each row's given columns, the rest as a plain successful request."""
    base = {
        "replica": "vllm-0",
        "arrival_ts": T0,
        "end_ts": T0 + timedelta(seconds=2),
        "ok": True,
        "error_type": None,
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "ttft_s": 0.1,
        "e2e_s": 2.0,
        "ingested_ts": T0 + timedelta(seconds=7),
    }
    return pl.DataFrame([{**base, **row} for row in rows], schema=REQUESTS_SCHEMA)


def scrapes(rows: list[tuple[str, int, bool]], *, kind: str = "vllm") -> pl.DataFrame:
    """(target, seconds after T0, ok) per scrape, 20 ms each."""
    return pl.DataFrame(
        {
            "target_id": [r[0] for r in rows],
            "ts": [T0 + timedelta(seconds=r[1]) for r in rows],
            "ok": [r[2] for r in rows],
            "duration_s": [0.02] * len(rows),
            "samples": [100] * len(rows),
            "error": [None if r[2] else "connection refused" for r in rows],
            "kind": [kind] * len(rows),
        },
        schema=SCRAPES_SCHEMA,
    )


def every_minute(
    target: str, *, start_min: int = 0, end_min: int = 60
) -> list[tuple[str, int, bool]]:
    return [(target, 60 * m + 5, True) for m in range(start_min, end_min)]


def finding(kind: FindingKind, scope: str, *, ongoing: bool = False) -> Finding:
    return Finding(
        kind=kind,
        scope_unit=ScopeUnit.REPLICA,
        scope=scope,
        start=T0,
        end=None if ongoing else T0 + timedelta(minutes=10),
        confidence=0.9,
        summary=f"{kind.value} on {scope}",
    )


# -- nothing collected: every box still shows, saying so -----------------------------------------


def test_with_nothing_collected_every_box_says_no_signal_and_what_would_give_one() -> None:
    signals = box_signals(BoxFrames())
    assert [box for box in Box if any(s.box is box for s in signals)] == list(Box)
    assert {s.state for s in signals} == {NONE}
    assert all(s.value == "-" for s in signals)
    assert all(s.how for s in signals)
    assert signal(BoxFrames(), Box.GATEWAY, "failed requests").how.startswith("no traced requests")


# -- gateway -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "state_failed", "value_failed", "state_429", "value_429"),
    [
        # Engine spans name no HTTP status: failures count, 429s cannot be seen.
        (["abort", "abort", None], DEGRADED, "3 of 100 (3.00%): abort 2, unnamed 1", NONE, "-"),
        # A gateway's statuses in error.type: 429s counted among all requests.
        (["429", "429", "503"], DEGRADED, "3 of 100 (3.00%): 429 2, 503 1", DEGRADED, "2 of 100"),
        (["500"], OK, "1 of 100 (1.00%): 500 1", OK, "0 of 100 (0.00%)"),
        ([], OK, "0 of 100 (0.00%)", NONE, "-"),
    ],
)
def test_the_gateway_counts_failed_and_rate_limited_requests(
    failures: list[str | None],
    state_failed: BoxState,
    value_failed: str,
    state_429: BoxState,
    value_429: str,
) -> None:
    rows = [{"ok": False, "error_type": e} for e in failures]
    rows += [{} for _ in range(100 - len(failures))]
    frames = BoxFrames(requests=requests(rows))
    failed = signal(frames, Box.GATEWAY, "failed requests")
    assert (failed.state, failed.value) == (state_failed, value_failed)
    limited = signal(frames, Box.GATEWAY, "rate limited (HTTP 429)")
    assert limited.state is state_429
    assert limited.value.startswith(value_429)


def test_client_aborts_come_from_the_engines_finish_reason_counter() -> None:
    reasons = pl.DataFrame(
        {
            "minute_ts": [T0, T0, T0 + timedelta(minutes=1)],
            "finished_reason": ["stop", "abort", "length"],
            "requests": [80.0, 10.0, 10.0],
        }
    )
    aborted = signal(BoxFrames(finish_reasons=reasons), Box.GATEWAY, "aborted by clients")
    assert aborted.state is DEGRADED
    assert aborted.value == "10 of 100 finished requests (10.00%)"
    assert signal(BoxFrames(), Box.GATEWAY, "aborted by clients").state is NONE


# -- router --------------------------------------------------------------------------------------


def request_minutes(counts: dict[str, int]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "minute_ts": [T0] * len(counts),
            "replica": list(counts),
            "requests": list(counts.values()),
            "completion_tokens": [10 * n for n in counts.values()],
        }
    )


@pytest.mark.parametrize(
    ("counts", "state", "value"),
    [
        (
            {"vllm-0": 25, "vllm-1": 25, "vllm-2": 25, "vllm-10": 25},
            OK,
            "busiest vllm-0 1.00x even",
        ),
        # vllm-10 takes 40% of four: 1.6x even.
        (
            {"vllm-0": 20, "vllm-1": 20, "vllm-2": 20, "vllm-10": 40},
            DEGRADED,
            "busiest vllm-10 1.60x",
        ),
        # A replica drawing under half its share stands out as much.
        (
            {"vllm-0": 30, "vllm-1": 30, "vllm-2": 30, "vllm-10": 10},
            DEGRADED,
            "quietest vllm-10 0.40x",
        ),
    ],
)
def test_router_load_skew_is_the_busiest_and_quietest_share_over_the_even_share(
    counts: dict[str, int], state: BoxState, value: str
) -> None:
    skew = signal(BoxFrames(request_minutes=request_minutes(counts)), Box.ROUTER, "load skew")
    assert skew.state is state
    assert value in skew.value


def prefix(hits: dict[str, float], queries: float = 1000.0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "minute_ts": [T0] * len(hits),
            "replica": list(hits),
            "hits_tokens": list(hits.values()),
            "queries_tokens": [queries] * len(hits),
        }
    )


@pytest.mark.parametrize(
    ("findings", "state", "tail"),
    [
        (None, OK, "(detectors not run)"),
        ((), OK, "found a drop"),
        ((finding(FindingKind.AFFINITY_LOSS, "vllm-1", ongoing=True),), DEGRADED, "found a drop"),
    ],
)
def test_router_affinity_is_the_spread_of_hit_rates_and_the_affinity_loss_detector(
    findings: tuple[Finding, ...] | None, state: BoxState, tail: str
) -> None:
    frames = BoxFrames(prefix_cache=prefix({"vllm-0": 700.0, "vllm-1": 200.0}), findings=findings)
    affinity = signal(frames, Box.ROUTER, "prefix affinity")
    assert affinity.state is state
    assert affinity.value.startswith("hit rate by replica 20.0% (vllm-1) to 70.0% (vllm-0)")
    assert affinity.how.endswith(tail)
    if state is DEGRADED:
        assert affinity.value.endswith("affinity loss: affinity_loss on replica vllm-1 (ongoing)")


# -- scheduler -----------------------------------------------------------------------------------


def scheduler(waiting: list[float], preemptions: list[float] | None) -> pl.DataFrame:
    frame = pl.DataFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(len(waiting))],
            "replica": ["vllm-3"] * len(waiting),
            "running_requests": [8.0] * len(waiting),
            "waiting_requests": waiting,
        }
    )
    if preemptions is None:
        return frame
    return frame.with_columns(preemptions=pl.Series(preemptions))


@pytest.mark.parametrize(
    ("waiting", "preemptions", "queue", "preempted"),
    [
        ([0.0] * 20, [0.0] * 20, (OK, "0 of 20 replica-minutes (0.0%) had a queue"), (OK, "0")),
        # One minute of twenty queued (5%, not above): ok; two preemptions: degraded.
        (
            [0.0] * 19 + [3.5],
            [0.0] * 18 + [2.0, 0.0],
            (
                OK,
                (
                    "1 of 20 replica-minutes (5.0%) had a queue; "
                    "longest 3.5 waiting on vllm-3 at 10:19"
                ),
            ),
            (DEGRADED, "2: vllm-3 2"),
        ),
        ([0.0] * 18 + [1.0, 2.0], None, (DEGRADED, "2 of 20"), (NONE, "-")),
    ],
)
def test_the_scheduler_reads_queued_minutes_and_preemptions(
    waiting: list[float],
    preemptions: list[float] | None,
    queue: tuple[BoxState, str],
    preempted: tuple[BoxState, str],
) -> None:
    frames = BoxFrames(scheduler_state=scheduler(waiting, preemptions))
    got = signal(frames, Box.SCHEDULER, "queue")
    assert got.state is queue[0]
    assert got.value.startswith(queue[1])
    got = signal(frames, Box.SCHEDULER, "preemptions")
    assert (got.state, got.value) == preempted


# -- replicas ------------------------------------------------------------------------------------


def targets(pairs: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"target_id": list(pairs), "replica": list(pairs.values()), "kind": ["vllm"] * len(pairs)},
        schema={k: TARGETS_SCHEMA[k] for k in ("target_id", "replica", "kind")},
    )


ENGINE_TARGETS = {"t-0": "vllm-0", "t-10": "vllm-10", "t-2": "vllm-2"}


@pytest.mark.parametrize(
    ("dcgm_kind", "exporter_listed"),
    [
        # The scrape says what it read.
        ("dcgm", False),
        # A failed scrape records no page kind: the targets table says it is an exporter.
        (None, True),
    ],
)
def test_a_replica_is_down_when_its_last_scrape_failed_and_dcgm_exporters_are_no_replicas(
    dcgm_kind: str | None, exporter_listed: bool
) -> None:
    rows = every_minute("t-0") + every_minute("t-10") + every_minute("t-2")[:-1]
    rows.append(("t-2", 3590, False))
    dcgm = scrapes([("dcgm-h0", 3590, False)]).with_columns(kind=pl.lit(dcgm_kind, pl.String))
    listed = targets({**ENGINE_TARGETS, "dcgm-h0": ""}).with_columns(
        replica=pl.when(pl.col("target_id") == "dcgm-h0").then(None).otherwise("replica"),
        kind=pl.when(pl.col("target_id") == "dcgm-h0").then(pl.lit("dcgm")).otherwise("kind"),
    )
    frames = BoxFrames(
        scrapes=pl.concat([scrapes(rows), dcgm]),
        targets=listed if exporter_listed else targets(ENGINE_TARGETS),
    )
    up = signal(frames, Box.REPLICAS, "up")
    assert (up.state, up.value) == (DEGRADED, "2 of 3 up at the end of the window; down: vllm-2")


def test_without_targets_a_scraped_target_names_its_replica() -> None:
    frames = BoxFrames(scrapes=scrapes(every_minute("vllm-0")))
    up = signal(frames, Box.REPLICAS, "up")
    assert (up.state, up.value) == (OK, "1 of 1 up at the end of the window")


@pytest.mark.parametrize(
    ("findings", "state", "value"),
    [
        (None, NONE, "-"),
        ((), OK, "0"),
        # KV pressure is the KV tier's and affinity loss the router's: not the replicas'.
        ((finding(FindingKind.KV_PRESSURE, "vllm-1"),), OK, "0"),
        (
            (finding(FindingKind.SLOW_REPLICA, "vllm-9", ongoing=True),),
            DEGRADED,
            "1: slow_replica on replica vllm-9 (ongoing)",
        ),
    ],
)
def test_replica_health_is_the_findings_about_replicas(
    findings: tuple[Finding, ...] | None, state: BoxState, value: str
) -> None:
    got = signal(BoxFrames(findings=findings), Box.REPLICAS, "health findings")
    assert (got.state, got.value) == (state, value)


# -- KV tier -------------------------------------------------------------------------------------


def kv_usage(ratios: list[float]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(len(ratios))],
            "replica": ["vllm-4"] * len(ratios),
            "kv_cache_usage_ratio": ratios,
        }
    )


@pytest.mark.parametrize(
    ("ratios", "findings", "state", "value"),
    [
        ([0.4, 0.6], (), OK, "mean 50%, highest minute 60% on vllm-4 at 10:01"),
        ([0.5, 0.96], (), DEGRADED, "mean 73%, highest minute 96% on vllm-4 at 10:01"),
        (
            [0.4, 0.6],
            (finding(FindingKind.KV_PRESSURE, "vllm-4"),),
            DEGRADED,
            (
                "mean 50%, highest minute 60% on vllm-4 at 10:01; KV pressure: kv_pressure on "
                "replica vllm-4"
            ),
        ),
    ],
)
def test_kv_usage_is_degraded_near_full_or_under_pressure(
    ratios: list[float], findings: tuple[Finding, ...], state: BoxState, value: str
) -> None:
    frames = BoxFrames(kv_cache_usage=kv_usage(ratios), findings=findings)
    got = signal(frames, Box.KV_TIER, "KV-cache usage")
    assert (got.state, got.value) == (state, value)


def test_the_kv_tier_hit_rate_sums_hits_over_queries() -> None:
    frames = BoxFrames(prefix_cache=prefix({"vllm-0": 700.0, "vllm-1": 200.0}))
    got = signal(frames, Box.KV_TIER, "prefix-cache hit rate")
    assert (got.state, got.value) == (OK, "45.0% of 2,000 prompt tokens looked up")


def token_sources(rows: list[tuple[str, str, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(T0, *row) for row in rows],
        schema=["minute_ts", "counter", "token_source", "tokens"],
        orient="row",
    )


@pytest.mark.parametrize(
    ("rows", "state", "value"),
    [
        ([], NONE, "-"),
        (
            [("prompt", "local_compute", 600.0), ("prompt", "local_cache_hit", 400.0)],
            OK,
            "0.0% of prompt tokens from a KV connector",
        ),
        (
            [
                ("prompt", "local_compute", 500.0),
                ("prompt", "external_kv_transfer", 500.0),
                ("cached", "device", 300.0),
                ("cached", "host", 100.0),
            ],
            OK,
            (
                "50.0% of prompt tokens from a KV connector; cached tokens by tier: device 75%, "
                "host 25%"
            ),
        ),
    ],
)
def test_kv_beyond_the_gpu_comes_from_prompt_tokens_by_source(
    rows: list[tuple[str, str, float]], state: BoxState, value: str
) -> None:
    frames = BoxFrames(prompt_token_sources=token_sources(rows) if rows else None)
    got = signal(frames, Box.KV_TIER, "KV beyond the GPU")
    assert (got.state, got.value) == (state, value)


# -- autoscaler ----------------------------------------------------------------------------------


def test_replicas_appearing_and_leaving_and_how_long_a_new_one_took_to_serve() -> None:
    rows = every_minute("vllm-0") + every_minute("vllm-1", end_min=30)
    rows += every_minute("vllm-2", start_min=20) + every_minute("vllm-10", start_min=40)
    served = requests(
        [
            {"replica": "vllm-0", "arrival_ts": T0 + timedelta(minutes=1)},
            # vllm-2's first scrape is 10:20:05; its first request arrives 95 s later.
            {"replica": "vllm-2", "arrival_ts": T0 + timedelta(minutes=21, seconds=40)},
        ]
    )
    frames = BoxFrames(window=WINDOW, scrapes=scrapes(rows), requests=served)
    changes = signal(frames, Box.AUTOSCALER, "replica count changes")
    assert (changes.state, changes.value) == (
        OK,
        "2 at the start, 3 at the end: +vllm-2, +vllm-10, -vllm-1",
    )
    cold = signal(frames, Box.AUTOSCALER, "cold starts")
    # vllm-10 appeared 20 minutes before the end and never served: past the 5-minute limit.
    assert (cold.state, cold.value) == (DEGRADED, "vllm-2 95 s, vllm-10 never served")


@pytest.mark.parametrize(
    ("rows", "with_requests", "state", "value"),
    [
        (every_minute("vllm-0"), True, NONE, "none: no replica appeared"),
        # Appeared in the window but nothing traced: when it first served cannot be seen.
        (
            every_minute("vllm-0") + every_minute("vllm-1", start_min=30),
            False,
            NONE,
            "1 replica(s) appeared",
        ),
        # First scrape in the last five minutes, not serving yet: too early to call.
        (
            every_minute("vllm-0") + every_minute("vllm-1", start_min=57),
            True,
            OK,
            "vllm-1 never served",
        ),
    ],
)
def test_cold_starts_without_a_new_replica_or_without_traces(
    rows: list[tuple[str, int, bool]], with_requests: bool, state: BoxState, value: str
) -> None:
    served = requests([{"replica": "vllm-0"}]) if with_requests else None
    frames = BoxFrames(window=WINDOW, scrapes=scrapes(rows), requests=served)
    got = signal(frames, Box.AUTOSCALER, "cold starts")
    assert (got.state, got.value) == (state, value)


def test_a_steady_fleet_reports_no_change() -> None:
    frames = BoxFrames(
        window=WINDOW, scrapes=scrapes(every_minute("vllm-0") + every_minute("vllm-1"))
    )
    got = signal(frames, Box.AUTOSCALER, "replica count changes")
    assert got.value == "2 at the start, 2 at the end, no change"


# -- observer ------------------------------------------------------------------------------------


def test_the_observer_counts_answered_scrapes_and_their_durations() -> None:
    rows = every_minute("vllm-0")[: 98 // 2] + every_minute("vllm-1")[:50]
    rows += [("vllm-1", 3590, False)]
    frame = scrapes(rows).with_columns(duration_s=pl.when(pl.col("ok")).then(0.02).otherwise(6.0))
    frames = BoxFrames(scrapes=frame)
    answered = signal(frames, Box.OBSERVER, "scrapes answered")
    assert (answered.state, answered.value) == (OK, "99 of 100 (99.00%), every target")
    duration = signal(frames, Box.OBSERVER, "scrape duration")
    assert (duration.state, duration.value) == (OK, "p95 20 ms, longest 6,000 ms")


def test_replayed_scrapes_record_no_duration_so_it_has_no_signal() -> None:
    frame = scrapes(every_minute("vllm-0")).with_columns(duration_s=pl.lit(None, pl.Float64))
    got = signal(BoxFrames(scrapes=frame), Box.OBSERVER, "scrape duration")
    assert (got.state, got.value) == (NONE, "-")
    assert "replayed scrapes" in got.how


@pytest.mark.parametrize(
    ("lags_s", "state", "value"),
    [
        ([2.0, 5.0, 5.0, 7.0], OK, "median 5 s, p95 7 s"),
        ([2.0, 5.0, 90.0, 120.0], DEGRADED, "median 48 s, p95 120 s"),
        # A replay stamps rows days after the requests ended: not a live lag.
        ([86400.0 * 3] * 4, NONE, "median 3.0 d, p95 3.0 d"),
        ([], NONE, "-"),
    ],
)
def test_trace_ingest_lag_is_store_write_less_request_end(
    lags_s: list[float], state: BoxState, value: str
) -> None:
    end = T0 + timedelta(seconds=2)
    rows = [{"end_ts": end, "ingested_ts": end + timedelta(seconds=s)} for s in lags_s]
    frames = BoxFrames(requests=requests(rows or [{"ingested_ts": None}]))
    got = signal(frames, Box.OBSERVER, "trace ingest lag")
    assert (got.state, got.value) == (state, value)


# -- the page ------------------------------------------------------------------------------------


def test_a_box_is_as_bad_as_its_worst_signal() -> None:
    def of(*states: BoxState) -> BoxState:
        return box_state([BoxSignal(Box.GATEWAY, "s", s, "-", "h") for s in states])

    assert of(NONE, OK) is OK
    assert of(OK, DEGRADED, NONE) is DEGRADED
    assert of(NONE) is NONE


def test_each_box_prints_its_signals_whole_with_the_state_beside_them() -> None:
    long_how = "a reason " * 20
    signals = [
        BoxSignal(Box.GATEWAY, "failed requests", DEGRADED, "3 of 100 (3.00%)", long_how.strip()),
        BoxSignal(Box.GATEWAY, "rate limited (HTTP 429)", NONE, "-", "no status"),
        BoxSignal(Box.OBSERVER, "scrapes answered", OK, "all", "ok / all"),
    ]
    printed = box_lines(signals[:1]).filter(pl.col("style") == "how")["text"].to_list()
    assert " ".join(printed) == f"How: {long_how.strip()}"
    assert len(printed) == 3  # wrapped, not cut
    lines = box_lines(signals[:2])
    assert lines.filter(pl.col("style") == "degraded").rows() == [(0, 150, "degraded", "degraded")]
    # The second signal starts after the first's wrapped lines and a blank one.
    assert lines.filter(pl.col("text") == "rate limited (HTTP 429)")["line"].to_list() == [5]
    spec = seven_boxes_chart(signals).to_dict()
    titles = [table["title"]["text"] for table in spec["vconcat"]]
    assert titles == ["Gateway: degraded", "Observer: ok"]
    assert spec["vconcat"][0]["title"]["color"] == "#d62728"
    assert spec["title"]["subtitle"][1] == "Degraded: gateway."


def test_the_report_always_carries_the_seven_boxes_and_names_a_missing_source() -> None:
    report = build_report(ReportInputs(), limits=GoodputLimits())
    assert [c.slug for c in report.charts] == ["seven-boxes"]
    spec = report.charts[0].chart.to_dict()
    assert len(spec["vconcat"]) == 7
    assert (
        "No signal: gateway, router, scheduler, replicas, KV tier, autoscaler, observer."
        in (spec["title"]["subtitle"])
    )
    omitted = dict(report.omitted)
    assert omitted["Prompt tokens by source"].startswith("not exported: the engines send no")
