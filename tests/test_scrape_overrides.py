"""A target's own scrape interval and timeout: inline keys in servewatch.toml, Prometheus's
`__scrape_interval__` / `__scrape_timeout__` labels in file_sd; bad values named by path; the
service's target resolver keeps a file's last good list."""

from __future__ import annotations

from pathlib import Path

import pytest

from servewatch.collectors.scrape.targets import TargetError, duration_s, parse_file_sd
from servewatch.config import ConfigError, parse_config
from servewatch.scraping import TargetResolver, scheduled_targets


def test_inline_targets_carry_their_own_interval_and_timeout() -> None:
    config = parse_config(
        {
            "scrape": {"interval_s": 15, "timeout_s": 10},
            "targets": [
                {"kind": "vllm", "url": "http://a:1/metrics", "interval_s": 60, "timeout_s": 20},
                {"kind": "vllm", "url": "http://b:1/metrics", "interval_s": 5},
                {"kind": "vllm", "url": "http://c:1/metrics"},
            ],
        },
        source=Path("sw.toml"),
    )
    a, b, c = config.targets
    assert (a.interval_s, a.timeout_s) == (60, 20)
    assert (b.interval_s, b.timeout_s) == (5, None)
    assert (c.interval_s, c.timeout_s) == (None, None)
    schedules = [e.schedule for e in scheduled_targets(list(config.targets), config.scrape)]
    assert [(s.interval_s, s.timeout_s) for s in schedules] == [(60, 20), (5, 5), (15, 10)]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            {"interval_s": 5, "timeout_s": 6},
            "sw.toml: targets[0].timeout_s: must not exceed the target's interval (5 s)",
        ),
        (
            {"timeout_s": 20},
            "sw.toml: targets[0].timeout_s: must not exceed the target's interval (15 s)",
        ),
        ({"interval_s": -1}, "sw.toml: targets[0].interval_s: must be a positive number, got -1"),
        ({"interval_s": "15s"}, "sw.toml: targets[0].interval_s: must be a number, got '15s'"),
    ],
)
def test_bad_target_overrides_are_named_by_path(target: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {
                "scrape": {"interval_s": 15, "timeout_s": 10},
                "targets": [{"kind": "vllm", "url": "http://a:1/metrics", **target}],
            },
            source=Path("sw.toml"),
        )
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("1m", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), (30, 30.0)],
)
def test_prometheus_durations(text: str | int, seconds: float) -> None:
    assert duration_s(text, where="x") == seconds


@pytest.mark.parametrize("text", ["", "15", "fast", "0s", "1d", -5, True])
def test_bad_durations_say_what_is_allowed(text: object) -> None:
    with pytest.raises(TargetError, match="x: must be a positive number of seconds or a duration"):
        duration_s(text, where="x")


def test_file_sd_scrape_labels() -> None:
    doc = (
        '[{"targets": ["h:1"], "labels": {"kind": "vllm", "__scrape_interval__": "30s",'
        ' "__scrape_timeout__": "2s"}}, {"targets": ["h:2"], "labels": {"kind": "dcgm"}}]'
    )
    slow, plain = parse_file_sd(doc, source="sd.json")
    assert (slow.interval_s, slow.timeout_s) == (30.0, 2.0)
    assert (plain.interval_s, plain.timeout_s) == (None, None)
    with pytest.raises(TargetError, match=r"sd.json: \[0\].targets\[0\]: __scrape_interval__"):
        parse_file_sd(
            '[{"targets": ["h:1"], "labels": {"kind": "vllm", "__scrape_interval__": "soon"}}]',
            source="sd.json",
        )
    with pytest.raises(TargetError, match=r"__scrape_timeout__ \(10 s\) must not exceed"):
        parse_file_sd(
            '[{"targets": ["h:1"], "labels": {"kind": "vllm", "__scrape_interval__": "5s",'
            ' "__scrape_timeout__": "10s"}}]',
            source="sd.json",
        )


def test_the_resolver_keeps_a_broken_files_last_good_targets(tmp_path: Path) -> None:
    sd = tmp_path / "sd.json"
    sd.write_text('[{"targets": ["h:1"], "labels": {"kind": "vllm"}}]', encoding="utf-8")
    config = parse_config({"file_sd": [{"path": str(sd)}]}, source=tmp_path / "sw.toml")
    resolver = TargetResolver()
    first, problems = resolver.resolve(config)
    assert [t.url for t in first] == ["http://h:1/metrics"]
    assert problems == []
    sd.write_text("[{", encoding="utf-8")
    again, problems = resolver.resolve(config)
    assert again == first
    assert len(problems) == 1
    assert "not valid JSON" in problems[0]
