"""A fixture folder's files: gzip-compressed pages and the span stream, written in order.

Fixture mode writes a hundred thousand pages and about 2 GB of span JSON a day; formatting
spans, compressing and writing cost about as much as the simulation itself. `FixtureFiles`
hands that work to a helper process (`python -m servewatch.emulator.fixture_files`) through a
pipe, so it runs on the second core: finished requests and replica events go over in batches and the
helper turns them into span lines (`JsonLinesSpanOutput`); vLLM pages go over as their sample
values (a tenth of the text) and DCGM pages as text, and the helper renders, compresses and
writes them. A thread would not do: it must take the GIL back from the
simulation after every compress and write call. `InlineFixtureFiles` does the same work in the
caller's process.

Both write the same bytes: the helper gets every record and page in the order the simulation
made them, pages are gzip-compressed with mtime 0 and span lines go through one gzip stream,
so a fixture does not depend on timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Protocol

from servewatch.emulator.records import (
    EngineKind,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
)
from servewatch.emulator.span_output import (
    JsonLinesSpanOutput,
    SpanFields,
    jsonl_span_output,
    span_fields,
)
from servewatch.emulator.vllm_metrics import EngineSettings, render_page_values

_HEADER = struct.Struct("<BIQ")  # kind, path length in bytes, data length in bytes
_SETUP, _PAGE, _RECORDS, _VLLM_PAGE = 1, 2, 3, 4
_BATCH = 512  # records per message
_EVENT_FIELD_COUNT = 6
_PIPE_BYTES = 1 << 20  # a larger pipe means fewer switches between the two processes
_F_SETPIPE_SZ = 1031  # fcntl's F_SETPIPE_SZ on Linux


class FixtureFilesError(RuntimeError):
    """Writing a fixture's files failed."""


class SpanSink(Protocol):
    """What `FixtureWriter` needs of its span output."""

    spans_emitted: int

    def request_finished(self, record: FinishedRequest) -> None: ...

    def replica_event(self, event: ReplicaEvent) -> None: ...

    def shutdown(self) -> None: ...


class InlineFixtureFiles:
    """Pages and span lines written at once, in the caller's process."""

    def __init__(
        self,
        spans_path: Path,
        *,
        settings: EngineSettings,
        compresslevel: int,
        placements: Iterable[ReplicaPlacement],
        seed: int,
        spans_per_line: int,
        conversation_ids: bool = False,
    ) -> None:
        self.settings = settings
        self.compresslevel = compresslevel
        # mtime=0 keeps the gzip header, and so the whole folder, the same from run to run.
        self._spans_file = gzip.GzipFile(
            spans_path, mode="wb", compresslevel=compresslevel, mtime=0
        )
        self.spans: JsonLinesSpanOutput = jsonl_span_output(
            placements,
            _Utf8Lines(self._spans_file),
            seed=seed,
            spans_per_line=spans_per_line,
            conversation_ids=conversation_ids,
        )

    def page(self, path: Path | bytes, data: bytes) -> None:
        compressed = gzip.compress(data, compresslevel=self.compresslevel, mtime=0)
        # os-level calls: a day is a hundred thousand files, and a file object costs more
        # than the write. Mode and truncation as Path.write_bytes would have them.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(compressed)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def vllm_page(self, path: Path | bytes, model_name: str, values: list[float]) -> None:
        """A vLLM page from `VllmMetricsObserver.page_values`."""
        self.page(path, render_page_values(model_name, self.settings, values))

    def close(self) -> None:
        self.spans.shutdown()
        self._spans_file.close()


class _Utf8Lines:
    """The text stream a span output writes to, over the gzip stream."""

    def __init__(self, binary: gzip.GzipFile) -> None:
        self._binary = binary

    def write(self, text: str) -> int:
        self._binary.write(text.encode())
        return len(text)

    def flush(self) -> None:
        """The gzip stream is flushed when it closes."""


_EventFields = tuple[str, float, str, str, float, str | None]


def _event_fields(event: ReplicaEvent) -> _EventFields:
    # A compiled frozen record cannot be unpickled (unpickling sets its fields one by one).
    return (event.replica, event.at_s, event.kind.value, event.detail, event.factor, event.model)


def _event(fields: _EventFields) -> ReplicaEvent:
    replica, at_s, kind, detail, factor, model = fields
    return ReplicaEvent(replica, at_s, ReplicaEventKind(kind), detail, factor, model)


class _ForwardedSpans:
    """`FixtureFiles`' span output: records batched for the helper, which makes the spans."""

    def __init__(self, files: FixtureFiles, placements: Iterable[ReplicaPlacement]) -> None:
        self._files = files
        self._known = {p.replica for p in placements}
        # Span fields (12 values) and event fields (6), in the order they happened.
        self._batch: list[SpanFields | _EventFields] = []
        self.spans_emitted = 0

    def request_finished(self, record: FinishedRequest) -> None:
        if record.replica not in self._known:
            raise KeyError(
                f"record for replica {record.replica!r}, which has no placement "
                f"(known: {sorted(self._known)})"
            )
        # What the span needs, as a tuple: several times cheaper to pickle than the record,
        # and every value keeps its type.
        self._batch.append(span_fields(record))
        self.spans_emitted += 1
        if len(self._batch) >= _BATCH:
            self.send()

    def replica_event(self, event: ReplicaEvent) -> None:
        self._batch.append(_event_fields(event))

    def send(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._files.send(_RECORDS, b"", pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))

    def shutdown(self) -> None:
        self.send()


