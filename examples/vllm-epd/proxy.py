#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A small encode -> prefill/decode proxy for two vLLM instances wired with ecx.

Each OpenAI chat request goes first to the encoder instance (ec_producer) with
max_tokens=1: it runs the vision encoder, ecx keeps the embeddings, and the
answer's `ec_transfer_params` says where each image's embeddings are. The
proxy then sends the request, with those params, to the prefill/decode
instance (ec_consumer), whose ecx connector fetches the embeddings instead of
encoding again (or encodes locally, saying why), and returns its answer.

For each request it prints one line per image: announced by the encoder (or
not held there), and, when --consumer-metrics is given, what the consumer's
ecx did (fetched, or fell back with its reason) from the difference of its
ecx_consumer_fetches_total counters.

    proxy.py --encoder http://127.0.0.1:8100 --consumer http://127.0.0.1:8200 \
             --consumer-metrics http://127.0.0.1:9200/metrics --port 8000

With --encoder-events HOST:PORT (the encoder's ec_connector_extra_config
"events_endpoint"), it also keeps the encoder-cache table of
examples/encoder-router (docs/EVENTS.md) and prints, for each image, which
encoders hold its encoding: what a proxy with several encoders would route
by. That option needs pyzmq, msgpack and the ecx package; the rest is the
standard library only.
"""
import argparse
import http.server
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request

_FETCHES = re.compile(r'^ecx_consumer_fetches_total\{outcome="([A-Z_a-z]+)"\} (\d+)', re.M)


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def fetch_counts(url: str) -> dict:
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return {k: int(v) for k, v in _FETCHES.findall(r.read().decode())}
    except (OSError, ValueError):
        return {}


class Proxy:
    def __init__(self, encoder: str, consumer: str, metrics: str, timeout: float,
                 router=None) -> None:
        self.encoder, self.consumer = encoder.rstrip("/"), consumer.rstrip("/")
        self.metrics, self.timeout = metrics, timeout
        self.router = router  # examples/encoder-router's Router, or None
        self.lock = threading.Lock()  # one request at a time keeps the metric deltas honest

    def handle(self, path: str, body: dict) -> dict:
        with self.lock:
            first = dict(body, max_tokens=1, stream=False)
            first.pop("max_completion_tokens", None)
            enc = post(self.encoder + path, first, self.timeout)
            params = enc.get("ec_transfer_params") or {}
            for h, ann in params.items():
                if isinstance(ann, dict) and "peer_host" in ann:
                    print(f"proxy: image {h[:16]}: encoder holds it at {ann['peer_host']}:"
                          f"{ann['peer_port']} ({ann['size_bytes']} bytes, shape "
                          f"{ann.get('shape')})", flush=True)
                else:
                    print(f"proxy: image {h[:16]}: encoder does not hold it (consumer encodes)",
                          flush=True)
                if self.router:
                    where = ", ".join(f"{x['peer_host']}:{x['peer_port']}"
                                      for x in self.router.where(h))
                    print(f"proxy: router: image {h[:16]} held by {where or 'no encoder'}",
                          flush=True)
            before = fetch_counts(self.metrics)
            second = dict(body, ec_transfer_params=params) if params else dict(body)
            out = post(self.consumer + path, second, self.timeout)
            after = fetch_counts(self.metrics)
            delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            if self.metrics:
                what = ", ".join(("fetched" if k == "ready" else f"fell back ({k})") + f" x{n}"
                                 for k, n in sorted(delta.items())) or "no fetch (local hit)"
                print(f"proxy: consumer's ecx: {what}", flush=True)
            return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", required=True, help="encoder instance base URL")
    ap.add_argument("--consumer", required=True, help="prefill/decode instance base URL")
    ap.add_argument("--consumer-metrics", default="", help="the consumer's ecx metrics URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--encoder-events", action="append", default=[], metavar="HOST:PORT",
                    help="an encoder's events endpoint (repeatable): print who holds each image")
    a = ap.parse_args()
    router = None
    if a.encoder_events:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "encoder-router"))
        from router import Router  # needs pyzmq, msgpack and ecx
        router = Router(a.encoder_events).start()
    proxy = Proxy(a.encoder, a.consumer, a.consumer_metrics, a.timeout, router)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            try:
                n = int(self.headers.get("Content-Length", "0"))
                if not 0 <= n <= 64 << 20:
                    raise ValueError("request too large")
                body = json.loads(self.rfile.read(n))
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                out = json.dumps(proxy.handle(self.path, body)).encode()
                code = 200
            except urllib.error.HTTPError as e:
                out, code = e.read(), e.code
            except (OSError, ValueError) as e:
                out, code = json.dumps({"error": str(e)}).encode(), 502
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((a.host, a.port), Handler)
    print(f"proxy: listening on http://{a.host}:{a.port}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
