"""PromQL-exact `histogram_quantile`, `rate` and `increase`, as Prometheus 2.42 computes them.

This module owns the arithmetic users hold our numbers against: each function follows the Go
source of Prometheus 2.42 (promql/quantile.go `bucketQuantile`, promql/functions.go
`extrapolatedRate`) operation by operation, so results agree bit for bit, not only closely.
Two details that look incidental are reproduced on purpose:

- Buckets are ordered with Go 1.19's `sort.Sort` (pattern-defeating quicksort, insertion sort
  up to 12 elements). With NaN bounds the order, and so the result, depends on the order the
  buckets arrive in; duplicate bounds are summed in sorted order.
- Timestamps are whole milliseconds, as Prometheus stores them: inputs in seconds are rounded
  to the nearest millisecond and durations are integer milliseconds divided by 1000.

Scalar forms take plain Python values; the frame forms are `LazyFrame -> LazyFrame` transforms
over many groups or series that agree with the scalar forms (tests hold them to it).
docs/promql.md describes the semantics and how the Prometheus oracle test works.

Size: over 500 lines on purpose: each function mirrors one Go function of Prometheus 2.42 and
they share its helpers (bucket order, extrapolation); promtool is the oracle of them all at
once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import polars as pl

# Go's sort.Sort switches to insertion sort at or below this length.
_GO_MAX_INSERTION = 12
# A group of this name stands in for "no grouping" in the frame forms.
_ALL = "__promql_all__"
_EXTRAPOLATION_SLACK = 1.1  # extrapolate to a window edge closer than 1.1 average intervals


# -- Go semantics the results depend on ------------------------------------------------------


def _go_div(numerator: float, denominator: float) -> float:
    """IEEE division as Go does it: x/0 is +-Inf and 0/0 is NaN, never an exception."""
    if denominator != 0 or math.isnan(denominator):
        return numerator / denominator
    if numerator == 0 or math.isnan(numerator):
        return math.nan
    negative = (math.copysign(1.0, numerator) < 0) != (math.copysign(1.0, denominator) < 0)
    return -math.inf if negative else math.inf


def _go_search(n: int, found: Callable[[int], bool]) -> int:
    """Go's sort.Search: a binary search that assumes `found` is monotonic (it may not be)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if not found(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


