"""Fleet config files: the documented example, defaults, and errors that name the field."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import (
    FleetConfig,
    FleetConfigError,
    RouterPolicy,
    load_fleet_config,
)
from servewatch.emulator.trace_replay import TraceFormat
from servewatch.emulator.workload import ArrivalKind, Distribution, DistributionKind, RateStep
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "docs" / "fleet.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_documented_example_loads_and_differs_from_defaults_only_where_it_says() -> None:
    config = load_fleet_config(EXAMPLE)
    default = FleetConfig.default()
    assert config.engine == default.engine
    assert config.topology == default.topology
    assert config.router == default.router
    assert config.slo == default.slo
    assert config.workload.arrival.kind is ArrivalKind.DIURNAL
    assert config.workload.arrival.steps == (RateStep(3600.0, 12.0), RateStep(4200.0, 6.0))
    assert replace(config.workload, arrival=default.workload.arrival) == default.workload
    assert [f.kind for f in config.failures] == [
        FailureKind.REPLICA_CRASH,
        FailureKind.SLOW_REPLICA,
        FailureKind.ERROR_BURST,
        FailureKind.REGISTRY_OUTAGE,
        FailureKind.HOST_LOSS,
    ]
    assert config.failures[4] == FailureSpec(
        FailureKind.HOST_LOSS, at_s=5400.0, target="host-1", duration_s=300.0
    )


def test_an_empty_file_is_the_default_fleet(tmp_path: Path) -> None:
    assert load_fleet_config(write(tmp_path, "")) == FleetConfig.default()
    assert len(FleetConfig.default().placements()) == 6


def test_partial_tables_keep_the_other_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [engine]
        max_num_seqs = 64
        [router]
        policy = "prefix_affinity"
        [workload.output_tokens]
        median = 300
        [workload.user_tokens]
        kind = "fixed"
        value = 128
        [workload.replay]
        path = "trace.jsonl"
        format = "mooncake"
        [gateway]
        conversation_ids = true
        """,
    )
    config = load_fleet_config(path)
    default = FleetConfig.default()
    assert config.conversation_ids
    assert not default.conversation_ids
    assert config.engine == replace(default.engine, max_num_seqs=64)
    assert config.router.policy is RouterPolicy.PREFIX_AFFINITY
    assert config.workload.output_tokens == replace(default.workload.output_tokens, median=300.0)
    assert config.workload.user_tokens == Distribution(DistributionKind.FIXED, value=128.0)
    replay = config.workload.replay
    assert replay is not None
    assert (replay.path, replay.format) == (tmp_path / "trace.jsonl", TraceFormat.MOONCAKE_JSONL)


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("[engine]\nmax_num_seqs = 0\n", "engine.max_num_seqs", ">= 1"),
        ("[engine]\nmax_num_seqs = 'many'\n", "engine.max_num_seqs", "must be an integer"),
        (
            "[engine]\nmax_num_batched_tokens = 10\n",
            "engine.max_num_batched_tokens",
            "max_num_seqs",
        ),
        ("[engine]\nstep_base_s = true\n", "engine.step_base_s", "must be a number"),
        ("[engine]\nenable_prefix_caching = 1\n", "engine.enable_prefix_caching", "true or false"),
        ("[engine]\nblock_size = 16\n", "engine.block_size", "unknown key"),
        ("[topology]\nzones = []\n", "topology.zones", "at least one zone"),
        ("[topology]\nzones = 'a'\n", "topology.zones", "list of strings"),
        ("[router]\npolicy = 'random'\n", "router.policy", "round_robin"),
        ("[gateway]\nconversation_ids = 'yes'\n", "gateway.conversation_ids", "true or false"),
        ("[gateway]\nsession_ids = true\n", "gateway.session_ids", "unknown key"),
        ("[workload.arrival]\nrate_rps = -2\n", "workload.arrival.rate_rps", ">= 0"),
        (
            "[workload.arrival]\nsteps = [{at_s = 5, rate_rps = 1}, {at_s = 1, rate_rps = 1}]\n",
            "workload.arrival.steps[1].at_s",
            "increasing",
        ),
        (
            "[workload.arrival]\nsteps = [{at_s = 5}]\n",
            "workload.arrival.steps[0].rate_rps",
            "required",
        ),
        (
            "[workload.user_tokens]\nkind = 'lognormal'\nmedian = 0\n",
            "workload.user_tokens.median",
            "> 0",
        ),
        ("[workload.conversation]\nturns_mean = 0.5\n", "workload.conversation.turns_mean", ">= 1"),
        (
            "[workload.conversation.think_time_s]\nkind = 'uniform'\nlow = 5\nhigh = 1\n",
            "workload.conversation.think_time_s.high",
            ">= low",
        ),
        (
            "[[workload.tenants]]\nname = 'a'\n[[workload.tenants]]\nname = 'b'\nweight = -1\n",
            "workload.tenants[1].weight",
            "> 0",
        ),
        ("[workload.replay]\nformat = 'azure'\n", "workload.replay.path", "required"),
        (
            "[workload.replay]\npath = 'x'\nformat = 'sharegpt'\n",
            "workload.replay.format",
            "mooncake",
        ),
        ("[[failures]]\nat_s = 5\n", "failures[0].kind", "required"),
        ("[[failures]]\nkind = 'host_loss'\ntarget = 'host-0'\n", "failures[0].at_s", "required"),
        (
            (
                "[[failures]]\nkind = 'host_loss'\nat_s = 1\ntarget = 'host-0'\n"
                "[[failures]]\nkind = 'host_loss'\nat_s = 1\ntarget = 'host-9'\n"
            ),
            "failures[1].target",
            "host-0",
        ),
        ("[[failures]]\nkind = 'replica_crash'\nat_s = 1\n", "failures[0].target", "replica name"),
        (
            "[[failures]]\nkind = 'slow_replica'\nat_s = 1\ntarget = 'vllm-0'\nfactor = 0.5\n",
            "failures[0].factor",
            ">= 1",
        ),
        ("[slo]\ntarget_ratio = 1.5\n", "slo.target_ratio", r"\(0, 1\]"),
        ("colour = 'blue'\n", "colour", "unknown key"),
        ("model = ''\n", "model", "empty"),
    ],
)
def test_bad_values_name_file_field_and_rule(
    tmp_path: Path, text: str, path: str, message: str
) -> None:
    config_path = write(tmp_path, text)
    with pytest.raises(FleetConfigError, match=message) as info:
        load_fleet_config(config_path)
    assert info.value.path == path
    assert str(info.value).startswith(f"{config_path}: {path}: ")


def test_unreadable_or_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="cannot read the config"):
        load_fleet_config(tmp_path / "absent.toml")
    with pytest.raises(FleetConfigError, match="not valid TOML"):
        load_fleet_config(write(tmp_path, "[engine\n"))
