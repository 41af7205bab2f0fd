"""A plain gRPC client (no xDS) for the real-Envoy gateway test: calls /pasa.e2e.Echo/Who COUNT
times through TARGET (host:port) with AUTHORITY as the :authority, and prints one JSON line: the
names that answered, or the status codes of the calls that failed.

    grpc_call.py TARGET AUTHORITY COUNT
"""

import json
import sys

import grpc


def main() -> None:
    target, authority, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    channel = grpc.insecure_channel(target, options=[("grpc.default_authority", authority)])
    who = channel.unary_unary("/pasa.e2e.Echo/Who")
    answers = []
    for _ in range(count):
        try:
            answers.append({"backend": who(b"", timeout=5).decode()})
        except grpc.RpcError as e:  # every failure is an answer the test judges
            answers.append({"code": e.code().name, "details": e.details()})
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
