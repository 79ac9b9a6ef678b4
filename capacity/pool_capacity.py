"""Pool capacity: one replica's capacity at the SLO in each pool, measured from what it served.

Replicas of one pool share a model and a GPU shape, so their capacity is one number; pools differ,
and are fitted apart. Per pool: the attainment knee over the pool's minutes (attainment_fit.py),
the same knee per replica (a slow or misrouted replica shows as an outlier), the TTFT and TPOT
latency lines (latency_model.py) and, when asked, the engine model: the step time fitted from the
pool's requests (engine_fit.py) and its knee searched in simulation (knee_search.py).

The estimate is the attainment knee when attainment was seen to cross the target (the engine
model's knee is then a check, flagged when over 15% away); otherwise the knee lies beyond the
highest load observed and the estimate is the engine model's knee (never below the highest
observed load, where attainment still held). Without an engine model it is the lower of the two
latency lines' knees, marked extrapolated; with neither line usable it is unbounded: the data
bounds no capacity.

Capacity is in req/s per replica; in tokens/s it is that rate times the tokens per request the
pool served (decode tokens from completions, prefill tokens from prompts).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from enum import Enum

import polars as pl

from servewatch.capacity.attainment_fit import (
    AttainmentFit,
    AttainmentSpec,
    complete_minutes,
    fit_attainment,
    minute_loads,
    request_outcomes,
)
from servewatch.capacity.capacity_fit import LoadUnit
from servewatch.capacity.conversation_turns import without_continued_prefix
from servewatch.capacity.engine_fit import fit_engine, sampled_decode_steps
from servewatch.capacity.figure import Figure, fmt, measured
from servewatch.capacity.knee_search import (
    KneeSearchSpec,
    ModelKnee,
    replays_conversations,
    search_knee,
)
from servewatch.capacity.latency_model import LatencyModel, fit_tpot, fit_ttft, latency_minutes
from servewatch.capacity.parallel import Mapper, serial_map
from servewatch.capacity.requirement import Requirement
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet_config import RouterPolicy

NO_POOL = "(no pool)"


class CapacityMethod(Enum):
    ATTAINMENT = "attainment crossing"
    ENGINE_MODEL = "engine model knee"
    LATENCY_MODEL = "latency model extrapolation"
    UNBOUNDED = "no knee located"


# The engine model's knee is checked against an observed crossing; further apart than this is
# a flag (one of them misreads the fleet).
MODEL_DISAGREEMENT_RATIO = 0.15
# Resamples for the fits that do not size the fleet (per-replica knees, latency lines beside an
# estimate from a crossing or the engine model): a 90% interval from 100 resamples moves by a
# few percent against 400, which a per-replica outlier or a context line can afford.
OUTLIER_RESAMPLES = 100


@dataclass(frozen=True)
class EngineModelSettings:
    """How the engine model is fitted and searched for every pool (knee_search.py)."""

    router: RouterPolicy
    resamples: int = 24
    limits: EngineParams = field(default_factory=EngineParams)


@dataclass(frozen=True)
class PoolCapacity:
    """One pool's measured capacity per replica; reads as a knee fit (capacity_fit.KneeFit)."""

    pool: str
    attainment: AttainmentFit
    replica_fits: tuple[AttainmentFit, ...]
    ttft_model: LatencyModel | None
    tpot_model: LatencyModel | None
    engine_model: ModelKnee | None = None

    @property
    def binding_model(self) -> LatencyModel | None:
        models = [m for m in (self.ttft_model, self.tpot_model) if m is not None]
        return min(models, key=lambda m: m.knee_rps) if models else None

    @property
    def method(self) -> CapacityMethod:
        if self.attainment.observed:
            return CapacityMethod.ATTAINMENT
        if self.engine_model is not None and self.engine_model.knee_rps > 0:
            return CapacityMethod.ENGINE_MODEL
        model = self.binding_model
        if model is None or math.isinf(model.knee_rps):
            return CapacityMethod.UNBOUNDED
        return CapacityMethod.LATENCY_MODEL

    def _ends(self) -> tuple[float, float, float]:
        fit, floor = self.attainment, self.attainment.load_max
        match self.method:
            case CapacityMethod.ATTAINMENT:
                return fit.knee_load, fit.knee_low_load, fit.knee_high_load
            case CapacityMethod.ENGINE_MODEL:
                engine = self.engine_model
                assert engine is not None  # the method says the engine model drives
                # Attainment held up to the highest observed load: no knee lies below it.
                knee = max(engine.knee_rps, floor)
                return knee, max(engine.low_rps, floor), max(engine.high_rps, knee)
            case CapacityMethod.LATENCY_MODEL:
                model = self.binding_model
                assert model is not None  # the method says a model binds
                knee = max(model.knee_rps, floor)
                return knee, max(model.knee_low_rps, floor), max(model.knee_high_rps, knee)
            case CapacityMethod.UNBOUNDED:
                return math.inf, floor, math.inf

    @property
    def knee_load(self) -> float:
        return self._ends()[0]

    @property
    def knee_low_load(self) -> float:
        return self._ends()[1]

    @property
    def knee_high_load(self) -> float:
        return self._ends()[2]

    @property
    def load_unit(self) -> LoadUnit:
        return LoadUnit.REQ_PER_S

    @property
    def load_min(self) -> float:
        return self.attainment.load_min

    @property
    def load_max(self) -> float:
        return self.attainment.load_max

    @property
    def confidence_ratio(self) -> float:
        return self.attainment.confidence_ratio

    @property
    def points(self) -> int:
        return self.attainment.points

    @property
    def replicas(self) -> int:
        return self.attainment.replicas

    @property
    def data(self) -> str:
        return self.attainment.data

    @property
    def extrapolated(self) -> bool:
        """A knee beyond the observed load that no model of the engine supports."""
        return self.method in (CapacityMethod.LATENCY_MODEL, CapacityMethod.UNBOUNDED)

    @property
    def model_disagreement_ratio(self) -> float | None:
        """The engine model's knee against the observed crossing, when both exist."""
        if self.method is not CapacityMethod.ATTAINMENT or self.engine_model is None:
            return None
        if not self.attainment.knee_load > 0:
            return None
        return self.engine_model.knee_rps / self.attainment.knee_load - 1.0

    @property
    def extrapolation_ratio(self) -> float:
        return self.knee_load / self.load_max if self.load_max > 0 else math.inf

    def decode_tokens_per_s(self, rps: float) -> float:
        return rps * self.attainment.completion_tokens_per_request

    def prefill_tokens_per_s(self, rps: float) -> float:
        return rps * self.attainment.prompt_tokens_per_request

    def summary(self) -> str:
        head = f"pool {self.pool}, {self.method.value}"
        match self.method:
            case CapacityMethod.ATTAINMENT:
                text = f"{head}: {self.attainment.summary()}"
                disagreement = self.model_disagreement_ratio
                if self.engine_model is not None and disagreement is not None:
                    text += (
                        f"; the engine model puts the knee at "
                        f"{fmt(self.engine_model.knee_rps)} req/s ({disagreement:+.0%})"
                    )
                return text
            case CapacityMethod.ENGINE_MODEL:
                engine = self.engine_model
                assert engine is not None
                return (
                    f"{head}: {self.attainment.summary()}; {engine.summary()}; the knee is "
                    f"{self.knee_load / self.load_max:.1f}x the highest observed load"
                    if self.load_max > 0
                    else f"{head}: {engine.summary()}"
                )
            case CapacityMethod.LATENCY_MODEL:
                model = self.binding_model
                assert model is not None
                return (
                    f"{head}: {self.attainment.summary()}; the {model.kind.value} model "
                    f"({model.summary()}) puts it at {fmt(self.knee_load)} req/s, "
                    f"extrapolated {self.extrapolation_ratio:.1f}x the highest observed load"
                )
            case CapacityMethod.UNBOUNDED:
                return (
                    f"{head}: {self.attainment.summary()}; no latency model meets its limit, so "
                    "the data bounds no capacity (extrapolated)"
                )


