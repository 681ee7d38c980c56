#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vllm_peer.py — vLLM 0.34.0's own ECCPUConnector as a peer, without an engine.

Runs vLLM's real modules from vllm/distributed/ec_transfer/ec_connector/cpu/ (unpacked by
tests/nixl/venv.sh into the venv's vllm-src/): protocol.py (XferReq/XferAck, compat hash,
EC_CONNECTOR_VERSION = 2), session.py (ProducerSession, ConsumerSession), control/zmq.py
(ROUTER/DEALER, heartbeats, disconnect monitor), data/nixl.py (NixlDataTransport: real NIXL
agent, real UCX), utils.py (descriptor lists), ec_shared_region.py (the /dev/shm region) and
scheduler/embedding_cache.py (the block cache), plus vllm/distributed/nixl_utils.py. It drives
them the way vLLM's ECCPUScheduler does (_setup_nixl, _admit_item's size/shape check,
_start_xfer, _poll_step, _process_session_results, request_finished's announcement), with a
plain loop in place of engine steps.

Stubs (only what needs a GPU or a running engine), all installed in sys.modules below:
  vllm, vllm.distributed, vllm.distributed.ec_transfer   package shells; their __init__
      (engine config imports) is not run; submodules load from vllm-src
  vllm.distributed.ec_transfer.ec_connector.cpu.scheduler  package shell: its __init__
      (ECCPUScheduler: VllmConfig, request objects, worker metadata) is not run;
      scheduler/embedding_cache.py loads from vllm-src. Its logic that we use is mirrored
      by the Consumer / Producer drivers below (noted at each place).
  vllm.logger.init_logger          a logging.Logger with vLLM's info_once / warning_once
  vllm.platforms.current_platform  is_rocm() False (CPU machine: the CUDA NIXL wheel)
  vllm.utils.network_utils         make_zmq_path, make_zmq_socket as vLLM 0.34.0 writes
      them (RCVHWM/SNDHWM 0, bind/connect, IPV6 for v6 hosts) but with the OS socket
      buffer size (vLLM picks 0.5 GB buffers on big machines via psutil), get_ip
  vllm.version.__version__         "0.34.0" (only the default --vllm-version)
Config objects are not built: block_size_bytes = hidden x element size, num_blocks =
region bytes // block_size_bytes (common.create_ec_shared_region), the ack timeout
(consumer_ack_timeout_s, default PRODUCER_PIN_LEASE_S = 30 s) and the 60 s per-item wait
(_ADMIT_DEFER_TIMEOUT_S) come from options.

Test hooks, not vLLM behaviour (each named so in --help): --send-version N puts an explicit
connector_version in the consumer's XferReq (vLLM never sends it: omit_defaults); the
producer's --demand-version N changes the version ProducerSession's check compares with
(its decoder still fills an absent field with 2), to make vLLM's code answer NACK_VERSION.
The producer's --status-file and the consumer's per-item "status" only observe (ack
statuses decoded from the bytes the sessions send and receive).

Item content: ecx's synthetic items (tools/opts.c): mm_hash = sha256("ecx-synthetic:I:BYTES")
hex, bytes = splitmix64 words seeded by the hash's first 8 bytes (little-endian), so ecx and
this peer can check each other's bytes.

usage:
  vllm_peer.py producer --listen HOST:PORT --synthetic N:BYTES --announce-out FILE
                        [--ready-delay-ms MS] [--lease-s S] [--status-file FILE]
                        [--demand-version N]
  vllm_peer.py consumer --params FILE [--params-wait] [--verify-synthetic] [--ack-timeout-s S] [--wait-s S]
                        [--expect-rows N] [--mm-hash H ...] [--send-version N]
                        [--again-after FILE] [--rounds N]
  vllm_peer.py bench --items N --size BYTES [--rounds R]
