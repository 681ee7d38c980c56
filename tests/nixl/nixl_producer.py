# SPDX-License-Identifier: Apache-2.0
"""A real nixl agent as a producer the way vLLM's ECCPUConnector is one, for
`ecx get --data nixl` (tests/shell/test_nixl_get.sh).

Usage: nixl_producer.py DIR PORT BLOCK_BYTES NUM_BLOCKS SECONDS [VERSION]

VERSION (default 2, as vLLM 0.34 speaks): under 2 every item is whole blocks
and its announcement carries shape [blocks, BLOCK_BYTES / 2] (bf16 rows of one
block), as vLLM 0.34's producer announces; under 1 the good items end inside
their last block and announcements have no shape.

Fills NUM_BLOCKS blocks with random bytes, registers them as one DRAM
descriptor, and answers XferReqs on a ZeroMQ ROUTER at 127.0.0.1:PORT with
XferAcks as vLLM does: src_block_indices, agent_metadata =
get_agent_metadata(), mem_descriptor = msgspec of [(addr, len, 0)] per block.
Items (written to DIR/announce.json and DIR/items/<mm_hash>):
  good-<k>      k + 1 blocks starting at block 2k (version 1: the last partial)
  meta-<p>-<x>  one block, whose ack's agent_metadata has byte p xor x (every
                byte outside the UCX worker address and rkeys)
  ucx-<p>-<x>   the same for every byte inside them (opaque to NIXL's format:
                ecx's guard tries them in a child, docs/NIXL.md §6)
  desc-<p>      one block, whose ack's mem_descriptor has byte p xor 0xff
  trunc-<n>     one block, whose ack's agent_metadata is cut to n bytes
Runs SECONDS, then prints every notification received ("notif NAME TEXT").
"""
import ctypes
import json
import os
import struct
import sys
import time

import msgspec
import zmq

from nixl_common import XferAck, XferReq, nixl_api


def blob_spans(md):
    """Byte ranges of the UCX worker address and the rkeys in NIXL metadata."""
    spans, o = [], 11

    def field(tag):
        nonlocal o
        assert md[o:o + len(tag)] == tag
        o += len(tag)
        n = struct.unpack_from("<Q", md, o)[0]
        o += 8
        v = (o, o + n)
        o += n + 1
        return v

    field(b"Agent")
    conns = struct.unpack_from("<Q", md, field(b"Conns")[0])[0]
    for _ in range(conns):
        field(b"t")
        spans.append(field(b"c"))
    field(b"")
    secs = struct.unpack_from("<Q", md, field(b"nixlSecElms")[0])[0]
    for _ in range(secs):
        field(b"bknd"), field(b"nixlDList"), field(b"t")
        n = struct.unpack_from("<Q", md, field(b"n")[0])[0]
        for _ in range(n):
            a, b = field(b"")
            spans.append((a + 24, b))
    return spans


def main():
    d, port, bs, nb, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        float(sys.argv[5])
    version = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    os.makedirs(d + "/items", exist_ok=True)
    data = os.urandom(nb * bs)
    buf = ctypes.create_string_buffer(data, nb * bs)
    base = ctypes.addressof(buf)
    ag = nixl_api.nixl_agent("vllm-producer", nixl_api.nixl_agent_config(num_threads=0))
    reg = ag.get_reg_descs([(base, nb * bs, 0, "")], "DRAM")
    ag.register_memory(reg, backends=["UCX"])
    md = ag.get_agent_metadata()
    desc = msgspec.msgpack.encode([(base + i * bs, bs, 0) for i in range(nb)])
    items = {}  # mm_hash -> (indices, size, metadata, descriptor)
    for k in range(3):
        idx = list(range(2 * k, 3 * k + 1))
        items[f"good-{k}"] = (idx, (k + 1) * bs - (0 if version == 2 else 1000), md, desc)
    spans = blob_spans(md)
    for p in range(11, len(md)):
        kind = "ucx" if any(a <= p < b for a, b in spans) else "meta"
        for x in (0xFF, 0x01):
            m = bytearray(md)
            m[p] ^= x
            items[f"{kind}-{p}-{x}"] = ([0], bs, bytes(m), desc)
    for p in range(0, 64):
        m = bytearray(desc)
        m[p] ^= 0xFF
        items[f"desc-{p}"] = ([0], bs, md, bytes(m))
    for n in range(0, len(md), 7):
        items[f"trunc-{n}"] = ([0], bs, md[:n], desc)
    ann = {}
    for h, (idx, size, _, _) in items.items():
        got = b"".join(data[i * bs:(i + 1) * bs] for i in idx)[:size]
        open(f"{d}/items/{h}", "wb").write(got)
        ann[h] = {"metadata": {}, "peer_host": "127.0.0.1", "peer_port": port, "size_bytes": size}
        if version == 2:
            ann[h]["shape"] = [len(idx), bs // 2]
    zctx = zmq.Context()
    srv = zctx.socket(zmq.ROUTER)
    srv.bind(f"tcp://127.0.0.1:{port}")
    json.dump(ann, open(d + "/announce.json.tmp", "w"))
    os.rename(d + "/announce.json.tmp", d + "/announce.json")
    dec = msgspec.msgpack.Decoder(XferReq)
    notifs = []
    end = time.time() + secs
    while time.time() < end:
        if srv.poll(5):
            rid, _, payload = srv.recv_multipart()
            r = dec.decode(payload)
            idx, _, m, dsc = items[r.mm_hash]
            ack = XferAck(mm_hash=r.mm_hash, status=0, session_id=r.session_id,
                          src_block_indices=idx, agent_metadata=m, mem_descriptor=dsc)
            srv.send_multipart([rid, b"", msgspec.msgpack.encode(ack)])
        for name, msgs in ag.get_new_notifs().items():
            notifs += [(name, m.decode()) for m in msgs]
        if os.path.exists(d + "/stop"):
            break
    for name, m in notifs:
        print("notif", name, m, flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
