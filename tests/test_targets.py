"""Targets: file_sd parsing (JSON and YAML), label handling, bad input, last-good-list reloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from servewatch.collectors.scrape.targets import (
    FileSdSource,
    Target,
    TargetError,
    TargetKind,
    merge_targets,
    parse_file_sd,
    target_from_labels,
)

GROUPS = [
    {
        "targets": ["10.0.0.1:8000", "10.0.0.2:8000"],
        "labels": {"kind": "vllm", "host": "h1", "zone": "z1", "pool": "chat", "gpus": "2"},
    },
    {"targets": ["https://h1:9400/m"], "labels": {"kind": "dcgm", "host": "h1"}},
]


def test_json_and_yaml_file_sd_give_the_same_targets() -> None:
    from_json = parse_file_sd(json.dumps(GROUPS), source="t.json")
    from_yaml = parse_file_sd(yaml.safe_dump(GROUPS), source="t.yml")
    assert from_json == from_yaml
    first = from_json[0]
    assert first == Target(
        target_id="http://10.0.0.1:8000/metrics",
        kind=TargetKind.VLLM,
        url="http://10.0.0.1:8000/metrics",
        host="h1",
        zone="z1",
        pool="chat",
        gpus=2,
    )
    assert from_json[2].url == "https://h1:9400/m"
    assert from_json[2].zone is None  # missing zone is allowed


def test_gpu_uuids_label_is_a_comma_separated_list() -> None:
    doc = [{"targets": ["a:1"], "labels": {"kind": "vllm", "gpu_uuids": "GPU-1a2b, GPU-3c4d"}}]
    assert parse_file_sd(json.dumps(doc), source="t.json")[0].gpu_uuids == ("GPU-1a2b", "GPU-3c4d")


def test_scheme_and_metrics_path_labels() -> None:
    doc = [
        {
            "targets": ["a:1"],
            "labels": {"kind": "vllm", "__scheme__": "https", "__metrics_path__": "x"},
        }
    ]
    assert parse_file_sd(json.dumps(doc), source="t.json")[0].url == "https://a:1/x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "t.json: not valid JSON"),
        ('{"targets": []}', "expected a list of target groups"),
        (
            '[{"targets": "a:1", "labels": {"kind": "vllm"}}]',
            "t.json: [0].targets: expected a list",
        ),
        (
            '[{"targets": ["a:1"], "labels": {"kind": "triton"}}]',
            (
                "label kind is 'triton'; allowed: vllm, dcgm, sglang, trtllm, tgi, llamacpp, "
                "gateway, auto"
            ),
        ),
        (
            '[{"targets": ["a:1"], "labels": {"kind": "vllm", "gpus": "two"}}]',
            "label gpus must be a positive whole number, got 'two'",
        ),
        (
            '[{"targets": ["a:1"], "labels": {"kind": "vllm", "gpus": "-1"}}]',
            "label gpus must be a positive whole number, got '-1'",
        ),
        (
            '[{"targets": ["a:1"], "labels": {"kind": "vllm", "gpu_uuids": "0,1"}}]',
            "label gpu_uuids must hold GPU UUIDs such as GPU-5d1c2a3b",
        ),
        (
            '[{"targets": ["a:1"], "labels": {"kind": "vllm", "__scheme__": "ftp"}}]',
            "[0].targets[0]: target URL must be an http:// or https:// URL with a host, got 'ftp:",
        ),
        ('[{"targets": [""], "labels": {"kind": "vllm"}}]', "[0].targets[0]: target address"),
    ],
)
def test_bad_file_sd_names_the_file_and_field(text: str, message: str) -> None:
    with pytest.raises(TargetError) as caught:
        parse_file_sd(text, source="t.json")
    assert message in str(caught.value)


def test_a_file_that_stops_parsing_keeps_the_last_good_list(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text(json.dumps(GROUPS), encoding="utf-8")
    source = FileSdSource(path)
    assert source.refresh() is True
    assert len(source.targets) == 3
    assert source.refresh() is False  # unchanged file: not re-read

    path.write_text("[{broken", encoding="utf-8")
    os.utime(path, ns=(1, 1))  # a different mtime, whatever the filesystem's resolution
    assert source.refresh() is False
    assert source.error is not None
    assert "not valid JSON" in source.error
    assert len(source.targets) == 3

    path.write_text(json.dumps(GROUPS[:1]), encoding="utf-8")
    os.utime(path, ns=(2, 2))
    assert source.refresh() is True
    assert source.error is None
    assert len(source.targets) == 2


def test_missing_file_is_reported(tmp_path: Path) -> None:
    source = FileSdSource(tmp_path / "nope.json")
    assert source.refresh() is False
    assert source.error is not None
    assert "cannot read" in source.error


def test_merge_keeps_the_first_definition() -> None:
    a = parse_file_sd(json.dumps(GROUPS), source="a.json")
    b = parse_file_sd(json.dumps(GROUPS[:1]), source="b.json")
    merged = merge_targets([a, b])
    assert merged == a


@pytest.mark.parametrize(
    ("labels", "replica", "error"),
    [
        ({"pod": "vllm-7f9c", "namespace": "serving"}, "serving/vllm-7f9c", None),
        ({"pod": "p", "namespace": "ns", "replica": "ns/p"}, "ns/p", None),
        ({"replica": "vllm-0"}, "vllm-0", None),
        ({"pod": "p"}, None, "label pod needs label namespace too"),
        ({"namespace": "ns"}, None, "label namespace needs label pod too"),
        ({"pod": "p", "namespace": "ns", "replica": "r"}, None, "contradicts labels pod"),
    ],
)
def test_pod_and_namespace_name_the_replica(
    labels: dict[str, str], replica: str | None, error: str | None
) -> None:
    if error is None:
        target = target_from_labels("10.0.0.5:8000", {"kind": "vllm", **labels}, where="t")
        assert target.replica == replica
    else:
        with pytest.raises(TargetError, match=error):
            target_from_labels("10.0.0.5:8000", {"kind": "vllm", **labels}, where="t")
