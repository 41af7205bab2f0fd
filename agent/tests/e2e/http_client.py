"""The client of the real-Envoy traffic tests: sends COUNT requests and prints one JSON line
with each answer's status, the backend that answered (from its JSON body), the time taken and
the response headers the test asks about. Runs inside the test's network namespace.

    http_client.py URL COUNT [--host HOST] [--header K:V]... [--sni NAME --ca FILE]
                   [--timeout SECONDS] [--gid GID]

With `--sni` the connection is TLS to the URL's address with that server name, verified
against `--ca`. With `--gid` the client runs as that group: as the proxy's group, its traffic
is not captured by the pod's sidecar (a workload without a sidecar, as the server sees it).
"""

import argparse
import http.client
import json
import os
import ssl
import time
import urllib.parse

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("count", type=int)
parser.add_argument("--host")
parser.add_argument("--header", action="append", default=[])
parser.add_argument("--sni")
parser.add_argument("--ca")
parser.add_argument("--timeout", type=float, default=10.0)
parser.add_argument("--gid", type=int)
args = parser.parse_args()
if args.gid is not None:
    os.setgroups([])
    os.setgid(args.gid)
url = urllib.parse.urlsplit(args.url)
headers = dict(h.split(":", 1) for h in args.header)
if args.host:
    headers["Host"] = args.host
answers = []
for _ in range(args.count):
    started = time.monotonic()
    try:
        if args.sni:
            context = ssl.create_default_context(cafile=args.ca)
            context.check_hostname = True
            conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=args.timeout, context=context)
            conn._tunnel_host = None
            # Connect with the wanted server name, whatever the URL's address.
            raw = __import__("socket").create_connection((url.hostname, url.port), timeout=args.timeout)
            conn.sock = context.wrap_socket(raw, server_hostname=args.sni)
        else:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=args.timeout)
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
        try:
            backend = json.loads(body).get("backend")
            echoed = json.loads(body).get("headers", {})
            seen_path = json.loads(body).get("path")
        except ValueError:
            backend, echoed, seen_path = None, {}, None
        answers.append({
            "status": response.status,
            "backend": backend,
            "path": seen_path,
            "echoed": echoed,
            "body": body if backend is None else None,
            "location": response.getheader("location"),
            "headers": {k.lower(): v for k, v in response.getheaders()},
            "ms": round((time.monotonic() - started) * 1000),
        })
        conn.close()
    except Exception as e:  # noqa: BLE001 - every failure is an answer the test judges
        answers.append({"status": 0, "error": f"{type(e).__name__}: {e}",
                        "ms": round((time.monotonic() - started) * 1000)})
print(json.dumps(answers))
