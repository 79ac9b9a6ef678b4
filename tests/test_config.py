"""servewatch.toml: a full example loads; every bad field is named by its path."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from servewatch.collectors.scrape.targets import TargetKind
from servewatch.config import ConfigError, load_config, parse_config

EXAMPLE = """
[store]
path = "data/fleet.duckdb"

[scrape]
interval_s = 30
timeout_s = 5

[[targets]]
kind = "vllm"
url = "http://127.0.0.1:8000/metrics"
replica = "vllm-0"
host = "host-a"
zone = "zone-1"
gpus = 2
gpu_uuids = ["GPU-5d1c2a3b-0f2e-4b6a-9c1d-2e3f4a5b6c7d", "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"]

[[file_sd]]
path = "targets/dcgm.json"

[otlp]
listen = "127.0.0.1:14318"
bearer_token = "t0k"
read_timeout_s = 5
max_connections = 8

[otlp.mapping]
replica_keys = ["k8s.pod.name"]
"""


def test_example_loads_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "servewatch.toml"
    path.write_text(EXAMPLE, encoding="utf-8")
    config = load_config(path)
    assert config.store_path == tmp_path / "data" / "fleet.duckdb"
    assert config.scrape.interval_s == 30
    assert config.scrape.failing_after == 3
    (target,) = config.targets
    assert (target.kind, target.replica, target.gpus) == (TargetKind.VLLM, "vllm-0", 2)
    assert target.gpu_uuids == (
        "GPU-5d1c2a3b-0f2e-4b6a-9c1d-2e3f4a5b6c7d",
        "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
    )
    assert config.file_sd == (tmp_path / "targets" / "dcgm.json",)
    assert (config.otlp.host, config.otlp.port, config.otlp.bearer_token) == (
        "127.0.0.1",
        14318,
        "t0k",
    )
    assert config.otlp.mapping.replica_keys == ("k8s.pod.name",)
    assert config.otlp.mapping.host_keys  # defaults kept where not given
    assert (config.otlp.read_timeout_s, config.otlp.max_connections) == (5, 8)
    assert config.otlp.commit_timeout_s == 10  # the default


def test_empty_config_gives_defaults() -> None:
    config = parse_config({}, source=None)
    assert config.scrape.interval_s == 15
    assert config.targets == ()
    assert config.otlp.host == "127.0.0.1"
    # gRPC beside HTTP, on loopback at OTLP's port: vLLM exports over gRPC by default.
    assert (config.otlp.grpc_enabled, config.otlp.grpc_host, config.otlp.grpc_port) == (
        True,
        "127.0.0.1",
        4317,
    )
    assert "service.instance.id" not in config.otlp.mapping.replica_keys


def test_grpc_and_identity_settings_are_read() -> None:
    config = parse_config(
        {
            "otlp": {
                "grpc": False,
                "grpc_listen": "127.0.0.1:14317",
                "mapping": {
                    "replica_keys": ["k8s.pod.name"],
                    "process_keys": ["process.pid"],
                    "fallback_replica_keys": ["service.instance.id"],
                    "replica_per_process": True,
                    "adapter_keys": ["lora.adapter"],
                    "default_model": "meta-llama/Llama-3.1-8B-Instruct",
                },
            }
        },
        source=None,
    )
    otlp, mapping = config.otlp, config.otlp.mapping
    assert (otlp.grpc_enabled, otlp.grpc_host, otlp.grpc_port) == (False, "127.0.0.1", 14317)
    assert mapping.process_keys == ("process.pid",)
    assert mapping.fallback_replica_keys == ("service.instance.id",)
    assert mapping.replica_per_process
    assert mapping.adapter_keys == ("lora.adapter",)
    assert mapping.default_model == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"scrape": {"interval_s": -1}}, "scrape.interval_s: must be a positive number, got -1"),
        ({"scrape": {"interval_s": "15s"}}, "scrape.interval_s: must be a number, got '15s'"),
        ({"scrape": {"interval_s": 5, "timeout_s": 10}}, "scrape.timeout_s: must not exceed"),
        ({"scrape": {"intervl_s": 5}}, "scrape.intervl_s: unknown setting; allowed here:"),
        ({"store": "x.duckdb"}, "store: must be a table"),
        ({"targets": [{"kind": "vllm"}]}, "targets[0].url: is required"),
        (
            {"targets": [{"kind": "triton", "url": "http://a/metrics"}]},
            "targets[0]: label kind is 'triton'",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "u", "colour": "red"}]},
            "targets[0].colour: unknown",
        ),
        ({"otlp": {"listen": "4318"}}, "otlp.listen: must be HOST:PORT"),
        (
            {"otlp": {"grpc_listen": ":4317"}},
            "otlp.grpc_listen: must be HOST:PORT such as 127.0.0.1:4317",
        ),
        ({"otlp": {"grpc": "yes"}}, "otlp.grpc: must be"),
        (
            {"otlp": {"mapping": {"replica_per_process": 1}}},
            "otlp.mapping.replica_per_process: must be",
        ),
        (
            {"otlp": {"mapping": {"replica_keys": "pod"}}},
            "otlp.mapping.replica_keys: must be a list",
        ),
        ({"file_sd": [{}]}, "file_sd[0].path: is required"),
        ({"scrape": {"failing_after": 0}}, "scrape.failing_after: must be a whole number >= 1"),
        (
            {"targets": [{"kind": "vllm", "url": "http://a/metrics", "gpus": -1}]},
            "targets[0].gpus: must be a positive whole number, got -1",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "http://a/metrics", "gpus": 0}]},
            "targets[0].gpus: must be a positive whole number, got 0",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "http://a/metrics", "gpus": 1.5}]},
            "targets[0].gpus: must be a positive whole number, got 1.5",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "http://a/metrics", "gpu_uuids": ["gpu0"]}]},
            "targets[0].gpu_uuids: must hold GPU UUIDs such as GPU-5d1c2a3b",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "http://a/metrics", "gpu_uuids": 3}]},
            "targets[0].gpu_uuids: must be a list of GPU UUIDs or a comma-separated string",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "ftp://a/metrics"}]},
            "targets[0].url: must be an http:// or https:// URL with a host, got 'ftp://a/metrics'",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "http:///metrics"}]},
            "targets[0].url: must be an http:// or https:// URL with a host",
        ),
        (
            {"targets": [{"kind": "vllm", "url": "127.0.0.1:8000/metrics"}]},
            "targets[0].url: must be an http:// or https:// URL with a host",
        ),
        ({"otlp": {"bearer_token": "s\u00e9cret"}}, "otlp.bearer_token: must be printable ASCII"),
        ({"otlp": {"bearer_token": "two words"}}, "otlp.bearer_token: must be printable ASCII"),
        ({"sloz": {}}, "sloz: unknown setting"),
    ],
)
def test_bad_fields_are_named_by_path(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source=Path("servewatch.toml"))
    assert str(caught.value).startswith("servewatch.toml: ")
    assert message in str(caught.value)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[store\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_a_token_error_does_not_show_the_token() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"otlp": {"bearer_token": "hunter\u00e92"}}, source=None)
    assert "hunter" not in str(caught.value)
    assert "character 7" in str(caught.value)


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "servewatch.toml"
    path.write_bytes(b"[scrape]\ninterval_s = 15\n# caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: line 3: not UTF-8 text (TOML files are UTF-8)"


def test_the_documented_example_parses() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(
        encoding="utf-8"
    )
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    config = parse_config(tomllib.loads(block), source=Path("servewatch.toml"))
    assert config.targets[0].replica == "vllm-0"
    assert config.slo.alertmanager_url == "http://127.0.0.1:9093"
