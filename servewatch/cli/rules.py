"""`servewatch rules sli`: Prometheus recording rules for the metric SLIs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import EXIT_BAD_INPUT, JsonOption, command_group, fail, write_file
from servewatch.render import out_console, print_json
from servewatch.slo.sli_rules import (
    DEFAULT_DIALECT,
    DEFAULT_PREFIX,
    DEFAULT_QUANTILES,
    DEFAULT_WINDOW,
    SliLabels,
    SliRulesError,
    sli_rules,
)

rules_app = command_group("rules", "Prometheus rules for a fleet's own Prometheus to evaluate.")

_DEFAULT_LABELS = SliLabels()


def _quantiles(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise fail(
            f"--quantiles {text!r}: give numbers between 0 and 1, comma separated (0.5,0.9,0.99)",
            code=EXIT_BAD_INPUT,
        ) from exc


@rules_app.command("sli")
def rules_sli_command(
    out: Annotated[Path, typer.Option(help="Where to write the Prometheus rule file.")] = Path(
        "rules.yml"
    ),
    window: Annotated[
        str, typer.Option(help="The range of every rate and time-average (5m, 1h, ...).")
    ] = DEFAULT_WINDOW,
    quantiles: Annotated[
        str, typer.Option(help="Latency quantiles to record, comma separated.")
    ] = ",".join(f"{q:g}" for q in DEFAULT_QUANTILES),
    interval: Annotated[
        str | None,
        typer.Option(
            help="The groups' evaluation interval (default: Prometheus' evaluation_interval)."
        ),
    ] = None,
    replica_label: Annotated[
        str, typer.Option(help="The label naming a series' replica.")
    ] = _DEFAULT_LABELS.replica,
    pool_label: Annotated[
        str, typer.Option(help="The label naming a series' pool.")
    ] = _DEFAULT_LABELS.pool,
    model_label: Annotated[
        str, typer.Option(help="The label naming a series' model (vLLM's own).")
    ] = _DEFAULT_LABELS.model,
    metric_prefix: Annotated[
        str, typer.Option(help="vLLM's metric prefix as the fleet's Prometheus stores it.")
    ] = DEFAULT_PREFIX,
    dialect: Annotated[
        str,
        typer.Option(
            help="prometheus (PromQL: Prometheus, Thanos, Mimir) or metricsql (vmalert with "
            "VictoriaMetrics): every rate written as Prometheus' extrapolated rate in MetricsQL."
        ),
    ] = DEFAULT_DIALECT,
    as_json: JsonOption = False,
) -> None:
    """Write Prometheus recording rules for the SLIs `servewatch sli --source histograms`
    computes: TTFT, ITL, TPOT and e2e quantiles, request and token rates, error ratio, KV-cache
    usage, prefix-cache hit ratio and queues, per replica, pool and pool and model
    (promtool-valid; names and labels in docs/promql.md). --dialect metricsql writes the same
    rules for vmalert and VictoriaMetrics, whose own rate() differs from Prometheus'.
    --json prints {path, groups, rules}."""
    try:
        rules = sli_rules(
            window=window,
            quantiles=_quantiles(quantiles),
            metric_prefix=metric_prefix,
            labels=SliLabels(replica=replica_label, pool=pool_label, model=model_label),
            interval=interval,
            dialect=dialect,
        )
    except SliRulesError as exc:
        option = "--" + exc.option.replace("_", "-")
        raise fail(f"{option}: {exc.problem}", code=EXIT_BAD_INPUT) from exc
    write_file(out, rules.to_yaml(), what="the rule file")
    if as_json:
        print_json(
            {
                "path": str(out),
                "groups": [group["name"] for group in rules.groups],
                "rules": list(rules.records),
            }
        )
        return
    out_console.print(
        f"wrote {out}: {len(rules.records)} recording rules in {len(rules.groups)} groups",
        highlight=False,
    )