class _GoSort:
    """Go 1.19's sort.Sort (pdqsort) over [upper_bound, count] pairs, ordered by bound.

    `less` is Go's `<` on float64: false whenever a NaN is involved, which makes the order of
    NaN bounds depend on the algorithm's exact steps, hence a faithful port.
    """

    def __init__(self, items: list[list[float]]) -> None:
        self.items = items

    def less(self, i: int, j: int) -> bool:
        return self.items[i][0] < self.items[j][0]

    def swap(self, i: int, j: int) -> None:
        items = self.items
        items[i], items[j] = items[j], items[i]

    def sort(self) -> None:
        n = len(self.items)
        if n > 1:
            self._pdqsort(0, n, n.bit_length())

    def _insertion_sort(self, a: int, b: int) -> None:
        for i in range(a + 1, b):
            j = i
            while j > a and self.less(j, j - 1):
                self.swap(j, j - 1)
                j -= 1

    def _sift_down(self, lo: int, hi: int, first: int) -> None:
        root = lo
        while True:
            child = 2 * root + 1
            if child >= hi:
                return
            if child + 1 < hi and self.less(first + child, first + child + 1):
                child += 1
            if not self.less(first + root, first + child):
                return
            self.swap(first + root, first + child)
            root = child

    def _heap_sort(self, a: int, b: int) -> None:
        first, hi = a, b - a
        for i in range((hi - 1) // 2, -1, -1):
            self._sift_down(i, hi, first)
        for i in range(hi - 1, -1, -1):
            self.swap(first, first + i)
            self._sift_down(0, i, first)

    def _pdqsort(self, a: int, b: int, limit: int) -> None:
        was_balanced = True
        was_partitioned = True
        while True:
            length = b - a
            if length <= _GO_MAX_INSERTION:
                self._insertion_sort(a, b)
                return
            if limit == 0:
                self._heap_sort(a, b)
                return
            if not was_balanced:
                self._break_patterns(a, b)
                limit -= 1
            pivot, hint = self._choose_pivot(a, b)
            if hint == _DECREASING:
                self._reverse_range(a, b)
                pivot = (b - 1) - (pivot - a)
                hint = _INCREASING
            if (
                was_balanced
                and was_partitioned
                and hint == _INCREASING
                and self._partial_insertion_sort(a, b)
            ):
                return
            if a > 0 and not self.less(a - 1, pivot):
                a = self._partition_equal(a, b, pivot)
                continue
            mid, already_partitioned = self._partition(a, b, pivot)
            was_partitioned = already_partitioned
            left_len, right_len = mid - a, b - mid
            balance_threshold = length // 8
            if left_len < right_len:
                was_balanced = left_len >= balance_threshold
                self._pdqsort(a, mid, limit)
                a = mid + 1
            else:
                was_balanced = right_len >= balance_threshold
                self._pdqsort(mid + 1, b, limit)
                b = mid

    def _partition(self, a: int, b: int, pivot: int) -> tuple[int, bool]:
        self.swap(a, pivot)
        i, j = a + 1, b - 1
        while i <= j and self.less(i, a):
            i += 1
        while i <= j and not self.less(j, a):
            j -= 1
        if i > j:
            self.swap(j, a)
            return j, True
        self.swap(i, j)
        i += 1
        j -= 1
        while True:
            while i <= j and self.less(i, a):
                i += 1
            while i <= j and not self.less(j, a):
                j -= 1
            if i > j:
                break
            self.swap(i, j)
            i += 1
            j -= 1
        self.swap(j, a)
        return j, False

    def _partition_equal(self, a: int, b: int, pivot: int) -> int:
        self.swap(a, pivot)
        i, j = a + 1, b - 1
        while True:
            while i <= j and not self.less(a, i):
                i += 1
            while i <= j and self.less(a, j):
                j -= 1
            if i > j:
                return i
            self.swap(i, j)
            i += 1
            j -= 1

    def _partial_insertion_sort(self, a: int, b: int) -> bool:
        max_steps, shortest_shifting = 5, 50
        i = a + 1
        for _ in range(max_steps):
            while i < b and not self.less(i, i - 1):
                i += 1
            if i == b:
                return True
            if b - a < shortest_shifting:
                return False
            self.swap(i, i - 1)
            if i - a >= 2:
                for j in range(i - 1, 0, -1):
                    if not self.less(j, j - 1):
                        break
                    self.swap(j, j - 1)
            if b - i >= 2:
                for j in range(i + 1, b):
                    if not self.less(j, j - 1):
                        break
                    self.swap(j, j - 1)
        return False

    def _break_patterns(self, a: int, b: int) -> None:
        length = b - a
        if length < 8:
            return
        state = length
        modulus = 1 << length.bit_length()
        centre = a + (length // 4) * 2
        for idx in range(centre - 1, centre + 2):
            # Go 1.19's xorshift on a uint64: shifts 13, 17, 5.
            state ^= (state << 13) & _U64
            state ^= state >> 17
            state ^= (state << 5) & _U64
            other = state & (modulus - 1)
            if other >= length:
                other -= length
            self.swap(idx, a + other)

    def _choose_pivot(self, a: int, b: int) -> tuple[int, int]:
        shortest_ninther, max_swaps = 50, 4 * 3
        length = b - a
        swaps = [0]
        i, j, k = a + length // 4 * 1, a + length // 4 * 2, a + length // 4 * 3
        if length >= 8:
            if length >= shortest_ninther:
                i = self._median(i - 1, i, i + 1, swaps)
                j = self._median(j - 1, j, j + 1, swaps)
                k = self._median(k - 1, k, k + 1, swaps)
            j = self._median(i, j, k, swaps)
        if swaps[0] == 0:
            return j, _INCREASING
        if swaps[0] == max_swaps:
            return j, _DECREASING
        return j, _UNKNOWN

    def _order2(self, a: int, b: int, swaps: list[int]) -> tuple[int, int]:
        if self.less(b, a):
            swaps[0] += 1
            return b, a
        return a, b

    def _median(self, a: int, b: int, c: int, swaps: list[int]) -> int:
        a, b = self._order2(a, b, swaps)
        b, c = self._order2(b, c, swaps)
        a, b = self._order2(a, b, swaps)
        return b

    def _reverse_range(self, a: int, b: int) -> None:
        i, j = a, b - 1
        while i < j:
            self.swap(i, j)
            i += 1
            j -= 1


_U64 = (1 << 64) - 1
_UNKNOWN, _INCREASING, _DECREASING = 0, 1, 2


# -- histogram_quantile ----------------------------------------------------------------------


def _as_buckets(buckets: Iterable[tuple[float, float]]) -> list[list[float]]:
    pairs: list[list[float]] = []
    for index, item in enumerate(buckets):
        try:
            upper_bound, count = item
            pairs.append([float(upper_bound), float(count)])
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"histogram bucket {index}: expected an (upper_bound, cumulative_count) pair "
                f"of numbers, got {item!r}"
            ) from exc
    return pairs


def _as_quantile(q: float) -> float:
    try:
        return float(q)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"q must be a number (NaN and +-Inf allowed), got {q!r}") from exc


