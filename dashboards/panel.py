"""Panel: the face every chart shares: size, a title, a subtitle that says what is drawn and how
it was reduced, time axes in UTC, and chart data that serialises the same way every run.

Times reach the chart as epoch milliseconds on a UTC scale: a browser parses an ISO string
without an offset as local time, so the same report would read differently in another zone.
Floats are rounded to a few significant figures because a day of a large fleet inlines tens of
thousands of values into the HTML; four figures are finer than any axis can show.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import altair as alt
import polars as pl

# Re-exported: every chart orders its labels with the one natural sort.
from servewatch.pipeline.natural_sort import natural_order as natural_order  # noqa: PLC0414

WIDTH_PX = 640
HEIGHT_PX = 220
# Rows of a categorical axis (a replica per row in heatmaps): enough to read a label.
ROW_PX = 14
SIGNIFICANT_FIGURES = 4
# Ratios near 1 (attainment 99.95 % against a 99.9 % objective) need more.
RATIO_FIGURES = 6
# Hours and minutes, and the date where a day starts, so a multi-day axis still says which day.
TIME_LABEL_EXPR = (
    "utcFormat(datum.value, utchours(datum.value) == 0 && utcminutes(datum.value) == 0 "
    "? '%b %d' : '%H:%M')"
)
TOOLTIP_TIME_FORMAT = "%Y-%m-%d %H:%M UTC"
TIME_TITLE = "time (UTC)"

TimeDomain = tuple[datetime, datetime]


def epoch_ms(column: str) -> pl.Expr:
    """A naive-UTC datetime column as integer epoch milliseconds."""
    return pl.col(column).dt.epoch("ms")


def epoch_ms_of(instant: datetime) -> int:
    """An instant (naive means UTC) as epoch milliseconds, exactly as `epoch_ms` maps columns."""
    return int(pl.Series([instant], dtype=pl.Datetime("us")).dt.epoch("ms")[0])


def open_interval_end(rows: pl.DataFrame, *, domain: TimeDomain | None) -> datetime:
    """Where an interval still open (null `end_ts`) is drawn to: the end of the shown window,
    else the latest start or end among `rows`."""
    if domain is not None:
        return domain[1]
    until = datetime(1970, 1, 1)
    for latest in (rows["end_ts"].max(), rows["start_ts"].max()):
        if isinstance(latest, datetime):
            until = max(until, latest)
    return until


def compact(frame: pl.DataFrame, *, figures: int = SIGNIFICANT_FIGURES) -> pl.DataFrame:
    """Float columns rounded to `figures` significant figures, NaN as null (JSON has no NaN)."""
    floats = [name for name, dtype in frame.schema.items() if dtype.is_float()]
    if not floats:
        return frame
    return frame.with_columns(
        pl.col(name).fill_nan(None).round_sig_figs(figures) for name in floats
    )


def time_x(field: str = "ts", *, domain: TimeDomain | None = None, title: str = TIME_TITLE) -> Any:
    scale = alt.Scale(type="utc")
    if domain is not None:
        # Plain epoch numbers as expressions: Vega-Lite turns a temporal `domain` into signals
        # that conflict between layers, and a number given as such into `datetime(ms)`, which
        # Vega's expression interpreter (the page runs without eval) reads as a year.
        scale = alt.Scale(
            type="utc",
            domainMin=alt.ExprRef(str(epoch_ms_of(domain[0]))),
            domainMax=alt.ExprRef(str(epoch_ms_of(domain[1]))),
        )
    return alt.X(
        f"{field}:T",
        title=title,
        scale=scale,
        axis=alt.Axis(labelExpr=TIME_LABEL_EXPR, labelOverlap=True),
    )


def time_tooltip(field: str = "ts", *, title: str = "time") -> Any:
    return alt.Tooltip(f"{field}:T", title=title, format=TOOLTIP_TIME_FORMAT, formatType="utc")


def bucket_span(width_s: float, column: str = "bucket") -> tuple[pl.Expr, pl.Expr]:
    """A time bucket's start and end in epoch ms, `ts` and `ts_end`: a heatmap cell's x, x2."""
    return (
        epoch_ms(column).alias("ts"),
        (epoch_ms(column) + width_s * 1000).alias("ts_end"),
    )


def time_heatmap(
    data: pl.DataFrame,
    *,
    y: Any,
    color: Any,
    tooltip: Sequence[Any],
    domain: TimeDomain | None,
    height_px: int,
) -> Any:
    """Cells from `ts` to `ts_end` (see `bucket_span`) on rows `y`, coloured by `color`; the
    tooltip starts with the cell's time."""
    return (
        data_chart(data)
        .mark_rect()
        .encode(
            time_x(domain=domain),
            alt.X2("ts_end:T"),
            y,
            color,
            tooltip=[time_tooltip(), *tooltip],
        )
        .properties(width=WIDTH_PX, height=height_px)
    )


