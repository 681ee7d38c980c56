# SPDX-License-Identifier: Apache-2.0
"""py_producer — a minimal producer with the Python reference's control-plane
behaviour, to measure `ecx serve` against under the same `ecx bench ctrl`
load (bench/compare.sh). Run with /usr/bin/python3 (python3-zmq,
python3-msgpack).

It does what the reference's producer does per request (docs/PROTOCOL.md §4.3-4.4), in
the reference's style: one ROUTER, recv_multipart, decode the XferReq with
msgpack (tests/pyref/ref_wire.py, which reproduces msgspec's bytes), check
version, compatibility hash, session id, entry and readiness in that order,
pin the entry under the grant key "session_id:mm_hash" (a repeated key
releases the old pin first), and reply an XferAck with the same fields and
bytes as the reference: the entry's block indices, the agent metadata, and
a descriptor list of ~14 B per block of the whole region, as NIXL's
serialized descriptor list is. Leases expire after --lease-ms. There is no
data plane: nobody READs in a control-plane benchmark.

It serves the same items as `ecx serve --synthetic COUNT:BYTES` (same
mm_hashes, same block counts, blocks handed out in ascending runs) and
writes the same announcements file.

  py_producer.py --synthetic COUNT:BYTES [--listen HOST:PORT]
                 [--announce-out FILE] [--block-bytes SIZE] [--lease-ms MS]
                 [--vllm-version V] [--model M] [--dtype D] [--seconds S]
"""
import argparse
import hashlib
import json
import os
import re
import signal
import sys
import time

import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pyref"))
import ref_wire as w  # noqa: E402

# NIXL's serialized descriptor list: ~14 bytes per registered block.
DESC_BYTES_PER_BLOCK = 14
# NIXL agent metadata stand-in (agent name, backend, UCX worker address): the
# same size as ecx's own agent metadata (376 B with UCX 1.13, which also
# carries a UCX worker address), so both producers send similar metadata.
AGENT_METADATA = b"NIXL" + b"\x00" * 372

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_size(s):
    m = re.fullmatch(r"(\d*(?:\.\d*)?)(|K|M|G|T|Ki|Mi|Gi|Ti)", s)
    if not m or m.group(1) in ("", "."):
        raise argparse.ArgumentTypeError("'%s' is not a size (e.g. 4096, 64Ki, 4.7M)" % s)
    from fractions import Fraction
    v = Fraction(m.group(1)) * _UNITS[m.group(2)]
    if v.denominator != 1 or v <= 0:
        raise argparse.ArgumentTypeError("'%s' is not a whole number of bytes" % s)
    return int(v)


# Element sizes of the dtypes a version-2 shape's width is counted in.
ELEM_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "float32": 4,
              "float": 4, "fp32": 4, "float64": 8, "double": 8, "int8": 1, "uint8": 1}


def version2(vllm_version):
    """vLLM 0.32 and later speak protocol version 2 (docs/PROTOCOL.md §3.7)."""
    try:
        major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", vllm_version).groups())
    except (AttributeError, ValueError):
        return False
    return (major, minor) >= (0, 32)


