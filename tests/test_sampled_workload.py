"""Sampled workloads: request shapes drawn from served requests, and recorded conversations
replayed turn by turn through the engine's prefix cache."""

from __future__ import annotations

import pytest

from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, RouterSpec, TopologySpec
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.sampled_workload import SHARED_PREFIX_KEY, SampledMix
from servewatch.emulator.workload import PrefixSegment, SpecError

START_S = 1_800_000_000.0
# Two recorded conversations: three turns whose prompts carry the history, and one turn.
CHAT = ((1000, 100, 0.0), (1400, 80, 5.0), (1800, 60, 12.0))
ONE = ((600, 40, 0.0),)


@pytest.mark.parametrize(
    ("conversations", "where", "message"),
    [
        (((),), "conversations[0]", "at least one turn"),
        ((CHAT, ((10, 0, 0.0),)), "conversations[1][0]", "tokens must be >= 1"),
        ((((10, 5, -1.0),),), "conversations[0][0]", "think time >= 0"),
    ],
)
def test_a_bad_conversation_is_refused_with_its_place(
    conversations: tuple[tuple[tuple[int, int, float], ...], ...], where: str, message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        SampledMix(((10, 5),), conversations)
    assert caught.value.field == where
    assert message in str(caught.value)


def test_turns_follow_each_other_a_think_time_after_the_answer() -> None:
    mix = SampledMix(((1000, 100),), (CHAT,))
    assert mix.replays_prefixes
    assert mix.turns_mean == 3.0
    assert mix.think_s_p90 == 17.0
    source = mix.source(1.0, seed=1, start_s=START_S, until_s=START_S + 1e6)
    first = source.next_arrival()
    assert first is not None
    assert (first.prompt_tokens, first.output_tokens) == (1000, 100)
    assert first.prefix == (PrefixSegment(first.conversation_id or "", 1000),)
    assert first.answer_extends_prefix
    second = source.follow_up(first, completion_tokens=100, end_s=first.arrival_s + 3, ok=True)
    assert second is not None
    assert second.conversation_id == first.conversation_id
    assert second.arrival_s == first.arrival_s + 3 + 5.0
    assert (second.prompt_tokens, second.prefix[0].end_tokens) == (1400, 1400)
    third = source.follow_up(second, completion_tokens=80, end_s=second.arrival_s + 2, ok=True)
    assert third is not None
    assert third.arrival_s == second.arrival_s + 2 + 12.0
    assert source.follow_up(third, completion_tokens=60, end_s=third.arrival_s + 1, ok=True) is None


def test_a_failed_turn_ends_its_conversation() -> None:
    source = SampledMix(((1000, 100),), (CHAT,)).source(
        1.0, seed=1, start_s=START_S, until_s=START_S + 1e6
    )
    first = source.next_arrival()
    assert first is not None
    end_s = first.arrival_s + 1
    assert source.follow_up(first, completion_tokens=0, end_s=end_s, ok=False) is None
    assert source.follow_up(first, completion_tokens=100, end_s=end_s, ok=True) is None


def test_conversations_start_at_the_rate_over_their_mean_turns() -> None:
    mix = SampledMix(((1000, 100),), (CHAT, ONE))  # two turns a conversation on average
    source = mix.source(4.0, seed=7, start_s=START_S, until_s=START_S + 2000.0)
    firsts = 0
    while source.next_arrival() is not None:
        firsts += 1
    assert firsts == pytest.approx(2.0 * 2000.0, rel=0.05)


def hit_ratio(router: RouterPolicy) -> float:
    """Prefix-cache hits of replayed conversations on four replicas behind `router`."""
    config = FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=4, replicas_per_host=1),
        engine=EngineParams(enable_prefix_caching=True),
        router=RouterSpec(policy=router),
    )
    mix = SampledMix(((1000, 100),), (CHAT,))
    collect = FinishedRequests()
    FleetSimulation(
        config,
        observer=collect,
        seed=3,
        start_s=START_S,
        source=mix.source(2.0, seed=3, start_s=START_S, until_s=START_S + 600.0),
    ).run_until(START_S + 900.0)
    done = [r for r in collect.finished if not r.failed]
    assert len(done) > 1000
    return sum(r.cached_prompt_tokens for r in done) / sum(r.prompt_tokens for r in done)


def test_replayed_follow_ups_hit_the_cache_where_the_router_keeps_them() -> None:
    # Behind prefix affinity a follow-up finds its history (1100 and 1480 of 1400 and 1800
    # tokens: about 0.6 of all prompt tokens); round-robin on four replicas mostly does not.
    affinity, spread = hit_ratio(RouterPolicy.PREFIX_AFFINITY), hit_ratio(RouterPolicy.ROUND_ROBIN)
    assert affinity == pytest.approx((1100 + 1480) / (1000 + 1400 + 1800), abs=0.05)
    assert spread < affinity / 2


def test_conversations_open_with_the_shared_prefix_when_longer_than_it() -> None:
    with pytest.raises(SpecError) as caught:
        SampledMix(((10, 5),), (CHAT,), shared_prefix_tokens=-1)
    assert caught.value.field == "shared_prefix_tokens"
    mix = SampledMix(((1000, 100),), (CHAT, ONE), shared_prefix_tokens=800)
    source = mix.source(1.0, seed=2, start_s=START_S, until_s=START_S + 1e4)
    chains = {}
    while (request := source.next_arrival()) is not None:
        chains[request.prompt_tokens] = request.prefix
    # CHAT opens with 1000 tokens, past the shared 800; ONE's 600 are not.
    assert chains[1000] == (
        PrefixSegment(SHARED_PREFIX_KEY, 800),
        PrefixSegment(chains[1000][1].key, 1000),
    )
    assert len(chains[600]) == 1
