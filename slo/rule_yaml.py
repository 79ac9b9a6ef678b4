"""Prometheus rule files as YAML: the dumper every rule generator of servewatch writes with."""

from __future__ import annotations

from typing import Any

import yaml


class RuleDumper(yaml.SafeDumper):
    """Writes multi-line PromQL as literal blocks, the way people write rule files."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


RuleDumper.add_representer(str, _text)


def dump_rule_groups(groups: list[dict[str, Any]]) -> str:
    """`groups:` and its rule groups, in the order given, keys in insertion order."""
    return yaml.dump({"groups": groups}, Dumper=RuleDumper, sort_keys=False, width=100)