def _coalesce(items: list[list[float]]) -> list[list[float]]:
    """Merge neighbours with equal bounds by summing their counts (input sorted by bound)."""
    merged = [items[0]]
    for bound, count in items[1:]:
        last = merged[-1]
        if bound == last[0]:
            last[1] += count
        else:
            merged.append([bound, count])
    return merged


def _ensure_monotonic(items: list[list[float]]) -> None:
    """Raise counts to the running maximum; NaN counts compare false and stay as they are."""
    running_max = items[0][1]
    for item in items[1:]:
        if item[1] > running_max:
            running_max = item[1]
        elif item[1] < running_max:
            item[1] = running_max


def _prepared(items: list[list[float]]) -> list[list[float]] | None:
    """Sorted, merged, monotonic buckets; None where Prometheus answers NaN for the shape."""
    if not items:
        return None
    _GoSort(items).sort()
    if items[-1][0] != math.inf:
        return None
    items = _coalesce(items)
    _ensure_monotonic(items)
    if len(items) < 2 or items[-1][1] == 0:
        return None
    return items


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile of a classic histogram, as PromQL's histogram_quantile (Prometheus 2.42).

    `buckets` are (upper_bound, cumulative_count) pairs in any order; they are sorted as
    Prometheus sorts them, which only matters for NaN bounds. Returns NaN for q NaN, -Inf for
    q < 0, +Inf for q > 1, NaN when the highest bound is not +Inf, when fewer than two distinct
    bounds remain or when the total count is 0. An empty input gives NaN for q in [0, 1];
    Prometheus emits no sample at all for a group without buckets.
    """
    q = _as_quantile(q)
    items = _as_buckets(buckets)
    special = _special_quantile(q)
    if special is not None:
        return special
    prepared = _prepared(items)
    if prepared is None:
        return math.nan
    rank = q * prepared[-1][1]
    b = _go_search(len(prepared) - 1, lambda i: prepared[i][1] >= rank)
    if b == len(prepared) - 1:
        return prepared[-2][0]
    if b == 0 and prepared[0][0] <= 0:
        return prepared[0][0]
    bucket_start = 0.0
    bucket_end, count = prepared[b]
    if b > 0:
        bucket_start = prepared[b - 1][0]
        count -= prepared[b - 1][1]
        rank -= prepared[b - 1][1]
    return bucket_start + (bucket_end - bucket_start) * _go_div(rank, count)


def _special_quantile(q: float) -> float | None:
    """The answer every group gets when q alone decides it, else None."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    return None


