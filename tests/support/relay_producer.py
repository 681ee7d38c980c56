# SPDX-License-Identifier: Apache-2.0
"""relay_producer — a hostile producer that owns no region: it answers each
request by asking a real producer (UPSTREAM) for an item in the
requesting consumer's own session id, and relays that producer's genuine
ack (agent_metadata, mem_descriptor, token, checksum) as its own, under
the hash the consumer asked for. A consumer that used the relayed
registration would copy the other producer's region under this one's items:
on shm, once one relayed hello has mapped that region, any blocks of it.

usage: relay_producer.py PORT_FILE UPSTREAM_PORT MAP
MAP: comma-separated HASH=UPSTREAM_HASH@DELAY_S (e.g. "y=y@0.3,w=x@0.6"): a
request for HASH is answered with the ack for UPSTREAM_HASH, DELAY_S
seconds after it came. Writes the port it listens on (127.0.0.1) to
PORT_FILE, logs one line per relayed ack to stderr, runs 60 s.
"""
import os
import sys
import time

import msgpack
import zmq

port_file, upstream, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
plan = {}
for part in spec.split(","):
    h, rest = part.split("=")
    up, delay = rest.split("@")
    plan[h] = (up, float(delay))

ctx = zmq.Context()
front = ctx.socket(zmq.ROUTER)
front.setsockopt(zmq.LINGER, 0)
port = front.bind_to_random_port("tcp://127.0.0.1")
with open(port_file + ".tmp", "w") as f:
    f.write("%d\n" % port)
os.rename(port_file + ".tmp", port_file)

ups = {}  # one upstream connection per session id: a grant belongs to its connection


def ask_upstream(sid, item, compat):
    s = ups.get(sid)
    if s is None:
        s = ups[sid] = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect("tcp://127.0.0.1:%d" % upstream)
    req = {"type": "req", "mm_hash": item, "compatibility_hash": compat, "session_id": sid}
    s.send_multipart([b"", msgpack.packb(req)])
    if not s.poll(5000):
        return None
    return msgpack.unpackb(s.recv_multipart()[-1], raw=False)


pending = []  # (when, identity, ack)
end = time.time() + 60
while time.time() < end:
    now = time.time()
    for p in [p for p in pending if p[0] <= now]:
        pending.remove(p)
        front.send_multipart([p[1], b"", msgpack.packb(p[2])])
        print("relayed %s (status %s)" % (p[2]["mm_hash"], p[2].get("status")), file=sys.stderr,
              flush=True)
    if not front.poll(20):
        continue
    frames = front.recv_multipart()
    req = msgpack.unpackb(frames[-1], raw=False)
    h = req.get("mm_hash")
    if h not in plan:
        continue
    up, delay = plan[h]
    ack = ask_upstream(req["session_id"], up, req["compatibility_hash"])
    if ack is None:
        print("upstream did not answer for %s" % up, file=sys.stderr, flush=True)
        continue
    ack["mm_hash"] = h
    pending.append((now + delay, frames[0], ack))
