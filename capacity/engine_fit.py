"""Engine fit: one replica's step-time model, measured from the requests it served at any load.

A continuous-batching engine (vLLM, SGLang, TensorRT-LLM) runs steps; each step carries one token
for every decoding sequence plus chunks of the prompts being prefilled, and takes about
`a + b x sequences in the step + c x prompt tokens prefilled in it` seconds (Sarathi-Serve's and
Vidur's step model; the emulator's engine is the same shape). The seeds size a replica from that
engine: decode goodput from the batch at which TPOT reaches its limit, prefill from a token rate.
Its terms are observable below the knee, because batch and prefill load vary through every day.

From spans alone (arrival, TTFT, end-to-end latency, token counts: what every engine's traces
carry), per request i on its replica:

- its decode ran `n_i = completion_tokens - 1` steps, from its first token to its last, and took
  `decode_i = e2e - TTFT`;
- the sequences those steps carried: every decoding request j emits tokens at about
  `n_j / decode_j` per second, so the token count of the replica over i's decode interval is the
  integral of the summed emission rates (i's own n_i included); a request whose first token falls
  inside the interval was prefilled in one of those steps and adds one sequence and its prompt;
- so `TPOT_i = a + b x (sequences over i's steps) / n_i + c x (prompt tokens prefilled) / n_i`,
  a linear model fitted by weighted least squares (weight n_i: a long decode averages more steps),
  with b and c held non-negative.

`c` is then the step cost per prompt token as served, cache hits included: a prompt whose prefix
was cached costs its uncached part, so `c` is the true per-token cost times the miss ratio of the
workload seen. The knee search replays that workload with the cache off, so the two agree; a
changed hit ratio is the sizing chain's lever (sizing.py), not this fit's. Attention's cost per
token of context is folded into `b` at the workload's mean context, which holds while the mix of
lengths does.

The interval comes from a bootstrap over replica-minutes (a request belongs to the minute it
arrived in): each resample refits the three terms; thin data gives wide terms, and the knee
search carries them into the capacity's interval.

A busy pool's day holds millions of requests, far more than three terms need. Beyond
`MAX_FIT_REQUESTS`, `sampled_decode_steps` fits on evenly spaced windows of the day (its load
swings kept): each window's requests with their concurrency rebuilt from every request that
overlapped them, so no request in it is seen with a neighbour missing.
"""

from __future__ import annotations

import functools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import polars as pl

from servewatch.capacity.bootstrap import outward_interval
from servewatch.capacity.figure import fmt

MIN_DECODING_REQUESTS = 30
MAX_FIT_REQUESTS = 600_000
FIT_WINDOWS = 12
MIN_MINUTES = 3
_EPOCH_S = pl.col("arrival_ts").dt.epoch("us").cast(pl.Float64) / 1e6


@dataclass(frozen=True)
class StepTime:
    """Seconds per engine step: `base_s + per_seq_s x sequences + per_prefill_token_s x prompt
    tokens prefilled in the step`."""

    base_s: float
    per_seq_s: float
    per_prefill_token_s: float

    def step_s(self, *, sequences: float, prefill_tokens: float = 0.0) -> float:
        return self.base_s + self.per_seq_s * sequences + self.per_prefill_token_s * prefill_tokens

    def summary(self) -> str:
        return (
            f"step = {self.base_s * 1e3:.2f} ms + {self.per_seq_s * 1e6:.1f} us x sequences + "
            f"{self.per_prefill_token_s * 1e6:.2f} us x prefill tokens"
        )


@dataclass(frozen=True)
class EngineFit:
    """The fitted step time with its bootstrap resamples, and what the fit was made from."""

    step: StepTime
    resampled: tuple[StepTime, ...]
    requests: int
    replicas: int
    minutes: int
    mean_batch: float  # sequences per decode step, averaged over the requests' steps
    max_batch: float  # the largest per-request mean batch seen: a lower bound on the limit
    residual_ratio: float  # weighted RMS residual of TPOT over the weighted mean TPOT
    source: str

    def term_interval(self, name: str, confidence_ratio: float) -> tuple[float, float]:
        return outward_interval(sorted(getattr(s, name) for s in self.resampled), confidence_ratio)

    def summary(self) -> str:
        return (
            f"{self.step.summary()} (weighted least squares over {self.requests} decoding "
            f"requests on {self.replicas} replicas, {self.minutes} replica-minutes; TPOT "
            f"residual {self.residual_ratio:.0%}; mean batch {fmt(self.mean_batch)}, largest "
            f"seen {fmt(self.max_batch)})"
        )


