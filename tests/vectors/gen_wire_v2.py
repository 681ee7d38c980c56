#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gen_wire_v2.py VLLM_SRC > wire_v2.json — protocol-version vectors made with the real msgspec
and vLLM 0.34.0's own protocol.py (VLLM_SRC: the venv's vllm-src from tests/nixl/venv.sh).

Version 1's module is the same file with EC_CONNECTOR_VERSION = 1 (the reference's v1
protocol.py, shared/seed/, differs from 0.34.0's only in that constant and a comment).

  encode:  XferReq / XferAck as a version-2 peer encodes them ("version": 2), hex;
  cross:   one request encoded by a peer of version E, decoded by a peer of version D:
           the bytes, and the connector_version D concludes (an absent field takes the
           decoder's own default), and whether D's producer answers NACK_VERSION.
"""
import json
import os
import sys

import msgspec

src = os.path.join(sys.argv[1], "vllm/distributed/ec_transfer/ec_connector/cpu/protocol.py")
text = open(src).read()
assert "EC_CONNECTOR_VERSION: int = 2" in text, "not vLLM 0.34's protocol.py"


def module(version):
    ns = {"__name__": "protocol_v%d" % version}
    exec(compile(text.replace("EC_CONNECTOR_VERSION: int = 2",
                              "EC_CONNECTOR_VERSION: int = %d" % version), src, "exec"), ns)
    return ns


P = {1: module(1), 2: module(2)}
enc = msgspec.msgpack.Encoder()
H = "e3b0c44298fc1c149afbf4c8996fb924e3b0c44298fc1c149afbf4c8996fb924"
C = "a" * 64
SID = "5d1c1c7e-2b7a-4a57-9a0e-6a8f7f0e9c11"


def req_fields(r):
    f = {"type": "req", "mm_hash": r.mm_hash, "compatibility_hash": r.compatibility_hash}
    if r.session_id:
        f["session_id"] = r.session_id
    f["connector_version"] = r.connector_version
    return f


out = {"generator": "tests/vectors/gen_wire_v2.py with vLLM 0.34.0 protocol.py, msgspec " +
       msgspec.__version__, "encode": [], "cross": []}
v2 = P[2]
reqs = [
    ("req v2 minimal (version 2 omitted)", v2["XferReq"](mm_hash="h1", compatibility_hash=C)),
    ("req v2 with session", v2["XferReq"](mm_hash=H, compatibility_hash=C, session_id=SID)),
    ("req v2 explicit version 1 (kept)", v2["XferReq"](mm_hash=H, compatibility_hash=C,
                                                        session_id=SID, connector_version=1)),
    ("req v2 explicit version 3 (kept)", v2["XferReq"](mm_hash="h1", compatibility_hash=C,
                                                        session_id=SID, connector_version=3)),
]
for name, r in reqs:
    out["encode"].append({"name": name, "version": 2, "fields": req_fields(r),
                          "hex": enc.encode(r).hex()})
S = v2["XferStatus"]
acks = [
    ("ack v2 NACK_VERSION", v2["XferAck"](mm_hash=H, status=S.NACK_VERSION)),
    ("ack v2 OK", v2["XferAck"](mm_hash=H, status=S.OK, session_id=SID,
                                 src_block_indices=[0, 1, 2, 300, 70000],
                                 agent_metadata=b"\x00meta", mem_descriptor=b"\x93\x01\x02\x03")),
]
for name, a in acks:
    f = {"type": "ack", "mm_hash": a.mm_hash, "status": int(a.status)}
    if a.session_id:
        f.update(session_id=a.session_id, src_block_indices=a.src_block_indices,
                 agent_metadata=a.agent_metadata.hex(), mem_descriptor=a.mem_descriptor.hex())
    out["encode"].append({"name": name, "version": 2, "fields": f, "hex": enc.encode(a).hex()})

# Every (encoder, explicit version or its default) x decoder.
for ev in (1, 2):
    for explicit in (None, 1, 2, 3):
        kw = {} if explicit is None else {"connector_version": explicit}
        r = P[ev]["XferReq"](mm_hash=H, compatibility_hash=C, session_id=SID, **kw)
        frame = enc.encode(r)
        for dv in (1, 2):
            got = msgspec.msgpack.Decoder(P[dv]["XferReq"]).decode(frame)
            out["cross"].append({
                "name": "v%d encoder, %s, decoded by v%d" % (
                    ev, "its default" if explicit is None else "version %d" % explicit, dv),
                "encoder": ev, "sent_version": r.connector_version, "decoder": dv,
                "hex": frame.hex(), "on_wire": b"connector_version" in frame,
                "decoded_version": got.connector_version,
                "nack_version": got.connector_version != P[dv]["EC_CONNECTOR_VERSION"]})
json.dump(out, sys.stdout, indent=1)
print()
