"""Decision record: the recommendation with every number and its source, as JSON and Markdown.

Seed 000: "A design interview should end with a checkable decision record." It holds the
requirement, the measured capacity with its interval, the sizing chain step by step, the failure
table, the recommended fleet and its cost (and what the reserve costs), the riskiest assumption
with a measurement plan that could disprove the answer, and every input with its source. The
JSON form is what the store keeps and scripts read; the Markdown form is for the design review.
Non-finite numbers (an unbounded interval end) are `null` in JSON and "unbounded" in Markdown.

Size: over 500 lines on purpose: the record's JSON and Markdown are two renderings of one
document that change together; a field in one and not the other is what a split would invite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from servewatch.capacity.cache_hit_rate import HitRatioSpread
from servewatch.capacity.capacity_fit import CapacityFit, KneeFit
from servewatch.capacity.cost import AutoscaledFleet, CostLines, cost_lines, usd_text
from servewatch.capacity.demand import TokenDemand
from servewatch.capacity.failure_table import FailureRow
from servewatch.capacity.figure import Figure, Step, derived, fmt
from servewatch.capacity.fleet_drills import FleetDrills
from servewatch.capacity.fleet_size import FleetSize
from servewatch.capacity.knee_search import ModelKnee
from servewatch.capacity.latency_model import LatencyModel
from servewatch.capacity.observed_demand import ObservedDemand
from servewatch.capacity.placement import NO_LAYOUT, FailureUnit, Layout
from servewatch.capacity.pool_capacity import PoolCapacity
from servewatch.capacity.requirement import Requirement, figures
from servewatch.capacity.risk import RiskAssessment

SCHEMA = "servewatch.decision_record/1"


@dataclass(frozen=True)
class DecisionRecord:
    requirement: Requirement
    created_at: datetime
    fleet: FleetSize
    risk: RiskAssessment
    capacity_fit: KneeFit | None = None
    hit_ratio: HitRatioSpread | None = None
    layout: Layout = NO_LAYOUT
    notes: tuple[str, ...] = ()
    pools: tuple[PoolCapacity, ...] = ()
    observed_demand: ObservedDemand | None = None
    autoscaled: AutoscaledFleet | None = None
    drills: FleetDrills | None = None

    @property
    def recommended(self) -> FailureRow | None:
        """The smallest fleet whose drill holds when drilled, else the table's minimum."""
        if self.drills is not None:
            return None if self.drills.recommended is None else self.drills.recommended.row
        return self.fleet.table.minimum

    @property
    def feasible(self) -> bool:
        return self.recommended is not None

    def requirement_sentence(self) -> str:
        req = self.requirement
        demand = self.fleet.demand.req_per_min
        unit = req.failure_unit
        headroom = req.headroom_ratio.value
        carry = f"{demand.text()}" + (f" plus {headroom:.0%} headroom" if headroom else "")
        if unit is FailureUnit.NONE:
            return f"Carry {carry} at the SLO; no failure is in scope."
        return (
            f"Carry {carry} at the SLO after losing one {unit.value}, counting no replacement "
            f"for the first {req.recovery.interval_s.text()}."
        )

    def cost_figures(self) -> tuple[Figure, Figure] | None:
        """Monthly cost of the recommended fleet and of its failure reserve, with sources."""
        row, cost = self.recommended, self.requirement.cost
        if row is None or cost.usd_per_gpu_hour is None or row.usd_per_month is None:
            return None
        healthy = self.fleet.table.healthy_minimum
        healthy_replicas = healthy.replicas if healthy is not None else 0
        gpus = self.requirement.replica.gpus
        per = f"{gpus} GPUs x {cost.usd_per_gpu_hour.text()} x {cost.hours_per_month.text()}"
        total = derived(row.usd_per_month, "usd/month", f"{row.replicas} replicas x {per}")
        reserve = derived(
            row.reserve_usd_per_month or 0.0,
            "usd/month",
            f"({row.replicas} - {healthy_replicas} replicas that meet healthy demand) x {per}",
        )
        return total, reserve

    def cost_lines(self) -> CostLines | None:
        """The recommended fleet's $/hour, $/month, $ per million output tokens at the demand,
        and $ per user-month when users are stated; None without a GPU price."""
        row, cost = self.recommended, self.requirement.cost
        if row is None or cost.usd_per_gpu_hour is None:
            return None
        demand = self.fleet.demand
        # The token model gives the decode rate; a request rate needs the observed answers.
        tokens = demand.decode_tokens_per_s
        observed = self.observed_demand
        if tokens is None and observed is not None and observed.output_tokens_per_request:
            tokens = derived(
                demand.req_per_min.value / 60 * observed.output_tokens_per_request,
                "tokens/s",
                f"{demand.req_per_min.text()} / 60 s x {fmt(observed.output_tokens_per_request)} "
                "output tokens per observed request",
            )
        stated = self.requirement.demand
        return cost_lines(
            replicas=row.replicas,
            gpus_per_replica=self.requirement.replica.gpus,
            usd_per_gpu_hour=cost.usd_per_gpu_hour,
            hours_per_month=cost.hours_per_month,
            output_tokens_per_s=tokens,
            users=stated.concurrent_users if isinstance(stated, TokenDemand) else None,
            autoscaled=self.autoscaled,
        )

    def verdict(self) -> str:
        row, table = self.recommended, self.fleet.table
        if row is None:
            reason = table.infeasible_reason
            if self.drills is not None and self.drills.reason is not None:
                reason = self.drills.reason
            return f"The requirement cannot be met: {reason}."
        unit = table.spec.unit.value
        chain = self.fleet.chain
        gpus = row.replicas * self.requirement.replica.gpus
        text = (
            f"{row.hosts} hosts ({row.replicas} replicas, {gpus} GPUs, in {row.zones} "
            f"zone{'s' if row.zones != 1 else ''}) meet the requirement: "
            f"the demand needs {fmt(chain.replicas_with_headroom.value)} replicas' worth of "
            f"capacity ({chain.binding.value} binds)"
        )
        if self.requirement.failure_unit is not FailureUnit.NONE:
            text += (
                f", and after losing one {self.requirement.failure_unit.value} the survivors keep "
                f"{fmt(row.failed_capacity)} {unit} against {fmt(table.spec.demand_rate)} {unit}"
            )
        text += (
            f". Admit at most {fmt(row.max_admission)} {unit} to keep that promise (healthy "
            f"capacity is {fmt(row.healthy_capacity)} {unit})."
        )
        drills = self.drills
        if drills is not None and drills.recommended is not None:
            minimum = table.minimum
            if minimum is not None and minimum.hosts != row.hosts:
                text += (
                    f" The failure table's arithmetic gives {minimum.hosts} hosts, but "
                    f"{'its drill fails' if minimum.hosts < row.hosts else 'fewer hold'} in "
                    "simulation."
                )
            text += f" Drilled in simulation: {drills.recommended.drill.verdict()}"
            if drills.smaller is not None:
                text += f"; with one host fewer: {drills.smaller.drill.verdict()}"
            text += "."
            if drills.warm_pool is not None:
                text += f" Traffic step: {drills.warm_pool.summary()}."
        today = len(table.spec.initial.hosts)
        if today and row.hosts != today:
            change = row.hosts - today
            text += (
                f" That is {abs(change)} host{'s' if abs(change) != 1 else ''} "
                f"{'more' if change > 0 else 'fewer'} than the {today} in service today"
                + (", taken from the zones with the most hosts." if change < 0 else ".")
            )
        costs = self.cost_figures()
        if costs is not None:
            total, reserve = costs
            healthy = table.healthy_minimum
            text += (
                f" Cost {usd_text(total.value)}/month, of which {usd_text(reserve.value)}/month "
                f"buys the failure reserve beyond the {healthy.hosts if healthy else 0} hosts "
                "that meet healthy demand."
            )
        return text

    def to_json(self) -> dict[str, Any]:
        fleet, table = self.fleet, self.fleet.table
        row = self.recommended
        costs = self.cost_figures()
        return {
            "schema": SCHEMA,
            "name": self.requirement.name,
            "created_at": self.created_at.isoformat(),
            "requirement": {
                "source": self.requirement.source,
                "statement": self.requirement_sentence(),
                "failure_unit": self.requirement.failure_unit.value,
                "replicas_per_host": self.requirement.placement.replicas_per_host,
                "zones": list(self.requirement.placement.zones),
                "gpus_per_replica": self.requirement.replica.gpus,
                "startup_dependencies": list(self.requirement.recovery.startup_dependencies),
                "slo_latency": self.requirement.slo.latency,
                "slo_latency_limit_s": self.requirement.slo.latency_limit_s,
            },
            "verdict": self.verdict(),
            "feasible": self.feasible,
            "recommendation": None
            if row is None
            else {
                "hosts": row.hosts,
                "replicas": row.replicas,
                "gpus": row.replicas * self.requirement.replica.gpus,
                "zones": row.zones,
                "healthy_capacity": _num(row.healthy_capacity),
                "failed_capacity": _num(row.failed_capacity),
                "max_admission": _num(row.max_admission),
                "rate_unit": table.spec.unit.value,
                "usd_per_month": None if costs is None else _figure_json(costs[0]),
                "reserve_usd_per_month": None if costs is None else _figure_json(costs[1]),
                "cost": _cost_json(self.cost_lines()),
            },
            "inputs": [
                {"path": path, **_figure_json(figure)}
                for path, figure in figures(self.requirement).items()
            ],
            "notes": list(self.notes),
            "capacity_fit": None if self.capacity_fit is None else _fit_json(self.capacity_fit),
            "capacity_by_pool": [_pool_json(pool) for pool in self.pools],
            "cache_hit_ratio": None if self.hit_ratio is None else _hit_json(self.hit_ratio),
            "observed_demand": _demand_json(self.observed_demand),
            "chain": [_step_json(step) for step in fleet.chain.steps],
            "failure_table": {
                "rate_unit": table.spec.unit.value,
                "failure_unit": table.spec.failure_unit.value,
                "demand": _num(table.spec.demand_rate),
                "demand_source": fleet.chain.demand_rate.source,
                "replica_capacity": _num(table.spec.replica_rate),
                "replica_capacity_source": fleet.chain.replica_rate.source,
                "backlog": _figure_json(fleet.backlog_work),
                "rows": [_row_json(r, self.drills) for r in table_rows(self)],
                "minimum_hosts": None if row is None else row.hosts,
                "healthy_minimum_hosts": None
                if table.healthy_minimum is None
                else table.healthy_minimum.hosts,
                "infeasible_reason": table.infeasible_reason,
            },
            "risk": _risk_json(self.risk),
            "drills": drill_section_json(self.drills),
        }

    def to_markdown(self) -> str:
        return "\n".join(_markdown_lines(self)) + "\n"


