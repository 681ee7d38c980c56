# SPDX-License-Identifier: Apache-2.0
"""conn_hog — a peer that holds a listener's connection slots the cheap way
(issue 20), from many loopback source addresses, for a bounded time, and
opens a new connection whenever the producer closes one.

usage: conn_hog.py MODE PORT SECONDS ADDRS PER_ADDR
  MODE     drip    ecx's tcp data plane: a request, one byte per second
           refused ecx's tcp data plane: one whole request with a wrong token,
                   then silence
           zmtp    the control plane: a ZMTP 3.0 NULL handshake (as a DEALER),
                   then silence
           http    /metrics: half an HTTP request, then one byte per second
  ADDRS    comma-separated source addresses (127.x.y.z: all of 127/8 is lo)
  PER_ADDR connections held from each
Prints "open N" every second and a last line
"summary opened=N closed=N max_open=N".
"""
import os
import resource
import select
import socket
import struct
import sys
import time

mode, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
addrs, per_addr = sys.argv[4].split(","), int(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = len(addrs) * per_addr + 64
if soft < want:  # our own limit, not the producer's
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

key = b"k" * 512  # ECXI_DATA_NOTIF_MAX: a 540-byte request
REQ = b"\x01G" + struct.pack("<Q", 1) + os.urandom(16) + struct.pack("<H", len(key)) + key
ZMTP = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" +
        b"\x00" * 31)
body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
ZMTP += bytes([0x04, len(body)]) + body
HTTP = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"


class Slot:
    def __init__(self, addr):
        self.addr, self.sock, self.sent, self.next = addr, None, 0, 0.0


slots = [Slot(a) for a in addrs for _ in range(per_addr)]
opened = closed = max_open = 0
end = time.monotonic() + seconds
next_print = 0.0


def first_bytes():
    return {"drip": REQ[:1], "refused": REQ, "zmtp": ZMTP, "http": HTTP}[mode]


def drop(s):
    global closed
    try:
        s.sock.close()
    except OSError:
        pass
    s.sock = None
    closed += 1


while time.monotonic() < end:
    now = time.monotonic()
    # (Re)open what is closed: at most 200 per round, so a producer that
    # refuses everything does not make this spin.
    budget = 200
    for s in slots:
        if s.sock is None and budget and now >= s.next:
            budget -= 1
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                c.bind((s.addr, 0))
                c.settimeout(1)
                c.connect(("127.0.0.1", port))
                c.setblocking(False)
                c.send(first_bytes())
            except OSError:
                c.close()
                s.next = now + 0.5
                continue
            s.sock, s.sent, s.next = c, len(first_bytes()), now + 1
            opened += 1
    # Drip: one more byte a second.
    if mode in ("drip", "http"):
        more = REQ if mode == "drip" else HTTP + b"X-Drip: " + b"a" * 100000
        for s in slots:
            if s.sock is not None and now >= s.next and s.sent < len(more):
                try:
                    s.sock.send(more[s.sent:s.sent + 1])
                    s.sent += 1
                    s.next = now + 1
                except OSError:
                    drop(s)
    # Read and discard what the producer sends; a close frees the slot.
    byfd = {s.sock.fileno(): s for s in slots if s.sock is not None}
    p = select.poll()
    for fd in byfd:
        p.register(fd, select.POLLIN)
    for fd, _ in p.poll(0):
        s = byfd[fd]
        try:
            if not s.sock.recv(65536):
                drop(s)
        except BlockingIOError:
            pass
        except OSError:
            drop(s)
    n = sum(s.sock is not None for s in slots)
    max_open = max(max_open, n)
    if now >= next_print:
        print("open", n, flush=True)
        next_print = now + 1
    time.sleep(0.1)
print("summary opened=%d closed=%d max_open=%d" % (opened, closed, max_open), flush=True)