def pool_capacity_figure(capacity: PoolCapacity, *, rate_form: bool) -> Figure:
    """One replica's capacity as req/min (`rate_form`) or decode tokens/s, ranged over the
    interval; an extrapolated knee's low end is the highest observed load."""
    if math.isinf(capacity.knee_load):
        raise ValueError(
            f"capacity of pool {capacity.pool} ({capacity.data}): attainment held up to "
            f"{fmt(capacity.load_max)} req/s and no latency model meets its limit, so the data "
            "bounds no capacity"
        )
    if not capacity.knee_load > 0:
        raise ValueError(
            f"capacity of pool {capacity.pool} ({capacity.data}): attainment is below "
            f"{capacity.attainment.spec.target_ratio:.0%} at every observed load, so no load "
            "meets the SLO by this fit"
        )
    if rate_form:
        scale, unit, how = 60.0, "req/min", "knee req/s x 60 s"
    else:
        scale = capacity.attainment.completion_tokens_per_request
        unit = "tokens/s"
        how = f"knee req/s x {fmt(scale)} completion tokens per request"
    low, high = capacity.knee_low_load * scale, capacity.knee_high_load * scale
    why = f"{capacity.confidence_ratio:.0%} bootstrap interval over minutes"
    if capacity.method is CapacityMethod.ENGINE_MODEL:
        why = (
            f"{capacity.confidence_ratio:.0%} interval of the engine model's knee over refits on "
            "resampled minutes, widened by the model's own error"
        )
    if capacity.extrapolated:
        low = min(low, capacity.load_max * scale)
        why += (
            f", low end the highest observed load ({fmt(capacity.load_max)} req/s) because the "
            f"knee is extrapolated {capacity.extrapolation_ratio:.1f}x beyond it"
        )
    return measured(
        capacity.knee_load * scale,
        unit,
        f"capacity at the SLO, {how}: {capacity.summary()}; range {why}",
        low=low,
        high=high,
    )