def histogram_quantile_frame(
    buckets: pl.LazyFrame,
    *,
    q: float,
    by: Sequence[str],
    le_column: str = "le",
    count_column: str = "count",
    value_column: str = "quantile",
) -> pl.LazyFrame:
    """One q-quantile per group of `by`: `histogram_quantile` over frames of bucket rows.

    Each row is one bucket: a float upper bound in `le_column` and its cumulative count in
    `count_column`; rows with a null bound or count are ignored, as a missing series would be.
    Returns `by` columns and `value_column`, one row per group that has buckets, sorted by `by`.
    Groups Prometheus would answer independently of row order are computed column-wise;
    the rest (NaN bounds or counts, a bound given three or more times, infinite counts on a
    repeated bound) go through the scalar form in frame row order, as Prometheus takes them
    in series order.
    """
    q = _as_quantile(q)
    keys = list(by) or [_ALL]
    le, count = pl.col(le_column), pl.col(count_column)
    schema = buckets.collect_schema()
    for column in (le_column, count_column):
        if column not in schema or not schema[column].is_numeric():
            raise ValueError(
                f"column {column!r} holds {schema.get(column, 'nothing (it is missing)')}; "
                "expected numbers (parse text `le` labels to floats first)"
            )
    rows = buckets
    if not by:
        rows = rows.with_columns(pl.lit(0).alias(_ALL))
    rows = rows.select(*keys, le.cast(pl.Float64), count.cast(pl.Float64)).drop_nulls(
        [le_column, count_column]
    )
    special = _special_quantile(q)
    if special is not None:
        result = rows.group_by(keys).agg(pl.lit(special, dtype=pl.Float64).alias(value_column))
    else:
        repeats = pl.col("_repeats")
        irregular = (
            le.is_nan().any()
            | count.is_nan().any()
            | (repeats >= 3).any()
            | ((repeats == 2) & count.is_infinite()).any()
        ).over(keys)
        flagged = rows.with_columns(
            # Polars groups -0.0 with 0.0, as Go's == does; adding 0.0 makes that explicit.
            pl.len().over([*keys, le + 0.0]).alias("_repeats")
        ).with_columns(irregular.alias("_irregular"))
        regular = flagged.filter(~pl.col("_irregular")).pipe(
            _quantile_columnwise, q=q, keys=keys, le_column=le_column, count_column=count_column
        )
        fallback = (
            flagged.filter(pl.col("_irregular"))
            .group_by(keys, maintain_order=True)
            .agg(le, count)
            .select(
                *keys,
                pl.struct(le_column, count_column)
                .map_elements(
                    lambda group: histogram_quantile(
                        q, zip(group[le_column], group[count_column], strict=True)
                    ),
                    return_dtype=pl.Float64,
                )
                .alias("_value"),
            )
        )
        result = pl.concat([regular, fallback]).rename({"_value": value_column})
    if not by:
        return result.select(value_column)
    return result.sort(list(by), nulls_last=True)


def _quantile_columnwise(
    rows: pl.LazyFrame, *, q: float, keys: list[str], le_column: str, count_column: str
) -> pl.LazyFrame:
    """bucketQuantile for groups without NaNs and with at most pairs of equal bounds.

    Pairs sum the same in either order and a non-decreasing count column makes the binary
    search a first-match search, so no Go ordering detail can change these answers.
    """
    le, count = pl.col(le_column), pl.col(count_column)
    n, idx = pl.col("_n"), pl.col("_idx")
    bound, mono = pl.col("_bound"), pl.col("_mono")
    prev_bound, prev_mono = pl.col("_prev_bound"), pl.col("_prev_mono")
    rank, b = pl.col("_rank"), pl.col("_b")
    merged = (
        rows.group_by([*keys, (le + 0.0).alias("_le_key")])
        .agg(
            le.first().alias("_bound"),
            # A single count is kept as is: Polars' sum would turn -0.0 into 0.0.
            pl.when(pl.len() == 1)
            .then(count.first())
            .otherwise(count.first() + count.last())
            .alias("_count"),
        )
        .sort([*keys, "_le_key"])
    )
    running_max = pl.col("_count").cum_max().shift(1).over(keys)
    located = (
        merged.with_columns(
            pl.len().over(keys).alias("_n"),
            pl.int_range(pl.len()).over(keys).alias("_idx"),
            (pl.col("_le_key").max().over(keys) == math.inf).alias("_top_is_inf"),
            pl.when(pl.col("_count") < running_max)
            .then(running_max)
            .otherwise(pl.col("_count"))
            .alias("_mono"),
        )
        .with_columns(
            (q * mono.last().over(keys)).alias("_rank"),
            mono.last().over(keys).alias("_total"),
            bound.shift(1).over(keys).alias("_prev_bound"),
            mono.shift(1).over(keys).alias("_prev_mono"),
        )
        .with_columns(
            pl.when((mono >= rank) & rank.is_not_nan() & (idx < n - 1))
            .then(idx)
            .otherwise(None)
            .min()
            .over(keys)
            .fill_null(n - 1)
            .alias("_b")
        )
        .filter(idx == b)
    )
    first_bucket = pl.lit(0.0) + (bound - 0.0) * (rank / mono)
    interpolated = prev_bound + (bound - prev_bound) * ((rank - prev_mono) / (mono - prev_mono))
    value = (
        pl.when(~pl.col("_top_is_inf") | (n < 2) | (pl.col("_total") == 0))
        .then(math.nan)
        .when(b == n - 1)
        .then(prev_bound)
        .when((b == 0) & (bound <= 0))
        .then(bound)
        .when(b == 0)
        .then(first_bucket)
        .otherwise(interpolated)
    )
    return located.select(*keys, value.cast(pl.Float64).alias("_value"))


