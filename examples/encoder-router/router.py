#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which encoder holds which image's encoding: a router's table, from the
encoder-cache events of several ecx producers (docs/EVENTS.md).

    router.py 10.0.0.5:7100 10.0.0.6:7100 --http 127.0.0.1:8300
    curl http://127.0.0.1:8300/where/<mm_hash>
    -> {"mm_hash": "...", "holders": [{"peer_host": "10.0.0.5", "peer_port": 5600,
        "size_bytes": 4718592, "events": "10.0.0.5:7100"}]}

Each argument is an encoder's events endpoint (`ecx serve --events-endpoint`,
ecx_config.events_endpoint). For each, the router keeps exactly what that
encoder holds (ecx.events.Subscriber starts from a snapshot and fills every
gap), and answers "where is this encoding" with the encoders that hold it,
by their announced control-plane address: what a cache-aware proxy needs to
send a request to the encoder that already has its images, or to tell a
consumer where to fetch them. An encoder that stopped holds nothing.

Needs pyzmq and msgpack (pip install ecx[events]).
"""
import argparse
import http.server
import json
import sys
import threading
from typing import Optional

import zmq

from ecx.events import Holdings, Subscriber


class Router:
    """The table: start() runs a thread that applies every encoder's events."""

    def __init__(self, endpoints: list[str], topic: str = "",
                 curve_server_key: Optional[str] = None) -> None:
        self.endpoints = list(endpoints)
        self._subs = {ep: Subscriber(ep, topic, curve_server_key=curve_server_key)
                      for ep in self.endpoints}
        self._held = {ep: Holdings() for ep in self.endpoints}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def step(self, timeout_ms: int = 100) -> int:
        """Apply what arrived within timeout_ms; returns the number of events."""
        poller = zmq.Poller()
        for s in self._subs.values():
            poller.register(s.sub, zmq.POLLIN)
        ready = dict(poller.poll(timeout_ms))
        n = 0
        for ep, s in self._subs.items():
            # poll(0) also takes the first snapshot, which needs no message.
            evs = s.poll(0) if (s.sub in ready or s.last_seq is None) else []
            with self._lock:
                for e in evs:
                    self._held[ep].apply(e)
            n += len(evs)
        return n

    def start(self) -> "Router":
        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.step()
                except Exception as e:  # an encoder that breaks the format: say so, go on
                    print(f"router: {e}", file=sys.stderr, flush=True)
                    self._stop.wait(1)
        self._thread = threading.Thread(target=run, name="ecx-router", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        for s in self._subs.values():
            s.close()

    def where(self, mm_hash: str) -> list[dict]:
        """The encoders that hold mm_hash now, by their control-plane address."""
        with self._lock:
            return [{"peer_host": h.peer[0], "peer_port": h.peer[1],
                     "size_bytes": h.items[mm_hash], "events": ep}
                    for ep, h in self._held.items() if h.up and mm_hash in h.items]

    def holdings(self) -> dict[str, set[str]]:
        with self._lock:
            return {ep: set(h.items) for ep, h in self._held.items()}


def serve_http(router: Router, host: str, port: int) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/where/"):
                h = self.path[len("/where/"):]
                body, code = {"mm_hash": h, "holders": router.where(h)}, 200
            elif self.path == "/holdings":
                body = {ep: sorted(s) for ep, s in router.holdings().items()}
                code = 200
            else:
                body, code = {"error": "GET /where/<mm_hash> or /holdings"}, 404
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("endpoints", nargs="+", help="encoders' events endpoints, HOST:PORT")
    ap.add_argument("--topic", default="", help="the encoders' --events-topic")
    ap.add_argument("--http", default="127.0.0.1:8300", help="answer GET /where/<mm_hash> here")
    a = ap.parse_args()
    router = Router(a.endpoints, a.topic).start()
    host, _, port = a.http.rpartition(":")
    print(f"router: {len(a.endpoints)} encoder(s); http://{a.http}/where/<mm_hash>", flush=True)
    serve_http(router, host, int(port))


if __name__ == "__main__":
    main()
