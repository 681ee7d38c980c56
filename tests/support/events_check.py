# SPDX-License-Identifier: Apache-2.0
"""events_check — test_events' driver: real producer processes
(events_producer) and subscribers (python/ecx/events.py, loaded by path, so
the shipped client is what is tested).

usage: events_check.py EVENTS_PRODUCER ECX_CLI SRC_DIR PORT_A PORT_B PORT_C
Every step is bounded in time; the first failure exits 1 with a message.
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

import zmq

prod_bin, ecx_cli, src = sys.argv[1:4]
port_a, port_b, port_c = (int(p) for p in sys.argv[4:7])
spec = importlib.util.spec_from_file_location("ecx_events", os.path.join(src, "python/ecx/events.py"))
events = importlib.util.module_from_spec(spec)
sys.modules["ecx_events"] = events
spec.loader.exec_module(events)

BLOCK = 8192  # the default: one row of llava-1.5 (protocol version 2, whole-block saves)
REGION = 64 * BLOCK  # 64 blocks: saves of 4 blocks evict after 16


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


class Producer:
    def __init__(self, port, topic="enc", curve_secret=None):
        self.port = port
        extra = [curve_secret] if curve_secret else []
        env = dict(os.environ)
        if "ASAN_OPTIONS" in env:
            # ASan keeps freed memory in a 256 MB quarantine, so under it the
            # resident size grows with every free until that fills: step 5's
            # bound would measure the sanitizer (it failed once by 116 KiB).
            # A small one fills in the warm-up before step 5's first reading.
            env["ASAN_OPTIONS"] += ":quarantine_size_mb=4"
        self.p = subprocess.Popen([prod_bin, "127.0.0.1:%d" % port, str(REGION), str(BLOCK), topic]
                                  + extra, env=env,
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
            if self.p.wait(10) != 0:  # under ASan: a leak or an error at ecx_free
                fail("producer on %d exited %d" % (self.port, self.p.returncode))


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
    if B.cmd("save b%d %d" % (i, BLOCK)) != "ok":
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
first_stored = min(e.seq for e in ev_a if e.type == "stored")
rr.send_multipart([b"", first_stored.to_bytes(8, "big")])
n_checked = 0
while rr.poll(3000):
    f = rr.recv_multipart()
    if int.from_bytes(f[1], "big") in (events.SEQ_END, events.SEQ_RESYNC):
        break
    if msgpack.packb(msgpack.unpackb(f[2])) != f[2]:
        fail("batch %d is not canonical msgpack: %s" % (int.from_bytes(f[1], "big"), f[2].hex()))
    n_checked += 1
if n_checked < 1:
    fail("replay from batch %d gave nothing" % first_stored)
rr.close(0)
print("ok 1 two producers: %d events from A in order, %d evictions, no gap" % (len(ev_a), len(removed)))

# 2. Restart of B: "stop", then a new life: the subscriber ends with its contents.
B.stop()
drain(sb, hb, lambda h: not h.up, 5)
if hb.up or hb.items:
    fail("B's stop not seen: %r" % hb)
B = Producer(port_b)
B.cmd("save b-new %d" % BLOCK)
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
A.cmd("fill %sburst 100000 %d" % ("d" * 200, BLOCK))  # ~25 MB of events (over 1000 batches) while slow does not read
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
A.cmd("fill %swarm 160000 %d" % ("d" * 200, BLOCK))  # past the ring's bound: it is full from here on
for r in range(3):  # the ring (16 MiB) and the dead subscriber's queue fill up
    A.cmd("fill %s%d- 20000 %d" % ("d" * 200, r, BLOCK))
rss0 = int(A.cmd("rss").split()[1])
for r in range(3, 8):
    A.cmd("fill %s%d- 20000 %d" % ("d" * 200, r, BLOCK))  # long keys: ~25 MB more events
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
A.cmd("save after-flood %d" % BLOCK)
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
# 7. The example router (examples/encoder-router) over both producers:
#    "where is this encoding" names the encoder that holds it, by its address.
import types
pkg = types.ModuleType("ecx")
pkg.events = events
sys.modules["ecx"], sys.modules["ecx.events"] = pkg, events  # the shipped files, no C extension
rspec = importlib.util.spec_from_file_location("router", os.path.join(src, "examples/encoder-router/router.py"))
router_mod = importlib.util.module_from_spec(rspec)
rspec.loader.exec_module(router_mod)
B.cmd("save shared %d" % BLOCK)
A.cmd("save shared %d" % BLOCK)
router = router_mod.Router(["127.0.0.1:%d" % port_a, "127.0.0.1:%d" % port_b], "enc")
truth_a, truth_b = A.held(), B.held()
end = time.monotonic() + 15
while time.monotonic() < end:
    router.step(100)
    h = router.holdings()
    if h["127.0.0.1:%d" % port_a] == truth_a and h["127.0.0.1:%d" % port_b] == truth_b:
        break
w = router.where("shared")
if sorted(x["events"] for x in w) != sorted(["127.0.0.1:%d" % port_a, "127.0.0.1:%d" % port_b]):
    fail("router: where(shared) = %r" % w)
if router.where("b-new") != [] and [x["events"] for x in router.where("b-new")] != ["127.0.0.1:%d" % port_b]:
    fail("router: where(b-new) = %r" % router.where("b-new"))
if router.where("nothing"):
    fail("router: an unknown hash has holders")
if any(x["peer_port"] <= 0 for x in w):
    fail("router: holders without a control-plane port: %r" % w)
router.close()
print("ok 7 router: where(shared) names both encoders; holdings equal both producers'")

# 8. The CLI: `ecx events --json` prints the snapshot, and then a change.
cli = subprocess.Popen([ecx_cli, "events", "127.0.0.1:%d" % port_b, "--topic", "enc", "--json",
                        "--count", str(len(truth_b) + 2)], stdout=subprocess.PIPE, text=True)
time.sleep(1.0)
B.cmd("save cli-item %d" % BLOCK)
try:
    out, _ = cli.communicate(timeout=20)
except subprocess.TimeoutExpired:
    cli.kill()
    fail("ecx events did not print the snapshot and the change")
lines = [json.loads(x) for x in out.splitlines()]
if lines[0]["type"] != "cleared" or lines[0]["reason"] != "snapshot" or lines[0]["items"] != len(truth_b):
    fail("ecx events: first line %r" % lines[0])
if {x["mm_hash"] for x in lines[1:-1]} != truth_b or lines[-1]["mm_hash"] != "cli-item":
    fail("ecx events printed %r" % lines)
if cli.returncode != 0:
    fail("ecx events exited %d" % cli.returncode)
print("ok 8 ecx events --json: snapshot of %d items, then the new save" % len(truth_b))

# 9. CURVE: with the control plane's key, the events are CURVE too: a
#    subscriber without the key gets nothing, one with it gets everything.
pub, sec = zmq.curve_keypair()
C = Producer(port_c, "enc", sec.decode())
C.cmd("save secret-item %d" % BLOCK)
plain = ctx.socket(zmq.DEALER)
plain.setsockopt(zmq.LINGER, 0)
plain.connect("tcp://127.0.0.1:%d" % (port_c + 1))
plain.send_multipart([b"", events.SNAPSHOT.to_bytes(8, "big")])
if plain.poll(1500):
    fail("a plaintext client got an answer from a CURVE producer")
plain.close(0)
sc = events.Subscriber("127.0.0.1:%d" % port_c, "enc", curve_server_key=pub.decode())
hcv = events.Holdings()
drain(sc, hcv, lambda h: set(h.items) == {"secret-item"})
if set(hcv.items) != {"secret-item"}:
    fail("CURVE subscriber: %r" % hcv.items)
sc.close()
C.stop()
print("ok 9 CURVE: refused without the key, exact with it")

for s in (sa, sb, again, slow, check):
    s.close()
for x in (r, big, flood):
    x.close(0)
A.stop()
B.stop()
print("PASS")
