"""DCGM exporter pages of emulated GPU hosts: dcgm-exporter's default fields, tied to load.

Each host serves one page covering its GPUs, with dcgm-exporter's default counters
(`etc/default-counters.csv`: 25 fields plus the driver version as a label), its label set
(`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`) and
its text layout (integers as integers, floating-point fields with six decimals). A replica owns
one GPU, or `placement.gpus` GPUs with tensor parallelism, and its load is spread evenly over
them; a MIG replica (`placement.mig_profile`) owns one slice of its host's MIG GPU, labelled as
dcgm-exporter labels slices (the parent's `UUID` and `gpu`, plus `GPU_I_PROFILE` and
`GPU_I_ID`, instance ids from 1 in placement order). A replica placed in a Kubernetes
namespace (`placement.namespace`) is a pod named as the replica: its GPUs carry `container`,
`namespace` and `pod` last, as the exporter's Kubernetes mapping appends them.

How values follow load (a model, stated so nobody mistakes it for measurement):
- `activity` = busy_ratio * (0.3 + 0.7 * running / (running + 32)): the engine's duty cycle,
  weighted by how full the batch is, because larger batches keep more of the GPU busy per step.
- power, tensor-pipe activity, DRAM activity, clocks and temperatures rise with `activity`.
- `GPU_UTIL` saturates: it counts sample periods in which any kernel ran, so it reads ~100
  under any steady load and is a poor load signal, as on real GPUs.
- `FB_USED` is flat while the vLLM process lives (it reserves gpu_memory_utilization of the
  memory at start-up) and near zero while it is down: it shows fit, not load.
- Energy integrates power between samples. Error counters stay at zero.
- No two GPUs read alike: each GPU (each slice) has a fixed `variation` of 0.92-1.08 scaling
  its activity, duty cycle and power, so the two GPUs of a tensor-parallel replica differ too.
- A MIG slice reports every field for itself, its framebuffer sized by its profile; real
  exporters may repeat some device-level fields of the parent GPU on each slice.
Every page also carries `servewatch_emulated 1`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from servewatch.emulator.records import (
    EngineSteps,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)

PAGE_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EMULATED_GAUGE = "servewatch_emulated"
BATCH_HALF_FILL = 32  # running requests at which the batch counts as half full
POD_CONTAINER = "vllm"  # the container of a replica's pod that requested its GPUs


class FieldType(Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True)
class DcgmField:
    name: str
    type: FieldType
    help: str
    is_float: bool = False


# dcgm-exporter's default-counters.csv, in file order.
DEFAULT_FIELDS = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", FieldType.GAUGE, "SM clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", FieldType.GAUGE, "Memory clock frequency (in MHz)."),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", FieldType.GAUGE, "Memory temperature (in C)."),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", FieldType.GAUGE, "GPU temperature (in C)."),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", FieldType.GAUGE, "Power draw (in W).", is_float=True),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        FieldType.COUNTER,
        "Total energy consumption since boot (in mJ).",
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", FieldType.COUNTER, "Total number of PCIe retries."
    ),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", FieldType.GAUGE, "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", FieldType.GAUGE, "Memory utilization (in %)."),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", FieldType.GAUGE, "Encoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", FieldType.GAUGE, "Decoder utilization (in %)."),
    DcgmField(
        "DCGM_FI_DEV_XID_ERRORS", FieldType.GAUGE, "Value of the last XID error encountered."
    ),
    DcgmField("DCGM_FI_DEV_FB_FREE", FieldType.GAUGE, "Framebuffer memory free (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_USED", FieldType.GAUGE, "Framebuffer memory used (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", FieldType.GAUGE, "Framebuffer memory reserved (in MiB)."),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        FieldType.COUNTER,
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    DcgmField("DCGM_FI_DEV_VGPU_LICENSE_STATUS", FieldType.GAUGE, "vGPU License status"),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        FieldType.COUNTER,
        "Number of remapped rows for uncorrectable errors",
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        FieldType.COUNTER,
        "Number of remapped rows for correctable errors",
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", FieldType.GAUGE, "Whether remapping of rows has failed"
    ),
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        FieldType.GAUGE,
        "Ratio of time the graphics engine is active.",
        is_float=True,
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        FieldType.GAUGE,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        is_float=True,
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        FieldType.GAUGE,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        is_float=True,
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        FieldType.GAUGE,
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        FieldType.GAUGE,
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
)


@dataclass(frozen=True)
class GpuSpec:
    """The emulated GPU model (defaults: an H100 80GB HBM3 SXM) and its exporter's driver."""

    model_name: str = "NVIDIA H100 80GB HBM3"
    fb_total_mib: int = 81559
    fb_reserved_mib: int = 329
    idle_power_w: float = 70.0
    max_power_w: float = 700.0
    idle_sm_clock_mhz: int = 345
    max_sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    idle_gpu_temp_c: float = 30.0
    max_gpu_temp_c: float = 68.0
    idle_memory_temp_c: float = 36.0
    max_memory_temp_c: float = 78.0
    nvlink_peak_bytes_per_s: float = 4.5e11
    driver_version: str = "580.105.08"


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of a host (or one MIG slice of it) and the replica that owns it."""

    host: str
    index: int
    uuid: str  # a MIG slice carries its parent GPU's UUID, as dcgm-exporter writes it
    pci_bus_id: str
    replica: str
    replica_gpus: int  # how many GPUs the owning replica spreads over (tensor parallelism)
    gpu_instance: int | None = None  # the MIG GPU instance id (GPU_I_ID)
    mig_profile: str | None = None  # the MIG profile (GPU_I_PROFILE)
    namespace: str | None = None  # the owning pod's namespace (Kubernetes mapping)

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"

    @property
    def key(self) -> str:
        """Unique per GPU and per MIG slice (the UUID alone is shared by slices)."""
        return self.uuid if self.gpu_instance is None else f"{self.uuid}/{self.gpu_instance}"

    @property
    def variation(self) -> float:
        """0.92-1.08: no two GPUs draw alike under one load (silicon, cooling, position)."""
        digest = hashlib.sha256(self.key.encode()).digest()
        return 0.92 + 0.16 * (int.from_bytes(digest[:4], "big") % 1000) / 1000


def _gpu_uuid(host: str, index: int) -> str:
    digest = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _pci_bus_id(index: int) -> str:
    # An eight-GPU HGX board's bus numbers, one PCI domain per board.
    return f"{index // 8:08X}:{0x53 + 0x11 * (index % 8):02X}:00.0"


def host_gpus(placements: Iterable[ReplicaPlacement]) -> dict[str, tuple[GpuDevice, ...]]:
    """GPUs of every host, numbered on each host in placement order."""
    devices: dict[str, list[GpuDevice]] = {}
    mig_gpus: dict[str, int] = {}  # host -> index of its MIG GPU
    for placement in placements:
        if placement.gpus < 1:
            raise ValueError(
                f"replica {placement.replica!r} on host {placement.host!r} has "
                f"gpus={placement.gpus}; a replica needs at least one GPU"
            )
        on_host = devices.setdefault(placement.host, [])
        if placement.mig_profile is not None:
            # MIG replicas of a host share one GPU, a slice each; instance ids from 1.
            index = mig_gpus.setdefault(placement.host, len({d.index for d in on_host}))
            slices = sum(1 for d in on_host if d.gpu_instance is not None)
            on_host.append(
                GpuDevice(
                    host=placement.host,
                    index=index,
                    uuid=_gpu_uuid(placement.host, index),
                    pci_bus_id=_pci_bus_id(index),
                    replica=placement.replica,
                    replica_gpus=1,
                    gpu_instance=slices + 1,
                    mig_profile=placement.mig_profile,
                    namespace=placement.namespace,
                )
            )
            continue
        for _ in range(placement.gpus):
            index = len({d.index for d in on_host})
            on_host.append(
                GpuDevice(
                    host=placement.host,
                    index=index,
                    uuid=_gpu_uuid(placement.host, index),
                    pci_bus_id=_pci_bus_id(index),
                    replica=placement.replica,
                    replica_gpus=placement.gpus,
                    namespace=placement.namespace,
                )
            )
    return {host: tuple(gpus) for host, gpus in devices.items()}


def gpu_activity(state: ReplicaState | None) -> float:
    """0-1: how hard the replica drives its GPUs (see the module docstring)."""
    if state is None or not state.up:
        return 0.0
    busy = min(max(state.busy_ratio, 0.0), 1.0)
    running = max(state.running, 0)
    return busy * (0.3 + 0.7 * running / (running + BATCH_HALF_FILL))


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values at one sample, field name -> value."""

    device: GpuDevice
    values: dict[str, float]


