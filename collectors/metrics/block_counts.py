"""Block counts: vLLM's prefix-cache counters that counted KV blocks, converted to tokens.

Until 0.8.5 vLLM's V1 engine counted `gpu_prefix_cache_queries` and `gpu_prefix_cache_hits` in
KV blocks; 0.9.0 counts tokens under the same names (vLLM PR 18003), so the name cannot tell
them apart, but each page's HELP line does: "in terms of number of queried blocks". On such a
page a count times the `block_size` label of the page's `cache_config_info` is the tokens of
whole-block matches, the unit the signal stores. A page that says blocks and has no block size
is left as counted and named, so a reader knows its hit ratio is a ratio of blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson
import polars as pl

from servewatch.collectors.metrics.exposition import ParsedPage

BLOCK_COUNTED = ("gpu_prefix_cache_queries", "gpu_prefix_cache_hits")
PREFIXES = ("vllm:", "vllm_")
CACHE_CONFIG = ("vllm:cache_config_info", "vllm_cache_config_info")
_NAMES = frozenset(p + f + s for p in PREFIXES for f in BLOCK_COUNTED for s in ("", "_total"))


@dataclass(frozen=True)
class BlockPages:
    """Pages (by index) whose prefix-cache counters count blocks: the tokens a block holds, or
    None where the page names no block size."""

    block_size: Mapping[int, float | None]

    def unconverted(self) -> list[int]:
        return sorted(page for page, size in self.block_size.items() if size is None)


def block_pages(pages: Mapping[int, ParsedPage]) -> BlockPages:
    """The pages whose HELP says their prefix-cache counters count blocks."""
    found: dict[int, float | None] = {}
    for index, page in pages.items():
        if any(
            name in _NAMES and family.help is not None and "blocks" in family.help
            for name, family in page.families.items()
        ):
            found[index] = _block_size(page)
    return BlockPages(found)


def _block_size(page: ParsedPage) -> float | None:
    sizes = set()
    for metric, labels in zip(page.metric, page.labels, strict=True):
        if metric in CACHE_CONFIG:
            size = orjson.loads(labels).get("block_size")
            if isinstance(size, str) and size.isdigit() and int(size) > 0:
                sizes.add(float(size))
    # Engines of one server share a cache configuration; two sizes on one page cannot be told
    # apart per counter.
    return sizes.pop() if len(sizes) == 1 else None


def in_tokens(samples: pl.DataFrame, *, blocks: BlockPages) -> pl.DataFrame:
    """`samples` (the parser's batch frame: `page`, `metric` as exposed, `value`) with the
    block-counted counters of `blocks`' pages times their block size."""
    sizes = {page: size for page, size in blocks.block_size.items() if size is not None}
    if not sizes:
        return samples
    factor = pl.col("page").replace_strict(sizes, default=1.0, return_dtype=pl.Float64)
    counted = pl.col("metric").is_in(list(_NAMES))
    return samples.with_columns(
        value=pl.when(counted).then(pl.col("value") * factor).otherwise(pl.col("value"))
    )