# -- rate and increase -----------------------------------------------------------------------


def to_milliseconds(seconds: float) -> int:
    """A time in seconds as Prometheus's integer milliseconds (nearest, halves round up)."""
    return math.floor(seconds * 1000 + 0.5)


def _go_duration_seconds(duration_ms: int) -> float:
    """time.Duration.Seconds() of a whole-millisecond duration, rounding exactly as Go does."""
    whole_s, rest_ms = divmod(duration_ms, 1000)
    return float(whole_s) + float(rest_ms * 1_000_000) / 1e9


def _window_samples(
    samples: Sequence[tuple[float, float]], *, start_ms: int, end_ms: int
) -> list[tuple[int, float]]:
    """Samples with start <= ts <= end in time order; of equal timestamps the first is kept."""
    chosen: dict[int, float] = {}
    for index, item in enumerate(samples):
        try:
            ts_s, value = item
            ts_ms, number = to_milliseconds(float(ts_s)), float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(
                f"counter sample {index}: expected a (ts_s, value) pair of numbers with a "
                f"finite timestamp, got {item!r}"
            ) from exc
        if start_ms <= ts_ms <= end_ms:
            chosen.setdefault(ts_ms, number)
    return sorted(chosen.items())


def _extrapolated_delta(
    samples: Sequence[tuple[float, float]],
    *,
    range_start_s: float,
    range_end_s: float,
    is_rate: bool,
) -> float | None:
    """promql/functions.go extrapolatedRate for a counter, as of Prometheus 2.42."""
    try:
        start_ms, end_ms = to_milliseconds(range_start_s), to_milliseconds(range_end_s)
    except (ValueError, OverflowError) as exc:
        raise ValueError(
            f"range_start_s and range_end_s must be finite, got {range_start_s}, {range_end_s}"
        ) from exc
    if end_ms <= start_ms:
        raise ValueError(
            f"range_end_s ({range_end_s}) must be at least 1 ms after "
            f"range_start_s ({range_start_s})"
        )
    points = _window_samples(samples, start_ms=start_ms, end_ms=end_ms)
    if len(points) < 2:
        return None
    (first_ms, first_value), (last_ms, last_value) = points[0], points[-1]
    result = last_value - first_value
    previous = first_value
    for _, value in points[1:]:
        if value < previous:
            # A drop means the counter restarted from zero: what it had counted is kept.
            result += previous
        previous = value
    duration_to_start = (first_ms - start_ms) / 1000
    duration_to_end = (end_ms - last_ms) / 1000
    sampled_interval = (last_ms - first_ms) / 1000
    average_interval = sampled_interval / (len(points) - 1)
    if result > 0 and first_value >= 0:
        # A counter is never negative: do not extrapolate back past its zero point.
        duration_to_zero = sampled_interval * (first_value / result)
        duration_to_start = min(duration_to_start, duration_to_zero)
    threshold = average_interval * _EXTRAPOLATION_SLACK
    extrapolate_to = sampled_interval
    extrapolate_to += duration_to_start if duration_to_start < threshold else average_interval / 2
    extrapolate_to += duration_to_end if duration_to_end < threshold else average_interval / 2
    factor = extrapolate_to / sampled_interval
    if is_rate:
        factor /= _go_duration_seconds(end_ms - start_ms)
    return result * factor


