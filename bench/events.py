#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/events.py — what encoder-cache events (docs/EVENTS.md) cost a producer.

usage: bench/events.py BUILD_DIR [--saves N] [--size BYTES] [--paced N]

1. Save rate: N saves of BYTES through ecx_save (tests/events_producer):
   events off; on with no subscriber; on with one subscriber reading
   (python ecx.events, in this process: on a small machine it competes with
   the producer for the cores); alternated 3 times, the best of each, and
   the ratios to "off".
2. Latency: --paced saves, one per ms, with the subscriber reading; for each
   Stored event, the time from the save's commit (the event's ts, stamped at
   commit) to the subscriber having decoded it: p50, p99, max.
Everything on loopback; the region holds 4096 blocks (saves evict past it).
"""
import argparse
import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--saves", type=int, default=200000)
ap.add_argument("--size", type=int, default=4096)
ap.add_argument("--paced", type=int, default=2000)
a = ap.parse_args()
src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("ecx_events", os.path.join(src, "python/ecx/events.py"))
events = importlib.util.module_from_spec(spec)
sys.modules["ecx_events"] = events
spec.loader.exec_module(events)
if "ECX_SHM_DIR" not in os.environ:  # a private region directory, removed at exit
    os.environ["ECX_SHM_DIR"] = tempfile.mkdtemp(prefix="ecx-bench-events-", dir="/dev/shm")
    atexit.register(shutil.rmtree, os.environ["ECX_SHM_DIR"], True)
PROD = os.path.join(a.build, "events_producer")


def free_pair():
    """A loopback port P with P + 1 free too (events, replay)."""
    for _ in range(100):
        a, b = socket.socket(), socket.socket()
        try:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", a.getsockname()[1] + 1))
            return a.getsockname()[1]
        except OSError:
            pass
        finally:
            a.close()
            b.close()
    sys.exit("no free port pair")


PORT = free_pair()


class Producer:
    def __init__(self, events_on):
        ep = "127.0.0.1:%d" % PORT if events_on else "-"
        self.p = subprocess.Popen([PROD, ep, str(4096 * 4096), "4096"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().startswith("ready")

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split()

    def close(self):
        self.cmd("quit")
        self.p.wait(10)


class Reader(threading.Thread):
    """A subscriber that reads everything, noting each Stored event's delay."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sub = events.Subscriber("127.0.0.1:%d" % PORT)
        self.sub.poll(0)  # the snapshot: connected and current
        self.delays, self.n, self.stop = [], 0, False

    def run(self):
        while not self.stop:
            for e in self.sub.poll(100):
                self.n += 1
                if e.type == "stored":
                    self.delays.append(time.time() - e.ts)


def rate(events_on, reader):
    p = Producer(events_on)
    r = Reader() if reader else None
    if r:
        r.start()
    v = float(p.cmd("bench %d %d" % (a.saves, a.size))[1])
    if r:
        r.stop = True
        r.join(15)
        r.sub.close()
    p.close()
    return v


runs = {"off": [], "on": [], "on+sub": []}
for _ in range(3):
    runs["off"].append(rate(False, False))
    runs["on"].append(rate(True, False))
    runs["on+sub"].append(rate(True, True))
best = {k: max(v) for k, v in runs.items()}
print("save rate, %d saves of %d B (best of 3): events off %.0f/s; on, no subscriber %.0f/s "
      "(ratio_on_off=%.3f); on, one subscriber reading %.0f/s (ratio_onsub_off=%.3f)"
      % (a.saves, a.size, best["off"], best["on"], best["on"] / best["off"], best["on+sub"],
         best["on+sub"] / best["off"]))

p = Producer(True)
r = Reader()
r.start()
p.cmd("pace %d %d 1000" % (a.paced, a.size))
end = time.monotonic() + 10
while len(r.delays) < a.paced and time.monotonic() < end:
    time.sleep(0.05)
r.stop = True
r.join(15)
r.sub.close()
p.close()
d = sorted(r.delays)
if not d:
    sys.exit("no events arrived")
pct = lambda q: d[min(len(d) - 1, int(q * len(d)))] * 1e6
print("event latency (commit -> subscriber decoded), %d paced saves, %d received: "
      "p50 %.0f us, p99 %.0f us, max %.0f us" % (a.paced, len(d), pct(0.5), pct(0.99), d[-1] * 1e6))
