"""events_check — test_events' driver: real producer processes
(events_producer) and subscribers (python/ecx/events.py, loaded by path, so
the shipped client is what is tested).

usage: events_check.py EVENTS_PRODUCER SRC_DIR PORT_A PORT_B
Every step is bounded in time; the first failure exits 1 with a message.
"""
import importlib.util
import os
import socket
import subprocess
import sys
import time

import zmq

prod_bin, src, port_a, port_b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = importlib.util.spec_from_file_location("ecx_events", os.path.join(src, "python/ecx/events.py"))
events = importlib.util.module_from_spec(spec)
sys.modules["ecx_events"] = events
spec.loader.exec_module(events)

BLOCK = 4096
REGION = 64 * BLOCK  # 64 blocks: saves of 4 blocks evict after 16


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


class Producer:
    def __init__(self, port, topic="enc"):
        self.port = port
        self.p = subprocess.Popen([prod_bin, "127.0.0.1:%d" % port, str(REGION), str(BLOCK), topic],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.p.stdout.readline()
        if not first.startswith("ready"):
            fail("producer on %d did not start: %r" % (port, first))

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def held(self):
        return set(self.cmd("held").split()[1:])

    def metric(self, name):
        return float(self.cmd("metric " + name).split()[1])

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(10)


def drain(sub, holdings, until, timeout=10.0):
    """Apply events until until(holdings) or timeout; returns the events."""
    got = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for e in sub.poll(100):
            holdings.apply(e)
            got.append(e)
        if until(holdings):
            return got
    return got


# 1. Two producers, one subscriber each (a router's view): every save, eviction
#    and restart appears, in order, with no gap.
A, B = Producer(port_a), Producer(port_b)
sa = events.Subscriber("127.0.0.1:%d" % port_a, "enc")
sb = events.Subscriber("127.0.0.1:%d" % port_b, "enc")
ha, hb = events.Holdings(), events.Holdings()
drain(sa, ha, lambda h: h.up), drain(sb, hb, lambda h: h.up)
if not ha.up or ha.peer[0] != "127.0.0.1":
    fail("A's snapshot missing: %r" % ha)
for i in range(40):  # 40 x 4 blocks in 64: A evicts 24
    if A.cmd("save a%d %d" % (i, 4 * BLOCK)) != "ok":
        fail("save a%d" % i)
for i in range(5):
    if B.cmd("save b%d 100" % i) != "ok":
        fail("save b%d" % i)
truth_a, truth_b = A.held(), B.held()
if len(truth_a) != 16:
    fail("A holds %d, not 16" % len(truth_a))
ev_a = drain(sa, ha, lambda h: set(h.items) == truth_a)
drain(sb, hb, lambda h: set(h.items) == truth_b)
if set(ha.items) != truth_a or set(hb.items) != truth_b:
    fail("subscribers' view differs: A %s vs %s" % (sorted(ha.items), sorted(truth_a)))
stored = [e.mm_hash for e in ev_a if e.type == "stored"]
removed = [(e.mm_hash, e.reason) for e in ev_a if e.type == "removed"]
if stored != ["a%d" % i for i in range(40)]:
    fail("A's stored events out of order or missing: %s" % stored)
if removed != [("a%d" % i, "evicted") for i in range(24)]:
    fail("A's removed events wrong: %s" % removed)
seqs = [e.seq for e in ev_a]
if any(b - a not in (0, 1) for a, b in zip(seqs, seqs[1:])):
    fail("A's sequence numbers have a gap: %s" % seqs)
if sa.replays or sa.resyncs:
    fail("no loss expected, yet %d replays %d resyncs" % (sa.replays, sa.resyncs))
if ev_a[0].ts <= 0 or ev_a[-1].size_bytes not in (0, 4 * BLOCK):
    fail("event fields wrong: %r" % ev_a[-1])
rr = zmq.Context.instance().socket(zmq.DEALER)
rr.setsockopt(zmq.LINGER, 0)
rr.connect("tcp://127.0.0.1:%d" % (port_a + 1))
# The bytes are msgpack's canonical encoding (smallest ints, float 64, str),
# as docs/EVENTS.md spells them: re-encoding a replayed batch gives it back.
import msgpack
rr.send_multipart([b"", (sa.last_seq - 3).to_bytes(8, "big")])
n_checked = 0
while rr.poll(3000):
    f = rr.recv_multipart()
    if int.from_bytes(f[1], "big") == events.SEQ_END:
        break
    if msgpack.packb(msgpack.unpackb(f[2])) != f[2]:
        fail("batch %d is not canonical msgpack: %s" % (int.from_bytes(f[1], "big"), f[2].hex()))
    n_checked += 1
if n_checked < 4:
    fail("replay of the last 4 batches gave %d" % n_checked)
rr.close(0)
print("ok 1 two producers: %d events from A in order, %d evictions, no gap" % (len(ev_a), len(removed)))

# 2. Restart of B: "stop", then a new life: the subscriber ends with its contents.
B.stop()
drain(sb, hb, lambda h: not h.up, 5)
if hb.up or hb.items:
    fail("B's stop not seen: %r" % hb)
B = Producer(port_b)
B.cmd("save b-new 100")
drain(sb, hb, lambda h: set(h.items) == {"b-new"})
if set(hb.items) != {"b-new"} or not hb.up:
    fail("after B's restart the view is %s" % sorted(hb.items))
print("ok 2 restart: stop seen, new life's contents exact (resyncs %d)" % sb.resyncs)

# 3. A subscriber that joins late gets the snapshot; one killed and restarted
#    ends with exactly the producer's contents.
late = events.Subscriber("127.0.0.1:%d" % port_a, "enc")
hl = events.Holdings()
drain(late, hl, lambda h: set(h.items) == truth_a)
if set(hl.items) != truth_a:
    fail("late subscriber: %s" % sorted(hl.items))
late.close()
code = (
    "import importlib.util,sys\n"
    "s=importlib.util.spec_from_file_location('e',sys.argv[1]);m=importlib.util.module_from_spec(s)\n"
    "sys.modules['e']=m;s.loader.exec_module(m)\n"
    "h=m.Holdings();sub=m.Subscriber(sys.argv[2],'enc')\n"
    "for e in sub:\n"
    "    h.apply(e);print(e.type,e.mm_hash,flush=True)\n")
child = subprocess.Popen([sys.executable, "-c", code, os.path.join(src, "python/ecx/events.py"),
                          "127.0.0.1:%d" % port_a], stdout=subprocess.PIPE, text=True)
time.sleep(0.5)
child.kill()
child.wait()
for i in range(40, 60):
    A.cmd("save a%d %d" % (i, 4 * BLOCK))
truth_a = A.held()
again = events.Subscriber("127.0.0.1:%d" % port_a, "enc")
hg = events.Holdings()
drain(again, hg, lambda h: set(h.items) == truth_a)
if set(hg.items) != truth_a:
    fail("restarted subscriber: %s vs %s" % (sorted(hg.items), sorted(truth_a)))
drain(sa, ha, lambda h: set(h.items) == truth_a)
if set(ha.items) != truth_a:
    fail("the first subscriber fell behind: %s" % sorted(ha.items))
print("ok 3 late and restarted subscribers end with exactly A's %d items" % len(truth_a))

# 4. Gaps: a subscriber that stops reading past the high-water mark is skipped
#    for what it missed and recovers it by replay (or a snapshot).
slow = events.Subscriber("127.0.0.1:%d" % port_a, "enc")
hs = events.Holdings()
drain(slow, hs, lambda h: set(h.items) == truth_a)
ep = "tcp://127.0.0.1:%d" % port_a  # reconnect with tiny queues, so that the burst overflows them
slow.sub.disconnect(ep)
slow.sub.setsockopt(zmq.RCVHWM, 2)
slow.sub.setsockopt(zmq.RCVBUF, 4096)
slow.sub.connect(ep)
time.sleep(0.3)
A.cmd("fill burst 30000 64")  # thousands of batches while slow does not read
truth_a = A.held()
drain(slow, hs, lambda h: set(h.items) == truth_a, 30)
if set(hs.items) != truth_a:
    fail("slow subscriber did not recover: %d vs %d items" % (len(hs.items), len(truth_a)))
if not slow.replays and not slow.resyncs:
    fail("the slow subscriber lost nothing: the step tests nothing")
print("ok 4 a subscriber that stopped reading recovered (replays %d, resyncs %d, hwm drops %d)"
      % (slow.replays, slow.resyncs, A.metric("ecx_events_hwm_drops_total")))

# 5. A subscriber that never reads does not grow the producer past its bound.
ctx = zmq.Context()
dead = ctx.socket(zmq.SUB)
dead.setsockopt(zmq.RCVHWM, 1)
dead.setsockopt(zmq.RCVBUF, 4096)
dead.setsockopt(zmq.SUBSCRIBE, b"")
dead.connect("tcp://127.0.0.1:%d" % port_a)
time.sleep(0.3)
A.cmd("fill %swarm 160000 64" % ("d" * 200))  # past the ring's bound: it is full from here on
for r in range(3):  # the ring (16 MiB) and the dead subscriber's queue fill up
    A.cmd("fill %s%d- 20000 64" % ("d" * 200, r))
rss0 = int(A.cmd("rss").split()[1])
for r in range(3, 8):
    A.cmd("fill %s%d- 20000 64" % ("d" * 200, r))  # long keys: ~25 MB more events
rss1 = int(A.cmd("rss").split()[1])
drops = A.metric("ecx_events_hwm_drops_total")
if rss1 - rss0 > 8 * 1024:  # the ring and the queues are full: no growth with saves
    fail("producer grew %d KiB with a subscriber that never reads" % (rss1 - rss0))
if drops <= 0:
    fail("no drops counted for a subscriber that never reads")
print("ok 5 never-reading subscriber: producer RSS %d -> %d KiB after 100000 more saves; "
      "%d batches counted as dropped" % (rss0, rss1, drops))
dead.close(0)

# 6. Hostile replay requests: garbage, huge frames, floods: errors, no crash.
r = ctx.socket(zmq.DEALER)
r.setsockopt(zmq.LINGER, 0)
r.connect("tcp://127.0.0.1:%d" % (port_a + 1))
r.send_multipart([b"", b"garbage"])
if not r.poll(3000):
    fail("no answer to a garbage request")
f = r.recv_multipart()
if int.from_bytes(f[1], "big") != events.SEQ_ERROR:
    fail("garbage got %r" % f)
r.send_multipart([b"", b"\0" * 8, b"extra", b"frames"])
if not r.poll(3000) or int.from_bytes(r.recv_multipart()[1], "big") != events.SEQ_ERROR:
    fail("extra frames not refused")
r.send_multipart([b"", (5).to_bytes(8, "big")])  # older than the ring
got = []
while r.poll(3000):
    got.append(int.from_bytes(r.recv_multipart()[1], "big"))
    if got[-1] == events.SEQ_END:
        break
if got != [events.SEQ_RESYNC, events.SEQ_END]:
    fail("a request older than the ring got %r" % got)
big = ctx.socket(zmq.DEALER)
big.setsockopt(zmq.LINGER, 0)
big.connect("tcp://127.0.0.1:%d" % (port_a + 1))
big.send_multipart([b"", b"x" * (1 << 20)])
raw = socket.create_connection(("127.0.0.1", port_a + 1), 3)
raw.sendall(os.urandom(65536))
raw.close()
flood = ctx.socket(zmq.DEALER)
flood.setsockopt(zmq.LINGER, 0)
flood.setsockopt(zmq.SNDHWM, 0)
flood.connect("tcp://127.0.0.1:%d" % (port_a + 1))
t0 = time.monotonic()
for _ in range(3000):
    flood.send_multipart([b"", events.SNAPSHOT.to_bytes(8, "big")])
A.cmd("save after-flood 100")
if A.p.poll() is not None:
    fail("producer died under hostile replay input")
bad = A.metric("ecx_events_bad_requests_total")
truth_a = A.held()
check = events.Subscriber("127.0.0.1:%d" % port_a, "enc")
hc = events.Holdings()
drain(check, hc, lambda h: set(h.items) == truth_a, 30)
if set(hc.items) != truth_a:
    fail("after the hostile input a new subscriber does not get A's contents")
print("ok 6 hostile replay input: %d bad requests answered with errors, flood of 3000 "
      "snapshot requests, producer alive and exact" % bad)
for s in (sa, sb, again, slow, check):
    s.close()
for x in (r, big, flood):
    x.close(0)
A.stop()
B.stop()
print("PASS")
