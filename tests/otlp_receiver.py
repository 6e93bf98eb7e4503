"""An OTLP/HTTP trace receiver for the tests (issue 23): it decodes each export's protobuf
with ``opentelemetry-proto``, so a child process configured by ``OTEL_*`` alone can be read
back span by span."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


class Receiver:
    """An OTLP/HTTP trace receiver on a loopback port: ``spans`` are ``(name, attributes,
    resource attributes, parent span id, span id)``, as decoded from each export."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                assert self.path == "/v1/traces", self.path
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for rs in request.resource_spans:
                        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                receiver.spans.append(
                                    {
                                        "name": span.name,
                                        "attrs": {a.key: _value(a.value) for a in span.attributes},
                                        "resource": resource,
                                        "scope": ss.scope.name,
                                        "id": span.span_id.hex(),
                                        "parent": span.parent_span_id.hex(),
                                        "status": span.status.code,
                                    }
                                )
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def otel_env(receiver: Receiver) -> dict[str, str]:
    """Only standard variables: the exporter, its endpoint, the service, a short batch delay."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "dh-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
