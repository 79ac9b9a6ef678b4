"""Fixture mode's fast output paths write exactly what the general paths write.

Spans straight from records against SDK spans through the OTLP JSON encoder; vLLM pages from
the template against prometheus-client's encoder; DCGM pages from a cached layout against
plain line-by-line rendering; and a whole fixture folder, written on its own thread, the same
bytes run after run.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from servewatch.emulator import native
from servewatch.emulator.dcgm_metrics import (
    DEFAULT_FIELDS,
    EMULATED_GAUGE,
    DcgmObserver,
    GpuReading,
    GpuSpec,
    host_gpus,
    render_dcgm_page,
)
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fixture_files import FixtureFilesError
from servewatch.emulator.fixture_writer import FixtureWriter, record_fixture
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.otlp_jsonl import OtlpJsonLinesExporter
from servewatch.emulator.records import (
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.span_output import (
    SeededIdGenerator,
    SpanOutput,
    SyncBatchSpanProcessor,
    jsonl_span_output,
)
from servewatch.emulator.vllm_metrics import (
    EngineSettings,
    ReplicaMetrics,
    encode_families,
    page_template,
    render_vllm_page,
)
from tests.conftest import REPO_ROOT

T0 = 1_795_000_000.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLACEMENTS = (
    ReplicaPlacement("vllm-0", "host-a", "zone-1", MODEL, "chat", 1),
    ReplicaPlacement("vllm-1", "host-a", "zone-1", MODEL, "chat", 1),
    ReplicaPlacement("vllm-2", "host-b", "zone-2", "other/model-\u00e9", "batch", 2),
)


class Recorder:
    """Keeps every record a simulation reports, in order."""

    def __init__(self) -> None:
        self.records: list[FinishedRequest | ReplicaEvent] = []

    def request_finished(self, record: FinishedRequest) -> None:
        self.records.append(record)

    def engine_steps(self, record: EngineSteps) -> None:
        """Steps leave no spans."""

    def replica_event(self, event: ReplicaEvent) -> None:
        self.records.append(event)


def failing_config() -> FleetConfig:
    return dataclasses.replace(
        FleetConfig.default(),
        failures=(
            FailureSpec(FailureKind.REPLICA_CRASH, at_s=90.0, target="vllm-2"),
            FailureSpec(
                FailureKind.ERROR_BURST, at_s=30.0, target="vllm-1", duration_s=60, error_ratio=0.5
            ),
        ),
    )


def both_span_paths(
    placements: tuple[ReplicaPlacement, ...] | list[ReplicaPlacement],
    records: list[FinishedRequest | ReplicaEvent],
    *,
    per_line: int,
    conversation_ids: bool = False,
) -> tuple[str, str]:
    general, direct = io.StringIO(), io.StringIO()
    sdk = SpanOutput(
        placements,
        SyncBatchSpanProcessor(OtlpJsonLinesExporter(general), batch_size=per_line),
        id_generator=SeededIdGenerator(5),
        conversation_ids=conversation_ids,
    )
    fast = jsonl_span_output(
        placements, direct, seed=5, spans_per_line=per_line, conversation_ids=conversation_ids
    )
    for output in (sdk, fast):
        for record in records:
            if isinstance(record, FinishedRequest):
                output.request_finished(record)
            else:
                output.replica_event(record)
        output.shutdown()
    return general.getvalue(), direct.getvalue()


def test_direct_span_lines_equal_the_sdk_encoders_for_a_simulated_fleet() -> None:
    config = failing_config()
    recorder = Recorder()
    FleetSimulation(config, observer=recorder, seed=9, start_s=T0).run_until(T0 + 240)
    finished = [r for r in recorder.records if isinstance(r, FinishedRequest)]
    assert len(finished) > 300
    assert any(r.failed for r in finished)
    assert any(
        isinstance(r, ReplicaEvent) and r.kind is ReplicaEventKind.STARTED for r in recorder.records
    )
    general, direct = both_span_paths(config.placements(), recorder.records, per_line=64)
    assert direct == general
    assert len(direct.splitlines()) == math.ceil(len(finished) / 64)


def request(n: int, replica: str = "vllm-0", **changes: object) -> FinishedRequest:
    base = FinishedRequest(
        replica=replica,
        request_id=f"cmpl-{n}",
        conversation_id=None,
        tenant=None,
        arrival_s=T0 + n,
        queue_s=0.02,
        prefill_s=0.05,
        decode_s=0.3,
        prompt_tokens=100,
        cached_prompt_tokens=0,
        completion_tokens=16,
        max_tokens=64,
        finished_reason=FinishedReason.STOP,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "odd",
    [
        {"tenant": 'acme "quoted" \u00e9'},
        {"finished_reason": FinishedReason.ABORT, "completion_tokens": 0, "decode_s": 0.0},
        {"queue_s": 0, "prompt_tokens": 7},  # an int where a float is usual
        {"arrival_s": 0.0},  # a zero start time is left out of the span
        {"request_id": "id-\u2603\n"},
    ],
    ids=["tenant", "abort", "int-time", "zero-start", "odd-id"],
)
def test_direct_span_lines_equal_the_sdk_encoders_for_odd_records(odd: dict[str, object]) -> None:
    records: list[FinishedRequest | ReplicaEvent] = [
        request(0),
        request(1, "vllm-2", **odd),
        ReplicaEvent("vllm-0", T0 + 2, ReplicaEventKind.STARTED, model="rolled/model@v2"),
        request(3, **odd),
        request(4, "vllm-1"),
    ]
    general, direct = both_span_paths(PLACEMENTS, records, per_line=3)
    assert direct == general


@pytest.mark.parametrize("conversation_ids", [False, True])
def test_spans_name_their_conversation_only_when_the_gateway_does(
    *, conversation_ids: bool
) -> None:
    records: list[FinishedRequest | ReplicaEvent] = [
        request(0, conversation_id="conv-\u2603", tenant="acme"),
        request(1, conversation_id="conv-2"),
        request(2, conversation_id="conv-3", queue_s=0),  # through the SDK encoder
        request(3),
    ]
    general, direct = both_span_paths(
        PLACEMENTS, records, per_line=2, conversation_ids=conversation_ids
    )
    assert direct == general
    named = direct.count('"key":"gen_ai.conversation.id"')
    assert named == (3 if conversation_ids else 0)


def test_fast_vllm_page_is_prometheus_clients_encoding_for_large_and_odd_values() -> None:
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0 + 0.125, settings=EngineSettings())
    metrics.prompt_tokens = 123_456_789
    metrics.cached_prompt_tokens = 999_999
    metrics.generation_tokens = 1_000_000
    metrics.preemptions = 0
    metrics.itl.observe(0.0123, 10**7 + 3)
    metrics.itl.observe(0.5, 999_999)
    metrics.ttft.observe(1e-9)
    metrics.e2e.observe(12345.678)
    state = ReplicaState("vllm-0", True, 3, 0, 0.1 + 0.2, 1.0, 5.0)
    page = render_vllm_page(metrics, state)
    assert page == encode_families(metrics.families(state))
    parsed = {
        s.name: s.value
        for family in text_string_to_metric_families(page.decode())
        for s in family.samples
    }
    assert parsed["vllm:prompt_tokens_total"] == 123_456_789
    assert parsed["vllm:kv_cache_usage_perc"] == 0.1 + 0.2


def plain_dcgm_page(readings: list[GpuReading], spec: GpuSpec) -> bytes:
    """dcgm-exporter's layout written line by line, as the page was first rendered."""
    lines: list[str] = []
    for field in DEFAULT_FIELDS:
        lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} {field.type.value}"]
        for r in readings:
            d = r.device
            labels = (
                f'gpu="{d.index}",UUID="{d.uuid}",pci_bus_id="{d.pci_bus_id}",'
                f'device="{d.device}",modelName="{spec.model_name}",Hostname="{d.host}",'
                f'DCGM_FI_DRIVER_VERSION="{spec.driver_version}"'
            )
            raw = r.values[field.name]
            value = f"{raw:f}" if field.is_float else str(int(raw))
            lines.append(f"{field.name}{{{labels}}} {value}")
    lines += [
        (
            f"# HELP {EMULATED_GAUGE} 1: this page comes from the servewatch emulator, "
            "not from a real dcgm-exporter."
        ),
        f"# TYPE {EMULATED_GAUGE} gauge",
        f"{EMULATED_GAUGE} 1",
    ]
    return ("\n".join(lines) + "\n").encode()


