# SPDX-License-Identifier: Apache-2.0
"""Blobs written by the real nixl package, for tests/unit/test_nixl_format.c.

Usage: nixl_blobs.py OUT.json   (run with a python that has nixl_cu12 and msgspec)

Writes {"meta": [...], "desc": [...]}: agent metadata from real nixl agents
(get_agent_metadata(), vLLM's way: the region registered as one DRAM
descriptor; also two descriptors, and a tcp-only UCX), each with the fields
the agent was given (name, ranges), and vLLM's mem_descriptor as msgspec
encodes it (vLLM's utils.serialize_mem_descriptor is msgspec.msgpack.Encoder
over list[tuple[int, int, int]]) for counts and values across msgpack's
integer and array forms.
"""
import ctypes
import json
import os
import sys

import msgspec

from nixl_common import nixl_api


def agent_blob(name, sizes):
    bufs = [ctypes.create_string_buffer(s) for s in sizes]
    ag = nixl_api.nixl_agent(name, nixl_api.nixl_agent_config(num_threads=0))
    ranges = [(ctypes.addressof(b), len(b), 0) for b in bufs]
    reg = ag.get_reg_descs([(a, n, d, "") for a, n, d in ranges], "DRAM")
    ag.register_memory(reg, backends=["UCX"])
    md = ag.get_agent_metadata()
    ag.deregister_memory(reg)
    # NIXL's metadata lists an agent's ranges by address, not in registration order.
    return {"name": name, "ranges": [list(r) for r in sorted(ranges)], "hex": md.hex()}


def main():
    out = {"meta": [], "desc": []}
    out["meta"].append(agent_blob("ecx-test-producer", [1 << 20]))
    out["meta"].append(agent_blob("p" * 200, [4096, 3 * 65536]))
    out["meta"].append(agent_blob("x", [12345]))
    enc = msgspec.msgpack.Encoder()
    cases = [
        (0x7F12_3456_7000, 1 << 20, 1),
        (0x55AA_0000_1000, 4096, 15),
        (0x55AA_0000_1000, 4096, 16),
        (0x1000, 127, 3),
        (0x80, 128, 2),
        (0xFFFF, 0x10000, 2),
        (0xFFFF_FFFF, 0x1_0000_0000, 2),
        (0x7F00_0000_0000, 65536, 65535),
        (0x7F00_0000_0000, 64, 65536),
    ]
    for base, bs, n in cases:
        blocks = [(base + i * bs, bs, 0) for i in range(n)]
        out["desc"].append({"base": base, "block": bs, "n": n, "dev": 0,
                            "hex": enc.encode(blocks).hex()})
    blocks = [(7, 9, 3), (2**64 - 2, 1, 2**63)]
    # as strings: JSON readers stop at int64
    out["desc"].append({"list": [[str(v) for v in b] for b in blocks],
                        "hex": enc.encode(blocks).hex()})
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    # The UCX worker sometimes lingers at exit; nothing else is left to do.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
