"""Column contracts: the columns each chart builder takes, checked before anything is drawn.

A builder accepts any producer's frame (traces today, metric rollups tomorrow) as long as it has
the documented columns; extra columns are ignored. A frame that does not fit fails with the
chart's name, what is missing or mistyped, and the full contract, not deep inside Altair.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import polars as pl


class ColumnKind(Enum):
    TIME = "time"
    NUMBER = "number"
    TEXT = "text"
    FLAG = "flag"

    def accepts(self, dtype: pl.DataType) -> bool:
        if self is ColumnKind.TIME:
            return isinstance(dtype, pl.Datetime)
        if self is ColumnKind.NUMBER:
            return dtype.is_numeric()
        if self is ColumnKind.FLAG:
            return dtype == pl.Boolean()
        return dtype in (pl.String(), pl.Categorical()) or isinstance(dtype, pl.Enum)


@dataclass(frozen=True)
class Column:
    name: str
    kind: ColumnKind
    meaning: str

    def describe(self) -> str:
        return f"{self.name} ({self.kind.value}: {self.meaning})"


@dataclass(frozen=True)
class FrameContract:
    """What one chart builder reads: required columns, then optional ones it uses if present."""

    chart: str
    columns: tuple[Column, ...]
    optional: tuple[Column, ...] = ()

    def describe(self) -> str:
        required = "; ".join(c.describe() for c in self.columns)
        if not self.optional:
            return required
        return f"{required}; optional: {'; '.join(c.describe() for c in self.optional)}"

    def select(self, frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
        """The contract's columns of `frame` (optional ones when present), collected."""
        lazy = frame.lazy()
        schema = lazy.collect_schema()
        missing = [c.name for c in self.columns if c.name not in schema]
        if missing:
            raise ValueError(
                f"{self.chart}: the frame lacks column(s) {', '.join(missing)} "
                f"(it has {', '.join(schema.names()) or 'none'}); expected {self.describe()}"
            )
        present = [*self.columns, *(c for c in self.optional if c.name in schema)]
        for column in present:
            dtype = schema[column.name]
            if not column.kind.accepts(dtype):
                raise ValueError(
                    f"{self.chart}: column {column.name} is {dtype}; allowed: a "
                    f"{column.kind.value} column ({column.meaning})"
                )
        return lazy.select(c.name for c in present).collect()


def time_column(name: str = "minute_ts", meaning: str = "start of the minute, naive UTC") -> Column:
    return Column(name, ColumnKind.TIME, meaning)


MINUTE_TS = time_column()
REPLICA = Column("replica", ColumnKind.TEXT, "replica name")
