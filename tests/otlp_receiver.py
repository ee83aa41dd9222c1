"""A real OTLP trace receiver for the tests: OTLP/gRPC and OTLP/HTTP (protobuf), built on the
official `opentelemetry-proto` messages and service stubs (PyPI) with `grpcio`.

It binds both transports on 127.0.0.1 (port 0 unless given), prints one JSON line
{"ready": true, "grpc": PORT, "http": PORT}, then one JSON line per span received:
transport, the request's headers (gRPC metadata), resource attributes, scope, name, kind,
trace/span/parent ids (hex) and attributes.
With --quiet it decodes every request the same way and prints nothing per span (benchmarks).
It runs until killed.

    python otlp_receiver.py [--grpc-port N] [--http-port N] [--quiet]
"""

import argparse
import gzip
import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()
QUIET = False


def value(v):
    """An AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def emit(request, transport, headers):
    if QUIET:
        return
    with LOCK:
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    line = {
                        "transport": transport,
                        "headers": headers,
                        "resource": resource,
                        "scope": ss.scope.name,
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start_unix_nano": span.start_time_unix_nano,
                        "end_unix_nano": span.end_time_unix_nano,
                        "attributes": attributes(span.attributes),
                    }
                    sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        emit(request, "grpc", {k.lower(): v for k, v in context.invocation_metadata()})
        return trace_service_pb2.ExportTraceServiceResponse()


class HttpHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as err:  # a body that is not the OTLP message is the sender's bug
            self.send_error(400, str(err))
            return
        emit(request, "http", {k.lower(): v for k, v in self.headers.items()})
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    global QUIET
    QUIET = args.quiet
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    grpc_port = server.add_insecure_port(f"127.0.0.1:{args.grpc_port}")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", args.http_port), HttpHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    sys.stdout.write(
        json.dumps({"ready": True, "grpc": grpc_port, "http": http.server_address[1]}) + "\n"
    )
    sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
