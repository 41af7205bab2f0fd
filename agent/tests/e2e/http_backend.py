"""A small HTTP (or TLS) backend for the real-Envoy traffic tests: answers every request with
JSON naming itself, the path and the request headers it got. Runs inside the test's network
namespace; stops when its standard input closes (the test ends) or on SIGTERM.

    http_backend.py NAME ADDRESS:PORT [--tls CERT KEY]

Paths: `/status/<code>` answers with that status; `/delay/<ms>` waits first; `/flaky/<key>`
answers 503 to the first request for each key and 200 after (for retries); `/authz/...` answers
as an external authorizer (Envoy's HTTP ext_authz): 200 when the request carries
`x-ext-authz: allow`, 403 otherwise; `/api/v2/spans` is a Zipkin collector: a POST of spans
(Zipkin's JSON v2) is kept and answered 202, a GET answers `{"spans": [...]}` with those kept.
A WebSocket upgrade request (`upgrade: websocket`) is accepted (101, `x-backend: NAME`).
"""

import json
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1]
HOST, PORT = sys.argv[2].rsplit(":", 1)
SEEN = set()
SPANS = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        """The request body, sent with a length or in chunks (as Envoy's own clients send)."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def collect(self):
        if self.command == "POST":
            spans = json.loads(self.body() or b"[]")
            with LOCK:
                SPANS.extend(spans)
            status, body = 202, b""
        else:
            with LOCK:
                status, body = 200, json.dumps({"spans": SPANS}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self):
        if self.path.split("?")[0] == "/api/v2/spans":
            return self.collect()
        if self.headers.get("upgrade", "").lower() == "websocket":
            return self.upgrade()
        status = 200
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "status" and parts[1].isdigit():
            status = int(parts[1])
        elif len(parts) == 2 and parts[0] == "delay" and parts[1].isdigit():
            time.sleep(int(parts[1]) / 1000.0)
        elif parts[0] == "authz":
            status = 200 if self.headers.get("x-ext-authz") == "allow" else 403
        elif len(parts) == 2 and parts[0] == "flaky":
            with LOCK:
                first = parts[1] not in SEEN
                SEEN.add(parts[1])
            if first:
                status = 503
        body = json.dumps(
            {"backend": NAME, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
        ).encode()
        self.body()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def upgrade(self):
        """Accepts a WebSocket upgrade (101), then closes: the test judges the handshake."""
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("x-backend", NAME)
        self.end_headers()
        self.close_connection = True

    do_GET = answer
    do_POST = answer


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that hung up mid-answer (the timeout test's) is no error of the backend.
        pass


server = Server((HOST, int(PORT)), Handler)
if len(sys.argv) == 6 and sys.argv[3] == "--tls":
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[4], sys.argv[5])
    server.socket = context.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
