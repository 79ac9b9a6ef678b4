"""Metric families as the Python engines' prometheus-client exporters write them.

SGLang and TensorRT-LLM build their pages with prometheus-client, as vLLM does, but their
label order and sample order differ from what `HistogramMetricFamily` would write: label keys
come sorted (`le` between `engine_type` and `model_name`), SGLang's multiprocess collector
writes `_sum` before the buckets and no `_created` samples, TensorRT-LLM's single-process
registry writes `_created` for every counter and histogram child. These helpers add samples
in exactly those orders to plain `Metric` objects, which prometheus-client then encodes, so the
bytes are what the engine would send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.core import Metric

from servewatch.emulator.vllm_metrics import EMULATED_GAUGE, BucketCounts


def sorted_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(labels.items()))


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """`start * factor**i` for i = 0..count-1, as the engines' bucket helpers compute them."""
    return tuple(start * factor**i for i in range(count))


def add_histogram(
    family: Metric,
    labels: Mapping[str, str],
    counts: BucketCounts,
    *,
    sum_first: bool,
    created_s: float | None = None,
) -> None:
    """One histogram child: cumulative buckets, `_count` and `_sum`, in the exporter's order.

    `sum_first`: prometheus-client's multiprocess collector order (`_sum`, buckets, `_count`);
    otherwise the single-process order (buckets, `_count`, `_sum`). `created_s` adds the
    `_created` sample a single-process registry writes.
    """
    name = family.name
    buckets = [
        (sorted_labels({**labels, "le": bound}), value) for bound, value in counts.cumulative()
    ]
    plain = sorted_labels(labels)
    total = buckets[-1][1]
    if sum_first:
        family.add_sample(f"{name}_sum", dict(plain), counts.sum)
    for bucket_labels, value in buckets:
        family.add_sample(f"{name}_bucket", bucket_labels, value)
    family.add_sample(f"{name}_count", dict(plain), total)
    if not sum_first:
        family.add_sample(f"{name}_sum", dict(plain), counts.sum)
    if created_s is not None:
        family.add_sample(f"{name}_created", dict(plain), created_s)


def add_counter(
    family: Metric, labels: Mapping[str, str], value: float, *, created_s: float | None = None
) -> None:
    """One counter child (`<family>_total`), with its `_created` sample when given."""
    plain = sorted_labels(labels)
    family.add_sample(f"{family.name}_total", plain, float(value))
    if created_s is not None:
        family.add_sample(f"{family.name}_created", dict(plain), created_s)


def gauge(name: str, help_text: str, labels: Mapping[str, str], value: float) -> Metric:
    family = Metric(name, help_text, "gauge")
    family.add_sample(name, sorted_labels(labels), float(value))
    return family


def counter(
    name: str,
    help_text: str,
    labels: Mapping[str, str],
    value: float,
    *,
    created_s: float | None = None,
) -> Metric:
    """A counter family with one child; `name` is the declared name, `_total` or not."""
    family = Metric(name.removesuffix("_total"), help_text, "counter")
    add_counter(family, labels, value, created_s=created_s)
    return family


def histogram(
    name: str,
    help_text: str,
    children: Sequence[tuple[Mapping[str, str], BucketCounts]],
    *,
    sum_first: bool,
    created_s: float | None = None,
) -> Metric:
    family = Metric(name, help_text, "histogram")
    for labels, counts in children:
        add_histogram(family, labels, counts, sum_first=sum_first, created_s=created_s)
    return family


def declared(name: str, help_text: str, kind: str) -> Metric:
    """A labelled family no child of which exists yet: its HELP and TYPE lines only."""
    return Metric(name.removesuffix("_total") if kind == "counter" else name, help_text, kind)


def emulated_gauge(engine: str) -> Metric:
    """`servewatch_emulated 1`, on every emulated page so none passes for a real server's."""
    return gauge(
        EMULATED_GAUGE,
        f"1: this page comes from the servewatch emulator, not from a real {engine} server.",
        {},
        1.0,
    )
