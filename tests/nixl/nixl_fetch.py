# SPDX-License-Identifier: Apache-2.0
"""A real nixl agent fetching from `ecx serve --data nixl`, the way vLLM's
ECCPUConnector consumer does (tests/shell/test_nixl_serve.sh).

Usage: nixl_fetch.py ANNOUNCE_JSON ITEMS_DIR BLOCK_BYTES [VLLM_VERSION]

VLLM_VERSION (default 0.34.0, ecx's default) is the compat hash's first factor.

For each announced item: an XferReq over ZeroMQ (msgspec, as vLLM encodes
it), the XferAck; add_remote_agent(agent_metadata) (again whenever the bytes
change); remote descriptors from mem_descriptor (vLLM's msgpack list) and
src_block_indices; one READ into local blocks with the notification
"{session_id}:{mm_hash}"; polled to DONE; every byte compared with the file
ITEMS_DIR/<mm_hash>. Prints one line per item and exits non-zero on any
difference.
"""
import ctypes
import hashlib
import json
import sys
import time
import uuid

import msgspec
import zmq

from nixl_common import XferAck, XferReq, nixl_api


DESC = msgspec.msgpack.Decoder(list[tuple[int, int, int]])
ACK = msgspec.msgpack.Decoder(XferAck)


def compat_hash(version, bs):
    # ecx's defaults (include/ecx.h) and the reference's hash (tests/pyref/ref_wire.py)
    factors = json.dumps([version, "llava-hf/llava-1.5-7b-hf", "torch.bfloat16", bs],
                         separators=(",", ":"))
    return hashlib.sha256(factors.encode()).hexdigest()


def main():
    ann = json.load(open(sys.argv[1]))
    items, bs = sys.argv[2], int(sys.argv[3])
    version = sys.argv[4] if len(sys.argv) > 4 else "0.34.0"
    nb = max([16] + [-(-a["size_bytes"] // bs) for a in ann.values()])  # room for the largest
    buf = ctypes.create_string_buffer(nb * bs)
    base = ctypes.addressof(buf)
    ag = nixl_api.nixl_agent("vllm-consumer", nixl_api.nixl_agent_config(num_threads=0))
    reg = ag.get_reg_descs([(base, nb * bs, 0, "")], "DRAM")
    ag.register_memory(reg, backends=["UCX"])
    local = ag.prep_xfer_dlist("NIXL_INIT_AGENT",
                               ag.get_xfer_descs([(base + i * bs, bs, 0) for i in range(nb)], "DRAM"))
    zctx = zmq.Context()
    sid = str(uuid.uuid4())
    peer_md, peer_name, remote = None, None, None
    for mm_hash, a in sorted(ann.items()):
        s = zctx.socket(zmq.DEALER)
        s.connect(f"tcp://{a['peer_host']}:{a['peer_port']}")
        s.send_multipart([b"", msgspec.msgpack.encode(
            XferReq(mm_hash=mm_hash, compatibility_hash=compat_hash(version, bs), session_id=sid))])
        if not s.poll(10000):
            sys.exit(f"{mm_hash}: no ack")
        ack = ACK.decode(s.recv_multipart()[-1])
        s.close(0)
        if ack.status != 0:
            sys.exit(f"{mm_hash}: status {ack.status}")
        if ack.agent_metadata != peer_md:
            if peer_name:
                ag.remove_remote_agent(peer_name)
            peer_name = ag.add_remote_agent(ack.agent_metadata)
            peer_md = ack.agent_metadata
            remote = ag.prep_xfer_dlist(peer_name, ag.get_xfer_descs(DESC.decode(ack.mem_descriptor),
                                                                     "DRAM"))
        idx = ack.src_block_indices
        h = ag.make_prepped_xfer("READ", local, list(range(len(idx))), remote, idx,
                                 notif_msg=f"{sid}:{mm_hash}".encode())
        t0 = time.time()
        ag.transfer(h)
        st, end = "PROC", time.time() + 30
        while st == "PROC" and time.time() < end:
            st = ag.check_xfer_state(h)
        ms = (time.time() - t0) * 1e3
        if st != "DONE":
            sys.exit(f"{mm_hash}: READ ended {st}")
        want = open(f"{items}/{mm_hash}", "rb").read()
        if buf.raw[:len(want)] != want:
            sys.exit(f"{mm_hash}: bytes differ")
        ag.release_xfer_handle(h)
        print(f"{mm_hash}: {len(want)} bytes in {len(idx)} blocks {idx}, READ {ms:.1f} ms, "
              f"every byte equal", flush=True)
    time.sleep(0.5)  # let the last notification leave


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    import os
    os._exit(0)
