# SPDX-License-Identifier: Apache-2.0
"""grant_forger — a third process that knows another consumer's session id
(say, from a log) and tries to use it: re-request that consumer's grant from
its own connection, and release it with forged completion notifications on
the same-host path and forged declines on tcp. Speaks the reference's wire
format and ecx's shm and tcp protocols (src/data/shm/data_shm.c,
src/data/tcp/data_tcp.c) by
hand.

usage: grant_forger.py PORT COMPAT_HASH MM_HASH
Prints one line per step ("victim granted", "takeover status N",
"attacker granted", "shm F", "forged 2", "declined 2", then what became of garbage sent
to the shm and tcp listeners) and exits 0 if every step ran.
"""
import os
import socket
import struct
import sys

import msgpack
import zmq

port, compat, item = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = zmq.Context()


def ask(sid):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("tcp://127.0.0.1:%d" % port)
    req = {"type": "req", "mm_hash": item, "compatibility_hash": compat, "session_id": sid}
    s.send_multipart([b"", msgpack.packb(req)])
    if not s.poll(5000):
        sys.exit("no ack for %s" % sid)
    _, payload = s.recv_multipart()
    return s, msgpack.unpackb(payload)


def sections(b, head):
    n = struct.unpack_from("<H", b, 6)[0]
    off, out = head, {}
    for _ in range(n):
        t, ln = struct.unpack_from("<HH", b, off)
        out[t] = b[off + 4:off + 4 + ln]
        off += 4 + ln
    return out


victim, a = ask("victim-session")
assert a["status"] == 0, a
print("victim granted")
# The same session id from another connection: refused, the grant stays.
thief, t = ask("victim-session")
print("takeover status %d" % t["status"])
# The attacker's own grant gets it onto the producer's shm socket...
mine, m = ask("attacker-session")
assert m["status"] == 0, m
print("attacker granted")
shm = sections(m["agent_metadata"], 24)[1]
path_len = struct.unpack_from("<H", shm, 32)[0]
sock_len = struct.unpack_from("<H", shm, 34 + path_len)[0]
name = shm[36 + path_len:36 + path_len + sock_len]
token = sections(m["mem_descriptor"], 40)[3][:16]
c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
c.connect(b"\0" + name)
c.send(b"\x01H" + token + b"attacker-session:" + item.encode())
msg, anc, _, _ = c.recvmsg(64, socket.CMSG_SPACE(4))
for lvl, typ, data in anc:
    if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
        os.close(struct.unpack("i", data[:4])[0])
print("shm %s" % msg[1:2].decode())
# ...where it claims the victim's grant is done: with a guessed token and
# with its own.
victim_key = b"victim-session:" + item.encode()
c.send(b"\x01D" + os.urandom(16) + victim_key)
c.send(b"\x01D" + token + victim_key)
print("forged 2")
c.close()
# Garbage on both data-plane listeners: dropped, and counted.
g = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
g.connect(b"\0" + name)
g.send(b"\x09Z" + bytes(24))
g.settimeout(5)
print("shm garbage closed" if g.recv(64) == b"" else "shm garbage answered")
g.close()
tcp = sections(m["agent_metadata"], 24)[4]
family, tport = tcp[0], struct.unpack_from("<H", tcp, 1)[0]
host = socket.inet_ntop(socket.AF_INET if family == 4 else socket.AF_INET6, tcp[3:])
# On tcp, declines ('C': "I will not read it") of the victim's grant, with
# a guessed token and with the attacker's own: counted as forged, released
# nothing.
d = socket.create_connection((host, tport), timeout=5)
for tok in (os.urandom(16), token):
    d.sendall(b"\x01C" + bytes(8) + tok + struct.pack("<H", len(victim_key)) + victim_key)
print("declined 2")
t = socket.create_connection((host, tport), timeout=5)
t.sendall(b"GET / HTTP/1.0\r\n\r\n")
print("tcp garbage closed" if t.recv(64) == b"" else "tcp garbage answered")
t.close()
d.close()
for s in (victim, thief, mine):
    s.close()
ctx.term()