class FixtureFiles:
    """Pages and span records handed to a helper process that writes the fixture's files.

    Errors in the helper surface at the next call or at `close`, with its message.
    """

    def __init__(
        self,
        spans_path: Path,
        *,
        settings: EngineSettings,
        compresslevel: int,
        placements: Iterable[ReplicaPlacement],
        seed: int,
        spans_per_line: int,
        conversation_ids: bool = False,
    ) -> None:
        placement_list = list(placements)
        # The folder that holds the `servewatch` package, as this module was imported (a
        # source tree or site-packages): the helper imports the same code.
        package_root = str(Path(__file__).parents[len(__name__.split(".")) - 1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        self._process = subprocess.Popen(
            [sys.executable, "-m", "servewatch.emulator.fixture_files"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        stdin = self._process.stdin
        if stdin is None:
            raise FixtureFilesError("the fixture file writer has no input pipe")
        self._pipe: IO[bytes] = stdin
        try:
            import fcntl  # noqa: PLC0415 (POSIX only; elsewhere the default pipe size does)

            fcntl.fcntl(self._pipe.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
        except (ImportError, OSError):
            pass
        self._closed = False
        self.spans = _ForwardedSpans(self, placement_list)
        setup = {
            "spans_path": str(spans_path),
            "settings": dataclasses.asdict(settings),
            "compresslevel": compresslevel,
            "placements": [
                {**dataclasses.asdict(p), "engine": p.engine.value} for p in placement_list
            ],
            "seed": seed,
            "spans_per_line": spans_per_line,
            "conversation_ids": conversation_ids,
        }
        self.send(_SETUP, b"", json.dumps(setup).encode())

    def send(self, kind: int, path: bytes, data: bytes) -> None:
        if self._closed:
            raise FixtureFilesError("the fixture files are closed")
        try:
            # One write, so one pipe transfer per item rather than a small one and a large one.
            self._pipe.write(b"".join((_HEADER.pack(kind, len(path), len(data)), path, data)))
        except (BrokenPipeError, ValueError) as exc:
            raise self._failure() from exc

    def _failure(self) -> FixtureFilesError:
        self._closed = True
        with contextlib.suppress(BrokenPipeError):
            self._pipe.close()
        code = self._process.wait()
        stderr = self._process.stderr.read() if self._process.stderr else b""
        tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-5:])
        return FixtureFilesError(f"the fixture file writer exited with {code}: {tail}")

    def page(self, path: Path | bytes, data: bytes) -> None:
        self.spans.send()  # keeps the records waiting in memory to one scrape's worth
        self.send(_PAGE, os.fsencode(path), data)

    def vllm_page(self, path: Path | bytes, model_name: str, values: list[float]) -> None:
        """A vLLM page from `VllmMetricsObserver.page_values`, rendered by the helper."""
        self.spans.send()
        self.send(_VLLM_PAGE, os.fsencode(path), pickle.dumps((model_name, values), protocol=5))

    def close(self) -> None:
        """Wait until every file is written; raises if any was not."""
        if self._closed:
            return
        self.spans.shutdown()
        try:
            self._pipe.close()
        except BrokenPipeError as exc:
            raise self._failure() from exc
        code = self._process.wait()
        self._closed = True
        stderr = self._process.stderr.read() if self._process.stderr else b""
        if self._process.stderr:
            self._process.stderr.close()
        if code != 0:
            tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-5:])
            raise FixtureFilesError(f"the fixture file writer exited with {code}: {tail}")


def _items(stream: IO[bytes]) -> Iterator[tuple[int, bytes, bytes]]:
    while header := stream.read(_HEADER.size):
        if len(header) != _HEADER.size:
            raise FixtureFilesError("the input ended inside an item header")
        kind, path_len, data_len = _HEADER.unpack(header)
        path = stream.read(path_len)
        data = stream.read(data_len)
        if len(path) != path_len or len(data) != data_len:
            raise FixtureFilesError("the input ended inside an item")
        yield kind, path, data


def _serve(stream: IO[bytes]) -> None:
    items = _items(stream)
    kind, _, data = next(items, (0, b"", b""))
    if kind != _SETUP:
        raise FixtureFilesError("the input does not start with the fixture's setup")
    setup = json.loads(data)
    files = InlineFixtureFiles(
        Path(setup["spans_path"]),
        settings=EngineSettings(**setup["settings"]),
        compresslevel=setup["compresslevel"],
        placements=[
            ReplicaPlacement(**{**p, "engine": EngineKind(p["engine"])})
            for p in setup["placements"]
        ],
        seed=setup["seed"],
        spans_per_line=setup["spans_per_line"],
        conversation_ids=setup["conversation_ids"],
    )
    spans = files.spans
    for kind, path, data in items:
        if kind == _PAGE:
            files.page(path, data)
        elif kind == _VLLM_PAGE:
            model_name, values = pickle.loads(data)  # noqa: S301 (our parent, via a pipe)
            files.vllm_page(path, model_name, values)
        elif kind == _RECORDS:
            for record in pickle.loads(data):  # noqa: S301 (our own parent process, via a pipe)
                if len(record) == _EVENT_FIELD_COUNT:
                    spans.replica_event(_event(record))
                else:
                    spans.request_fields(record)
        else:
            raise FixtureFilesError(f"unknown item kind {kind}")
    files.close()


def main() -> int:
    """The helper process: items from stdin until it closes; a failure is one stderr line."""
    try:
        _serve(sys.stdin.buffer)
    except (OSError, ValueError, KeyError, FixtureFilesError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