def _emission_integral(decoding: pl.LazyFrame) -> pl.LazyFrame:
    """Per replica and event time: `tokens_before`, the integral of the summed token emission
    rates up to that time, and `rate`, the summed rate from it on."""
    events = pl.concat(
        [
            decoding.select("replica", t=pl.col("first_s"), d=pl.col("rate")),
            decoding.select("replica", t=pl.col("end_s"), d=-pl.col("rate")),
        ]
    )
    # Sorted before summing ties, so a float sum sees its terms in one order every run.
    return (
        events.sort("replica", "t", "d")
        .group_by("replica", "t", maintain_order=True)
        .agg(pl.col("d").sum())
        .with_columns(rate=pl.col("d").cum_sum().over("replica"))
        .with_columns(gap_s=pl.col("t").shift(-1).over("replica") - pl.col("t"))
        .with_columns(
            tokens_before=(pl.col("rate") * pl.col("gap_s"))
            .fill_null(0.0)
            .cum_sum()
            .shift(1, fill_value=0.0)
            .over("replica")
        )
        .select("replica", "t", "rate", "tokens_before")
    )


def _prefill_cumulative(served: pl.LazyFrame) -> pl.LazyFrame:
    """Per replica and first-token time: prompts prefilled so far (count and tokens)."""
    return (
        served.group_by("replica", t=pl.col("first_s"))
        .agg(prefills=pl.len().cast(pl.Float64), prompt=pl.col("prompt_tokens").sum())
        .sort("replica", "t")
        .select(
            "replica",
            "t",
            prefills_upto=pl.col("prefills").cum_sum().over("replica"),
            prompt_upto=pl.col("prompt").cast(pl.Float64).cum_sum().over("replica"),
        )
    )


def _at(frame: pl.LazyFrame, table: pl.LazyFrame, *, time: str, suffix: str) -> pl.LazyFrame:
    # The cumulative table's columns at `time`, each name suffixed: its last row at or before
    # that time on the same replica.
    columns = [c for c in table.collect_schema().names() if c != "replica"]
    renamed = table.rename({c: f"{c}{suffix}" for c in columns})
    return frame.sort(time).join_asof(
        renamed.sort(f"t{suffix}"),
        left_on=time,
        right_on=f"t{suffix}",
        by="replica",
        strategy="backward",
        check_sortedness=False,  # sorted by time just above, so within every replica too
    )


def decode_steps(requests: pl.LazyFrame) -> pl.LazyFrame:
    """Per successful request with at least two tokens: `minute_ts`, `steps` (n_i), `tpot_s`,
    `seqs_per_step` and `prefill_tokens_per_step` over its decode steps (module docstring)."""
    served = (
        requests.filter(
            pl.col("ok").fill_null(value=False)
            & pl.col("replica").is_not_null()
            & pl.col("ttft_s").is_not_null()
            & pl.col("e2e_s").is_not_null()
            & (pl.col("e2e_s") >= pl.col("ttft_s"))
        )
        .with_columns(
            first_s=_EPOCH_S + pl.col("ttft_s"),
            end_s=_EPOCH_S + pl.col("e2e_s"),
            steps=(pl.col("completion_tokens").fill_null(1) - 1).cast(pl.Float64),
            prompt_tokens=pl.col("prompt_tokens").fill_null(0),
            minute_ts=pl.col("arrival_ts").dt.truncate("1m"),
        )
        .select("replica", "minute_ts", "first_s", "end_s", "steps", "prompt_tokens")
    )
    decoding = served.filter(
        (pl.col("steps") >= 1) & (pl.col("end_s") > pl.col("first_s"))
    ).with_columns(rate=pl.col("steps") / (pl.col("end_s") - pl.col("first_s")))
    emission = _emission_integral(decoding)
    prefills = _prefill_cumulative(served)

    def tokens(suffix: str) -> pl.Expr:
        time = pl.col("first_s" if suffix == "_first" else "end_s")
        return pl.col(f"tokens_before{suffix}") + pl.col(f"rate{suffix}") * (
            time - pl.col(f"t{suffix}")
        )

    frame = decoding.select("replica", "minute_ts", "first_s", "end_s", "steps")
    for time, suffix in (("first_s", "_first"), ("end_s", "_end")):
        frame = _at(frame, emission, time=time, suffix=suffix)
        frame = _at(frame, prefills, time=time, suffix=f"{suffix}_p")
    return frame.select(
        "replica",
        "minute_ts",
        "steps",
        tpot_s=(pl.col("end_s") - pl.col("first_s")) / pl.col("steps"),
        seqs_per_step=(
            tokens("_end")
            - tokens("_first")
            + pl.col("prefills_upto_end_p").fill_null(0.0)
            - pl.col("prefills_upto_first_p").fill_null(0.0)
        )
        / pl.col("steps"),
        prefill_tokens_per_step=(
            pl.col("prompt_upto_end_p").fill_null(0.0)
            - pl.col("prompt_upto_first_p").fill_null(0.0)
        )
        / pl.col("steps"),
    ).sort(pl.all())