def synthetic(spec):
    count, _, size = spec.partition(":")
    if not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError("--synthetic takes COUNT:BYTES, not '%s'" % spec)
    return int(count), parse_size(size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", type=synthetic, required=True, metavar="COUNT:BYTES")
    ap.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    ap.add_argument("--announce-out", metavar="FILE")
    ap.add_argument("--block-bytes", type=parse_size, default=8 << 10)  # ecx serve's default
    ap.add_argument("--lease-ms", type=int, default=30000)
    ap.add_argument("--vllm-version", default="0.34.0")  # ecx serve's default
    ap.add_argument("--model", default="llava-hf/llava-1.5-7b-hf")
    ap.add_argument("--dtype", default="torch.bfloat16")
    ap.add_argument("--seconds", type=float, default=600, help="exit after this long")
    a = ap.parse_args()

    count, size = a.synthetic
    bs = a.block_bytes
    compat = w.compat_hash(a.vllm_version, a.model, a.dtype, bs)
    own = 2 if version2(a.vllm_version) else 1  # the version it speaks, as the reference's
    # The cache: mm_hash -> block indices, ascending runs as ecx's cache hands out.
    blocks, sizes, pins, nxt = {}, {}, {}, 0
    for i in range(count):
        h = hashlib.sha256(("ecx-synthetic:%d:%d" % (i, size)).encode()).hexdigest()
        n = -(-size // bs)
        blocks[h] = list(range(nxt, nxt + n))
        sizes[h] = size
        pins[h] = 0
        nxt += n
    ready = set(blocks)
    mem_descriptor = b"\x01" * (DESC_BYTES_PER_BLOCK * nxt)  # whole region, as NIXL registers it

    host, _, port = a.listen.rpartition(":")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if int(port) == 0:
        port = sock.bind_to_random_port("tcp://" + host)
    else:
        sock.bind("tcp://%s:%s" % (host, port))
        port = int(port)
    if a.announce_out:
        ann = {h: {"peer_host": host, "peer_port": port, "size_bytes": sizes[h], "metadata": {}}
               for h in blocks}
        if version2(a.vllm_version):  # as ecx serve: shape [blocks, block width]
            elem = ELEM_BYTES.get(a.dtype.removeprefix("torch."), 2)
            for h in blocks:
                ann[h]["shape"] = [len(blocks[h]), bs // elem]
        tmp = "%s.tmp.%d" % (a.announce_out, os.getpid())
        with open(tmp, "w") as f:
            json.dump(ann, f, indent=1, sort_keys=True)
        os.rename(tmp, a.announce_out)
    print("py_producer: serving %d item(s) on port %d" % (count, port), file=sys.stderr)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    grants = {}  # "session:mm_hash" -> (mm_hash, expires_at), oldest first
    lease = a.lease_ms / 1000.0
    stats = {"requests": 0, "malformed": 0, "ok": 0, "nack": 0, "expired": 0}
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    end = time.monotonic() + a.seconds

    def nack(ident, h, status):
        stats["nack"] += 1
        sock.send_multipart([ident, b"", w.encode_ack(mm_hash=h, status=status)])

    while not stop and time.monotonic() < end:
        try:
            poller.poll(100)
        except zmq.ZMQError:
            continue  # EINTR
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            stats["requests"] += 1
            if len(frames) != 3 or frames[1] != b"":
                stats["malformed"] += 1
                continue
            ident, _, payload = frames
            try:
                req = w.decode(payload, "req", own)
            except ValueError:
                stats["malformed"] += 1
                continue
            h, sid, ver = req["mm_hash"], req["session_id"], req["connector_version"]
            if not (isinstance(h, str) and isinstance(req["compatibility_hash"], str)
                    and isinstance(sid, str) and type(ver) is int):
                stats["malformed"] += 1  # msgspec's type checks
                continue
            if ver != own:
                nack(ident, h, w.NACK_VERSION)
            elif req["compatibility_hash"] != compat:
                nack(ident, h, w.NACK_INCOMPAT)
            elif not sid:
                nack(ident, h, w.NACK_INTERNAL)
            elif h not in blocks:
                nack(ident, h, w.NACK_MISSING)
            elif h not in ready:
                nack(ident, h, w.NACK_NOT_READY)
            else:
                key = sid + ":" + h
                old = grants.pop(key, None)
                if old is not None:  # asked again: the old pin goes first
                    pins[old[0]] -= 1
                pins[h] += 1
                grants[key] = (h, time.monotonic() + lease)
                sock.send_multipart([ident, b"", w.encode_ack(
                    mm_hash=h, status=w.OK, session_id=sid, src_block_indices=blocks[h],
                    agent_metadata=AGENT_METADATA, mem_descriptor=mem_descriptor)])
                stats["ok"] += 1
        now = time.monotonic()
        while grants:
            key, (h, exp) = next(iter(grants.items()))
            if exp > now:
                break
            del grants[key]
            pins[h] -= 1
            stats["expired"] += 1
    print("py_producer: %s" % " ".join("%s=%d" % kv for kv in stats.items()), file=sys.stderr)
    sock.close()
    ctx.term()


if __name__ == "__main__":
    main()