def titled(chart: Any, *, title: str, subtitle: Sequence[str]) -> Any:
    """The chart with its title and subtitle lines (what is drawn, units, any reduction)."""
    return chart.properties(
        title=alt.TitleParams(text=title, subtitle=list(subtitle), anchor="start")
    )


def duration_label(seconds: int) -> str:
    """5m, 1h, 3d: how SRE tables name windows."""
    for unit_s, suffix in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds % unit_s == 0:
            return f"{seconds // unit_s}{suffix}"
    return f"{seconds}s"


def number_text(value: float) -> str:
    """A number for a subtitle: 0.5, 14.4, 1,200."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def data_chart(frame: pl.DataFrame) -> Any:
    """An Altair chart over the frame's rows, inlined as JSON values.

    Values rather than the frame itself: Altair refuses frames over 5,000 rows unless a
    process-wide setting is changed, and a library must not change it for its caller.
    """
    return alt.Chart(inline_values(frame))


class FrozenRows(alt.InlineData):
    """Inline rows that Altair neither validates when created nor copies on every chart method.

    Built charts are never mutated, so sharing the rows is safe, and a day of a fleet is tens of
    thousands of rows that each `.encode()` and `.properties()` would copy again; the whole
    spec is still validated when it is turned into JSON.
    """

    _class_is_valid_at_instantiation = False

    def __deepcopy__(self, memo: object) -> FrozenRows:
        return self


def inline_values(frame: pl.DataFrame) -> Any:
    return FrozenRows(values=frame.to_dicts())


def series_lines(
    data: pl.DataFrame,
    *,
    y: str,
    y_title: str,
    color: str,
    color_title: str,
    domain: TimeDomain | None,
    order: Sequence[str] | None = None,
    value_format: str = ".4g",
    points: bool = False,
) -> Any:
    """Lines over time (`ts`, epoch ms) per category, with a tooltip carrying the unit."""
    return (
        data_chart(data)
        .mark_line(point=points, strokeWidth=1.5)
        .encode(
            time_x(domain=domain),
            alt.Y(f"{y}:Q", title=y_title),
            alt.Color(f"{color}:N", title=color_title, sort=list(order) if order else None),
            tooltip=[
                time_tooltip(),
                alt.Tooltip(f"{color}:N", title=color_title),
                alt.Tooltip(f"{y}:Q", title=y_title, format=value_format),
            ],
        )
    )


def level_rule(value: float, *, label: str, color: str) -> list[Any]:
    """A dashed horizontal line with its label at the left edge (an SLO limit, a threshold)."""
    frame = pl.DataFrame({"level": [value], "label": [label]})
    rule = data_chart(frame).mark_rule(color=color, strokeDash=[6, 4]).encode(y="level:Q")
    # At the right edge: the left edge is where lines start and labels would sit on them.
    text = (
        data_chart(frame)
        .mark_text(align="right", dy=-6, color=color)
        .encode(y="level:Q", x=alt.value(WIDTH_PX - 4), text="label:N")
    )
    return [rule, text]