def engine_model_settings(requirement: Requirement) -> EngineModelSettings:
    """The requirement's router and stated engine limits; the emulator's defaults otherwise."""
    limits = EngineParams()
    if requirement.max_num_seqs is not None:
        limits = replace(
            limits,
            max_num_seqs=requirement.max_num_seqs,
            max_num_batched_tokens=max(limits.max_num_batched_tokens, requirement.max_num_seqs),
        )
    return EngineModelSettings(router=requirement.placement.router, limits=limits)


def _pool_column(requests: pl.LazyFrame) -> pl.LazyFrame:
    return requests.with_columns(pl.col("pool").fill_null(NO_POOL))


def model_minutes(
    outcomes: pl.LazyFrame,
    *,
    quantile: float,
    running: pl.LazyFrame | None,
    prefix: pl.LazyFrame | None,
) -> pl.LazyFrame:
    """Per replica-minute: load, latency quantiles, `running_batch` (scraped running requests)
    and `uncached_tokens` per request (scraped prefix-cache queries minus hits, or the traced
    prompt tokens when no cache counters were scraped)."""
    frame = outcomes.pipe(latency_minutes, quantile=quantile)
    on = ["replica", "minute_ts"]
    if running is not None:
        frame = frame.join(
            running.select(*on, running_batch=pl.col("running_requests")), on=on, how="left"
        )
    else:
        frame = frame.with_columns(running_batch=pl.lit(None, dtype=pl.Float64))
    if prefix is not None:
        frame = frame.join(
            prefix.select(*on, uncached=pl.col("queries_tokens") - pl.col("hits_tokens")),
            on=on,
            how="left",
        ).with_columns(
            uncached_tokens=pl.coalesce(
                pl.col("uncached") / (pl.col("load_rps") * 60.0),
                pl.col("prompt_tokens_per_request"),
            )
        )
    else:
        frame = frame.with_columns(uncached_tokens=pl.col("prompt_tokens_per_request"))
    return frame