def test_dcgm_page_layout_matches_line_by_line_rendering() -> None:
    observer = DcgmObserver(PLACEMENTS, started_s=T0)
    states = [
        ReplicaState(p.replica, True, 5 * i, i, 0.3, 0.2 * i, 900.0)
        for i, p in enumerate(PLACEMENTS)
    ]
    observer.sample(T0 + 15, states)
    observer.sample(T0 + 30, states)
    spec = GpuSpec()
    for host, gpus in host_gpus(PLACEMENTS).items():
        page = observer.page(host)
        assert page is not None
        readings = list(observer._readings[host])
        assert [r.device for r in readings] == list(gpus)
        assert page == plain_dcgm_page(readings, spec)
    assert render_dcgm_page([], spec=spec) == plain_dcgm_page([], spec)


def record_folder(folder: Path, *, seed: int, background: bool = True) -> dict[str, object]:
    config = failing_config()
    writer = FixtureWriter(
        folder,
        config.placements(),
        start_s=T0,
        scrape_interval_s=15.0,
        engine=EngineSettings.from_engine(config.engine),
        seed=seed,
        background=background,
    )
    simulation = FleetSimulation(config, observer=writer, seed=seed, start_s=T0)
    return record_fixture(simulation, writer, end_s=T0 + 180)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_same_seed_writes_a_byte_identical_fixture_folder(tmp_path: Path) -> None:
    first = record_folder(tmp_path / "a", seed=4)
    record_folder(tmp_path / "b", seed=4)
    record_folder(tmp_path / "c", seed=5)
    a, b, c = (folder_bytes(tmp_path / name) for name in "abc")
    pages = first["pages"]
    assert isinstance(pages, dict)
    assert len(a) == pages["count"] + 2  # pages, spans, manifest
    assert a == b
    assert a["spans.jsonl.gz"] != c["spans.jsonl.gz"]


