"""The store's schema history: numbered migrations, append only.

The schema grows only through `MIGRATIONS`; a file is brought up to date when it is opened
(`Store.open`), and a file written by a newer servewatch is refused rather than misread.
"""

from __future__ import annotations

from dataclasses import dataclass

from servewatch.store.point_layout import COMPACT_STATEMENTS, POINT_BLOCK_SQL, POINTS_VIEW_SQL


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


# Append only: a released migration never changes, a new need gets a new number.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="raw layer: targets, scrapes, series, points, requests, ingest_errors",
        statements=(
            """
            CREATE TABLE targets (
                target_id    VARCHAR PRIMARY KEY,
                kind         VARCHAR NOT NULL,
                url          VARCHAR,
                replica      VARCHAR,
                host         VARCHAR,
                zone         VARCHAR,
                model        VARCHAR,
                pool         VARCHAR,
                gpus         INTEGER,
                first_seen_ts TIMESTAMP,
                last_seen_ts  TIMESTAMP
            )
            """,
            """
            CREATE TABLE scrapes (
                target_id  VARCHAR NOT NULL,
                ts         TIMESTAMP NOT NULL,
                ok         BOOLEAN NOT NULL,
                duration_s DOUBLE,
                samples    INTEGER,
                error      VARCHAR,
                PRIMARY KEY (target_id, ts)
            )
            """,
            """
            CREATE TABLE series (
                series_id  INTEGER PRIMARY KEY,
                target_id  VARCHAR NOT NULL,
                signal     VARCHAR,
                metric     VARCHAR NOT NULL,
                labels     VARCHAR NOT NULL,
                UNIQUE (target_id, metric, labels)
            )
            """,
            """
            CREATE TABLE points (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP NOT NULL,
                value     DOUBLE
            )
            """,
            """
            CREATE TABLE requests (
                trace_id          VARCHAR NOT NULL,
                span_id           VARCHAR NOT NULL,
                request_id        VARCHAR,
                replica           VARCHAR,
                host              VARCHAR,
                zone              VARCHAR,
                model             VARCHAR,
                pool              VARCHAR,
                tenant            VARCHAR,
                arrival_ts        TIMESTAMP NOT NULL,
                end_ts            TIMESTAMP NOT NULL,
                ok                BOOLEAN NOT NULL,
                error_type        VARCHAR,
                prompt_tokens     BIGINT,
                completion_tokens BIGINT,
                ttft_s            DOUBLE,
                e2e_s             DOUBLE,
                queue_s           DOUBLE,
                prefill_s         DOUBLE,
                decode_s          DOUBLE,
                inference_s       DOUBLE,
                max_tokens        BIGINT,
                emulated          BOOLEAN NOT NULL,
                source            VARCHAR,
                PRIMARY KEY (trace_id, span_id)
            )
            """,
            """
            CREATE TABLE ingest_errors (
                source      VARCHAR NOT NULL,
                location    VARCHAR NOT NULL,
                message     VARCHAR NOT NULL,
                recorded_ts TIMESTAMP NOT NULL,
                PRIMARY KEY (source, location)
            )
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=2,
        description="rollup layer: request_minutes, slo_minutes, rollup_watermarks; "
        "requests.ingested_ts for incremental rollups",
        statements=(
            "ALTER TABLE requests ADD COLUMN ingested_ts TIMESTAMP",
            """
            CREATE TABLE request_minutes (
                replica           VARCHAR,
                minute_ts         TIMESTAMP NOT NULL,
                requests          BIGINT NOT NULL,
                failed_requests   BIGINT NOT NULL,
                prompt_tokens     BIGINT,
                completion_tokens BIGINT,
                ttft_p50_s DOUBLE, ttft_p95_s DOUBLE, ttft_p99_s DOUBLE,
                tpot_p50_s DOUBLE, tpot_p95_s DOUBLE, tpot_p99_s DOUBLE,
                e2e_p50_s  DOUBLE, e2e_p95_s  DOUBLE, e2e_p99_s  DOUBLE
            )
            """,
            """
            CREATE TABLE slo_minutes (
                minute_ts TIMESTAMP NOT NULL,
                slo       VARCHAR NOT NULL,
                replica   VARCHAR,
                good      BIGINT NOT NULL,
                total     BIGINT NOT NULL
            )
            """,
            """
            CREATE TABLE rollup_watermarks (
                source       VARCHAR PRIMARY KEY,
                watermark_ts TIMESTAMP,
                fingerprint  VARCHAR NOT NULL,
                updated_ts   TIMESTAMP NOT NULL
            )
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=3,
        description="series.source (engine, router, dcgm) and unknown_families",
        statements=(
            "ALTER TABLE series ADD COLUMN source VARCHAR",
            """
            CREATE TABLE unknown_families (
                target_id    VARCHAR NOT NULL,
                family       VARCHAR NOT NULL,
                samples      BIGINT NOT NULL,
                first_seen_ts TIMESTAMP NOT NULL,
                last_seen_ts  TIMESTAMP NOT NULL,
                PRIMARY KEY (target_id, family)
            )
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=4,
        description="results layer: alerts (state history), recommendations (decision records)",
        statements=(
            """
            CREATE TABLE alerts (
                slo                   VARCHAR NOT NULL,
                severity              VARCHAR NOT NULL,
                long_window_s         BIGINT NOT NULL,
                short_window_s        BIGINT NOT NULL,
                state                 VARCHAR NOT NULL,
                changed_ts            TIMESTAMP NOT NULL,
                active_since_ts       TIMESTAMP,
                long_burn_rate        DOUBLE,
                short_burn_rate       DOUBLE,
                burn_threshold        DOUBLE NOT NULL,
                budget_consumed_ratio DOUBLE,
                labels                VARCHAR NOT NULL,
                PRIMARY KEY (slo, long_window_s, short_window_s, changed_ts)
            )
            """,
            """
            CREATE TABLE recommendations (
                created_ts TIMESTAMP NOT NULL,
                name       VARCHAR NOT NULL,
                verdict    VARCHAR NOT NULL,
                record     VARCHAR NOT NULL,
                PRIMARY KEY (name, created_ts)
            )
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=5,
        description="slo_minutes by pool, model and tenant too, so SLO scopes can select them",
        statements=(
            "ALTER TABLE slo_minutes ADD COLUMN pool VARCHAR",
            "ALTER TABLE slo_minutes ADD COLUMN model VARCHAR",
            "ALTER TABLE slo_minutes ADD COLUMN tenant VARCHAR",
            # Recomputed by the next rollup, now with the new columns filled.
            "DELETE FROM rollup_watermarks WHERE source = 'requests'",
        ),
    ),
)


