#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""hostile_peer — a raw ZMTP 3.0 peer that sends one multipart message that
never ends (1 MiB frames, each flagged "more"), for tests/shell/test_hostile_local.sh.

  hostile_peer.py dealer PORT SECONDS   connect to a ROUTER on 127.0.0.1:PORT
  hostile_peer.py router PORTFILE SECONDS
                                        listen on 127.0.0.1 (port written to
                                        PORTFILE) and flood whoever connects
  hostile_peer.py rss PID SECONDS       print the peak RSS (KiB) of PID seen
                                        until it exits or SECONDS pass

It speaks ZMTP by hand over a plain socket, so nothing buffers on this side:
a send blocks when the other end stops reading. When the other end drops the
connection (a send stalls for 1 s or fails) it reconnects (dealer) or
accepts again (router) until SECONDS
have passed, then prints how many connections it made and frames it sent.
"""
import socket
import struct
import sys
import os
import time

FRAME = b"x" * (1 << 20)


def greeting(as_server):
    return (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") +
            bytes([as_server]) + b"\0" * 31)


def ready(socket_type):
    prop = b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    body = b"\x05READY" + prop
    return b"\x04" + bytes([len(body)]) + body


def flood(s, deadline, as_server, socket_type):
    """Handshake, then send frames flagged "more" until the deadline or the
    peer hangs up. Returns the number of frames sent."""
    frames = 0
    try:
        # A send stalled for a second: the other end dropped us.
        s.settimeout(1)
        s.sendall(greeting(as_server) + ready(socket_type))
        head = b"\x03" + struct.pack(">Q", len(FRAME))  # more | long
        while time.monotonic() < deadline:
            s.sendall(head + FRAME)
            frames += 1
    except OSError:
        pass
    s.close()
    return frames


def keep_flooding(seconds, connect, as_server, socket_type):
    """Flood every connection connect() gives until SECONDS have passed."""
    deadline = time.monotonic() + seconds
    conns = frames = 0
    while time.monotonic() < deadline:
        try:
            s = connect(max(0.1, deadline - time.monotonic()))
        except OSError:
            time.sleep(0.05)
            continue
        conns += 1
        frames += flood(s, deadline, as_server, socket_type)
    print("connections %d frames %d" % (conns, frames))


def dealer(port, seconds):
    keep_flooding(seconds, lambda t: socket.create_connection(("127.0.0.1", port), timeout=t),
                  0, b"DEALER")


def router(portfile, seconds):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)

    def accept(t):
        ls.settimeout(t)
        return ls.accept()[0]
    keep_flooding(seconds, accept, 1, b"ROUTER")


def rss(pid, seconds):
    deadline = time.monotonic() + seconds
    peak = 0
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            break
        time.sleep(0.02)
    print(peak)


if __name__ == "__main__":
    mode, arg, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if mode == "dealer":
        dealer(int(arg), secs)
    elif mode == "router":
        router(arg, secs)
    else:
        rss(int(arg), secs)
