"""The proxyless gRPC xDS client of the end-to-end test, driven line by line on stdin.

Usage: GRPC_XDS_BOOTSTRAP=bootstrap.json grpc_client.py xds:///host:port [--xds-credentials]
With --xds-credentials the client takes its transport security from xDS (mutual TLS from its
clusters' TLS contexts and its bootstrap's certificate providers; plaintext where none is sent).
Commands (one per line), each answered with one JSON line on stdout:
  calls N            N calls; {"counts": {backend: n}, "errors": [...]}
  until ANSWER SECS  call until 20 calls in a row answer ANSWER (a backend's answer with spaces as
                     "+", or a status code's name such as PERMISSION_DENIED);
                     {"ok": bool, "elapsed": s, "calls": n, "last": answer}
  fail-fast          from now on a call fails at once when the server cannot be reached (by
                     default calls wait for the channel until their deadline); {"fail_fast": true}
  csds               the client's own view of its xDS resources (CSDS):
                     {"resources": [{"type", "name", "status", "error"}], "nacked": [...]}
  quit
"""

import json
import sys
import time

import grpc
import grpc.experimental
from grpc._cython import cygrpc
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.service.status.v3 import csds_pb2

TIMEOUT = 5.0


def main() -> None:
    target = sys.argv[1]
    if "--xds-credentials" in sys.argv[2:]:
        fallback = grpc.experimental.insecure_channel_credentials()
        channel = grpc.secure_channel(target, grpc.xds_channel_credentials(fallback))
    else:
        channel = grpc.insecure_channel(target)
    who = channel.unary_unary("/pasa.e2e.Echo/Who")

    wait_for_ready = True

    def call() -> str:
        return who(b"", timeout=TIMEOUT, wait_for_ready=wait_for_ready).decode()

    print(json.dumps({"started": target}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "calls":
            counts: dict = {}
            errors = []
            for _ in range(int(words[1])):
                try:
                    name = call()
                    counts[name] = counts.get(name, 0) + 1
                except grpc.RpcError as err:
                    errors.append(f"{err.code()}: {err.details()}")
            answer = {"counts": counts, "errors": errors[:5], "error_count": len(errors)}
        elif words[0] == "until":
            wanted, limit = words[1].replace("+", " "), float(words[2])
            start = time.monotonic()
            streak = calls = 0
            last = ""
            while time.monotonic() - start < limit and streak < 20:
                calls += 1
                try:
                    last = call()
                except grpc.RpcError as err:
                    last = err.code().name
                streak = streak + 1 if last == wanted else 0
            answer = {
                "ok": streak >= 20,
                "elapsed": time.monotonic() - start,
                "calls": calls,
                "last": last,
            }
        elif words[0] == "fail-fast":
            wait_for_ready = False
            answer = {"fail_fast": True}
        elif words[0] == "csds":
            answer = csds()
        elif words[0] == "quit":
            break
        else:
            answer = {"error": f"unknown command {words[0]!r}"}
        print(json.dumps(answer), flush=True)
    channel.close()


def csds() -> dict:
    """The client's CSDS dump: every resource it holds, with its status and any NACK error."""
    response = csds_pb2.ClientStatusResponse()
    response.ParseFromString(cygrpc.dump_xds_configs())
    resources = []
    for config in response.config:
        for generic in config.generic_xds_configs:
            status = config_dump_shared_pb2.ClientResourceStatus.Name(generic.client_status)
            error = generic.error_state.details if generic.HasField("error_state") else ""
            resources.append(
                {
                    "type": generic.type_url.rsplit(".", 1)[-1],
                    "name": generic.name,
                    "status": status,
                    "error": error,
                }
            )
    nacked = [r for r in resources if r["status"] == "NACKED" or r["error"]]
    return {"resources": resources, "nacked": nacked}


if __name__ == "__main__":
    main()