def sampled_decode_steps(
    requests: pl.DataFrame, *, max_requests: int = MAX_FIT_REQUESTS, windows: int = FIT_WINDOWS
) -> tuple[pl.DataFrame, str]:
    """`decode_steps` of all `requests`, or of `windows` evenly spaced windows holding about
    `max_requests` of them; and what was fitted on, in words."""
    if requests.height <= max_requests:
        return decode_steps(requests.lazy()).collect(), f"all {requests.height:,} requests"
    first, last = requests.select(
        first=pl.col("arrival_ts").min().dt.truncate("1m"), last=pl.col("arrival_ts").max()
    ).row(0)
    span = last - first
    # Whole minutes, since a request is fitted in the minute it arrived in.
    width = timedelta(
        minutes=max(1, round(span.total_seconds() / 60 * max_requests / requests.height / windows))
    )
    step = (span - width) / max(windows - 1, 1)
    starts = sorted(
        {first + timedelta(minutes=int((step * i).total_seconds() // 60)) for i in range(windows)}
    )
    # Requests arriving up to the longest end-to-end latency either side overlap the window's.
    longest_s = requests.select(pl.col("e2e_s").max()).item()
    reach = timedelta(seconds=float(longest_s or 0.0))

    def within(column: pl.Expr, margin: timedelta) -> pl.Expr:
        return functools.reduce(
            operator.or_,
            (column.is_between(s - margin, s + width + margin, closed="left") for s in starts),
        )

    steps = (
        decode_steps(requests.lazy().filter(within(pl.col("arrival_ts"), reach)))
        .filter(within(pl.col("minute_ts"), timedelta(0)))
        .collect()
    )
    fitted = requests.select(within(pl.col("arrival_ts"), timedelta(0)).sum()).item()
    return steps, (
        f"{fitted:,} of {requests.height:,} requests, in {len(starts)} windows of "
        f"{width.total_seconds() / 60:.0f} min spread over the data"
    )


@dataclass(frozen=True)
class _Sums:
    """Weighted normal-equation sums over requests, for x = (1, seqs, prefill tokens)."""

    xx: tuple[tuple[float, ...], ...]
    xy: tuple[float, ...]
    yy: float
    w: float
    wy: float


# Per block (replica-minute), the weighted sums the normal equations need, for x = (1, s, p)
# with weight w = decode steps: a bootstrap over blocks then adds up blocks, not requests.
_BLOCK_SUMS = ("w", "ws", "wp", "wss", "wsp", "wpp", "wy", "wsy", "wpy", "wyy")


def _block_sums(frame: pl.DataFrame) -> list[tuple[float, ...]]:
    """One row of `_BLOCK_SUMS` per block, in block order (`frame` sorted by block)."""
    w, y = pl.col("steps"), pl.col("tpot_s")
    s, p = pl.col("seqs_per_step"), pl.col("prefill_tokens_per_step")
    terms = {
        "w": w, "ws": w * s, "wp": w * p, "wss": w * s * s, "wsp": w * s * p, "wpp": w * p * p,
        "wy": w * y, "wsy": w * s * y, "wpy": w * p * y, "wyy": w * y * y,
    }  # fmt: skip
    return (
        frame.group_by("block", maintain_order=True)
        .agg(**{name: term.sum() for name, term in terms.items()})
        .select(_BLOCK_SUMS)
        .rows()
    )


def _sums(blocks: Sequence[tuple[float, ...]], counts: Sequence[int]) -> _Sums:
    """The normal-equation sums of the blocks, each taken `counts[b]` times."""
    t = [0.0] * len(_BLOCK_SUMS)
    for block, count in zip(blocks, counts, strict=True):
        if count:
            for i, value in enumerate(block):
                t[i] += count * value
    w, ws, wp, wss, wsp, wpp, wy, wsy, wpy, wyy = t
    xx = ((w, ws, wp), (ws, wss, wsp), (wp, wsp, wpp))
    return _Sums(xx, (wy, wsy, wpy), wyy, w, wy)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        scale = max(abs(m[r][col]) for r in range(n)) or 1.0
        if abs(m[pivot][col]) <= 1e-12 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(sums: _Sums) -> tuple[float, float, float] | None:
    """Non-negative b and c: terms that come out negative are dropped and the rest refitted
    (an active set over two terms; the base must stay positive)."""
    for free in ((0, 1, 2), (0, 1), (0, 2), (0,)):
        solved = _solve([[sums.xx[i][j] for j in free] for i in free], [sums.xy[i] for i in free])
        if solved is None:
            continue
        coef = [0.0, 0.0, 0.0]
        for i, value in zip(free, solved, strict=True):
            coef[i] = value
        if coef[1] >= 0 and coef[2] >= 0 and coef[0] > 0:
            return coef[0], coef[1], coef[2]
    return None


def _residual_ratio(sums: _Sums, coef: tuple[float, float, float]) -> float:
    # Weighted RSS = yy - 2 c.xy + c' XX c, without a second pass over the rows.
    fitted = sum(coef[i] * sums.xy[i] for i in range(3))
    quad = sum(coef[i] * coef[j] * sums.xx[i][j] for i in range(3) for j in range(3))
    rss = max(0.0, sums.yy - 2 * fitted + quad)
    mean = sums.wy / sums.w
    return math.sqrt(rss / sums.w) / mean if mean > 0 else math.nan


def fit_engine(steps: pl.DataFrame, *, seed: int, resamples: int, source: str) -> EngineFit:
    """The step time from `decode_steps` rows, with a bootstrap over replica-minutes."""
    frame = steps.filter(
        pl.col("tpot_s").is_finite() & pl.col("seqs_per_step").is_finite() & (pl.col("steps") > 0)
    )
    if frame.height < MIN_DECODING_REQUESTS:
        raise ValueError(
            f"{frame.height} successful requests with two or more tokens; the engine fit needs "
            f"at least {MIN_DECODING_REQUESTS}"
        )
    blocks = frame.select("replica", "minute_ts").unique().sort("replica", "minute_ts")
    if blocks.height < MIN_MINUTES:
        raise ValueError(
            f"{blocks.height} replica-minutes of requests; the engine fit needs at least "
            f"{MIN_MINUTES}"
        )
    frame = frame.join(blocks.with_row_index("block"), on=["replica", "minute_ts"]).sort(
        "block", "steps", "tpot_s", "seqs_per_step", "prefill_tokens_per_step"
    )
    sums = _block_sums(frame)
    whole = _sums(sums, [1] * len(sums))
    coef = _least_squares(whole)
    if coef is None:
        raise ValueError(
            "TPOT does not rise with the batch or the prefill load in these requests, and no "
            "positive per-step time fits them"
        )
    rng = random.Random(seed)  # noqa: S311 (a bootstrap, not secrets)
    resampled: list[StepTime] = []
    for _ in range(resamples):
        drawn = [0] * blocks.height
        for _ in range(blocks.height):
            drawn[rng.randrange(blocks.height)] += 1
        fitted = _least_squares(_sums(sums, drawn))
        if fitted is not None:
            resampled.append(StepTime(*fitted))
    seqs = frame.get_column("seqs_per_step")
    weights = frame.get_column("steps")
    return EngineFit(
        step=StepTime(*coef),
        resampled=tuple(resampled),
        requests=frame.height,
        replicas=frame.get_column("replica").n_unique(),
        minutes=blocks.height,
        mean_batch=float((seqs * weights).sum()) / float(weights.sum()),
        max_batch=float(seqs.max()),  # type: ignore[arg-type]
        residual_ratio=_residual_ratio(whole, coef),
        source=source,
    )
