"""A proxyless gRPC xDS *server* for the end-to-end test: it serves /pasa.e2e.Echo/Who only as
the listener its xDS server sends says (mutual TLS or plaintext, RBAC), and answers with its own
name and the caller's identity ("NAME spiffe://..." over mutual TLS, "NAME plaintext" otherwise).

Usage: GRPC_XDS_BOOTSTRAP=bootstrap.json grpc_xds_server.py NAME PORT. Prints "started" once it
listens on 127.0.0.1:PORT; it serves calls once its listener has arrived. It ends when the test
closes stdin (or kills the process).
"""

import sys
from concurrent import futures

import grpc


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        auth = context.auth_context()
        peer = auth.get("peer_spiffe_id") or [
            san for san in auth.get("x509_subject_alternative_name", []) if san.startswith(b"spiffe://")
        ]
        return f"{name} {peer[0].decode() if peer else 'plaintext'}".encode()

    handler = grpc.method_handlers_generic_handler(
        "pasa.e2e.Echo",
        {"Who": grpc.unary_unary_rpc_method_handler(who)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=True)
    server.add_generic_rpc_handlers((handler,))
    # Without security from xDS (a plaintext listener) the server falls back to plaintext.
    credentials = grpc.xds_server_credentials(grpc.insecure_server_credentials())
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    print("started", flush=True)
    sys.stdin.read()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
