"""Page kinds: what served a page, told from its families when the target does not say, and
the catalogue that reads each kind (`CATALOGUES`).

Every engine and exporter servewatch reads names its families with its own prefix (vLLM
`vllm:`, DCGM `DCGM_FI_`/`DCGM_EXP_`, SGLang `sglang:`, TensorRT-LLM `trtllm_` and, behind
Dynamo, `trtllm:`, TGI `tgi_`, llama.cpp `llamacpp:`, an inference gateway's endpoint picker
`inference_objective_`/`inference_model_`/`inference_pool_`); pipelines that rewrite `:` to `_` are
read too. Families without such a prefix (`process_*`, `python_gc_*`, `http_*`) say nothing:
every Python server has them. A page whose prefixed families all belong to one kind is of that
kind; a page with none, or with several kinds' families, cannot be told and its error names
what it saw, so the user can give the target its kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.collectors.metrics.catalogue import Catalogue, family_stem
from servewatch.collectors.metrics.dcgm_catalogue import DCGM_CATALOGUE
from servewatch.collectors.metrics.gateway_catalogue import GATEWAY_CATALOGUE
from servewatch.collectors.metrics.gateway_catalogue import KIND_PREFIXES as GATEWAY_PREFIXES
from servewatch.collectors.metrics.llamacpp_catalogue import LLAMACPP_CATALOGUE
from servewatch.collectors.metrics.sglang_catalogue import SGLANG_CATALOGUE
from servewatch.collectors.metrics.tgi_catalogue import TGI_CATALOGUE
from servewatch.collectors.metrics.trtllm_catalogue import TRTLLM_CATALOGUE
from servewatch.collectors.metrics.vllm_catalogue import VLLM_CATALOGUE
from servewatch.collectors.scrape.targets import TargetKind

CATALOGUES: Mapping[TargetKind, Catalogue] = {
    TargetKind.VLLM: VLLM_CATALOGUE,
    TargetKind.DCGM: DCGM_CATALOGUE,
    TargetKind.SGLANG: SGLANG_CATALOGUE,
    TargetKind.TRTLLM: TRTLLM_CATALOGUE,
    TargetKind.TGI: TGI_CATALOGUE,
    TargetKind.LLAMACPP: LLAMACPP_CATALOGUE,
    TargetKind.GATEWAY: GATEWAY_CATALOGUE,
}

# The prefixes each kind's families carry, as exposed.
KIND_PREFIXES: Mapping[TargetKind, tuple[str, ...]] = {
    TargetKind.VLLM: ("vllm:", "vllm_"),
    TargetKind.DCGM: ("DCGM_FI_", "DCGM_EXP_"),
    TargetKind.SGLANG: ("sglang:", "sglang_"),
    TargetKind.TRTLLM: ("trtllm_", "trtllm:"),
    TargetKind.TGI: ("tgi_",),
    TargetKind.LLAMACPP: ("llamacpp:", "llamacpp_"),
    TargetKind.GATEWAY: GATEWAY_PREFIXES,
}
FAMILIES_NAMED = 5  # families an error names, per kind or among the unprefixed


@dataclass(frozen=True)
class PageKind:
    """The kind a page was told to be, or why it could not be told."""

    kind: TargetKind | None
    error: str | None = None


def kind_of_name(name: pl.Expr) -> pl.Expr:
    """The kind whose prefix a sample name carries, or null."""
    out = pl.lit(None, dtype=pl.String)
    for kind, prefixes in reversed(list(KIND_PREFIXES.items())):
        hit = pl.any_horizontal([name.str.starts_with(p) for p in prefixes])
        out = pl.when(hit).then(pl.lit(kind.value)).otherwise(out)
    return out


def _named(families: Sequence[str]) -> str:
    shown = ", ".join(families[:FAMILIES_NAMED])
    more = len(families) - FAMILIES_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def page_kinds(samples: pl.LazyFrame, *, pages: Sequence[int]) -> dict[int, PageKind]:
    """The kind of each page in `pages`, from the `page` and `metric` (the sample name as
    exposed) columns of its samples, as the exposition parser's frame has them."""
    allowed = ", ".join(k.value for k in TargetKind if k is not TargetKind.AUTO)
    seen = (
        samples.filter(pl.col("page").is_in(list(pages)))
        .select("page", family=family_stem(pl.col("metric")))
        .with_columns(kind=kind_of_name(pl.col("family")))
        .unique()
        .sort("page", "kind", "family", nulls_last=True)
        .collect()
    )
    by_page: dict[int, dict[str | None, list[str]]] = {page: {} for page in pages}
    for page, family, kind in seen.iter_rows():
        by_page[page].setdefault(kind, []).append(family)
    out: dict[int, PageKind] = {}
    for page, kinds in by_page.items():
        prefixed = {k.value: kinds[k.value] for k in KIND_PREFIXES if k.value in kinds}
        if len(prefixed) == 1:
            out[page] = PageKind(TargetKind(next(iter(prefixed))))
        elif prefixed:
            parts = "; ".join(f"{kind}: {_named(families)}" for kind, families in prefixed.items())
            out[page] = PageKind(
                None,
                f"the page mixes families of {len(prefixed)} kinds ({parts}); give the target "
                f"its kind ({allowed}) or scrape each exporter on its own",
            )
        else:
            families = kinds.get(None, [])
            what = f"families {_named(families)}" if families else "no samples"
            out[page] = PageKind(
                None,
                f"cannot tell what serves the page: {what} carry no engine or exporter prefix; "
                f"give the target its kind ({allowed})",
            )
    return out