common: --hidden H (4096) --dtype bfloat16 --model M --vllm-version V --region-bytes B
Consumer output: one JSON line per item {"mm_hash","outcome":"ready"|"local","reason",
"status" (the last ack's),
"verified","retries","ms"}; exit 0 all ready and verified, 3 some fell back, 1 a byte
mismatch or error, 2 usage.
"""

import argparse
import hashlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import types

# ---------------------------------------------------------------- stubs and imports

SRC = os.environ.get("ECX_VLLM_SRC") or os.path.join(sys.prefix, "vllm-src")
CPU = "vllm.distributed.ec_transfer.ec_connector.cpu"


def _pkg(name, path):
    m = types.ModuleType(name)
    m.__path__ = [path]
    sys.modules[name] = m
    return m


class _Logger(logging.LoggerAdapter):
    _seen = set()

    def _once(self, level, msg, *args):
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            self.log(level, msg, *args)

    def info_once(self, msg, *args, **_):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **_):
        self._once(logging.WARNING, msg, *args)

    def debug_once(self, msg, *args, **_):
        self._once(logging.DEBUG, msg, *args)


def _install_stubs():
    if not os.path.isdir(os.path.join(SRC, "vllm", "distributed", "ec_transfer")):
        sys.exit("vllm_peer: no vLLM sources at %s (run tests/nixl/venv.sh)" % SRC)
    base = os.path.join(SRC, "vllm")
    _pkg("vllm", base)
    _pkg("vllm.distributed", os.path.join(base, "distributed"))
    _pkg("vllm.distributed.ec_transfer", os.path.join(base, "distributed", "ec_transfer"))
    _pkg(CPU + ".scheduler", os.path.join(base, *CPU.split(".")[1:], "scheduler"))

    lg = types.ModuleType("vllm.logger")
    lg.init_logger = lambda name: _Logger(logging.getLogger(name), {})
    sys.modules["vllm.logger"] = lg

    pf = types.ModuleType("vllm.platforms")
    pf.current_platform = types.SimpleNamespace(is_rocm=lambda: False)
    sys.modules["vllm.platforms"] = pf

    ver = types.ModuleType("vllm.version")
    ver.__version__ = "0.34.0"
    sys.modules["vllm.version"] = ver

    import zmq

    def make_zmq_path(scheme, host, port=None):
        if port is None:
            return f"{scheme}://{host}"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    def make_zmq_socket(ctx, path, socket_type, bind=None, identity=None, linger=None, **_):
        s = ctx.socket(socket_type)
        if bind is None:
            bind = socket_type not in (zmq.PUSH, zmq.SUB, zmq.XSUB)
        if socket_type in (zmq.PULL, zmq.DEALER, zmq.ROUTER):
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.RCVBUF, -1)
        if socket_type in (zmq.PUSH, zmq.DEALER, zmq.ROUTER):
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.SNDBUF, -1)
        if identity is not None:
            s.setsockopt(zmq.IDENTITY, identity)
        if linger is not None:
            s.setsockopt(zmq.LINGER, linger)
        if path.startswith("tcp://["):
            s.setsockopt(zmq.IPV6, 1)
        (s.bind if bind else s.connect)(path)
        return s

    _pkg("vllm.utils", os.path.join(base, "utils"))
    nu = types.ModuleType("vllm.utils.network_utils")
    nu.make_zmq_path = make_zmq_path
    nu.make_zmq_socket = make_zmq_socket
    nu.get_ip = lambda: "127.0.0.1"
    sys.modules["vllm.utils.network_utils"] = nu


_install_stubs()

import msgspec  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from vllm.distributed.ec_transfer.ec_connector.cpu import protocol  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.cpu import session as vsession  # noqa: E402
from vllm.distributed.ec_transfer.ec_connector.cpu.control.zmq import (  # noqa: E402
    ZmqClientTransport,
    ZmqServerTransport,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.data.nixl import (  # noqa: E402
    NixlDataTransport,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.ec_shared_region import (  # noqa: E402
    ECSharedRegion,
)
from vllm.distributed.ec_transfer.ec_connector.cpu.scheduler.embedding_cache import (  # noqa: E402
    EmbeddingCache,
)

# scheduler/__init__.py's constant (the module itself is a stub shell, see the header)
ADMIT_DEFER_TIMEOUT_S = 60.0

# ---------------------------------------------------------------- ecx's synthetic items

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def synthetic_hash(i, nbytes):
    return hashlib.sha256(b"ecx-synthetic:%d:%d" % (i, nbytes)).hexdigest()


def synthetic_bytes(mm_hash, nbytes):
    """ecx's synthetic_fill(mm_hash, dst, 0, nbytes) as a numpy uint8 array."""
    seed = np.uint64(int.from_bytes(bytes.fromhex(mm_hash[:16]), "little"))
    k = np.arange(1, (nbytes + 7) // 8 + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = seed + k * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").view(np.uint8)[:nbytes]


def parse_size(s):
    mult = {"K": 1000, "M": 1000**2, "G": 1000**3, "KI": 1024, "MI": 1024**2, "GI": 1024**3}
    u = s.upper()
    for suf in ("KI", "MI", "GI", "K", "M", "G"):
        if u.endswith(suf):
            return int(float(s[: -len(suf)]) * mult[suf])
    return int(s)


# ---------------------------------------------------------------- shared pieces


class Node:
    """The region, cache, compat hash and NIXL agent one ECCPUScheduler sets up."""

    def __init__(self, a, role, region_bytes):
        self.itemsize = torch.empty(0, dtype=getattr(torch, a.dtype)).element_size()
        self.block = a.hidden * self.itemsize  # common.create_ec_shared_region
        nblocks = max(1, region_bytes // self.block)
        self.region = ECSharedRegion(
            engine_id="ecxpeer-%s-%d" % (role, os.getpid()), num_blocks=nblocks,
            block_size_bytes=self.block)
        self.cache = EmbeddingCache(self.region.num_blocks)
        self.compat = protocol.compute_ec_compatibility_hash(
            vllm_version=a.vllm_version, model=a.model, dtype="torch." + a.dtype,
            block_size_bytes=self.block) if a.compat_hash is None else a.compat_hash
        self.data = NixlDataTransport(
            agent_name="ecxpeer-%s-%d" % (role, os.getpid()),
            base_ptr=self.region.blocks.data_ptr(), num_blocks=self.region.num_blocks,
            block_size_bytes=self.block, total_size_bytes=self.region.num_blocks * self.block)
        self.flat = self.region.blocks.numpy().view(np.uint8)

    def blocks_for(self, nbytes):  # scheduler._num_blocks over a [rows, hidden] shape
        return (nbytes + self.block - 1) // self.block

    def write(self, block_ids, payload):
        """Item bytes run through its blocks in list order (the worker's save)."""
        off = 0
        for b in block_ids:
            n = min(self.block, len(payload) - off)
            if n <= 0:
                break
            self.flat[b][:n] = payload[off:off + n]
            off += n

    def read(self, block_ids, nbytes):
        rows = self.flat[np.asarray(block_ids, dtype=np.int64)]
        return rows.reshape(-1)[:nbytes]

    def close(self):
        self.data.deregister()
        del self.flat  # the region's mmap cannot close while a view exports it
        self.region.cleanup()


# ---------------------------------------------------------------- producer


def run_producer(a):
    block = a.hidden * torch.empty(0, dtype=getattr(torch, a.dtype)).element_size()
    items = []
    if a.synthetic:
        n, size = a.synthetic.split(":", 1)
        # whole rows: an encoding is [rows, hidden], so its bytes fill whole blocks
        size = (parse_size(size) + block - 1) // block * block
        items = [(synthetic_hash(i, size), size) for i in range(int(n))]
    node = Node(a, "prod", a.region_bytes or sum(s for _, s in items) + block)
    vsession.PRODUCER_PIN_LEASE_S = a.lease_s  # read by ProducerSession._grant_or_nack
    if a.demand_version is not None:  # test hook, see --demand-version
        vsession.EC_CONNECTOR_VERSION = a.demand_version
    host, port = a.listen.rsplit(":", 1)
    transport = ZmqServerTransport(host=host.strip("[]"), port=int(port))
    acks = {}
    _count_acks(transport, acks)
    sess = vsession.ProducerSession(transport=transport, data=node.data, cache=node.cache,
                                    compat_hash=node.compat)
    ann = {}
    for i, (h, size) in enumerate(items):
        # update_state_after_alloc: the entry is allocated not ready with its shape
        rows = size // node.block
        entry = node.cache.alloc(h, node.blocks_for(size), (rows, a.hidden))
        if entry is None:
            sys.exit("vllm_peer producer: region too small")
        node.write(entry.block_ids, synthetic_bytes(h, size))
        # request_finished: collect_ec_item_metadata's entry, then the address merged in
        ann[h] = {"modality": "image", "item_indices": [i], "metadata": {},
                  "peer_host": host.strip("[]"), "peer_port": transport.port,
                  "size_bytes": len(entry.block_ids) * node.block, "shape": list(entry.shape)}
    ready_at = time.monotonic() + a.ready_delay_ms / 1000.0
    marked = False
    if a.announce_out:
        tmp = a.announce_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ann, f)
        os.replace(tmp, a.announce_out)
    print("vllm_peer producer: %d items on %s:%d, agent %s, %d B/block" % (
        len(items), host, transport.port, node.data._nixl.name, node.block),
        file=sys.stderr, flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    last_status = 0.0
    try:
        while not stop:
            now = time.monotonic()
            if not marked and now >= ready_at:
                for h, _ in items:
                    node.cache.mark_ready(h)  # update_connector_output: save landed
                marked = True
            # build_connector_meta's poll_step, with a 5 ms wait in place of an engine step
            sess.poll(transport.poll(timeout_ms=5))
            if a.status_file and now - last_status > 0.05:
                write_status(a.status_file, sess, node, items, acks)
                last_status = now
    finally:
        if a.status_file:
            write_status(a.status_file, sess, node, items, acks)
        sess.close()
        node.close()
    return 0


def _count_acks(transport, acks):
    """Count the acks ProducerSession sends, by status (observation only)."""
    send, dec = transport.send, msgspec.msgpack.Decoder(protocol.XferAck)

    def counted(identity, payload):
        st = dec.decode(payload).status.name
        acks[st] = acks.get(st, 0) + 1
        send(identity, payload)

    transport.send = counted


def write_status(path, sess, node, items, acks):
    """{active_xfers: grants held, pinned: items with pins, acks: {status: n}}"""
    pins = {h: node.cache.get(h)._pin_count for h, _ in items if node.cache.get(h)}
    st = {"active_xfers": len(sess._active_xfers), "pinned": sum(1 for p in pins.values() if p > 0),
          "acks": acks}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, path)


# ---------------------------------------------------------------- consumer


class Consumer:
    """ECCPUScheduler's consumer half: _admit_item, _start_xfer, _poll_step and
    _process_session_results, for a list of announced items all requested at once."""

    def __init__(self, a, params, region_bytes):
        self.a = a
        self.node = Node(a, "cons", region_bytes)
        self.transport = ZmqClientTransport()
        self.sessions = {}
        self.params = params
        self.acks = msgspec.msgpack.Decoder(protocol.XferAck)

    def fetch(self, hashes):
        """All items requested at once; returns {mm_hash: result dict}."""
        t0 = time.monotonic()
        todo = {h: {"mm_hash": h, "outcome": None, "reason": None, "verified": False,
                    "retries": 0, "since": t0, "status": None} for h in hashes}
        inflight = set()
        for h, r in todo.items():
            self.admit(h, r, inflight)
        end = t0 + self.a.wait_s + 5 * 60
        next_step = t0
        while any(r["outcome"] is None for r in todo.values()) and time.monotonic() < end:
            self.poll_step(todo, inflight)
            now = time.monotonic()
            if now >= next_step:  # retryable items are asked again on a later engine step
                next_step = now + self.a.step_ms / 1000.0
                for h in [h for h in todo if todo[h]["outcome"] is None and h not in inflight]:
                    self.admit(h, todo[h], inflight)
            time.sleep(0.0002)
        for r in todo.values():
            if r["outcome"] is None:
                r.update(outcome="local", reason="TIMEOUT")
        return todo

    def verify(self, todo):
        """Every landed item's bytes against ecx's synthetic content (after the timing)."""
        for h, r in todo.items():
            if r["outcome"] == "ready":
                shape = self.node.cache.get(h).shape
                nbytes = shape[0] * shape[1] * self.node.itemsize
                got = self.node.read(r["blocks"], nbytes)
                r["verified"] = bool(np.array_equal(got, synthetic_bytes(h, nbytes)))

    def admit(self, h, r, inflight):
        ann = self.params.get(h)
        now = time.monotonic()
        if not isinstance(ann, dict) or "peer_host" not in ann:
            return r.update(outcome="local", reason="NO_ANNOUNCEMENT")
        if now - r["since"] > self.a.wait_s:
            return r.update(outcome="local", reason=r["status"] or "WAIT_EXPIRED")
        try:  # _admit_item's checks of the announcement
            size = int(ann["size_bytes"])
            shape = tuple(int(d) for d in ann["shape"])
        except (KeyError, TypeError, ValueError):
            return r.update(outcome="local", reason="SIZE_UNUSABLE")
        rows = self.a.expect_rows if self.a.expect_rows is not None else shape[0] if shape else -1
        if (len(shape) != 2 or shape[0] != rows
                or size != self.node.blocks_for(shape[0] * shape[1] * self.node.itemsize) * self.node.block):
            return r.update(outcome="local", reason="SIZE_MISMATCH")
        n_blocks = max(1, math.ceil(size / self.node.block))  # _start_xfer
        entry = self.node.cache.alloc(h, n_blocks, shape)
        if entry is None:
            return r.update(outcome="local", reason="NO_ROOM")
        r["size"], r["blocks"] = size, list(entry.block_ids)
        addr = (ann["peer_host"], int(ann["peer_port"]))
        try:
            if addr not in self.sessions:
                self.sessions[addr] = vsession.ConsumerSession(
                    addr=addr, zmq_conn=self.transport.connect(addr), transport=self.transport,
                    data=self.node.data, compat_hash=self.node.compat)
                if self.a.send_version is not None:  # test hook, see --send-version
                    self.sessions[addr]._encoder = _VersionedEncoder(self.a.send_version)
            self.sessions[addr].start_xfer(h, list(entry.block_ids), now + self.a.ack_timeout_s)
        except Exception as error:
            # _admit_item: "the read could not be started", encode locally. (vLLM's
            # _start_xfer leaves the entry allocated when connect() raises; we free it.)
            logging.getLogger("vllm_peer").warning("start of %s failed: %r", h, error)
            self.node.cache.discard(h)
            return r.update(outcome="local", reason="START_FAILED")
        inflight.add(h)

    def poll_step(self, todo, inflight):  # _poll_step
        now = time.monotonic()
        msgs = self.transport.poll()
        for addr, sess in list(self.sessions.items()):
            for raw in msgs.get(addr, []):  # observe each ack's status for the report
                try:
                    ack = self.acks.decode(raw)
                    if ack.mm_hash in todo:
                        todo[ack.mm_hash]["status"] = ack.status.name
                except Exception:
                    pass
            sess.poll(msgs.get(addr, []), now)
        for addr in self.transport.poll_dead():
            sess = self.sessions.pop(addr, None)
            if sess is not None:  # _on_peer_down
                sess.on_peer_down()
                self.results(sess, todo, inflight, peer_down=True)
                sess.close()
        for sess in self.sessions.values():
            self.results(sess, todo, inflight)

    def results(self, sess, todo, inflight, peer_down=False):  # _process_session_results
        res = sess.take_results()
        for h in res.completed:
            inflight.discard(h)
            self.node.cache.mark_ready(h)
            r = todo[h]
            r["ms"] = round((time.monotonic() - r["since"]) * 1000, 1)
            r["outcome"] = "ready"
        for h in res.tombstoned:
            inflight.discard(h)
            self.node.cache.discard(h)
            todo[h].update(outcome="local", reason=todo[h]["status"] if todo[h]["status"] not in (None, "OK") else "READ_FAILED")
        for h in res.quarantined:
            inflight.discard(h)
            todo[h].update(outcome="local", reason="QUARANTINED")
        for h in res.retryable:
            inflight.discard(h)
            self.node.cache.discard(h)
            todo[h]["retries"] += 1
            if todo[h]["status"] is None or peer_down:
                todo[h]["status"] = "PEER_DOWN" if peer_down else "ACK_TIMEOUT"
            todo[h]["status_last"] = todo[h]["status"]
        for h, _ in res.settled:
            self.node.cache.discard(h)

    def close(self):
        for s in self.sessions.values():
            s.close()
        self.transport.close()
        self.node.close()


class _VersionedEncoder:
    """ConsumerSession's encoder with XferReq.connector_version set to N: msgspec puts
    it on the wire when N differs from vLLM's default (2); vLLM itself never does."""

    def __init__(self, version):
        self._enc = msgspec.msgpack.Encoder()
        self._version = version

    def encode(self, msg):
        if isinstance(msg, protocol.XferReq):
            msg = msgspec.structs.replace(msg, connector_version=self._version)
        return self._enc.encode(msg)


def load_params(path):
    with open(path) as f:
        return json.load(f)


def run_consumer(a):
    if a.params_wait:  # started before the producer: imports done, wait for its announcement
        print(json.dumps({"waiting_for_params": a.params}), file=sys.stderr, flush=True)
        for _ in range(1200):
            if os.path.exists(a.params):
                break
            time.sleep(0.1)
    params = load_params(a.params)
    hashes = a.mm_hash or sorted(params)
    need = sum(int(params[h].get("size_bytes", 0)) for h in hashes if isinstance(params.get(h), dict))
    c = Consumer(a, params, a.region_bytes or max(2 * need, 1 << 20))
    rc = 0
    try:
        rounds = max(a.rounds, 2 if a.again_after else 1)
        for rnd in range(1, rounds + 1):
            if rnd > 1:  # the same sessions, a cold cache: fetch everything again
                for _ in range(12000 if a.again_after and rnd == 2 else 0):
                    if os.path.exists(a.again_after):
                        break
                    c.poll_step({}, set())  # the engine keeps stepping meanwhile
                    time.sleep(0.01)
                c.node.cache = EmbeddingCache(c.node.region.num_blocks)
            t0 = time.monotonic()
            res = c.fetch(hashes)
            dt = time.monotonic() - t0
            got = [h for h in hashes if res[h]["outcome"] == "ready"]
            print(json.dumps({"round": rnd, "fetch_s": round(dt, 4), "ready": len(got),
                              "bytes": sum(res[h]["size"] for h in got)}),
                  file=sys.stderr, flush=True)
            if a.verify_synthetic:
                c.verify(res)
            for h in hashes:
                r = res[h]
                out = {k: r.get(k) for k in ("mm_hash", "outcome", "reason", "status",
                                             "verified", "retries", "ms")}
                out["round"] = rnd
                print(json.dumps(out), flush=True)
                if r["outcome"] != "ready":
                    rc = max(rc, 3)
                elif a.verify_synthetic and not r["verified"]:
                    rc = 1
    finally:
        c.close()
    return rc


# ---------------------------------------------------------------- bench


def run_bench(a):
    """vLLM producer (a child process) and vLLM consumer on loopback: all N items
    requested at once, timed from the first XferReq to the last item landed."""
    tmp = "/tmp/ecx-vllm-bench-%d" % os.getpid()
    os.makedirs(tmp, exist_ok=True)
    ann = os.path.join(tmp, "ann.json")
    common = ["--hidden", str(a.hidden), "--dtype", a.dtype]
    prod = subprocess.Popen([sys.executable, os.path.abspath(__file__), "producer",
                             "--listen", "127.0.0.1:0", "--synthetic", "%d:%d" % (a.items, a.size),
                             "--announce-out", ann] + common)
    try:
        for _ in range(600):
            if os.path.exists(ann) or prod.poll() is not None:
                break
            time.sleep(0.1)
        params = load_params(ann)
        hashes = sorted(params)
        need = sum(int(p["size_bytes"]) for p in params.values())
        size = need // len(params)
        c = Consumer(a, params, need + (1 << 20))
        try:
            rates = []
            for rnd in range(a.rounds):
                c.node.cache = EmbeddingCache(c.node.region.num_blocks)  # a cold cache per round
                t0 = time.monotonic()
                res = c.fetch(hashes)
                dt = time.monotonic() - t0
                c.verify(res)
                bad = [h for h in hashes if res[h]["outcome"] != "ready" or not res[h]["verified"]]
                if bad:
                    print("vllm_peer bench: round %d: %d items not fetched/verified: %s" % (
                        rnd, len(bad), [res[h]["reason"] for h in bad][:4]), file=sys.stderr)
                    return 1
                rates.append(dt)
                print("round %d: %d items x %d B in %.3f s: %.1f items/s, %.3f GB/s" % (
                    rnd, a.items, size, dt, a.items / dt, need / dt / 1e9), flush=True)
            best = min(rates)
            print(json.dumps({"peer": "vllm-0.34.0", "items": a.items, "size": size,
                              "rounds": a.rounds, "best_s": round(best, 4),
                              "items_per_s": round(a.items / best, 1),
                              "gb_per_s": round(need / best / 1e9, 3)}), flush=True)
        finally:
            c.close()
    finally:
        prod.send_signal(signal.SIGTERM)
        prod.wait(timeout=30)
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    return 0


# ---------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    modes = {m: sub.add_parser(m) for m in ("producer", "consumer", "bench")}
    for m in modes.values():
        m.add_argument("--hidden", type=int, default=4096)
        m.add_argument("--dtype", default="bfloat16")
        m.add_argument("--model", default="llava-hf/llava-1.5-7b-hf")
        m.add_argument("--vllm-version", default=sys.modules["vllm.version"].__version__)
        m.add_argument("--compat-hash", default=None, help="send/expect this hash as is")
        m.add_argument("--region-bytes", type=parse_size, default=0)
        m.add_argument("--ack-timeout-s", type=float, default=vsession.PRODUCER_PIN_LEASE_S)
        m.add_argument("--wait-s", type=float, default=ADMIT_DEFER_TIMEOUT_S)
        m.add_argument("--step-ms", type=float, default=10.0,
                       help="consumer: an engine step, between retries of retryable items")
        m.add_argument("--verbose", action="store_true")
    pr = modes["producer"]
    pr.add_argument("--listen", default="127.0.0.1:0")
    pr.add_argument("--synthetic", default=None)
    pr.add_argument("--announce-out", default=None)
    pr.add_argument("--ready-delay-ms", type=int, default=0)
    pr.add_argument("--lease-s", type=float, default=vsession.PRODUCER_PIN_LEASE_S)
    pr.add_argument("--status-file", default=None)
    pr.add_argument("--demand-version", type=int, default=None,
                    help="test hook: the version ProducerSession's check demands (its "
                    "decoder still defaults an absent field to 2), to send NACK_VERSION")
    co = modes["consumer"]
    co.add_argument("--params", required=True)
    co.add_argument("--params-wait", action="store_true",
                    help="wait (120 s at most) for the params file to appear")
    co.add_argument("--mm-hash", action="append")
    co.add_argument("--verify-synthetic", action="store_true")
    co.add_argument("--expect-rows", type=int, default=None)
    co.add_argument("--rounds", type=int, default=1,
                    help="fetch everything this many times (a cold cache each time, the same "
                    "sessions); each round's time on stderr as JSON")
    co.add_argument("--again-after", default=None,
                    help="after the first fetch, wait for this file, then fetch it all again "
                    "with the same sessions (a producer restarted in between)")
    co.add_argument("--send-version", type=int, default=None,
                    help="test hook: put connector_version N in every XferReq")
    be = modes["bench"]
    be.add_argument("--items", type=int, default=32)
    be.add_argument("--size", type=parse_size, default=parse_size("4.7M"))
    be.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.WARNING,
                        format="vllm_peer %(levelname)s %(name)s: %(message)s")
    if a.mode == "bench":
        a.verify_synthetic, a.expect_rows, a.send_version = True, None, None
    return {"producer": run_producer, "consumer": run_consumer, "bench": run_bench}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
