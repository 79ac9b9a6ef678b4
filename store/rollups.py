"""Minute rollups in SQL: `request_minutes` and `slo_minutes` recomputed for given minutes and
swapped in with their watermark in one transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import duckdb
import polars as pl

from servewatch.pipeline.request_minutes import MINUTE_LATENCIES, MINUTE_PERCENTILES
from servewatch.pipeline.request_sli import TPOT_SQL
from servewatch.pipeline.tables import (
    REQUEST_MINUTES_SCHEMA,
    REQUESTS_SCHEMA,
    SLO_MINUTES_SCHEMA,
)
from servewatch.store.connection import StoreBase
from servewatch.store.errors import StoreError
from servewatch.store.sql import column_list


class GoodEventLimits(Protocol):
    """What the store needs of an SLO's good-event criterion
    (`pipeline.request_minutes.EventCriterion`): inclusive limits, None when unconstrained."""

    @property
    def name(self) -> str: ...
    @property
    def ttft_limit_s(self) -> float | None: ...
    @property
    def tpot_limit_s(self) -> float | None: ...
    @property
    def e2e_limit_s(self) -> float | None: ...


# Bump when request_minutes' computation changes, so stored minutes are recomputed once.
REQUEST_MINUTES_VERSION = "request_minutes/1"
# The same for slo_minutes (2: output tokens of good and of all requests, migration 11).
SLO_MINUTES_VERSION = "slo_minutes/2"


def criteria_fingerprint(criteria: Sequence[GoodEventLimits]) -> str:
    """What `slo_minutes` was rolled up for: a change of criteria, or of the computation
    (`SLO_MINUTES_VERSION`), recomputes it."""
    text = "|".join([SLO_MINUTES_VERSION, *sorted(repr(c) for c in criteria)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The relation the rollups read requests from unless told otherwise.
REQUESTS_RELATION = "requests"

# A SQL statement and its parameters.
Statement = tuple[str, Sequence[object]]

_ROLLUP_SCHEMAS = {"request_minutes": REQUEST_MINUTES_SCHEMA, "slo_minutes": SLO_MINUTES_SCHEMA}


@dataclass(frozen=True)
class MinuteRollupSwap:
    """What one swap of a minute rollup put in place: the distinct minutes its new rows cover
    and the requests they count."""

    minutes: int
    requests: int


class MinuteRollups(StoreBase):
    """Recomputes minute rollups where the rows are and swaps them in with their watermark."""

    def watermark(self, source: str) -> tuple[datetime | None, str | None]:
        """(watermark_ts, fingerprint) of a rollup source; (None, None) before its first run."""
        rows = self._con.execute(
            "SELECT watermark_ts, fingerprint FROM rollup_watermarks WHERE source = ?", [source]
        ).fetchall()
        return (rows[0][0], rows[0][1]) if rows else (None, None)

    def rollup_is_current(self, table: str, *, fingerprint: str) -> bool:
        """Whether the rollup holds every stored request, computed as `fingerprint` says:
        its last run had that fingerprint and no request was stored since."""
        watermark_ts, stored = self.watermark(table)
        if stored != fingerprint and watermark_ts is not None:
            return False
        since = "" if watermark_ts is None else " WHERE ingested_ts >= ?"
        rows = self._con.execute(
            f"SELECT EXISTS (SELECT 1 FROM requests{since})",
            [] if watermark_ts is None else [watermark_ts],
        ).fetchall()
        return not rows[0][0]

    def minutes_ingested_since(self, since_ts: datetime | None) -> list[datetime]:
        """Minutes (of completion) touched by requests ingested at or after `since_ts` (all
        minutes when None)."""
        clause, params = ("WHERE ingested_ts >= ?", [since_ts]) if since_ts else ("", [])
        rows = self._con.execute(
            f"SELECT DISTINCT date_trunc('minute', end_ts) AS m FROM requests {clause} ORDER BY m",
            params,
        ).fetchall()
        return [row[0] for row in rows]

    def read_requests_in_minutes(self, minutes: Sequence[datetime]) -> pl.LazyFrame:
        """All requests that finished in any of the given minutes."""
        wanted = pl.DataFrame({"m": list(minutes)}, schema={"m": pl.Datetime("us")})
        self._con.register("wanted_minutes", wanted.to_arrow())
        try:
            return self._read(
                f"SELECT {column_list(REQUESTS_SCHEMA)} FROM requests "
                "WHERE date_trunc('minute', end_ts) IN (SELECT m FROM wanted_minutes) "
                "ORDER BY end_ts",
                table="requests",
            )
        finally:
            self._con.unregister("wanted_minutes")

    def recompute_request_minutes(
        self,
        minutes: Sequence[datetime] | None,
        *,
        watermark_ts: datetime,
        fingerprint: str,
        source: str = REQUESTS_RELATION,
        also: Sequence[Statement] = (),
    ) -> MinuteRollupSwap:
        """Recompute `request_minutes` (`pipeline.request_minutes.request_minutes`) for the
        requests that finished in `minutes` (all minutes when None) and swap them in with the
        new watermark (see `_swap_minute_rollup`). `source` is the relation the requests are
        read from (the `requests` table, or compacted Parquet partitions); `also` runs in the
        swap's transaction."""
        # The percentiles `pipeline.request_minutes` defines, as DuckDB computes them.
        fractions = ", ".join(repr(p / 100) for p in MINUTE_PERCENTILES)
        expressions = {"tpot_s": f"({TPOT_SQL})"}
        latency = ", ".join(
            f"quantile_cont({expressions.get(column, column)}, [{fractions}]) AS {stem}_q"
            for column, stem in MINUTE_LATENCIES
        )
        picked = ", ".join(
            f"{stem}_q[{i}] AS {stem}_p{p}_s"
            for _, stem in MINUTE_LATENCIES
            for i, p in enumerate(MINUTE_PERCENTILES, start=1)
        )
        with self._wanted_minutes(minutes) as (where, params):
            # Successful and failed requests (`ok` is never null) in two passes joined per
            # replica-minute: per-aggregate FILTERs on one pass cost more than the failed
            # requests' own small pass (~4 % of the full day's rollup).
            scoped = f"{where} AND" if where else " WHERE"
            sql = f"""
                WITH succeeded AS (
                    SELECT replica, date_trunc('minute', end_ts) AS minute_ts,
                           count(*) AS requests, sum(prompt_tokens) AS prompt_tokens,
                           sum(completion_tokens) AS completion_tokens, {latency}
                    FROM {source}{scoped} ok
                    GROUP BY ALL
                ),
                failed AS (
                    SELECT replica, date_trunc('minute', end_ts) AS minute_ts,
                           count(*) AS requests
                    FROM {source}{scoped} NOT ok
                    GROUP BY ALL
                )
                SELECT coalesce(s.replica, f.replica) AS replica,
                       coalesce(s.minute_ts, f.minute_ts) AS minute_ts,
                       coalesce(s.requests, 0) + coalesce(f.requests, 0) AS requests,
                       coalesce(f.requests, 0) AS failed_requests,
                       coalesce(s.prompt_tokens, 0)::BIGINT AS prompt_tokens,
                       coalesce(s.completion_tokens, 0)::BIGINT AS completion_tokens, {picked}
                FROM succeeded AS s FULL JOIN failed AS f
                    ON s.minute_ts = f.minute_ts AND s.replica IS NOT DISTINCT FROM f.replica
                ORDER BY minute_ts, replica NULLS LAST
            """
            return self._swap_minute_rollup(
                "request_minutes",
                minutes,
                select=(sql, [*params, *params]),
                requests=("sum(requests)", []),
                watermark_ts=watermark_ts,
                fingerprint=fingerprint,
                also=also,
            )

    def recompute_slo_minutes(
        self,
        minutes: Sequence[datetime] | None,
        *,
        criteria: Sequence[GoodEventLimits],
        watermark_ts: datetime,
        fingerprint: str,
        source: str = REQUESTS_RELATION,
        also: Sequence[Statement] = (),
    ) -> MinuteRollupSwap:
        """Recompute `slo_minutes` (`pipeline.request_minutes.slo_minutes`) for `criteria`, for
        the requests that finished in `minutes` (all minutes when None), in one pass for every
        criterion, and swap them in with the new watermark (see `_swap_minute_rollup`). Rows go
        in minute order (what the table's zone maps want). `source` and `also` as for
        `recompute_request_minutes`."""
        select: tuple[str, list[object]] | None = None
        with self._wanted_minutes(minutes) as (where, params):
            if criteria:
                goods: list[str] = []
                limit_params: list[object] = []
                for index, criterion in enumerate(criteria):
                    condition = "ok"
                    limits: list[object] = []
                    for column, limit in (
                        ("ttft_s", criterion.ttft_limit_s),
                        (f"coalesce({TPOT_SQL}, 0)", criterion.tpot_limit_s),
                        ("e2e_s", criterion.e2e_limit_s),
                    ):
                        if limit is not None:
                            condition += f" AND {column} <= ?"
                            limits.append(float(limit))
                    # The good requests and their output tokens: the condition twice.
                    goods.append(f"count(*) FILTER (WHERE {condition}) AS good_{index}")
                    goods.append(
                        f"coalesce(sum(completion_tokens) FILTER (WHERE {condition}), 0) "
                        f"AS good_tokens_{index}"
                    )
                    limit_params.extend([*limits, *limits])
                per_slo = " UNION ALL ".join(
                    f"SELECT minute_ts, ?::VARCHAR AS slo, replica, good_{index} AS good, total, "
                    f"pool, model, tenant, good_tokens_{index} AS good_output_tokens, "
                    "output_tokens, adapter FROM grouped"
                    for index in range(len(criteria))
                )
                sql = f"""
                    WITH grouped AS (
                        SELECT date_trunc('minute', end_ts) AS minute_ts, replica, pool, model,
                               tenant, adapter, count(*) AS total,
                               coalesce(sum(completion_tokens), 0) AS output_tokens,
                               {", ".join(goods)}
                        FROM {source}{where}
                        GROUP BY ALL
                    )
                    SELECT * FROM ({per_slo})
                    ORDER BY minute_ts
                """
                names = [criterion.name for criterion in criteria]
                select = (sql, [*limit_params, *params, *names])
            # Every criterion counts every request; the first one's totals are the requests.
            first = criteria[0].name if criteria else None
            return self._swap_minute_rollup(
                "slo_minutes",
                minutes,
                select=select,
                requests=("sum(total) FILTER (WHERE slo = ?)", [first]),
                watermark_ts=watermark_ts,
                fingerprint=fingerprint,
                also=also,
            )

    @contextmanager
    def _wanted_minutes(
        self, minutes: Sequence[datetime] | None
    ) -> Iterator[tuple[str, list[object]]]:
        """A WHERE clause selecting requests that finished in `minutes` (all when None). The
        range on end_ts lets DuckDB skip row groups by their min/max (requests are stored
        roughly in completion order), so recomputing a few minutes does not scan history.
        Registers `wanted_minutes` (one column, `m`) while open, for the swap's delete."""
        if minutes is None:
            yield "", []
            return
        if not minutes:
            yield " WHERE false", []
            return
        wanted = pl.DataFrame({"m": list(minutes)}, schema={"m": pl.Datetime("us")})
        self._con.register("wanted_minutes", wanted.to_arrow())
        try:
            where = (
                " WHERE end_ts >= ? AND end_ts < ? "
                "AND date_trunc('minute', end_ts) IN (SELECT m FROM wanted_minutes)"
            )
            yield (where, [min(minutes), max(minutes) + timedelta(minutes=1)])
        finally:
            self._con.unregister("wanted_minutes")

    def _swap_minute_rollup(
        self,
        table: str,
        minutes: Sequence[datetime] | None,
        *,
        select: tuple[str, list[object]] | None,
        requests: tuple[str, list[object]],
        watermark_ts: datetime,
        fingerprint: str,
        also: Sequence[Statement] = (),
    ) -> MinuteRollupSwap:
        """Replace a minute rollup's rows for `minutes` (all rows when None) by those `select`
        computes (none when None) and move its watermark, in one transaction, so a crash leaves
        either the old or the new state. `wanted_minutes` must be registered when `minutes` is
        given. The rows go from the query straight into the table: a day's worth of them never
        crosses into Python. `requests` is the aggregate over the new rows that counts the
        requests they hold. `also` (statements with their parameters) commits or rolls back
        with the swap: what a caller records about the rows it swapped in."""
        schema = _ROLLUP_SCHEMAS.get(table)
        if schema is None:
            raise StoreError(f"not a minute rollup: {table!r}; allowed: {sorted(_ROLLUP_SCHEMAS)}")
        if minutes is None:
            scope, scope_params = "", []
        elif minutes:
            # The range lets DuckDB skip row groups of history by their min/max.
            scope = (
                " WHERE minute_ts BETWEEN ? AND ? AND minute_ts IN (SELECT m FROM wanted_minutes)"
            )
            scope_params = [min(minutes), max(minutes)]
        else:
            scope, scope_params = " WHERE false", []
        columns = column_list(schema)
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(f"DELETE FROM {table}{scope}", scope_params)
            if select is not None:
                sql, params = select
                self._con.execute(
                    f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ({sql})", params
                )
            requests_sql, requests_params = requests
            # An aggregate without GROUP BY: exactly one row.
            ((minutes_count, requests_count),) = self._con.execute(
                f"SELECT count(DISTINCT minute_ts), coalesce({requests_sql}, 0) "
                f"FROM {table}{scope}",
                [*requests_params, *scope_params],
            ).fetchall()
            self._con.execute(
                """
                INSERT INTO rollup_watermarks VALUES (?, ?, ?, ?)
                ON CONFLICT (source) DO UPDATE SET watermark_ts = excluded.watermark_ts,
                    fingerprint = excluded.fingerprint, updated_ts = excluded.updated_ts
                """,
                [table, watermark_ts, fingerprint, self._clock()],
            )
            for statement, statement_params in also:
                self._con.execute(statement, statement_params)
            self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(f"replacing {table} in {self.path} failed: {exc}") from exc
        return MinuteRollupSwap(minutes=int(minutes_count), requests=int(requests_count))
