"""A benchmark result: our figure next to a peer's, measured in one run, and their ratio."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Comparison:
    benchmark: str
    unit: str
    ours_label: str
    ours: float
    peer_label: str
    peer: float
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        """How many times better we are than the peer (>1 means faster or smaller)."""
        return self.ours / self.peer if self.higher_is_better else self.peer / self.ours

    def lines(self) -> list[str]:
        width = max(len(self.ours_label), len(self.peer_label))
        return [
            f"== {self.benchmark}",
            f"  {self.ours_label:<{width}}  {self.ours:>14,.0f} {self.unit}",
            f"  {self.peer_label:<{width}}  {self.peer:>14,.0f} {self.unit}",
            f"  ratio (servewatch / peer, >1 is better): {self.ratio:.2f}",
        ]
