"""The store: the one package that holds SQL connections (DuckDB) and owns the schema.

One module per concept: `migrations` (the schema's history), `points` and `compaction` (the
scrape write path and its blocks), `requests` (the span write path), `rollups` and
`rollup_job` (minute rollups, kept up to date incrementally), `partitions` and
`partition_rollups` (compacted Parquet partitions of requests, and rollups read from them),
`results` (alerts, recommendations, rejected input), `reads` and `export` (tables to Parquet).
`Store` assembles them.
"""

from servewatch.store.compaction import CompactionReport
from servewatch.store.connection import Clock, utc_now
from servewatch.store.errors import (
    SchemaTooNewError,
    StoreBusyError,
    StoreDamagedError,
    StoreError,
    StoreMissingError,
    StorePathError,
    damage_error,
)
from servewatch.store.export import EXPORT_TABLES, ExportedFile, ExportError
from servewatch.store.holder import Holder, read_holder, remove_holder, write_holder
from servewatch.store.partition_rollups import PartitionRollupReport
from servewatch.store.partitions import PartitionError, PartitionWriter, PartitionWritten
from servewatch.store.rollup_job import (
    RollupReport,
    roll_up_request_minutes,
    roll_up_requests,
    roll_up_slo_minutes,
)
from servewatch.store.rollups import GoodEventLimits, MinuteRollupSwap
from servewatch.store.store import IN_MEMORY, Store

__all__ = [
    "EXPORT_TABLES",
    "IN_MEMORY",
    "Clock",
    "CompactionReport",
    "ExportError",
    "ExportedFile",
    "GoodEventLimits",
    "Holder",
    "MinuteRollupSwap",
    "PartitionError",
    "PartitionRollupReport",
    "PartitionWriter",
    "PartitionWritten",
    "RollupReport",
    "SchemaTooNewError",
    "Store",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreError",
    "StoreMissingError",
    "StorePathError",
    "damage_error",
    "read_holder",
    "remove_holder",
    "roll_up_request_minutes",
    "roll_up_requests",
    "roll_up_slo_minutes",
    "utc_now",
    "write_holder",
]