def gpu_values(
    device: GpuDevice,
    state: ReplicaState | None,
    *,
    spec: GpuSpec,
    process_alive: bool,
    gpu_memory_utilization: float,
    energy_mj: float,
    nvlink_total: float,
) -> dict[str, float]:
    """The default fields of one GPU for its replica's `state` (pure)."""
    variation = device.variation
    activity = min(gpu_activity(state) * variation, 1.0)
    busy = (
        min(max(state.busy_ratio, 0.0) * variation, 1.0) if state is not None and state.up else 0.0
    )
    tokens_per_s = max(state.tokens_per_s, 0.0) if state is not None and state.up else 0.0
    fb_total_mib = mig_memory_mib(device.mig_profile) or spec.fb_total_mib
    fb_used = round(fb_total_mib * gpu_memory_utilization) if process_alive else 0
    fb_used = min(fb_used, fb_total_mib - spec.fb_reserved_mib)
    return {
        "DCGM_FI_DEV_SM_CLOCK": spec.max_sm_clock_mhz if busy > 0 else spec.idle_sm_clock_mhz,
        "DCGM_FI_DEV_MEM_CLOCK": spec.mem_clock_mhz,
        "DCGM_FI_DEV_MEMORY_TEMP": round(
            spec.idle_memory_temp_c + (spec.max_memory_temp_c - spec.idle_memory_temp_c) * activity
        ),
        "DCGM_FI_DEV_GPU_TEMP": round(
            spec.idle_gpu_temp_c + (spec.max_gpu_temp_c - spec.idle_gpu_temp_c) * activity
        ),
        "DCGM_FI_DEV_POWER_USAGE": round(power_w(activity, spec) * variation, 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(energy_mj),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        # A kernel ran in a ~1/6 s sample window: saturates long before the GPU is full.
        "DCGM_FI_DEV_GPU_UTIL": round(100 * (1 - (1 - busy) ** 4)),
        "DCGM_FI_DEV_MEM_COPY_UTIL": round(100 * busy * (0.2 + 0.5 * activity)),
        "DCGM_FI_DEV_ENC_UTIL": 0,
        "DCGM_FI_DEV_DEC_UTIL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": fb_total_mib - spec.fb_reserved_mib - fb_used,
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_RESERVED": spec.fb_reserved_mib,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(nvlink_total),
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": busy,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.75 * activity,
        # Decode streams weights and KV from HBM every step, even for small batches.
        "DCGM_FI_PROF_DRAM_ACTIVE": busy * (0.35 + 0.5 * activity),
        "DCGM_FI_PROF_PCIE_TX_BYTES": round(
            (2.0e5 + 64.0 * tokens_per_s / device.replica_gpus) if process_alive else 0.0
        ),
        "DCGM_FI_PROF_PCIE_RX_BYTES": round(
            (3.0e5 + 256.0 * tokens_per_s / device.replica_gpus) if process_alive else 0.0
        ),
    }


_MIG_PROFILE = re.compile(r"\d+g\.(\d+)gb")


def mig_memory_mib(profile: str | None) -> int | None:
    """A MIG profile's memory (`1g.10gb`: 10 GiB), None off MIG or for a name not so formed."""
    match = _MIG_PROFILE.fullmatch(profile or "")
    return int(match.group(1)) * 1024 if match else None


def power_w(activity: float, spec: GpuSpec) -> float:
    return round(spec.idle_power_w + (spec.max_power_w - spec.idle_power_w) * activity, 3)


def _format_value(value: float, *, is_float: bool) -> str:
    # dcgm-exporter prints fp64 fields with %f and integer fields as integers.
    return f"{value:f}" if is_float else str(int(value))


def gpu_labels(device: GpuDevice, spec: GpuSpec) -> str:
    """A GPU's label set in dcgm-exporter's order: identity, MIG instance, host, driver, then
    (Kubernetes mapping) the owning pod's container, namespace and pod, sorted by name."""
    labels = (
        f'gpu="{device.index}",UUID="{device.uuid}",pci_bus_id="{device.pci_bus_id}",'
        f'device="{device.device}",modelName="{spec.model_name}"'
    )
    if device.mig_profile is not None:
        labels += f',GPU_I_PROFILE="{device.mig_profile}",GPU_I_ID="{device.gpu_instance}"'
    labels += f',Hostname="{device.host}",DCGM_FI_DRIVER_VERSION="{spec.driver_version}"'
    if device.namespace is not None:
        labels += (
            f',container="{POD_CONTAINER}",namespace="{device.namespace}",pod="{device.replica}"'
        )
    return labels


@functools.lru_cache(maxsize=256)
def _page_layout(
    devices: tuple[GpuDevice, ...], spec: GpuSpec
) -> tuple[tuple[tuple[str, str, bool], ...], str]:
    """A host page's text around its values: (text before, field, is_float) per sample, in
    page order, and the text after the last one. Hosts keep their GPUs, so each host's
    layout is built once."""
    label_sets = [gpu_labels(d, spec) for d in devices]
    samples: list[tuple[str, str, bool]] = []
    pending = ""
    for field in DEFAULT_FIELDS:
        pending += f"# HELP {field.name} {field.help}\n# TYPE {field.name} {field.type.value}\n"
        for labels in label_sets:
            samples.append((f"{pending}{field.name}{{{labels}}} ", field.name, field.is_float))
            pending = "\n"
    tail = (
        f"{pending}# HELP {EMULATED_GAUGE} 1: this page comes from the servewatch emulator, "
        f"not from a real dcgm-exporter.\n# TYPE {EMULATED_GAUGE} gauge\n{EMULATED_GAUGE} 1\n"
    )
    return tuple(samples), tail


def render_dcgm_page(readings: Sequence[GpuReading], *, spec: GpuSpec) -> bytes:
    """A host's dcgm-exporter page for `readings` (one per GPU, in GPU order)."""
    samples, tail = _page_layout(tuple(r.device for r in readings), spec)
    count = len(readings)
    parts: list[str] = []
    for i, (before, name, is_float) in enumerate(samples):
        parts.append(before)
        parts.append(_format_value(readings[i % count].values[name], is_float=is_float))
    parts.append(tail)
    return "".join(parts).encode()


class DcgmObserver:
    """The DCGM exporters of an emulated fleet's hosts.

    Events decide which processes live (`STARTED` / `CRASHED`) and which hosts are gone
    (`HOST_LOST` on any replica of a host takes the host's exporter down until a replica on it
    starts again, or until a replacement node is up but cannot start its replicas:
    `START_BLOCKED`, the node answering while the artifact registry is out); `sample` turns
    the simulation's states into readings, integrating energy and
    NVLink traffic over the time since the previous sample.
    """

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        *,
        started_s: float,
        spec: GpuSpec | None = None,
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        self.spec = spec or GpuSpec()
        self.gpu_memory_utilization = gpu_memory_utilization
        placement_list = list(placements)
        self.placements = {p.replica: p for p in placement_list}
        self.gpus = host_gpus(placement_list)
        self._lock = threading.Lock()
        self._alive = dict.fromkeys(self.placements, True)
        self._lost_hosts: set[str] = set()
        self._last_s = started_s
        self._states: dict[str, ReplicaState] = {}
        # Energy since boot: a boot some days before the emulation starts, differing per GPU.
        self._energy_mj = {
            gpu.key: 1.0e10 + int(gpu.uuid[4:12], 16) % 10**9
            for gpus in self.gpus.values()
            for gpu in gpus
        }
        self._nvlink = {gpu.key: 0.0 for gpus in self.gpus.values() for gpu in gpus}
        self._readings: dict[str, tuple[GpuReading, ...]] = {}
        self._refresh()

    def request_finished(self, record: FinishedRequest) -> None:
        """DCGM sees load only through the replica states."""

    def engine_steps(self, record: EngineSteps) -> None:
        """DCGM sees load only through the replica states."""

    def replica_event(self, event: ReplicaEvent) -> None:
        placement = self.placements.get(event.replica)
        if placement is None:
            raise KeyError(
                f"event for replica {event.replica!r}, which has no placement "
                f"(known: {sorted(self.placements)})"
            )
        with self._lock:
            if event.kind is ReplicaEventKind.STARTED:
                self._alive[event.replica] = True
                self._lost_hosts.discard(placement.host)
            elif event.kind is ReplicaEventKind.START_BLOCKED:
                self._lost_hosts.discard(placement.host)
            elif event.kind is ReplicaEventKind.CRASHED:
                self._alive[event.replica] = False
            elif event.kind is ReplicaEventKind.HOST_LOST:
                self._alive[event.replica] = False
                self._lost_hosts.add(placement.host)
            self._refresh()

    def sample(self, at_s: float, states: Iterable[ReplicaState]) -> None:
        """Take the simulation's snapshot at `at_s`: integrate energy up to now, then read."""
        with self._lock:
            elapsed_s = max(at_s - self._last_s, 0.0)
            for readings in self._readings.values():
                for reading in readings:
                    watts = reading.values["DCGM_FI_DEV_POWER_USAGE"]
                    self._energy_mj[reading.device.key] += watts * elapsed_s * 1000.0
                    if reading.device.replica_gpus > 1:
                        # Tensor-parallel all-reduces move data in proportion to the work.
                        share = reading.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] / 0.75
                        self._nvlink[reading.device.key] += (
                            self.spec.nvlink_peak_bytes_per_s * 0.2 * share * elapsed_s / 1024
                        )
            self._last_s = max(at_s, self._last_s)
            for state in states:
                self._states[state.replica] = state
            self._refresh()

    def _refresh(self) -> None:
        self._readings = {
            host: tuple(
                GpuReading(
                    device=gpu,
                    values=gpu_values(
                        gpu,
                        self._states.get(gpu.replica) if self._alive[gpu.replica] else None,
                        spec=self.spec,
                        process_alive=self._process_alive(gpu.replica),
                        gpu_memory_utilization=self.gpu_memory_utilization,
                        energy_mj=self._energy_mj[gpu.key],
                        nvlink_total=self._nvlink[gpu.key],
                    ),
                )
                for gpu in gpus
            )
            for host, gpus in self.gpus.items()
        }

    def _process_alive(self, replica: str) -> bool:
        state = self._states.get(replica)
        return self._alive[replica] and (state is None or state.up)

    def is_up(self, host: str) -> bool:
        with self._lock:
            return host not in self._lost_hosts

    def page(self, host: str) -> bytes | None:
        """The host's exporter page now, or None while the host is lost."""
        with self._lock:
            if host not in self.gpus:
                raise KeyError(f"unknown host {host!r} (known: {sorted(self.gpus)})")
            if host in self._lost_hosts:
                return None
            readings = self._readings[host]
        return render_dcgm_page(readings, spec=self.spec)
