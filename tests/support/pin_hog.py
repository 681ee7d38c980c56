# SPDX-License-Identifier: Apache-2.0
"""pin_hog — consumers that pin all they can and never read (issue 20, item
4): N connections (DEALER sockets, each its own routing id) each ask for
every item in DIR/ann.json (connection k starting at item 4k, so that
together they cover the region) and keep whatever is granted until its
lease ends. Speaks the reference's wire format by hand.

usage: pin_hog.py DIR N
Prints "ok K not_ready R internal I distinct D" over all requests (D:
items granted to some connection) and exits 0 (2 if an
ack is missing). Waits for DIR/quit (at most 60 s) before closing.
"""
import json
import os
import sys
import time

import msgpack
import zmq

d, n = sys.argv[1], int(sys.argv[2])
ann = json.load(open(os.path.join(d, "ann.json")))
compat = open(os.path.join(d, "compat")).read().strip()
ctx = zmq.Context()
socks, counts, granted = [], {0: 0, 4: 0, 5: 0}, set()
for k in range(n):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("tcp://127.0.0.1:%d" % next(iter(ann.values()))["peer_port"])
    socks.append(s)
    names = sorted(ann)
    for h in names[4 * k % len(names):] + names[:4 * k % len(names)]:
        req = {"type": "req", "mm_hash": h, "compatibility_hash": compat,
               "session_id": "hog-%d" % k}
        s.send_multipart([b"", msgpack.packb(req)])
        if not s.poll(5000):
            print("no ack")
            sys.exit(2)
        st = msgpack.unpackb(s.recv_multipart()[1])["status"]
        counts[st] = counts.get(st, 0) + 1
        if st == 0:
            granted.add(h)
print("ok %d not_ready %d internal %d distinct %d"
      % (counts[0], counts[5], counts[4], len(granted)), flush=True)
end = time.monotonic() + 60
while not os.path.exists(os.path.join(d, "quit")) and time.monotonic() < end:
    time.sleep(0.1)
for s in socks:
    s.close()
ctx.term()