def test_a_failed_page_write_is_reported_by_close(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    writer = FixtureWriter(folder, PLACEMENTS, start_s=T0, scrape_interval_s=15.0)
    (folder / "pages" / "vllm" / "vllm-1").rmdir()
    writer.scrape(T0, [])
    with pytest.raises(
        FixtureFilesError, match=r"exited with 1: \[Errno 2\] No such file.*vllm-1/1795000000000"
    ):
        writer.close(end_s=T0)


def test_background_and_inline_writing_give_the_same_folder(tmp_path: Path) -> None:
    record_folder(tmp_path / "a", seed=4)
    record_folder(tmp_path / "b", seed=4, background=False)
    assert folder_bytes(tmp_path / "a") == folder_bytes(tmp_path / "b")


def test_pure_python_writes_the_same_folder_as_this_process(tmp_path: Path) -> None:
    """Compiled modules (when this process has them) change nothing in a fixture."""
    record_folder(tmp_path / "here", seed=4)
    script = (
        "import sys; from pathlib import Path; "
        "from emulator import native; assert native.compiled_modules() == (); "
        "from tests.test_emulator_fast_outputs import record_folder; "
        "record_folder(Path(sys.argv[1]), seed=4)"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pure")],
        cwd=REPO_ROOT,
        env={**os.environ, native.DISABLE_ENV: "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert folder_bytes(tmp_path / "pure") == folder_bytes(tmp_path / "here")


def test_page_template_formats_every_value_as_prometheus_client_does() -> None:
    """Counts held as ints or as floats (compiled code stores them in a list[float]), signed
    zeros, large and fractional values: the text floatToGoString gives."""
    metrics = ReplicaMetrics(model_name=MODEL, created_s=T0 + 0.5, settings=EngineSettings())
    metrics.prompt_tokens = 2_345_678
    metrics.itl.observe(0.02, 999_999)
    metrics.itl.observe(0.3, 1_000_000)
    values = metrics.page_values(ReplicaState("vllm-0", True, 2, 1, 0.25, 1.0, 5.0))
    template = page_template(MODEL, EngineSettings())
    odd = [0.0, -0.0, 1e-7, 999_999.0, 1e6, 123.5, float(2**60), -3.0]
    for variant in (values, [float(v) for v in values], (odd * 40)[: len(values)]):
        expected = "".join(
            chunk + floatToGoString(value)
            for chunk, value in zip(template.chunks, variant, strict=True)
        )
        assert template.render(variant) == (expected + template.tail).encode()
