# SPDX-License-Identifier: Apache-2.0
"""slow_reader — a consumer that holds one grant and reads it slowly over the
tcp data path, past its lease, while the producer (tests/support/pin_saver.c churn)
saves new items (issue 20, item 1). Speaks the reference's wire format and
ecx's tcp data protocol (src/data/tcp/data_tcp.c) by hand, with a 4 KiB receive
buffer, reading 64 KiB every 20 ms.

usage: slow_reader.py DIR [SECONDS]
Asks for "victim", touches DIR/go (the producer starts saving), sends one
tcp request with the grant's token, and reads for at most SECONDS (default
20). Every byte is checked against the victim's own bytes (pin_saver.c's
pattern: 8-byte words (1 << 56) | index). Prints "got N of M bytes, W
wrong, ended HOW" (HOW: complete / cut / timeout) and, for wrong bytes, the
tags seen. Exits 0 if no wrong byte arrived, 1 otherwise, 2 on setup errors.
"""
import os
import socket
import struct
import sys
import time
from array import array

import msgpack
import zmq

d = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
ann = __import__("json").load(open(os.path.join(d, "ann.json")))["victim"]
compat = open(os.path.join(d, "compat")).read().strip()
nbytes = ann["size_bytes"]
# Before the request: building these 16 MiB takes Python up to a second on a
# loaded machine, and the grant's lease is 1 s from the ack.
want = array("Q", ((1 << 56) | i for i in range(nbytes // 8))).tobytes()
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect("tcp://127.0.0.1:%d" % ann["peer_port"])
req = {"type": "req", "mm_hash": "victim", "compatibility_hash": compat,
       "session_id": "slow-session"}
s.send_multipart([b"", msgpack.packb(req)])
if not s.poll(5000):
    sys.exit("no ack")
_, payload = s.recv_multipart()
a = msgpack.unpackb(payload)
if a["status"] != 0:
    print("ack status %d" % a["status"])
    sys.exit(2)


def sections(b, head):
    n = struct.unpack_from("<H", b, 6)[0]
    off, out = head, {}
    for _ in range(n):
        t, ln = struct.unpack_from("<HH", b, off)
        out[t] = b[off + 4:off + 4 + ln]
        off += 4 + ln
    return out


token = sections(a["mem_descriptor"], 40)[3][:16]
tcp = sections(a["agent_metadata"], 24)[4]
family, tport = tcp[0], struct.unpack_from("<H", tcp, 1)[0]
host = socket.inet_ntop(socket.AF_INET if family == 4 else socket.AF_INET6, tcp[3:])

open(os.path.join(d, "go"), "w").close()  # the producer starts saving
c = socket.socket(socket.AF_INET if family == 4 else socket.AF_INET6, socket.SOCK_STREAM)
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
c.settimeout(5)
c.connect((host, tport))
key = b"slow-session:victim"
c.sendall(b"\x01G" + struct.pack("<Q", 7) + token + struct.pack("<H", len(key)) + key)
head = b""
while len(head) < 17:
    try:
        b = c.recv(17 - len(head))
    except socket.timeout:  # the lease ran out before the request: set-up too slow
        print("no reply in 5 s (the grant's lease expired before the request?)")
        sys.exit(2)
    if not b:
        print("no reply")
        sys.exit(2)
    head += b
xid, status, n = struct.unpack("<QBQ", head)
if xid != 7 or status != 0 or n != nbytes:
    print("bad reply head", xid, status, n)
    sys.exit(2)
got, wrong, tags, how = 0, 0, set(), "timeout"
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        b = c.recv(65536)
    except (ConnectionResetError, socket.timeout):
        how = "cut"
        break
    if not b:
        how = "complete" if got == nbytes else "cut"
        break
    exp = want[got:got + len(b)]
    if b != exp:
        wrong += sum(1 for x, y in zip(b, exp) if x != y)
        tags.update(b[i] for i in range((7 - got) % 8, len(b), 8))  # each word's top byte
    got += len(b)
    if got == nbytes:
        how = "complete"
        break
    time.sleep(0.02)
print("got %d of %d bytes, %d wrong, ended %s" % (got, nbytes, wrong, how))
if wrong:
    print("tags of the wrong bytes: %s" % sorted(tags)[:20])
c.close()
s.close()
ctx.term()
sys.exit(1 if wrong else 0)
