"""Observed demand: what the fleet was asked to serve, measured from its traced requests.

Demand is counted where it arrives: requests by the minute they arrived in, failed ones
included (a request the fleet failed was still asked of it), with every minute of the window
counted, quiet ones as zero, so the mean and the quantiles are of minutes, not of busy minutes.
The first and last minute of the data are left out, since the data may start or end inside
them. From those minutes: the peak and a high quantile of arrivals per minute, the mean, the
peak-to-mean ratio, output and prompt tokens per second at their peak minute, the daily shape
(mean arrivals per minute by hour of day, UTC) and the same figures per pool and per tenant.

A requirement that says `req_per_min = "observed"` is sized on the peak minute (times its
growth); a stated value overrides, with the measured one beside it in the decision record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from servewatch.capacity.figure import Figure, fmt, measured

MINUTE = timedelta(minutes=1)
HIGH_QUANTILE = 0.99
_GROUPS = ("pool", "tenant")


@dataclass(frozen=True)
class GroupDemand:
    """One pool's or tenant's arrivals per minute over the same minutes as the fleet's."""

    by: str
    group: str
    peak_req_per_min: float
    high_req_per_min: float
    mean_req_per_min: float


@dataclass(frozen=True)
class ObservedDemand:
    window_start: datetime
    window_end: datetime  # exclusive: the end of the last minute counted
    minutes: int
    peak_req_per_min: float
    high_req_per_min: float  # the HIGH_QUANTILE of arrivals per minute
    mean_req_per_min: float
    peak_output_tokens_per_s: float
    peak_prompt_tokens_per_s: float
    output_tokens_per_request: float | None
    prompt_tokens_per_request: float | None
    daily_shape: tuple[tuple[int, float], ...]  # (UTC hour, mean req/min), hours observed
    groups: tuple[GroupDemand, ...] = ()

    @property
    def peak_to_mean_ratio(self) -> float | None:
        return self.peak_req_per_min / self.mean_req_per_min if self.mean_req_per_min else None

    def summary(self) -> str:
        ratio = self.peak_to_mean_ratio
        shape = f", peak-to-mean {fmt(ratio)}" if ratio is not None else ""
        return (
            f"peak minute {fmt(self.peak_req_per_min)} req/min (p{HIGH_QUANTILE * 100:g} "
            f"{fmt(self.high_req_per_min)}, mean {fmt(self.mean_req_per_min)}{shape}) over "
            f"{self.minutes} minutes from {self.window_start:%Y-%m-%d %H:%M} to "
            f"{self.window_end:%Y-%m-%d %H:%M} UTC"
        )

    def peak_figure(self) -> Figure:
        """The peak minute as a measured figure, ranged from the high quantile to the peak."""
        return measured(
            self.peak_req_per_min,
            "req/min",
            f"traced arrivals: {self.summary()}",
            low=min(self.high_req_per_min, self.peak_req_per_min),
            high=self.peak_req_per_min,
        )


def minute_arrivals(requests: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """Per group (of `by`) and arrival minute: `arrivals`, `output_tokens`, `prompt_tokens`,
    every minute strictly between the data's first and last minute, quiet ones as zero."""
    minute = pl.col("arrival_ts").dt.truncate("1m").alias("minute_ts")
    counted = requests.group_by(*by, minute).agg(
        arrivals=pl.len().cast(pl.Int64),
        output_tokens=pl.col("completion_tokens").fill_null(0).sum().cast(pl.Int64),
        prompt_tokens=pl.col("prompt_tokens").fill_null(0).sum().cast(pl.Int64),
    )
    minutes = requests.select(
        minute_ts=pl.datetime_range(
            pl.col("arrival_ts").min().dt.truncate("1m") + MINUTE,
            pl.col("arrival_ts").max().dt.truncate("1m") - MINUTE,
            interval="1m",
        )
    )
    grid = minutes.join(requests.select(*by).unique(), how="cross") if by else minutes
    return (
        grid.join(counted, on=[*by, "minute_ts"], how="left")
        .with_columns(pl.col("arrivals", "output_tokens", "prompt_tokens").fill_null(0))
        .sort(*by, "minute_ts")
    )


def _rates(minutes: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    arrivals = pl.col("arrivals").cast(pl.Float64)
    aggregations = [
        arrivals.max().alias("peak"),
        arrivals.quantile(HIGH_QUANTILE, interpolation="higher").alias("high"),
        arrivals.mean().alias("mean"),
    ]
    return minutes.group_by(*by).agg(aggregations).sort(*by) if by else minutes.select(aggregations)


def observed_demand(requests: pl.LazyFrame) -> ObservedDemand | None:
    """The demand `requests` show, or None when they span fewer than three minutes (the first
    and last are left out, so no whole minute would be counted)."""
    frame = requests.select(
        "arrival_ts", "completion_tokens", "prompt_tokens", *_GROUPS
    ).with_columns(pl.col(*_GROUPS).fill_null("(none)"))
    minutes = minute_arrivals(frame).collect()
    if minutes.height == 0:
        return None
    fleet = _rates(minutes.lazy()).collect().row(0, named=True)
    tokens = minutes.select(
        peak_output=pl.col("output_tokens").max() / 60.0,
        peak_prompt=pl.col("prompt_tokens").max() / 60.0,
        arrivals=pl.col("arrivals").sum(),
        output=pl.col("output_tokens").sum(),
        prompt=pl.col("prompt_tokens").sum(),
    ).row(0)
    peak_output, peak_prompt, counted, output, prompt = tokens
    shape = (
        minutes.group_by(hour=pl.col("minute_ts").dt.hour())
        .agg(pl.col("arrivals").cast(pl.Float64).mean())
        .sort("hour")
    )
    groups: list[GroupDemand] = []
    for by in _GROUPS:
        per_group = minute_arrivals(frame, by=[by]).pipe(_rates, by=[by]).collect()
        groups += [
            GroupDemand(by, str(row[by]), row["peak"], row["high"], row["mean"])
            for row in per_group.iter_rows(named=True)
        ]
    first: datetime = minutes.get_column("minute_ts").min()  # type: ignore[assignment]
    last: datetime = minutes.get_column("minute_ts").max()  # type: ignore[assignment]
    return ObservedDemand(
        window_start=first,
        window_end=last + MINUTE,
        minutes=minutes.height,
        peak_req_per_min=fleet["peak"],
        high_req_per_min=fleet["high"],
        mean_req_per_min=fleet["mean"],
        peak_output_tokens_per_s=float(peak_output),
        peak_prompt_tokens_per_s=float(peak_prompt),
        output_tokens_per_request=output / counted if counted else None,
        prompt_tokens_per_request=prompt / counted if counted else None,
        daily_shape=tuple((int(hour), float(mean)) for hour, mean in shape.iter_rows()),
        groups=tuple(groups),
    )
