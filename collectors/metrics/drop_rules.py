"""Drop rules: families a user chose not to store, by name or pattern, as metric relabelling does.

Every sample a page carries is stored by default, catalogued or not, so a user can query any
metric their exporter serves. Some exporters serve what nobody reads (`python_gc_*`, a
per-request `http_*` family with a label per path); a rule drops it before it costs storage.
A pattern is a regular expression in the syntax Prometheus' relabelling uses (RE2: Polars
speaks the same), anchored at both ends as Prometheus anchors it, and matched against the
sample name as exposed (`__name__`) and against its family (the name without `_bucket`,
`_sum`, `_count`, `_total` or `_created`), so naming a histogram drops all of its samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.collectors.metrics.catalogue import family_stem


class DropRuleError(ValueError):
    """A drop pattern is not a regular expression; the message names it and where."""


@dataclass(frozen=True)
class DropRules:
    """The patterns of families to drop; none by default."""

    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, patterns: Sequence[str], *, where: str) -> DropRules:
        """Rules from user input, each pattern checked by the regex engine that applies it."""
        for i, pattern in enumerate(patterns):
            if not isinstance(pattern, str) or not pattern:
                raise DropRuleError(f"{where}[{i}]: must be a non-empty pattern, got {pattern!r}")
            try:
                pl.select(pl.lit("x").str.contains(_anchored(pattern)))
            except pl.exceptions.ComputeError as exc:
                raise DropRuleError(
                    f"{where}[{i}]: {pattern!r} is not a regular expression (RE2 syntax, as "
                    f"Prometheus relabelling): {exc}"
                ) from exc
        return cls(tuple(patterns))

    def matches(self, name: pl.Expr) -> pl.Expr:
        """Whether a sample name (as exposed) is dropped by any rule."""
        if not self.patterns:
            return pl.lit(value=False)
        pattern = "|".join(_anchored(p) for p in self.patterns)
        return name.str.contains(pattern) | family_stem(name).str.contains(pattern)

    def kept(self, samples: pl.DataFrame) -> pl.DataFrame:
        """`samples` (with `metric` as exposed) without the dropped ones."""
        if not self.patterns:
            return samples
        return samples.filter(~self.matches(pl.col("metric")))


def _anchored(pattern: str) -> str:
    return f"^(?:{pattern})$"