# Migration 6 (superseded by 7 below): points stored in `points_ms` (millisecond timestamps, as
# Prometheus keeps them) and rewritten block by block in (series_id, ts) order once a 2 h block
# was closed; `points` stays the documented (series_id, ts TIMESTAMP, value) relation as a view.
# Its SQL keeps its own 2 h literal: a released migration never changes.
_V6_POINT_BLOCK_SQL = "INTERVAL 2 HOUR"


MIGRATIONS += (
    Migration(
        version=6,
        description="points stored as points_ms (TIMESTAMP_MS) in compacted 2 h blocks; "
        "points is a view; point_blocks tracks blocks awaiting compaction",
        statements=(
            """
            CREATE TABLE points_ms (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP_MS NOT NULL,
                value     DOUBLE
            )
            """,
            f"""
            INSERT INTO points_ms
            SELECT series_id, ts, value FROM points
            ORDER BY time_bucket({_V6_POINT_BLOCK_SQL}, ts), series_id, ts
            """,
            "DROP TABLE points",
            (
                "CREATE VIEW points AS "
                "SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_ms"
            ),
            """
            CREATE TABLE point_blocks (
                block_ts  TIMESTAMP PRIMARY KEY,
                compacted BOOLEAN NOT NULL
            )
            """,
            f"""
            INSERT INTO point_blocks
            SELECT DISTINCT CAST(time_bucket({_V6_POINT_BLOCK_SQL}, ts) AS TIMESTAMP), true
            FROM points_ms
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=7,
        description="points split into points_head (open blocks), point_instants (shared "
        "sample times) and point_rows (compacted blocks); points is a view over them",
        statements=(
            """
            CREATE TABLE points_head (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP_MS NOT NULL,
                value     DOUBLE
            )
            """,
            """
            CREATE TABLE point_instants (
                instant BIGINT NOT NULL,
                ts      TIMESTAMP_MS NOT NULL
            )
            """,
            """
            CREATE TABLE point_rows (
                series_id INTEGER NOT NULL,
                instant   BIGINT NOT NULL,
                value     DOUBLE
            )
            """,
            # Every stored point is compacted now, the open block too: a later point for it
            # reopens the block (`Store._compact_block` merges both).
            "CREATE TEMP TABLE compacting AS SELECT series_id, ts, value FROM points_ms",
            *COMPACT_STATEMENTS,
            # point_blocks listed 2 h blocks; now 1 h ones, all compacted.
            "DELETE FROM point_blocks",
            f"""
            INSERT INTO point_blocks
            SELECT DISTINCT CAST(time_bucket({POINT_BLOCK_SQL}, ts) AS TIMESTAMP), true
            FROM point_instants
            """,
            "DROP VIEW points",
            "DROP TABLE points_ms",
            POINTS_VIEW_SQL,
        ),
    ),
)


# Migration 8 drops the primary key of `requests`: DuckDB keeps such a key in an index over
# every row, which each insert updates and each checkpoint writes out; storing a million spans
# took three times the CPU of an unkeyed table, and the index twice the table's own space.
# `Store.write_requests` deduplicates instead. DuckDB cannot drop a key in place: the rows are
# copied, in their stored order.
MIGRATIONS += (
    Migration(
        version=8,
        description="requests without a primary key index: the write path deduplicates on "
        "(trace_id, span_id) among the stored rows of the batch's completion times",
        statements=(
            """
            CREATE TABLE requests_unkeyed (
                trace_id          VARCHAR NOT NULL,
                span_id           VARCHAR NOT NULL,
                request_id        VARCHAR,
                replica           VARCHAR,
                host              VARCHAR,
                zone              VARCHAR,
                model             VARCHAR,
                pool              VARCHAR,
                tenant            VARCHAR,
                arrival_ts        TIMESTAMP NOT NULL,
                end_ts            TIMESTAMP NOT NULL,
                ok                BOOLEAN NOT NULL,
                error_type        VARCHAR,
                prompt_tokens     BIGINT,
                completion_tokens BIGINT,
                ttft_s            DOUBLE,
                e2e_s             DOUBLE,
                queue_s           DOUBLE,
                prefill_s         DOUBLE,
                decode_s          DOUBLE,
                inference_s       DOUBLE,
                max_tokens        BIGINT,
                emulated          BOOLEAN NOT NULL,
                source            VARCHAR,
                ingested_ts       TIMESTAMP
            )
            """,
            "INSERT INTO requests_unkeyed SELECT * FROM requests",
            "DROP TABLE requests",
            "ALTER TABLE requests_unkeyed RENAME TO requests",
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=9,
        description="requests.conversation_id: the conversation a request belongs to, when "
        "its span names one (gen_ai.conversation.id), for replaying conversations",
        statements=("ALTER TABLE requests ADD COLUMN conversation_id VARCHAR",),
    ),
)


MIGRATIONS += (
    Migration(
        version=10,
        description="scrapes.kind: what served the page (vllm, dcgm, sglang, ...), as its target "
        "said or as its families showed; null when it could not be told",
        statements=("ALTER TABLE scrapes ADD COLUMN kind VARCHAR",),
    ),
)


MIGRATIONS += (
    Migration(
        version=11,
        description="slo_minutes.good_output_tokens and output_tokens: the output tokens of "
        "the good requests and of all requests, the events of token goodput SLOs",
        statements=(
            "ALTER TABLE slo_minutes ADD COLUMN good_output_tokens BIGINT",
            "ALTER TABLE slo_minutes ADD COLUMN output_tokens BIGINT",
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=12,
        description="requests.adapter and slo_minutes.adapter: the LoRA adapter a request "
        "used, so SLIs and SLO scopes can select by it",
        statements=(
            "ALTER TABLE requests ADD COLUMN adapter VARCHAR",
            # Every stored request has no adapter yet, so the stored minutes stay right as
            # they are (null adapter); no recomputation is needed.
            "ALTER TABLE slo_minutes ADD COLUMN adapter VARCHAR",
        ),
    ),
)

MIGRATIONS += (
    Migration(
        version=13,
        description="targets.gpu_uuids: the GPUs a replica was given (its CUDA_VISIBLE_DEVICES "
        "as UUIDs), so DCGM GPUs join replicas that share a host without Kubernetes",
        statements=("ALTER TABLE targets ADD COLUMN gpu_uuids VARCHAR[]",),
    ),
)


MIGRATIONS += (
    Migration(
        version=14,
        description="recorded_points: the SLI series a fleet's Prometheus (or VictoriaMetrics, "
        "Thanos, Mimir) recorded from `servewatch rules sli`, imported as evaluated",
        statements=(
            """
            CREATE TABLE recorded_points (
                source  VARCHAR NOT NULL,
                record  VARCHAR NOT NULL,
                labels  VARCHAR NOT NULL,
                ts      TIMESTAMP NOT NULL,
                value   DOUBLE,
                PRIMARY KEY (source, record, labels, ts)
            )
            """,
        ),
    ),
)


MIGRATIONS += (
    Migration(
        version=15,
        description="rollup_partitions: which compacted Parquet partitions each minute rollup "
        "was computed from, by fingerprint, so an unchanged partition is not read again",
        statements=(
            """
            CREATE TABLE rollup_partitions (
                rollup       VARCHAR NOT NULL,
                partition    VARCHAR NOT NULL,
                fingerprint  VARCHAR NOT NULL,
                rolled_up_ts TIMESTAMP NOT NULL,
                PRIMARY KEY (rollup, partition)
            )
            """,
        ),
    ),
)


LATEST_VERSION = MIGRATIONS[-1].version
