#!/usr/bin/env python3
"""Check an Envoy config's buffer limits against the prefix-router filter JSON in it.

Envoy cannot see inside the filter's JSON, and the filter cannot read Envoy's limits, so
`./build.sh validate` runs this on every envoy/*.yaml that embeds the filter:

  max_body_bytes + per_connection_buffer_limit_bytes <= request_body_buffer_limit

While the filter buffers a body, Envoy adds each socket read (up to the listener's
per_connection_buffer_limit_bytes) to the buffer before the filter sees it; the filter stops
buffering once it has seen more than max_body_bytes. So the request's buffer limit (the route's
request_body_buffer_limit, else the listener's limit) must hold max_body_bytes plus one full
read, or uploads just over max_body_bytes get intermittent 413s (issue 21).

Plain text parsing (no YAML library): the first per_connection_buffer_limit_bytes (the
listener's), the smallest request_body_buffer_limit, and the JSON block under the wasm
filter's `configuration: ... value: |`. Exit status 1 with a message naming the values when the
sum does not fit; 0 otherwise (also for a config without the filter).
"""
import json
import re
import sys

ENVOY_DEFAULT_BUFFER = 1 << 20  # Envoy's default per_connection_buffer_limit_bytes
FILTER_DEFAULT_MAX_BODY = 1 << 20  # the filter's default max_body_bytes


def filter_json(lines):
    """The filter JSON text under the first `value: |` after `envoy.filters.http.wasm`."""
    in_wasm = False
    for i, line in enumerate(lines):
        if "envoy.filters.http.wasm" in line:
            in_wasm = True
        if in_wasm and re.match(r"\s*value:\s*\|-?\s*$", line):
            indent = None
            block = []
            for l in lines[i + 1:]:
                if not l.strip():
                    block.append("")
                    continue
                ind = len(l) - len(l.lstrip())
                if indent is None:
                    indent = ind
                if ind < indent:
                    break
                block.append(l)
            return "\n".join(block)
    return None


def main(path):
    text = open(path, encoding="utf-8").read()
    lines = text.splitlines()
    js = filter_json(lines)
    if js is None:
        return 0
    try:
        cfg = json.loads(js)
    except ValueError as e:
        print(f"{path}: the filter JSON does not parse: {e}", file=sys.stderr)
        return 1
    max_body = int(cfg.get("max_body_bytes", FILTER_DEFAULT_MAX_BODY))
    conn = re.findall(r"^\s*per_connection_buffer_limit_bytes:\s*(\d+)", text, re.M)
    listener = int(conn[0]) if conn else ENVOY_DEFAULT_BUFFER
    req = [int(v) for v in re.findall(r"^\s*request_body_buffer_limit:\s*(\d+)", text, re.M)]
    request = min(req) if req else listener
    need = max_body + listener
    if request < need:
        where = "route request_body_buffer_limit" if req else "listener limit (no request_body_buffer_limit)"
        print(
            f"{path}: {where} = {request} < filter max_body_bytes {max_body} + listener "
            f"per_connection_buffer_limit_bytes {listener} = {need}: uploads just over "
            f"max_body_bytes can get 413 (one socket read is added to the buffer before the "
            f"filter sees it)",
            file=sys.stderr,
        )
        return 1
    print(
        f"{path}: buffer limits OK (max_body_bytes {max_body} + listener {listener} <= request {request})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(max((main(p) for p in sys.argv[1:]), default=0))
