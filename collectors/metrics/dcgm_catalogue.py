"""The DCGM metric catalogue: dcgm-exporter's field names, before and after 4.9.0, as signals.

What it rests on (../shared/REFERENCE.md section 4; sources and doubts in docs/catalogues.md):
- dcgm-exporter 4.9.0 renamed the default fields to their DCGM 4.7 names, and eleven of them
  changed unit (MHz -> Hz, mJ -> J, % -> ratio, MiB -> bytes, MB/s -> bytes/s). Both spellings
  are read and every value is stored in the newer unit (the signal's unit in
  `pipeline.signals`); the canonical metric name is the newer spelling;
- DCGM marks "no data" with sentinels of the field's width: int32 values at or above
  0x7ffffff0, int64 at or above 0x7ffffffffffffff0, fp64 at or above 2**47 (140737488355328.0),
  and NVML's "unavailable" is 0xFFFFFFFF; such points are stored as null, never as numbers
  (`FieldType` says which apply to a field);
- NVML utilisation is 0-100 % by definition, so values outside are clamped (after scaling,
  to 0-1); XID_ERRORS is the value of the last XID, a gauge, not a count;
- labels: `Hostname` became `hostname` in 4.8.3, the driver label `DCGM_FI_DRIVER_VERSION`
  became `DCGM_FI_SYSTEM_DRIVER_VERSION` in 4.9.0; behind a Prometheus with honorLabels false
  the GPU's `pod`, `namespace`, `container` arrive as `exported_*` and win over the scraper's
  own `pod` etc. (which name the exporter, not the GPU's workload);
- a field name with `_total` appended (as OpenMetrics readers do to counters) is the same field.
The rename table is data (`DCGM_FIELDS`) so that a wrong row is a one-line fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import polars as pl

from servewatch.collectors.metrics.catalogue import (
    Catalogue,
    CatalogueEntry,
    SourceRule,
    catalogue_frame,
)
from servewatch.pipeline.signals import SIGNALS, MetricType, Signal, Source


class FieldType(StrEnum):
    """How wide a field's values arrive: it decides which sentinels mean "no data".

    INT32 is a bounded integer (a temperature, a clock in MHz, a percentage, MiB, a count): its
    value is far below 2**31, so everything from DCGM_INT32_BLANK up is a sentinel, whichever
    width it came in (the int64 ones and NVML's 0xFFFFFFFF included). INT64 is an integer that
    may legitimately pass 2**31 (bytes, Hz, energy): only the int64 range is blank, plus the
    exact int32 and NVML sentinels when the field is a gauge (a counter such as energy in mJ
    runs through those numbers on its way up). FP64 fields blank from DCGM_FP64_BLANK up and at
    the exact int32 and NVML sentinels, which no ratio or wattage reaches.
    """

    INT32 = "int32"
    INT64 = "int64"
    FP64 = "fp64"


# DCGM_INT32_BLANK, DCGM_INT64_BLANK and DCGM_FP64_BLANK (dcgm_structs.h): values at or above
# are "blank", "not found", "not supported" and "not permissioned". As a float the int64 one
# rounds to 2**63.
BLANK_AT: Mapping[FieldType, float] = {
    FieldType.INT32: float(0x7FFFFFF0),
    FieldType.INT64: float(0x7FFFFFFFFFFFFFF0),
    FieldType.FP64: 140737488355328.0,
}
INT32_SENTINELS: tuple[float, ...] = tuple(float(0x7FFFFFF0 + i) for i in range(4))
NVML_UNAVAILABLE = float(0xFFFFFFFF)
EXACT_SENTINELS: tuple[float, ...] = (*INT32_SENTINELS, NVML_UNAVAILABLE)

PERCENT = 0.01
MEBIBYTE = 1024.0 * 1024.0
MEGA = 1e6
MILLI = 1e-3


@dataclass(frozen=True)
class DcgmField:
    """A DCGM field name as the exporter exposes it, and its scale to the signal's unit."""

    name: str
    signal: Signal
    scale: float = 1.0
    value_type: FieldType = FieldType.INT32
    legacy: bool = False  # the name before dcgm-exporter 4.9.0

    def blanks(self) -> tuple[float, tuple[float, ...]]:
        """The range threshold and exact values that mean "no data" for this field."""
        exact = EXACT_SENTINELS
        if self.value_type is FieldType.INT32 or (
            self.value_type is FieldType.INT64 and SIGNALS[self.signal].kind is MetricType.COUNTER
        ):
            exact = ()
        return BLANK_AT[self.value_type], exact


_W, _F = FieldType.INT64, FieldType.FP64

DCGM_FIELDS: tuple[DcgmField, ...] = (
    # clocks: MHz before 4.9.0, Hz after
    DcgmField("DCGM_FI_DEV_SM_CLOCK", Signal.GPU_SM_CLOCK_HZ, MEGA, legacy=True),
    DcgmField("DCGM_FI_DEV_SM_CLOCK_HERTZ", Signal.GPU_SM_CLOCK_HZ, value_type=_W),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", Signal.GPU_MEMORY_CLOCK_HZ, MEGA, legacy=True),
    DcgmField("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", Signal.GPU_MEMORY_CLOCK_HZ, value_type=_W),
    # temperatures: renamed only
    DcgmField("DCGM_FI_DEV_GPU_TEMP", Signal.GPU_TEMPERATURE_C, legacy=True),
    DcgmField("DCGM_FI_DEV_GPU_TEMP_CELSIUS", Signal.GPU_TEMPERATURE_C),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", Signal.GPU_MEMORY_TEMPERATURE_C, legacy=True),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", Signal.GPU_MEMORY_TEMPERATURE_C),
    # power (W, fp64) renamed only; energy mJ before, J after
    DcgmField("DCGM_FI_DEV_POWER_USAGE", Signal.GPU_POWER_W, value_type=_F, legacy=True),
    DcgmField("DCGM_FI_DEV_BOARD_POWER_WATTS", Signal.GPU_POWER_W, value_type=_F),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Signal.GPU_ENERGY_J, MILLI, _W, legacy=True),
    DcgmField("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", Signal.GPU_ENERGY_J, value_type=_W),
    # NVML utilisation: % before, ratio (fp64) after
    DcgmField("DCGM_FI_DEV_GPU_UTIL", Signal.GPU_UTIL_RATIO, PERCENT, legacy=True),
    DcgmField("DCGM_FI_DEV_GPU_UTIL_RATIO", Signal.GPU_UTIL_RATIO, value_type=_F),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", Signal.GPU_MEMORY_COPY_UTIL_RATIO, PERCENT, legacy=True),
    DcgmField("DCGM_FI_DEV_MEMORY_UTIL_RATIO", Signal.GPU_MEMORY_COPY_UTIL_RATIO, value_type=_F),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", Signal.GPU_ENCODER_UTIL_RATIO, PERCENT, legacy=True),
    DcgmField("DCGM_FI_DEV_ENC_UTIL_RATIO", Signal.GPU_ENCODER_UTIL_RATIO, value_type=_F),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", Signal.GPU_DECODER_UTIL_RATIO, PERCENT, legacy=True),
    DcgmField("DCGM_FI_DEV_DEC_UTIL_RATIO", Signal.GPU_DECODER_UTIL_RATIO, value_type=_F),
    # framebuffer: MiB before, bytes after (FB_TOTAL is not a default before 4.9.0)
    DcgmField("DCGM_FI_DEV_FB_FREE", Signal.GPU_FB_FREE_BYTES, MEBIBYTE, legacy=True),
    DcgmField("DCGM_FI_DEV_FB_FREE_BYTES", Signal.GPU_FB_FREE_BYTES, value_type=_W),
    DcgmField("DCGM_FI_DEV_FB_USED", Signal.GPU_FB_USED_BYTES, MEBIBYTE, legacy=True),
    DcgmField("DCGM_FI_DEV_FB_USED_BYTES", Signal.GPU_FB_USED_BYTES, value_type=_W),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", Signal.GPU_FB_RESERVED_BYTES, MEBIBYTE, legacy=True),
    DcgmField("DCGM_FI_DEV_FB_RESERVED_BYTES", Signal.GPU_FB_RESERVED_BYTES, value_type=_W),
    DcgmField("DCGM_FI_DEV_FB_TOTAL", Signal.GPU_FB_TOTAL_BYTES, MEBIBYTE, legacy=True),
    DcgmField("DCGM_FI_DEV_FB_CAPACITY_BYTES", Signal.GPU_FB_TOTAL_BYTES, value_type=_W),
    # PCIe
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Signal.GPU_PCIE_REPLAYS, legacy=True),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", Signal.GPU_PCIE_REPLAYS),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", Signal.GPU_PCIE_TX_BYTES_PER_S, value_type=_W),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", Signal.GPU_PCIE_RX_BYTES_PER_S, value_type=_W),
    # NVLink, all links: MB/s before (under two names), bytes/s after
    DcgmField(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Signal.GPU_NVLINK_BYTES_PER_S, MEGA, legacy=True
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", Signal.GPU_NVLINK_BYTES_PER_S, MEGA, legacy=True
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        Signal.GPU_NVLINK_BYTES_PER_S,
        value_type=_W,
    ),
    # errors and row remapping: renamed only
    DcgmField("DCGM_FI_DEV_XID_ERRORS", Signal.GPU_LAST_XID, legacy=True),
    DcgmField("DCGM_FI_DEV_XID_ERROR", Signal.GPU_LAST_XID),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Signal.GPU_REMAPPED_ROWS_UNCORRECTABLE,
        legacy=True,
    ),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", Signal.GPU_REMAPPED_ROWS_UNCORRECTABLE),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Signal.GPU_REMAPPED_ROWS_CORRECTABLE, legacy=True
    ),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", Signal.GPU_REMAPPED_ROWS_CORRECTABLE),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", Signal.GPU_ROW_REMAP_FAILED, legacy=True),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILED", Signal.GPU_ROW_REMAP_FAILED),
    # profiling ratios (fp64): renamed only
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        Signal.GPU_GRAPHICS_ACTIVE_RATIO,
        value_type=_F,
        legacy=True,
    ),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", Signal.GPU_GRAPHICS_ACTIVE_RATIO, value_type=_F),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", Signal.GPU_SM_ACTIVE_RATIO, value_type=_F, legacy=True),
    DcgmField("DCGM_FI_PROF_SM_UTIL_RATIO", Signal.GPU_SM_ACTIVE_RATIO, value_type=_F),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY", Signal.GPU_SM_OCCUPANCY_RATIO, value_type=_F, legacy=True
    ),
    DcgmField("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", Signal.GPU_SM_OCCUPANCY_RATIO, value_type=_F),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        Signal.GPU_TENSOR_ACTIVE_RATIO,
        value_type=_F,
        legacy=True,
    ),
    DcgmField("DCGM_FI_PROF_TENSOR_UTIL_RATIO", Signal.GPU_TENSOR_ACTIVE_RATIO, value_type=_F),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", Signal.GPU_DRAM_ACTIVE_RATIO, value_type=_F, legacy=True),
    DcgmField("DCGM_FI_PROF_DRAM_UTIL_RATIO", Signal.GPU_DRAM_ACTIVE_RATIO, value_type=_F),
    # the DCP set's per-precision pipes (commented out in the exporter's CSVs, there to enable)
    DcgmField("DCGM_FI_PROF_PIPE_FP64_ACTIVE", Signal.GPU_FP64_ACTIVE_RATIO, value_type=_F),
    DcgmField("DCGM_FI_PROF_PIPE_FP32_ACTIVE", Signal.GPU_FP32_ACTIVE_RATIO, value_type=_F),
    DcgmField("DCGM_FI_PROF_PIPE_FP16_ACTIVE", Signal.GPU_FP16_ACTIVE_RATIO, value_type=_F),
    DcgmField("DCGM_FI_DEV_VGPU_LICENSE_STATUS", Signal.GPU_VGPU_LICENSE_STATUS),
    # generated by the exporter itself: counts over its window (`window_size_in_ms`), labelled
    # `xid`, `clock_event`; health by `health_watch` and `health_error_code`; P2P by `peer_gpu`
    DcgmField("DCGM_EXP_XID_ERRORS_COUNT", Signal.GPU_XID_EVENTS),
    DcgmField("DCGM_EXP_GPU_HEALTH_STATUS", Signal.GPU_HEALTH_STATUS),
    DcgmField("DCGM_EXP_CLOCK_EVENTS_COUNT", Signal.GPU_CLOCK_EVENTS),
    DcgmField("DCGM_EXP_P2P_STATUS", Signal.GPU_P2P_STATUS),
)

