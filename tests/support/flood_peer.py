#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""flood_peer — a hostile producer for tests/shell/test_ack_flood.sh: a ZeroMQ
ROUTER on 127.0.0.1 that answers every request with COUNT acks nobody asked
for (junk mm_hashes with the asker's session id), each carrying PAD bytes of
padding, and never the ack that was asked for.

  flood_peer.py PORTFILE COUNT PAD SECONDS [HANGUP]

With FLOOD_FRAMING=bad in the environment each ack carries an extra frame
(a reply the consumer cannot even frame).

The port is written to PORTFILE. It sends as fast as the consumer takes
the acks (a small high-water mark, blocking) and stops a flood when the
consumer is gone; it prints one line per request answered and exits after
SECONDS, or HANGUP seconds after the first request (cutting the flood
short, and closing the connection on the consumer).
"""
import os
import sys
import time

import msgpack
import zmq

portfile, count, pad, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
hangup = float(sys.argv[5]) if len(sys.argv) > 5 else None
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.setsockopt(zmq.SNDHWM, 16)
s.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone consumer fails the send
s.setsockopt(zmq.SNDTIMEO, 100)
s.setsockopt(zmq.LINGER, 0)
port = s.bind_to_random_port("tcp://127.0.0.1")
with open(portfile + ".tmp", "w") as f:
    f.write(str(port))
os.rename(portfile + ".tmp", portfile)
deadline = time.monotonic() + seconds
filler = b"x" * pad
extra = [b"extra"] if os.environ.get("FLOOD_FRAMING") == "bad" else []
while time.monotonic() < deadline:
    if not s.poll(200):
        continue
    parts = s.recv_multipart()
    env, body = parts[:-1], parts[-1]
    try:
        sid = msgpack.unpackb(body, raw=False).get("session_id", "")
    except Exception:
        sid = ""
    if hangup is not None:
        deadline = min(deadline, time.monotonic() + hangup)
    sent = 0
    try:
        for i in range(count):
            ack = {"type": "ack", "mm_hash": "junk%d" % i, "status": 1, "session_id": sid,
                   "agent_metadata": filler}
            frames = env + [msgpack.packb(ack, use_bin_type=True)] + extra
            while True:  # blocked while the consumer does not read, up to the deadline
                try:
                    s.send_multipart(frames)
                    break
                except zmq.Again:
                    if time.monotonic() >= deadline:
                        raise
            sent += 1
    except zmq.ZMQError as e:
        print("flood stopped: %s" % e, flush=True)
    print("flooded %d acks of %d bytes" % (sent, len(filler)), flush=True)
s.close()
print("hung up", flush=True)
