"""Requirement files: the documented example loads; every bad field is named by its path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from servewatch.capacity.figure import SourceKind
from servewatch.capacity.fleet_size import size_fleet
from servewatch.capacity.placement import FailureUnit
from servewatch.capacity.requirement import (
    RequirementError,
    figures,
    load_requirement,
    parse_requirement,
    replace_figure,
)
from servewatch.capacity.sizing import TokenCapacity
from tests.conftest import REPO_ROOT


def minimal(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "failure_unit": "host",
        "demand": {"req_per_min": 120},
        "replica": {"capacity_req_per_min": 40},
        "placement": {"replicas_per_host": 2},
    }
    return data | overrides


def documented_example() -> str:
    text = (REPO_ROOT / "docs" / "capacity.md").read_text(encoding="utf-8")
    match = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert match, "docs/capacity.md has a toml example"
    return match.group(1)


def test_documented_example_loads_and_sizes_the_seed_chain(tmp_path: Path) -> None:
    path = tmp_path / "chat.toml"
    path.write_text(documented_example(), encoding="utf-8")
    requirement = load_requirement(path)
    assert requirement.failure_unit is FailureUnit.HOST
    assert isinstance(requirement.replica, TokenCapacity)
    fleet = size_fleet(requirement)
    assert 45 <= fleet.chain.replicas_with_headroom.value < 46
    cache = figures(requirement)["demand.cache_hit_ratio"]
    assert (cache.low, cache.high) == (0.65, 0.85)
    assert str(path) in figures(requirement)["demand.concurrent_users"].source


def test_minimal_requirement_states_its_defaults() -> None:
    requirement = parse_requirement(minimal(), where="req.toml")
    found = figures(requirement)
    assert found["demand.peak_req_per_min"].source == (
        "assumed: stated in req.toml at demand.req_per_min"
    )
    assert found["recovery.interval_s"].value == 180
    assert "seed 000" in found["recovery.interval_s"].source
    assert found["headroom_ratio"].source == "assumed: default: no headroom stated"
    assert requirement.cost.usd_per_gpu_hour is None


def test_figure_with_range_and_kind() -> None:
    data = minimal()
    data["replica"] = {
        "capacity_req_per_min": {
            "value": 40,
            "low": 35,
            "high": 44,
            "kind": "measured",
            "basis": "load test 2026-11-02",
        }
    }
    figure = figures(parse_requirement(data, where="r"))["replica.capacity_req_per_min"]
    assert (figure.value, figure.low, figure.high) == (40, 35, 44)
    assert figure.kind is SourceKind.MEASURED
    assert figure.source == "measured: load test 2026-11-02"


def test_replace_figure_by_path() -> None:
    requirement = parse_requirement(minimal(), where="r")
    figure = figures(requirement)["replica.capacity_req_per_min"].with_value(50)
    changed = replace_figure(requirement, "replica.capacity_req_per_min", figure)
    assert figures(changed)["replica.capacity_req_per_min"].value == 50
    assert figures(requirement)["replica.capacity_req_per_min"].value == 40
    with pytest.raises(KeyError, match=r"no figure at 'replica\.colour'"):
        replace_figure(requirement, "replica.colour", figure)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (minimal(failure_unit=None), "failure_unit: is required; allowed: none, replica, host"),
        (minimal(failure_unit="rack"), "failure_unit: is 'rack'; allowed: none, replica, host"),
        (minimal(demand={}), "demand.req_per_min: demand is missing: give req_per_min, or"),
        (
            minimal(demand={"req_per_min": 1, "concurrent_users": 5}),
            "demand.concurrent_users: cannot be given with req_per_min",
        ),
        (minimal(demand={"req_per_min": -3}), "demand.req_per_min: must be a positive number"),
        (minimal(demand={"req_per_min": "lots"}), "demand.req_per_min: must be a number"),
        (
            minimal(demand={"req_per_min": {"value": 120, "low": 100}}),
            "demand.req_per_min.high: is required when the other end",
        ),
        (
            minimal(demand={"req_per_min": {"value": 120, "low": 130, "high": 140}}),
            "demand.req_per_min.value: 120 lies outside its range [130, 140]",
        ),
        (
            minimal(demand={"req_per_min": {"value": 1, "kind": "guessed"}}),
            "demand.req_per_min.kind: is 'guessed'; allowed: assumed, measured",
        ),
        (
            minimal(demand={"req_per_min": {"low": 1, "high": 2}}),
            "demand.req_per_min.value: is required",
        ),
        (
            minimal(demand={"concurrent_users": 10, "answer_tokens": 300}),
            "demand.tpot_s: is required (a positive number, in s)",
        ),
        (
            minimal(
                demand={
                    "concurrent_users": 10,
                    "answer_tokens": 300,
                    "tpot_s": 0.05,
                    "think_and_read_s": 45,
                    "prompt_tokens": 1500,
                    "cache_hit_ratio": 1.5,
                }
            ),
            "demand.cache_hit_ratio: must be a ratio from 0 to 1, got 1.5",
        ),
        (minimal(replica={}), "replica.capacity_req_per_min: replica capacity is missing"),
        (
            minimal(replica={"capacity_req_per_min": 40, "decode_tokens_per_s": 1900}),
            "replica.decode_tokens_per_s: cannot be given with capacity_req_per_min",
        ),
        (
            minimal(replica={"decode_tokens_per_s": 1900, "prefill_tokens_per_s": 1e4}),
            "replica.prefill_share_ratio: is required (a ratio strictly between 0 and 1",
        ),
        (
            minimal(
                replica={
                    "decode_tokens_per_s": 1900,
                    "prefill_share_ratio": 0.3,
                    "prefill_compute": {"gpu_tflops": 700, "mfu_ratio": 0.4},
                }
            ),
            "replica.prefill_compute.model_params: is required",
        ),
        (
            minimal(replica={"capacity_req_per_min": 40, "gpus": 0}),
            "replica.gpus: must be a positive whole number, got 0",
        ),
        (
            minimal(placement={"zones": ["a", "a"]}),
            "placement.zones: lists a zone twice",
        ),
        (
            minimal(placement={"candidate_hosts": [2, 0]}),
            "placement.candidate_hosts: must be a list of positive whole numbers",
        ),
        (minimal(placement={"rack": 1}), "placement.rack: unknown setting; allowed here:"),
        (minimal(colour="red"), "colour: unknown setting; allowed here:"),
        (minimal(recovery={"interval_s": 0}), "recovery.interval_s: must be a positive number"),
        (minimal(headroom_ratio=-0.1), "headroom_ratio: must be a number >= 0, got -0.1"),
        (minimal(cost="cheap"), "cost: must be a table, got str"),
        (minimal(slo={"latency_limit_s": "50ms"}), "slo.latency_limit_s: must be a number"),
        (minimal(clients={"max_retries": -1}), "clients.max_retries: must be a whole number >= 0"),
        (minimal(clients={"max_retries": 1.5}), "clients.max_retries: must be a whole number"),
        (minimal(clients={"backoff_s": -1}), "clients.backoff_s: must be a number >= 0"),
        (minimal(clients={"retry": 2}), "clients.retry: unknown setting; allowed here:"),
        (minimal(traffic_step={"ratio": 0.5}), "traffic_step.ratio: must be a number >= 1"),
        (minimal(traffic_step={"over_s": 300}), "traffic_step.ratio: is required with over_s"),
        (
            minimal(traffic_step={"ratio": 2, "over_s": 0}),
            "traffic_step.over_s: must be a positive number, got 0",
        ),
    ],
)
def test_bad_field_is_named_by_its_path(data: dict[str, Any], message: str) -> None:
    data = {key: value for key, value in data.items() if value is not None}
    with pytest.raises(RequirementError) as caught:
        parse_requirement(data, where="req.toml")
    assert str(caught.value).startswith("req.toml: ")
    assert message in str(caught.value)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(RequirementError, match="cannot read"):
        load_requirement(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("failure_unit = \n", encoding="utf-8")
    with pytest.raises(RequirementError, match=r"bad\.toml: not valid TOML") as caught:
        load_requirement(bad)
    assert caught.value.__cause__ is not None


def test_clients_and_traffic_step_default_to_none_and_read_as_stated() -> None:
    plain = parse_requirement(minimal(), where="r")
    assert (plain.clients.max_retries, plain.traffic_step) == (0, None)
    stated = parse_requirement(
        minimal(clients={"max_retries": 2, "backoff_s": 0.5}, traffic_step={"ratio": 2}),
        where="r",
    )
    assert (stated.clients.max_retries, stated.clients.backoff_s) == (2, 0.5)
    assert stated.traffic_step is not None
    assert (stated.traffic_step.over_s, stated.traffic_step.autoscaler_lag_s) == (300.0, 60.0)
