"""A gRPC backend for the end-to-end test: answers /pasa.e2e.Echo/Who with its own name.

Usage: grpc_backend.py NAME [PORT [HOST]]. Prints "ready <port>" once it serves on HOST (by
default 127.0.0.1) and PORT (0, the default, picks one).
It runs in its own process: the xDS client and its backends must not share one.
"""

import sys
from concurrent import futures

import grpc


def main() -> None:
    name = sys.argv[1].encode()
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        return name

    handler = grpc.method_handlers_generic_handler(
        "pasa.e2e.Echo",
        {"Who": grpc.unary_unary_rpc_method_handler(who)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    print(f"ready {bound}", flush=True)
    # Ends when the test closes stdin (or kills the process).
    sys.stdin.read()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