def _replica_fit(
    item: tuple[str, pl.DataFrame], *, spec: AttainmentSpec, data: str
) -> AttainmentFit | str:
    """One replica's attainment fit, or the note saying why it has none: a unit a `Mapper`
    can spread (a day's replicas each bootstrap their own minutes)."""
    replica, minutes = item
    try:
        return fit_attainment(minutes, spec=spec, group=f"replica {replica}", data=data)
    except ValueError as exc:
        return f"replica {replica}: capacity not fitted: {exc}"


def pool_capacities(
    requests: pl.LazyFrame,
    *,
    spec: AttainmentSpec,
    data: str,
    running: pl.LazyFrame | None = None,
    prefix: pl.LazyFrame | None = None,
    engine_model: EngineModelSettings | None = None,
    mapper: Mapper = serial_map,
) -> tuple[tuple[PoolCapacity, ...], tuple[str, ...]]:
    """Each pool's capacity from traced requests (and scraped per-minute frames where given),
    and notes on pools or models that could not be fitted. With `engine_model`, each pool's
    engine is fitted from its requests and its knee searched in simulation (knee_search.py)."""
    # Materialized once: the minute loads, the latency models and each pool's engine fit all
    # read these rows, and a lazy frame would judge and filter the requests again for each.
    outcomes = (
        requests.filter(pl.col("replica").is_not_null())
        .pipe(_pool_column)
        .pipe(request_outcomes, spec=spec)
        .pipe(complete_minutes)
        .collect()
        .lazy()
    )
    by_pool = outcomes.pipe(minute_loads, by=["pool"]).collect()
    by_replica = outcomes.pipe(minute_loads, by=["pool", "replica"]).collect()
    replica_pools = outcomes.select("replica", "pool").unique()
    # Sorted after the joins, which leave rows in no fixed order: the latency models'
    # bootstraps draw rows by position, so an unfixed order gave another interval each run.
    models = (
        outcomes.pipe(model_minutes, quantile=spec.target_ratio, running=running, prefix=prefix)
        .join(replica_pools, on="replica", how="inner")
        .sort("pool", "replica", "minute_ts")
        .collect()
    )
    notes: list[str] = []
    found: list[PoolCapacity] = []
    for pool in sorted(by_pool.get_column("pool").unique().to_list()):
        minutes = by_pool.filter(pl.col("pool") == pool)
        replicas = by_replica.filter(pl.col("pool") == pool)
        try:
            fit = fit_attainment(minutes, spec=spec, group=f"pool {pool}", data=data)
        except ValueError as exc:
            notes.append(f"pool {pool}: capacity not fitted: {exc}")
            continue
        fit = _with_replica_count(fit, replicas.get_column("replica").n_unique())
        # Per replica the knee shows outliers; fewer resamples bound its interval well enough.
        replica_spec = replace(spec, resamples=min(spec.resamples, OUTLIER_RESAMPLES))
        replica_fits = []
        names = sorted(replicas.get_column("replica").unique().to_list())
        fitted = mapper(
            functools.partial(_replica_fit, spec=replica_spec, data=data),
            [(name, replicas.filter(pl.col("replica") == name)) for name in names],
        )
        for fitted_or_note in fitted:
            if isinstance(fitted_or_note, str):
                notes.append(fitted_or_note)
            else:
                replica_fits.append(fitted_or_note)
        model = None
        if engine_model is not None:
            model = _engine_model(
                outcomes.filter(pl.col("pool") == pool),
                prefix=prefix,
                fit=fit,
                load_rps=float(minutes.get_column("load_rps").mean()),  # type: ignore[arg-type]
                spec=spec,
                settings=engine_model,
                data=data,
                notes=notes,
                mapper=mapper,
            )
        # The latency lines estimate only when neither a crossing nor the engine model does;
        # otherwise they are context, and fewer resamples serve.
        resamples = spec.resamples
        if fit.observed or (model is not None and model.knee_rps > 0):
            resamples = min(resamples, OUTLIER_RESAMPLES)
        pool_models = models.filter(pl.col("pool") == pool)
        ttft = tpot = None
        if spec.ttft_limit_s is not None:
            ttft = fit_ttft(
                pool_models,
                limit_s=spec.ttft_limit_s,
                quantile=spec.target_ratio,
                seed=spec.seed,
                resamples=resamples,
                confidence_ratio=spec.confidence_ratio,
            )
        if spec.tpot_limit_s is not None:
            tpot = fit_tpot(
                pool_models,
                limit_s=spec.tpot_limit_s,
                quantile=spec.target_ratio,
                seed=spec.seed,
                resamples=resamples,
                confidence_ratio=spec.confidence_ratio,
            )
        capacity = PoolCapacity(pool, fit, tuple(replica_fits), ttft, tpot, model)
        disagreement = capacity.model_disagreement_ratio
        if disagreement is not None and abs(disagreement) > MODEL_DISAGREEMENT_RATIO:
            notes.append(
                f"pool {pool}: flag: the engine model's knee "
                f"({fmt(model.knee_rps if model else math.nan)} req/s) is {disagreement:+.0%} "
                f"from the observed crossing ({fmt(fit.knee_load)} req/s), beyond "
                f"{MODEL_DISAGREEMENT_RATIO:.0%}: the crossing is used; the model misreads "
                "this fleet, or the crossing was a transient"
            )
        found.append(capacity)
    return tuple(found), tuple(notes)