def increase(
    samples: Sequence[tuple[float, float]], *, range_start_s: float, range_end_s: float
) -> float | None:
    """PromQL `increase(counter[range])` evaluated at `range_end_s` (Prometheus 2.42).

    `samples` are (ts_s, value) of one counter series in any order; those with
    range_start_s <= ts <= range_end_s (both inclusive, at millisecond resolution) count.
    A value below its predecessor is a counter reset. The increase is extrapolated towards the
    window edges (at most half an average interval past the samples unless an edge is within
    1.1 average intervals, and never back past the counter's zero point). None when fewer than
    two samples fall in the window: Prometheus emits no sample then.
    """
    return _extrapolated_delta(
        samples, range_start_s=range_start_s, range_end_s=range_end_s, is_rate=False
    )


def rate(
    samples: Sequence[tuple[float, float]], *, range_start_s: float, range_end_s: float
) -> float | None:
    """PromQL `rate(counter[range])`: the extrapolated increase per second of the range.

    Same window and rules as `increase`; the division happens where Prometheus does it, so
    the result is bit-identical to Prometheus rather than to increase / range.
    """
    return _extrapolated_delta(
        samples, range_start_s=range_start_s, range_end_s=range_end_s, is_rate=True
    )


def increase_frame(
    samples: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    series_column: str = "series_id",
    ts_column: str = "ts",
    value_column: str = "value",
) -> pl.LazyFrame:
    """`increase` of every series for every window end: the vectorised form of `increase`.

    Samples are rows of (series, ts, value); ts is a Datetime or epoch seconds. Each window
    ends at one of `window_ends_s` (epoch seconds) and spans `range_s` back, both edges
    inclusive, exactly as `increase(..., range_start_s=end - range_s, range_end_s=end)`.
    Returns `series_column`, `window_end_s` and `increase`, one row per series and window
    holding at least two samples, sorted by series and window end.
    """
    return _extrapolated_frame(
        samples,
        range_s=range_s,
        window_ends_s=window_ends_s,
        series_column=series_column,
        ts_column=ts_column,
        value_column=value_column,
        is_rate=False,
    )


def rate_frame(
    samples: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    series_column: str = "series_id",
    ts_column: str = "ts",
    value_column: str = "value",
) -> pl.LazyFrame:
    """`rate` of every series for every window; as `increase_frame`, column `rate`."""
    return _extrapolated_frame(
        samples,
        range_s=range_s,
        window_ends_s=window_ends_s,
        series_column=series_column,
        ts_column=ts_column,
        value_column=value_column,
        is_rate=True,
    )


def _ts_milliseconds(samples: pl.LazyFrame, ts_column: str) -> pl.Expr:
    dtype = samples.collect_schema()[ts_column]
    ts = pl.col(ts_column)
    if isinstance(dtype, pl.Datetime):
        return (ts.dt.epoch("us") + 500) // 1000
    if dtype.is_numeric():
        return (ts.cast(pl.Float64) * 1000 + 0.5).floor().cast(pl.Int64)
    raise ValueError(
        f"column {ts_column!r} holds {dtype}; expected a Datetime or epoch seconds as numbers"
    )


