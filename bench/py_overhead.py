#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the Python binding adds to the engine's calls (issue 14).

    python bench/py_overhead.py BUILD/call_overhead [--rounds R] [--calls N]
                                [--items K] [--size BYTES] [--xfer-iters M] [--data PATH]

Run with a python that has the package installed (pip install .). Each round
runs the C baseline (bench/call_overhead.c, on the package's own libecx.so.1)
and then the same loops through `import ecx`, in this one run; medians over
the rounds are printed:

  c      fetch_pending_ns=.. poll0_ns=.. poll0_nothread_ns=.. save_ms=.. fetch_ms=.. read_ms=.. xfer_ms=..
  python (the same keys; read_ms is read() -> bytes; read_into_ms into a buffer)
  added  fetch_pending_ns=.. poll0_ns=.. poll0_nothread_ns=.. step100_ms=..
  ratio  xfer_c_over_python=.. (1.0: as fast as C; the median of the rounds' ratios)

fetch_pending: fetch(h, announcement_dict) of K items that stay pending (their
producer is a socket that never speaks), cycled; poll0: poll(0) with nothing to
do; step100_ms: 100 pending fetches + one poll(0), as an engine step; xfer:
save() of a fresh BYTES item, fetch() + poll(1) until ready, read(). Python
per-call figures include the for loop's own cost (a few ns).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import ecx


def per_call_ns(fn, args_seq):
    t = time.perf_counter_ns()
    for a in args_seq:
        fn(*a)
    return (time.perf_counter_ns() - t) / len(args_seq)


def py_round(calls, items, size, iters, data):
    out = {}
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    # One block of the defaults (protocol version 2: 8 KiB, one row of 4096
    # bf16, with its shape); another size would be refused locally, not pend.
    ann = {"peer_host": "127.0.0.1", "peer_port": srv.getsockname()[1], "size_bytes": 8192,
           "shape": [1, 4096], "metadata": {}}
    with ecx.Context("consumer", region_bytes=(items + 8) << 20, ack_timeout_ms=600000,
                     data=data) as c:
        hashes = [f"pending-{k}" for k in range(items)]
        for h in hashes:
            assert c.fetch(h, ann).state == "pending"
        seq = [(h, ann) for h in hashes] * max(1, calls // items)
        per_call_ns(c.fetch, seq[: len(seq) // 10])
        out["fetch_pending_ns"] = per_call_ns(c.fetch, seq)
    srv.close()
    for key, thread in (("poll0_ns", True), ("poll0_nothread_ns", False)):
        with ecx.Context("consumer", region_bytes=8 << 20, progress_thread=thread) as c:
            seq = [(0,)] * calls
            per_call_ns(c.poll, seq[: calls // 10])
            out[key] = per_call_ns(c.poll, seq)
    region = size * (iters + 3) + (64 << 20)  # no eviction in the timing, as in C
    src = bytes((i * 131 + 7) & 255 for i in range(256)) * (size // 256) + bytes(size % 256)
    dst = bytearray(size)
    sv, fv, rv, riv, xv = [], [], [], [], []
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=region, data=data,
                     ack_timeout_ms=600000) as p, \
         ecx.Context("consumer", region_bytes=region, data=data, ack_timeout_ms=600000) as c:
        for it in range(-2, iters):
            name = f"xfer-{it + 2}"
            t0 = time.perf_counter_ns()
            p.save(name, src)
            t1 = time.perf_counter_ns()
            a = p.announce(name)
            n = 0
            while (r := c.fetch(name, a, size)).state == "pending":
                n += 1
                assert n < 100000
                c.poll(1)
            assert r.state == "ready", r
            t2 = time.perf_counter_ns()
            b = c.read(name)
            t3 = time.perf_counter_ns()
            assert len(b) == size
            del b
            t4 = time.perf_counter_ns()
            c.read_into(name, dst)
            t5 = time.perf_counter_ns()
            if it >= 0:
                sv.append((t1 - t0) / 1e6), fv.append((t2 - t1) / 1e6)
                rv.append((t3 - t2) / 1e6), riv.append((t5 - t4) / 1e6)
                xv.append((t3 - t0) / 1e6)
        assert dst == src
    out.update(save_ms=statistics.median(sv), fetch_ms=statistics.median(fv),
               read_ms=statistics.median(rv), read_into_ms=statistics.median(riv),
               xfer_ms=statistics.median(xv))
    return out


def c_round(exe, calls, items, size, iters, data):
    # The same libecx.so.1 as the package's (LD_LIBRARY_PATH wins over the
    # program's RUNPATH): the two sides differ only in the binding.
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(ecx.__file__))
    r = subprocess.run([exe, "--calls", str(calls), "--items", str(items), "--size", str(size),
                        "--xfer-iters", str(iters), "--data", data],
                       capture_output=True, text=True, timeout=600, check=True, env=env)
    line = r.stdout.strip().splitlines()[-1].split()
    return {k: float(v) for k, v in (kv.split("=") for kv in line[1:])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("c_baseline", help="path to the call_overhead program (CMake build)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--size", type=int, default=28_835_840)  # llava-1.5: 3520 rows, whole blocks
    ap.add_argument("--xfer-iters", type=int, default=10)
    ap.add_argument("--data", default="auto", choices=ecx.DATA_PATHS)
    o = ap.parse_args()
    cs, ps = [], []
    for _ in range(o.rounds):
        cs.append(c_round(o.c_baseline, o.calls, o.items, o.size, o.xfer_iters, o.data))
        ps.append(py_round(o.calls, o.items, o.size, o.xfer_iters, o.data))
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    keys = ["fetch_pending_ns", "poll0_ns", "poll0_nothread_ns", "save_ms", "fetch_ms", "read_ms"]
    print("c      " + " ".join(f"{k}={med(cs, k):.1f}" if k.endswith("ns") else f"{k}={med(cs, k):.3f}"
                               for k in keys + ["xfer_ms"]))
    print("python " + " ".join(f"{k}={med(ps, k):.1f}" if k.endswith("ns") else f"{k}={med(ps, k):.3f}"
                               for k in keys + ["read_into_ms", "xfer_ms"]))
    added = {k: med(ps, k) - med(cs, k) for k in ["fetch_pending_ns", "poll0_ns", "poll0_nothread_ns"]}
    step = (100 * med(ps, "fetch_pending_ns") + med(ps, "poll0_ns")) / 1e6
    print("added  " + " ".join(f"{k}={v:.1f}" for k, v in added.items()) + f" step100_ms={step:.4f}")
    # Per round (C and Python measured back to back), then the median: on a
    # shared machine that is steadier than a ratio of medians.
    ratio = statistics.median(c["xfer_ms"] / p["xfer_ms"] for c, p in zip(cs, ps))
    print(f"ratio  xfer_c_over_python={ratio:.3f} size={o.size} "
          f"data={o.data} python={sys.version.split()[0]} ecx={ecx.__version__}")


if __name__ == "__main__":
    main()