def _num(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _demand_json(observed: ObservedDemand | None) -> dict[str, Any] | None:
    if observed is None:
        return None
    return {
        "window_start": observed.window_start.isoformat(),
        "window_end": observed.window_end.isoformat(),
        "minutes": observed.minutes,
        "peak_req_per_min": _num(observed.peak_req_per_min),
        "high_req_per_min": _num(observed.high_req_per_min),
        "mean_req_per_min": _num(observed.mean_req_per_min),
        "peak_to_mean_ratio": _num(observed.peak_to_mean_ratio),
        "peak_output_tokens_per_s": _num(observed.peak_output_tokens_per_s),
        "peak_prompt_tokens_per_s": _num(observed.peak_prompt_tokens_per_s),
        "output_tokens_per_request": _num(observed.output_tokens_per_request),
        "prompt_tokens_per_request": _num(observed.prompt_tokens_per_request),
        "daily_shape": [
            {"hour_utc": hour, "mean_req_per_min": _num(mean)}
            for hour, mean in observed.daily_shape
        ],
        "groups": [
            {
                "by": g.by,
                "group": g.group,
                "peak_req_per_min": _num(g.peak_req_per_min),
                "high_req_per_min": _num(g.high_req_per_min),
                "mean_req_per_min": _num(g.mean_req_per_min),
            }
            for g in observed.groups
        ],
    }


def _cost_json(lines: CostLines | None) -> dict[str, Any] | None:
    if lines is None:
        return None
    return {
        name: None if figure is None else _figure_json(figure)
        for name, figure in (
            ("usd_per_hour", lines.usd_per_hour),
            ("usd_per_month", lines.usd_per_month),
            ("usd_per_million_output_tokens", lines.usd_per_million_output_tokens),
            ("usd_per_user_month", lines.usd_per_user_month),
            ("autoscaled_usd_per_month", lines.autoscaled_usd_per_month),
            ("autoscaled_usd_per_user_month", lines.autoscaled_usd_per_user_month),
        )
    }


def _figure_json(figure: Figure) -> dict[str, Any]:
    return {
        "value": _num(figure.value),
        "unit": figure.unit,
        "kind": figure.kind.value,
        "source": figure.source,
        "low": _num(figure.low),
        "high": _num(figure.high),
    }


def _step_json(step: Step) -> dict[str, Any]:
    return {"step": step.label, **_figure_json(step.figure)}


def table_rows(record: DecisionRecord) -> list[FailureRow]:
    """The failure table's rows and every drilled row beyond them, by host count."""
    rows = {row.hosts: row for row in record.fleet.table.rows}
    if record.drills is not None:
        for drilled in record.drills.drilled:
            rows.setdefault(drilled.row.hosts, drilled.row)
    return [rows[hosts] for hosts in sorted(rows)]


def _drill_word(row: FailureRow, drills: FleetDrills | None) -> str | None:
    drilled = None if drills is None else drills.for_hosts(row.hosts)
    return None if drilled is None else "holds" if drilled.drill.holds else "fails"


def drill_section_json(drills: FleetDrills | None) -> dict[str, Any] | None:
    if drills is None:
        return None
    return {
        "summary": drills.summary(),
        "recommended_hosts": None if drills.recommended is None else drills.recommended.row.hosts,
        "reason": drills.reason,
        "replacement_startup_stated": drills.startup_stated,
        "recommended": None if drills.recommended is None else drills.recommended.drill.to_json(),
        "smaller": None if drills.smaller is None else drills.smaller.drill.to_json(),
        "drilled": [
            {"hosts": d.row.hosts, "holds": d.drill.holds, "verdict": d.drill.verdict()}
            for d in drills.drilled
        ],
        "traffic_step": None if drills.warm_pool is None else drills.warm_pool.to_json(),
        "combined": {
            "dependencies": list(drills.dependencies),
            "in_contract": drills.combined_in_contract,
            "contract": drills.contract_text(),
            "drill": None if drills.combined is None else drills.combined.drill.to_json(),
        },
    }


def _row_json(row: FailureRow, drills: FleetDrills | None = None) -> dict[str, Any]:
    return {
        "hosts": row.hosts,
        "replicas": row.replicas,
        "zones": row.zones,
        "healthy_capacity": _num(row.healthy_capacity),
        "after_replica_loss": _num(row.after_replica_loss),
        "after_host_loss": _num(row.after_host_loss),
        "after_zone_loss": _num(row.after_zone_loss),
        "failed_capacity": _num(row.failed_capacity),
        "max_admission": _num(row.max_admission),
        "drain_rate": _num(row.drain_rate),
        "drain_s": _num(row.drain_s),
        "meets_healthy": row.meets_healthy,
        "meets_failure": row.meets_failure,
        "usd_per_month": _num(row.usd_per_month),
        "reserve_usd_per_month": _num(row.reserve_usd_per_month),
        "drill": _drill_word(row, drills),
    }


def _fit_json(fit: KneeFit) -> dict[str, Any]:
    common = {
        "summary": fit.summary(),
        "load_unit": fit.load_unit.value,
        "knee_load": _num(fit.knee_load),
        "knee_low_load": _num(fit.knee_low_load),
        "knee_high_load": _num(fit.knee_high_load),
        "confidence_ratio": fit.confidence_ratio,
        "points": fit.points,
        "replicas": fit.replicas,
        "load_min": fit.load_min,
        "load_max": fit.load_max,
        "extrapolated": fit.extrapolated,
        "extrapolation_ratio": _num(fit.extrapolation_ratio),
        "data": fit.data,
    }
    if isinstance(fit, CapacityFit):
        return {
            **common,
            "method": "latency line",
            "latency_limit_s": fit.latency_limit_s,
            "intercept_s": fit.intercept_s,
            "slope_s_per_load": fit.slope_s_per_load,
        }
    if isinstance(fit, PoolCapacity):
        return {**common, "method": fit.method.value, "pool": fit.pool}
    return common


def _pool_json(pool: PoolCapacity) -> dict[str, Any]:
    fit = pool.attainment
    return {
        "pool": pool.pool,
        "method": pool.method.value,
        "extrapolated": pool.extrapolated,
        "capacity_rps_per_replica": _num(pool.knee_load),
        "capacity_low_rps": _num(pool.knee_low_load),
        "capacity_high_rps": _num(pool.knee_high_load),
        "decode_tokens_per_s_per_replica": _num(pool.decode_tokens_per_s(pool.knee_load)),
        "prefill_tokens_per_s_per_replica": _num(pool.prefill_tokens_per_s(pool.knee_load)),
        "confidence_ratio": pool.confidence_ratio,
        "slo": fit.spec.slo_text(),
        "load_min_rps": fit.load_min,
        "load_max_rps": fit.load_max,
        "minutes": fit.points,
        "replicas": fit.replicas,
        "requests": fit.requests,
        "attainment_ratio": fit.attainment_ratio,
        "summary": pool.summary(),
        "by_replica": [
            {
                "replica": replica.group.removeprefix("replica "),
                "capacity_rps": _num(replica.knee_load),
                "capacity_low_rps": _num(replica.knee_low_load),
                "capacity_high_rps": _num(replica.knee_high_load),
                "extrapolated": replica.extrapolated,
                "load_max_rps": replica.load_max,
                "minutes": replica.points,
            }
            for replica in pool.replica_fits
        ],
        "latency_models": [_model_json(m) for m in (pool.ttft_model, pool.tpot_model) if m],
        "engine_model": None if pool.engine_model is None else _engine_json(pool.engine_model),
        "model_disagreement_ratio": _num(pool.model_disagreement_ratio),
    }


def _engine_json(model: ModelKnee) -> dict[str, Any]:
    fit, check = model.engine, model.check
    return {
        "knee_rps": _num(model.knee_rps),
        "knee_low_rps": _num(model.low_rps),
        "knee_high_rps": _num(model.high_rps),
        "bootstrap_low_rps": _num(model.bootstrap_low_rps),
        "bootstrap_high_rps": _num(model.bootstrap_high_rps),
        "cache_lost_knee_rps": _num(model.cache_lost_knee_rps),
        "probed_virtual_s": _num(model.probed_virtual_s),
        "resampled_knees_rps": [_num(k) for k in model.resampled_knees_rps],
        "replicas": model.replicas,
        "router": model.router.value,
        "step_base_s": model.step.base_s,
        "step_per_seq_s": model.step.per_seq_s,
        "step_per_prefill_token_s": model.step.per_prefill_token_s,
        "fitted_step": {
            "base_s": fit.step.base_s,
            "per_seq_s": fit.step.per_seq_s,
            "per_prefill_token_s": fit.step.per_prefill_token_s,
            **{
                f"{term}_interval": [
                    _num(v) for v in fit.term_interval(term, model.confidence_ratio)
                ]
                for term in ("base_s", "per_seq_s", "per_prefill_token_s")
            },
        },
        "fit_requests": fit.requests,
        "fit_minutes": fit.minutes,
        "mean_batch": _num(fit.mean_batch),
        "max_batch_seen": _num(fit.max_batch),
        "tpot_residual_ratio": _num(fit.residual_ratio),
        "prefill": check.prefill.name.lower(),
        "first_turn_prefill": _first_turn_json(model),
        "check": {
            "load_rps": _num(check.load_rps),
            "observed_attainment_ratio": _num(check.observed_attainment_ratio),
            "simulated_attainment_ratio": _num(check.simulated_attainment_ratio),
            "observed_ttft_p90_s": _num(check.observed_ttft_p90_s),
            "simulated_ttft_p90_s": _num(check.simulated_ttft_p90_s),
            "observed_tpot_p90_s": _num(check.observed_tpot_p90_s),
            "simulated_tpot_p90_s": _num(check.simulated_tpot_p90_s),
            "ttft_offset_s": _num(check.ttft_offset_s),
            "simulated_hit_ratio": _num(check.simulated_hit_ratio),
            "observed_hit_ratio": _num(check.observed_hit_ratio),
        },
        "shared_prefix_tokens": model.mix.shared_prefix_tokens,
        "summary": model.summary(),
        "fit_summary": fit.summary(),
    }


def _first_turn_json(model: ModelKnee) -> dict[str, Any] | None:
    measured = model.first_turn_prefill
    if measured is None:
        return None
    return {
        "per_token_s": measured.per_token_s,
        "interval": [_num(v) for v in measured.interval(model.confidence_ratio)],
        "first_turns": measured.first_turns,
    }


def _model_json(model: LatencyModel) -> dict[str, Any]:
    return {
        "latency": model.kind.value,
        "quantile": model.quantile,
        "limit_s": model.limit_s,
        "formula": model.formula(),
        "coefficients": list(model.coefficients),
        "regressors": list(model.regressors),
        "knee_rps": _num(model.knee_rps),
        "knee_low_rps": _num(model.knee_low_rps),
        "knee_high_rps": _num(model.knee_high_rps),
        "extrapolated": model.extrapolated,
        "points": model.points,
        "summary": model.summary(),
    }


def _hit_json(spread: HitRatioSpread) -> dict[str, Any]:
    return {
        "summary": spread.summary(),
        "p10_ratio": spread.p10_ratio,
        "p50_ratio": spread.p50_ratio,
        "p90_ratio": spread.p90_ratio,
        "windows": spread.windows,
        "every": spread.every,
        "data": spread.data,
    }


def _risk_json(risk: RiskAssessment) -> dict[str, Any]:
    riskiest = risk.riskiest
    return {
        "riskiest": None
        if riskiest is None
        else {
            "assumption": riskiest.path,
            "reason": riskiest.reason,
            "break_even": _num(riskiest.break_even),
        },
        "measurement_plan": [] if riskiest is None else list(riskiest.measurement_plan),
        "tornado": [
            {
                "assumption": bar.path,
                "value": _num(bar.figure.value),
                "unit": bar.figure.unit,
                "source": bar.figure.source,
                "low": _num(bar.low),
                "high": _num(bar.high),
                "replicas_at_low": bar.replicas_at_low,
                "replicas_at_high": bar.replicas_at_high,
                "replicas_exact_at_low": _num(bar.replicas_exact_at_low),
                "replicas_exact_at_high": _num(bar.replicas_exact_at_high),
                "swing_replicas": _num(bar.swing_replicas),
            }
            for bar in risk.tornado
        ],
        "not_perturbed": list(risk.unranged),
        "flags": [
            {"kind": flag.kind.value, "assumption": flag.path, "message": flag.message}
            for flag in risk.flags
        ],
    }


def _cost_cell(value: float | None) -> str:
    # No GPU price was stated: there is no cost to show, which is not "never".
    return "-" if value is None else fmt(value)


def _requirement_lines(record: DecisionRecord) -> list[str]:
    req = record.requirement
    lines = [
        f"# Capacity decision record: {req.name}",
        "",
        f"Created {record.created_at.isoformat()} from {req.source}.",
        "",
        "## Requirement",
        "",
        record.requirement_sentence(),
        "",
        (
            f"- failure unit: {req.failure_unit.value}; recovery interval: "
            f"{req.recovery.interval_s.text()} ({req.recovery.interval_s.source})"
        ),
        (
            f"- placement: replicas per host {req.placement.replicas_per_host}, GPUs per "
            f"replica {req.replica.gpus}, new hosts go to zones {', '.join(req.placement.zones)}"
        ),
    ]
    if req.slo.latency_limit_s is not None:
        lines.append(f"- SLO: {req.slo.latency} <= {req.slo.latency_limit_s:g} s")
    if req.recovery.startup_dependencies:
        lines.append(f"- replacements depend on: {', '.join(req.recovery.startup_dependencies)}")
    return lines


def _recommendation_lines(record: DecisionRecord) -> list[str]:
    lines = ["", "## Recommendation", "", record.verdict(), ""]
    costs = record.cost_figures()
    if costs is not None:
        total, reserve = costs
        lines += [f"- monthly cost: {usd_text(total.value)} ({total.source})"]
        lines += [f"- reserve: {usd_text(reserve.value)} ({reserve.source})"]
    priced = record.cost_lines()
    if priced is not None:
        lines.append(
            f"- hourly cost: {usd_text(priced.usd_per_hour.value)} ({priced.usd_per_hour.source})"
        )
        for label, figure in (
            ("per million output tokens", priced.usd_per_million_output_tokens),
            ("per user-month", priced.usd_per_user_month),
            ("autoscaled to the observed day", priced.autoscaled_usd_per_month),
            ("autoscaled, per user-month", priced.autoscaled_usd_per_user_month),
        ):
            if figure is not None:
                lines.append(f"- {label}: {usd_text(figure.value)} ({figure.source})")
    lines += [f"- {note}" for note in record.notes]
    if record.capacity_fit is not None:
        lines.append(f"- measured capacity: {record.capacity_fit.summary()}")
    if record.hit_ratio is not None:
        lines.append(f"- measured cache: {record.hit_ratio.summary()}")
    observed = record.observed_demand
    if observed is not None:
        lines.append(f"- observed demand: {observed.summary()}")
        groups = [g for g in observed.groups if g.group != "(none)"]
        lines += [
            f"  - {g.by} {g.group}: peak {fmt(g.peak_req_per_min)} req/min, mean "
            f"{fmt(g.mean_req_per_min)}"
            for g in groups
        ]
    return lines


def _pool_lines(record: DecisionRecord) -> list[str]:
    if not record.pools:
        return []
    lines = [
        "",
        "## Measured capacity per replica",
        "",
        (
            "| pool / replica | method | req/s at the SLO | interval | decode tokens/s "
            "| highest load observed | extrapolated |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for pool in record.pools:
        lines.append(
            f"| {pool.pool} | {pool.method.value} | {fmt(pool.knee_load)} "
            f"| {_span(pool.knee_low_load, pool.knee_high_load)} "
            f"| {fmt(pool.decode_tokens_per_s(pool.knee_load))} | {fmt(pool.load_max)} "
            f"| {'yes' if pool.extrapolated else 'no'} |"
        )
        lines += [
            f"| {pool.pool} / {fit.group.removeprefix('replica ')} | attainment crossing "
            f"| {fmt(fit.knee_load)} | {_span(fit.knee_low_load, fit.knee_high_load)} "
            f"| {fmt(pool.decode_tokens_per_s(fit.knee_load))} | {fmt(fit.load_max)} "
            f"| {'yes' if fit.extrapolated else 'no'} |"
            for fit in pool.replica_fits
        ]
    lines.append("")
    for pool in record.pools:
        lines.append(f"- {pool.summary()}")
        lines += [
            f"- pool {pool.pool}: {m.summary()}" for m in (pool.ttft_model, pool.tpot_model) if m
        ]
        if pool.engine_model is not None:
            lines.append(f"- pool {pool.pool}: engine fit: {pool.engine_model.engine.summary()}")
    return lines


def _span(low: float, high: float) -> str:
    return f"{fmt(low)} to {fmt(high)}"


def _chain_lines(record: DecisionRecord) -> list[str]:
    lines = ["", "## Sizing chain", "", "| step | value | source |", "|---|---|---|"]
    lines += [
        f"| {step.label} | {step.figure.text()} | {step.figure.source} |"
        for step in record.fleet.chain.steps
    ]
    return lines


def _table_lines(record: DecisionRecord) -> list[str]:
    fleet, table = record.fleet, record.fleet.table
    unit = table.spec.unit.value
    lines = [
        "",
        f"## Failure table ({unit}, {_losing(table.spec.failure_unit)})",
        "",
        (
            f"Demand {fmt(table.spec.demand_rate)} {unit} ({fleet.chain.demand_rate.source}); "
            f"one replica {fmt(table.spec.replica_rate)} {unit} "
            f"({fleet.chain.replica_rate.source}); backlog at failure "
            f"{fleet.backlog_work.text()} ({fleet.backlog_work.source})."
        ),
        "",
        (
            "| hosts | replicas | healthy | after 1 replica | after 1 host | after 1 zone "
            "| max admission | drain after failure | meets | drill | usd/month "
            "| reserve usd/month |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    minimum = table.minimum.hosts if table.minimum is not None else None
    recommended = record.recommended
    for row in table_rows(record):
        drain = "never" if row.drain_s is None else f"{fmt(row.drain_s)} s"
        meets = "yes" if row.meets_failure else "no"
        meets += " (minimum)" if row.hosts == minimum else ""
        drill = _drill_word(row, record.drills) or ""
        if recommended is not None and record.drills is not None and row == recommended:
            drill += " (recommended)"
        lines.append(
            f"| {row.hosts} | {row.replicas} | {fmt(row.healthy_capacity)} "
            f"| {fmt(row.after_replica_loss)} | {fmt(row.after_host_loss)} "
            f"| {fmt(row.after_zone_loss)} | {fmt(row.max_admission)} | {drain} | {meets} "
            f"| {drill} | {_cost_cell(row.usd_per_month)} "
            f"| {_cost_cell(row.reserve_usd_per_month)} |"
        )
    if table.infeasible_reason:
        lines += ["", f"Not met: {table.infeasible_reason}."]
    return lines


def _drill_lines(record: DecisionRecord) -> list[str]:
    drills = record.drills
    if drills is None:
        return []
    lines = ["", "## Failure drill", "", drills.summary() + "."]
    if not drills.startup_stated:
        lines += [
            "",
            (
                "Replacement start-up not stated (`recovery.replacement_startup_s`): "
                "the engine's cold start was assumed."
            ),
        ]
    return [*lines, *drills.markdown_lines()]


def _risk_lines(record: DecisionRecord) -> list[str]:
    risk = record.risk
    lines = ["", "## Risk", ""]
    if risk.riskiest is None:
        lines.append("No stated range moves the answer and no structural risk was found.")
    else:
        lines += [f"Riskiest assumption: `{risk.riskiest.path}`: {risk.riskiest.reason}.", ""]
        lines += ["Measurement plan that could disprove the answer:", ""]
        lines += [f"{i}. {step}" for i, step in enumerate(risk.riskiest.measurement_plan, 1)]
    if risk.flags:
        lines += ["", "Structural flags:", ""]
        lines += [f"- {flag.kind.value} (`{flag.path}`): {flag.message}" for flag in risk.flags]
    if risk.tornado:
        lines += [
            "",
            "| assumption | value | range | replicas at low | replicas at high | swing |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| `{bar.path}` | {bar.figure.text()} | {fmt(bar.low)} to {fmt(bar.high)} "
            f"| {_replicas(bar.replicas_at_low)} | {_replicas(bar.replicas_at_high)} "
            f"| {fmt(bar.swing_replicas)} |"
            for bar in risk.tornado
        ]
    if risk.unranged:
        names = ", ".join(f"`{path}`" for path in risk.unranged)
        lines += ["", f"Not perturbed (no range stated): {names}."]
    return lines


def _input_lines(record: DecisionRecord) -> list[str]:
    lines = ["", "## Inputs", "", "| input | value | range | source |", "|---|---|---|---|"]
    for path, figure in figures(record.requirement).items():
        span = ""
        if figure.low is not None and figure.high is not None:
            span = f"{fmt(figure.low)} to {fmt(figure.high)}"
        lines.append(f"| `{path}` | {figure.text()} | {span} | {figure.source} |")
    return lines


def _markdown_lines(record: DecisionRecord) -> list[str]:
    return [
        *_requirement_lines(record),
        *_recommendation_lines(record),
        *_pool_lines(record),
        *_chain_lines(record),
        *_table_lines(record),
        *_drill_lines(record),
        *_risk_lines(record),
        *_input_lines(record),
    ]


def _losing(unit: FailureUnit) -> str:
    return "no failure in scope" if unit is FailureUnit.NONE else f"losing one {unit.value}"


def _replicas(value: int | None) -> str:
    return "none meets" if value is None else str(value)
