"""The OTLP/gRPC trace receiver: `TraceService/Export` on 127.0.0.1:4317, vLLM's default protocol.

It answers by the same rules as the OTLP/HTTP receiver, through the same code (`export`): the
bearer token (metadata `authorization`), the size limit (`max_body_bytes`, before and after
gRPC's own decompression), decoding, mapping, partial_success and durability: an export is
answered OK only once its spans are committed. The method handler takes the request's bytes as
they arrived, so the receiver's own protobuf reader decodes them, as it does for HTTP.

Codes are the OTLP/gRPC equivalents of the HTTP answers: INVALID_ARGUMENT for a body that does
not decode, UNAUTHENTICATED for a missing or wrong token, RESOURCE_EXHAUSTED for a message over
the limit (gRPC's own refusal too) or every worker busy (`max_connections` exports at once),
UNAVAILABLE when the spans were not committed (clients retry it; the store deduplicates), and
INTERNAL for a failure of the receiver itself.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from servewatch.collectors.traces.export import (
    PROTOBUF,
    SOURCE_GRPC,
    ExportOutcome,
    ReceiverConfig,
    TraceBatchSink,
    answer_export,
)
from servewatch.collectors.traces.span_identity import TargetDirectory

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METHOD = "Export"
# An outcome's HTTP status -> the OTLP/gRPC code that means the same.
GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}


class GrpcListenError(OSError):
    """The gRPC listener cannot bind its address; the message names it and what to change."""


def _metadata_value(context: Any, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else None
    return None


class OtlpGrpcReceiver:
    """A gRPC server answering OTLP trace exports; it binds when made, `start()` and `stop()` it."""

    def __init__(
        self,
        config: ReceiverConfig,
        sink: TraceBatchSink,
        *,
        on_accepted: Callable[[ExportOutcome], None] | None = None,
        targets: Callable[[], TargetDirectory] = TargetDirectory,
    ) -> None:
        """`on_accepted` sees every committed export's outcome (recording); `targets` gives the
        scrape targets spans are matched to, as they are now."""
        self.config = config
        self.sink = sink
        self.on_accepted = on_accepted
        self.targets = targets
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                # No (de)serializers: the handler takes and returns the bytes on the wire.
                METHOD: grpc.unary_unary_rpc_method_handler(self._export),
            },
        )
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=config.max_connections, thread_name_prefix="otlp-grpc"),
            handlers=[handler],
            maximum_concurrent_rpcs=config.max_connections,
            options=[
                ("grpc.max_receive_message_length", config.max_body_bytes),
                # Without this a second server could share the port and take half the exports.
                ("grpc.so_reuseport", 0),
            ],
        )
        address = f"{config.grpc_host}:{config.grpc_port}"
        try:
            self._port = int(self._server.add_insecure_port(address))
        except RuntimeError as exc:
            raise GrpcListenError(
                f"cannot listen for OTLP/gRPC on {address}: the port is in use or the address "
                "is not this machine's; set [otlp] grpc_listen to a free HOST:PORT, or "
                "grpc = false"
            ) from exc
        self._started = False

    def _export(self, body: bytes, context: Any) -> bytes:
        outcome = answer_export(
            body,
            content_type=PROTOBUF,
            content_encoding="",  # gRPC has inflated a compressed message already
            authorization=_metadata_value(context, "authorization"),
            config=self.config,
            sink=self.sink,
            source=SOURCE_GRPC,
            targets=self.targets(),
            on_accepted=self.on_accepted,
        )
        if outcome.status != 200:
            code = GRPC_CODES.get(outcome.status, grpc.StatusCode.INTERNAL)
            context.abort(code, outcome.message or f"refused ({outcome.status})")
        return outcome.body

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        return f"http://{self.config.grpc_host}:{self.port}"

    def start(self) -> None:
        self._server.start()
        self._started = True

    def stop(self) -> None:
        """Stop accepting; exports in progress get their answer (within the commit timeout)."""
        self._server.stop(grace=self.config.commit_timeout_s if self._started else 0).wait()
        self._started = False
