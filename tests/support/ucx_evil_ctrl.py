# SPDX-License-Identifier: Apache-2.0
"""ucx_evil_ctrl — the control plane of a hostile UCX producer (issue 20 #5,
tests/shell/test_ucx_hostile.sh): it answers a request for BAD with an OK ack
whose agent_metadata and mem_descriptor are those `ucx_hostile evil-ucx`
wrote to EVIL_FILE (its UCX listener, a grant of its own), and a request
for GOOD with a real producer's (UPSTREAM) genuine ack for GOOD, asked in
the consumer's own session id and sent DELAY_S seconds after the request
came: by then the hostile READ has run its course, so the good one follows
it in the same consumer process.

usage: ucx_evil_ctrl.py PORT_FILE EVIL_FILE UPSTREAM_PORT BAD GOOD DELAY_S
Writes the port it listens on (127.0.0.1) to PORT_FILE, logs one line per
ack to stderr, runs 90 s.
"""
import os
import sys
import time

import msgpack
import zmq

port_file, evil_file, upstream, bad, good, delay = sys.argv[1:7]
delay = float(delay)
evil = dict(line.split() for line in open(evil_file) if line.strip())
nblocks = int(evil["blocks"])  # the hostile grant's blocks, as the consumer counts them
meta, desc = bytes.fromhex(evil["meta"]), bytes.fromhex(evil["desc"])

ctx = zmq.Context()
front = ctx.socket(zmq.ROUTER)
front.setsockopt(zmq.LINGER, 0)
port = front.bind_to_random_port("tcp://127.0.0.1")
with open(port_file + ".tmp", "w") as f:
    f.write("%d\n" % port)
os.rename(port_file + ".tmp", port_file)


def ask_upstream(sid, compat):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("tcp://127.0.0.1:%s" % upstream)
    req = {"type": "req", "mm_hash": good, "compatibility_hash": compat, "session_id": sid}
    s.send_multipart([b"", msgpack.packb(req)])
    if not s.poll(5000):
        return None
    return msgpack.unpackb(s.recv_multipart()[-1], raw=False)


pending = []  # (when, identity, req)
end = time.time() + 90
while time.time() < end:
    now = time.time()
    for p in [p for p in pending if p[0] <= now]:
        pending.remove(p)
        ack = ask_upstream(p[2]["session_id"], p[2]["compatibility_hash"])
        if ack is None:
            print("upstream did not answer", file=sys.stderr, flush=True)
            continue
        front.send_multipart([p[1], b"", msgpack.packb(ack)])
        print("relayed %s (status %s)" % (good, ack.get("status")), file=sys.stderr, flush=True)
    if not front.poll(20):
        continue
    frames = front.recv_multipart()
    req = msgpack.unpackb(frames[-1], raw=False)
    h = req.get("mm_hash")
    if h == bad:
        ack = {"type": "ack", "mm_hash": bad, "status": 0, "session_id": req.get("session_id", ""),
               "src_block_indices": list(range(nblocks)), "agent_metadata": meta,
               "mem_descriptor": desc}
        front.send_multipart([frames[0], b"", msgpack.packb(ack)])
        print("answered %s with the hostile grant" % bad, file=sys.stderr, flush=True)
    elif h == good:
        pending.append((now + delay, frames[0], req))