def _extrapolated_frame(
    samples: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    series_column: str,
    ts_column: str,
    value_column: str,
    is_rate: bool,
) -> pl.LazyFrame:
    range_ms = to_milliseconds(range_s)
    if range_ms <= 0:
        raise ValueError(f"range_s must be at least 0.001 (one millisecond), got {range_s}")
    ends_ms = sorted({to_milliseconds(end) for end in window_ends_s})
    out_column = "rate" if is_rate else "increase"
    series, value = pl.col(series_column), pl.col(value_column).cast(pl.Float64)
    ends = pl.Series("_end_ms", ends_ms, dtype=pl.Int64)
    t_ms, v = pl.col("_t_ms"), pl.col("_v")
    previous = v.shift(1).over(series_column)
    reset_add = (
        pl.when(v.is_not_nan() & previous.is_not_nan() & (v < previous))
        .then(previous)
        .otherwise(0.0)
        .cast(pl.Float64)
    )
    in_windows = (
        samples.select(
            series, _ts_milliseconds(samples, ts_column).alias("_t_ms"), value.alias("_v")
        )
        .drop_nulls(["_t_ms", "_v"])
        .sort([series_column, "_t_ms"], maintain_order=True)
        .unique([series_column, "_t_ms"], keep="first", maintain_order=True)
        .with_columns(
            reset_add.alias("_reset_add"),
            pl.int_ranges(
                pl.lit(ends).search_sorted(t_ms, side="left"),
                pl.lit(ends).search_sorted(t_ms + range_ms, side="right"),
                dtype=pl.Int64,
            ).alias("_k"),
        )
        .explode("_k")
        .drop_nulls("_k")
    )
    window = [series_column, "_k"]
    position = pl.col("_pos")
    windows = (
        in_windows.with_columns(
            pl.len().over(window).alias("_n"),
            pl.int_range(pl.len()).over(window).alias("_pos"),
            t_ms.first().over(window).alias("_t_first"),
            v.first().over(window).alias("_v_first"),
            (v.last() - v.first()).over(window).alias("_delta"),
        )
        # Go adds the reset corrections one by one to (last - first); a cumulative sum keeps
        # that order, where a plain sum would not.
        .with_columns(
            pl.when(position == 0)
            .then(pl.col("_delta"))
            .otherwise(pl.col("_reset_add"))
            .cum_sum()
            .over(window)
            .alias("_result")
        )
        .filter((pl.col("_n") >= 2) & (position == pl.col("_n") - 1))
        .rename({"_t_ms": "_t_last"})
        .join(
            # Each end's seconds divided here, exactly: Polars' division by 1000 can land one
            # ulp off Python's, and callers key their rows by the float they pass.
            pl.LazyFrame(
                {
                    "_k": range(len(ends_ms)),
                    "_end_ms": ends_ms,
                    "window_end_s": [end / 1000 for end in ends_ms],
                },
                schema={"_k": pl.Int64, "_end_ms": pl.Int64, "window_end_s": pl.Float64},
            ),
            on="_k",
        )
    )
    return windows.select(
        series,
        "window_end_s",
        _extrapolated_value(range_ms=range_ms, is_rate=is_rate).alias(out_column),
    ).sort([series_column, "window_end_s"])


def _extrapolated_value(*, range_ms: int, is_rate: bool) -> pl.Expr:
    """The extrapolation of `_extrapolated_delta` as one expression over window columns."""
    result, first_value = pl.col("_result"), pl.col("_v_first")
    start_ms = pl.col("_end_ms") - range_ms
    to_start = _divided(pl.col("_t_first") - start_ms, 1000)
    to_end = _divided(pl.col("_end_ms") - pl.col("_t_last"), 1000)
    sampled = _divided(pl.col("_t_last") - pl.col("_t_first"), 1000)
    average = sampled / (pl.col("_n") - 1).cast(pl.Float64)
    # Polars orders NaN above every number, so NaN is ruled out before each comparison.
    to_zero = sampled * (first_value / result)
    zero_point_applies = (
        result.is_not_nan()
        & first_value.is_not_nan()
        & (result > 0)
        & (first_value >= 0)
        & to_zero.is_not_nan()
        & (to_zero < to_start)
    )
    to_start = pl.when(zero_point_applies).then(to_zero).otherwise(to_start)
    threshold = average * _EXTRAPOLATION_SLACK
    extrapolate_to = (
        sampled
        + pl.when(to_start < threshold).then(to_start).otherwise(average / 2)
        + pl.when(to_end < threshold).then(to_end).otherwise(average / 2)
    )
    factor = extrapolate_to / sampled
    if is_rate:
        factor = _divided(factor, _go_duration_seconds(range_ms))
    return result * factor


def _divided(numerator: pl.Expr, denominator: float) -> pl.Expr:
    """`numerator / denominator` rounded once, as Prometheus's float64 division is.

    Polars turns division by a constant into multiplication by its reciprocal, which is off in
    the last bit for about one value in seven; a denominator built from a column (`_end_ms`,
    present in every window frame) is never folded into a constant, so the division stays true.
    """
    return numerator.cast(pl.Float64) / (pl.col("_end_ms").cast(pl.Float64) * 0.0 + denominator)