# Ranges of normalised values, where the field has one by definition.
CLAMPS: Mapping[Signal, tuple[float, float]] = {
    Signal.GPU_UTIL_RATIO: (0.0, 1.0),
    Signal.GPU_MEMORY_COPY_UTIL_RATIO: (0.0, 1.0),
    Signal.GPU_ENCODER_UTIL_RATIO: (0.0, 1.0),
    Signal.GPU_DECODER_UTIL_RATIO: (0.0, 1.0),
}

# (old label, new label); the new one is what the store keeps.
LABEL_RENAMES: tuple[tuple[str, str], ...] = (
    ("Hostname", "hostname"),
    ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
    ("exported_pod", "pod"),
    ("exported_namespace", "namespace"),
    ("exported_container", "container"),
)


def canonical_names() -> dict[Signal, str]:
    """Each DCGM signal's canonical metric name: its field name since dcgm-exporter 4.9.0."""
    return {f.signal: f.name for f in DCGM_FIELDS if not f.legacy}


# dcgm-exporter writes counters without `_total`, but OpenMetrics-minded readers (the
# prometheus_client parser, an OpenTelemetry Collector's Prometheus exporter) append it to any
# family typed counter, and the type of each field is whatever the exporter's CSV says.
COUNTER_SUFFIX = "_total"


def _entries() -> Iterator[CatalogueEntry]:
    canonical = canonical_names()
    for f in DCGM_FIELDS:
        metric = canonical[f.signal]
        blank_at, blank_values = f.blanks()
        for name in (f.name, f.name + COUNTER_SUFFIX):
            yield CatalogueEntry(
                exposed=name,
                signal=f.signal,
                metric=metric,
                family=metric,
                alias=f.legacy,
                scale=f.scale,
                blank_at=blank_at,
                blank_values=blank_values,
                clamp=CLAMPS.get(f.signal),
            )


DCGM_CATALOGUE = Catalogue(
    name="dcgm",
    entries=tuple(_entries()),
    source_rule=SourceRule(default=Source.DCGM),
    label_renames=LABEL_RENAMES,
)


def catalogue_dcgm_frame(samples: pl.LazyFrame, *, page_by: Sequence[str] = ()) -> pl.LazyFrame:
    """Many dcgm-exporter pages catalogued at once (see `catalogue.catalogue_frame`)."""
    return catalogue_frame(samples, catalogue=DCGM_CATALOGUE, page_by=page_by)