def _engine_model(
    outcomes: pl.LazyFrame,
    *,
    prefix: pl.LazyFrame | None,
    fit: AttainmentFit,
    load_rps: float,
    spec: AttainmentSpec,
    settings: EngineModelSettings,
    data: str,
    notes: list[str],
    mapper: Mapper,
) -> ModelKnee | None:
    """One pool's engine model knee, or None with a note saying why not."""
    # Every use below orders what it reads itself (the replay sorts the shapes it draws).
    requests = outcomes.collect()
    hit_ratio = None
    if prefix is not None:
        replicas = requests.select("replica").unique().lazy()
        sums = (
            prefix.join(replicas, on="replica", how="inner")
            .sort("replica", "minute_ts")
            .select(pl.col("hits_tokens").sum(), pl.col("queries_tokens").sum())
            .collect()
        )
        hits, queries = sums.row(0)
        if queries:
            hit_ratio = float(hits) / float(queries)
    try:
        # Replayed conversations run through a prefix cache: the fit's prefill cost must then
        # be per token computed, not per token served with the hits among them.
        fitted = without_continued_prefix(requests) if replays_conversations(requests) else requests
        steps, fitted_on = sampled_decode_steps(fitted)
        engine = fit_engine(
            steps, seed=spec.seed, resamples=settings.resamples, source=f"{data}; {fitted_on}"
        )
        return search_knee(
            engine,
            requests,
            observed_attainment_ratio=fit.attainment_ratio,
            load_rps=load_rps,
            hit_ratio=hit_ratio,
            spec=KneeSearchSpec(
                ttft_limit_s=spec.ttft_limit_s,
                tpot_limit_s=spec.tpot_limit_s,
                target_ratio=spec.target_ratio,
                replicas=fit.replicas,
                router=settings.router,
                seed=spec.seed,
                resamples=settings.resamples,
                confidence_ratio=spec.confidence_ratio,
                limits=settings.limits,
            ),
            mapper=mapper,
        )
    except ValueError as exc:
        notes.append(f"pool {fit.group.removeprefix('pool ')}: engine model not fitted: {exc}")
        return None


def _with_replica_count(fit: AttainmentFit, replicas: int) -> AttainmentFit:
    # Per minute the pool counts replicas that served; the fit reports every replica seen.
    return replace(fit, replicas=replicas)
