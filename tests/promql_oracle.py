"""A real Prometheus 2.42 as a PromQL oracle: started on 127.0.0.1, fed by remote write.

One server answers a whole test module. Each batch of series is pushed with the remote-write
protocol (a protobuf WriteRequest, snappy-compressed), which lands in the TSDB head at once,
so hypothesis can push and query example after example, and shrink, without restarts.
Queries go through the ordinary HTTP API; values come back formatted by Go's
strconv.FormatFloat(v, 'f', -1, 64), which round-trips float64 exactly.

Series are created in the order they are pushed, and an instant-vector selector on the head
yields series in creation order; that is the order `histogram_quantile` sees buckets in.
"""

from __future__ import annotations

import itertools
import socket
import struct
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.protobuf_wire import field, varint

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Series:
    """One series to push: its labels (with `__name__`) and (timestamp_ms, value) samples."""

    labels: Mapping[str, str]
    samples: Sequence[tuple[int, float]]


# -- remote write encoding -------------------------------------------------------------------


def encode_write_request(series: Sequence[Series]) -> bytes:
    """prometheus.WriteRequest{timeseries: [TimeSeries{labels, samples}]} as protobuf."""
    out = bytearray()
    for one in series:
        body = bytearray()
        for name in sorted(one.labels):
            label = field(1, name.encode()) + field(2, one.labels[name].encode())
            body += field(1, label)
        for ts_ms, value in one.samples:
            if ts_ms < 0:
                raise ValueError(f"timestamp {ts_ms} ms: the oracle pushes non-negative ones")
            sample = b"\x09" + struct.pack("<d", value) + b"\x10" + varint(ts_ms)
            body += field(2, sample)
        out += field(1, bytes(body))
    return bytes(out)


def snappy_block(data: bytes) -> bytes:
    """Snappy block format made of literals only: valid input for any snappy decoder."""
    out = bytearray(varint(len(data)))
    chunk = 1 << 16
    for start in range(0, len(data), chunk):
        piece = data[start : start + chunk]
        # Tag 61: a literal whose length - 1 follows in two little-endian bytes.
        out += bytes([61 << 2]) + struct.pack("<H", len(piece) - 1) + piece
    return bytes(out)


# -- the server ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def format_ms(ts_ms: int) -> str:
    """Milliseconds as the API's decimal seconds, exactly."""
    sign = "-" if ts_ms < 0 else ""
    whole, rest = divmod(abs(ts_ms), 1000)
    return f"{sign}{whole}.{rest:03d}"


def _api_ms(ts_s: float) -> int:
    return round(ts_s * 1000)


class PrometheusOracle:
    """A running Prometheus with the remote-write receiver on; `stop()` ends it."""

    def __init__(self, process: subprocess.Popen[bytes], base_url: str, log_path: Path) -> None:
        self._process = process
        self._log_path = log_path
        self._client = httpx.Client(base_url=base_url, timeout=30.0)
        self._runs = itertools.count()

    @classmethod
    def start(cls, binary: str, workdir: Path) -> PrometheusOracle:
        config = workdir / "prometheus.yml"
        # No scrape jobs: the only data is what tests push.
        config.write_text("global:\n  evaluation_interval: 1h\n", encoding="utf-8")
        last_error = ""
        for attempt in range(3):
            port = _free_port()
            log_path = workdir / f"prometheus-{attempt}.log"
            data_dir = workdir / f"data-{attempt}"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={data_dir}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--web.enable-remote-write-receiver",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            oracle = cls(process, f"http://127.0.0.1:{port}", log_path)
            if oracle._wait_ready():
                return oracle
            oracle.stop()
            last_error = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"prometheus did not become ready on 127.0.0.1: {last_error}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                if self._client.get("/-/ready", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            # Not up yet: pace the next poll by waiting on the process, which also
            # returns at once should it exit.
            try:
                self._process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
        return False

    def stop(self) -> None:
        self._client.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def new_run(self) -> str:
        """A label value no earlier push used: keeps each example's series apart."""
        return f"r{next(self._runs)}"

    def write(self, series: Sequence[Series]) -> None:
        response = self._client.post(
            "/api/v1/write",
            content=snappy_block(encode_write_request(series)),
            headers={
                "Content-Encoding": "snappy",
                "Content-Type": "application/x-protobuf",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
            },
        )
        if response.status_code // 100 != 2:
            raise RuntimeError(f"remote write refused ({response.status_code}): {response.text}")

    def _get(self, path: str, params: Mapping[str, str]) -> dict[str, object]:
        response = self._client.post(path, data=dict(params))
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"query {dict(params)} failed ({response.status_code}): {body}")
        data: dict[str, object] = body["data"]
        return data

    def query(self, expr: str, *, at_ms: int) -> list[tuple[dict[str, str], float]]:
        """Instant query: (labels, value) per result sample."""
        data = self._get("/api/v1/query", {"query": expr, "time": format_ms(at_ms)})
        results = data["result"]
        assert isinstance(results, list)
        return [(item["metric"], float(item["value"][1])) for item in results]

    def query_range(
        self, expr: str, *, start_ms: int, end_ms: int, step_ms: int
    ) -> list[tuple[dict[str, str], dict[int, float]]]:
        """Range query: (labels, {eval_ms: value}) per result series."""
        data = self._get(
            "/api/v1/query_range",
            {
                "query": expr,
                "start": format_ms(start_ms),
                "end": format_ms(end_ms),
                "step": format_ms(step_ms),
            },
        )
        results = data["result"]
        assert isinstance(results, list)
        return [
            (item["metric"], {_api_ms(float(ts)): float(v) for ts, v in item["values"]})
            for item in results
        ]


# -- le spellings ----------------------------------------------------------------------------


def _case_variants(word: str) -> Iterator[str]:
    for flags in itertools.product((False, True), repeat=len(word)):
        yield "".join(c.upper() if up else c.lower() for c, up in zip(word, flags, strict=True))


def le_spellings(bound: float) -> Iterator[str]:
    """Distinct `le` label values that Go's strconv.ParseFloat reads as `bound`.

    Equal bounds must come from distinct series, so each repeat needs its own spelling.
    """
    if bound != bound:
        yield from _case_variants("nan")
    elif bound in (float("inf"), float("-inf")):
        signs = ("-",) if bound < 0 else ("+", "")
        for word in ("inf", "infinity"):
            for variant in _case_variants(word):
                for sign in signs:
                    yield sign + variant
    else:
        text = repr(bound)
        sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
        for zeros in itertools.count():
            yield sign + "0" * zeros + digits


def le_labels(bounds: Sequence[float]) -> list[str]:
    """One distinct spelling per bound, in order."""
    spellings: dict[str, Iterator[str]] = {}
    labels = []
    for bound in bounds:
        key = repr(bound)
        if key not in spellings:
            spellings[key] = le_spellings(bound)
        labels.append(next(spellings[key]))
    return labels
