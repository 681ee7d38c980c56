# SPDX-License-Identifier: Apache-2.0
"""A real nixl agent as the peer of tests/support/nixl_peer.c (tests/shell/test_nixl_peer.sh).

  nixl_peer.py serve DIR NB BS SECONDS
      a producer the way vLLM's NixlDataTransport is one: NB blocks of BS bytes
      (byte i = (i * 7 + 3) & 255) registered as one DRAM descriptor; writes
      DIR/nixl.md (get_agent_metadata()) and DIR/nixl.desc (vLLM's
      mem_descriptor: msgspec of [(addr, len, 0)] per block), then waits for
      one notification and prints "notif NAME TEXT".
  nixl_peer.py read DIR NB BS TEXT IDX...
      a consumer the way vLLM's is one: waits for DIR/ecx.md and DIR/ecx.desc,
      add_remote_agent, READs remote blocks IDX... into local blocks 0.. with
      the notification TEXT, polls to DONE and checks every byte.
"""
import ctypes
import os
import sys
import time

import msgspec

from nixl_common import nixl_api

DESC = msgspec.msgpack.Decoder(list[tuple[int, int, int]])


def region(name, nb, bs, fill):
    buf = ctypes.create_string_buffer(nb * bs)
    base = ctypes.addressof(buf)
    if fill:
        ctypes.memmove(base, bytes(((i * 7 + 3) & 255) for i in range(nb * bs)), nb * bs)
    ag = nixl_api.nixl_agent(name, nixl_api.nixl_agent_config(num_threads=0))
    reg = ag.get_reg_descs([(base, nb * bs, 0, "")], "DRAM")
    ag.register_memory(reg, backends=["UCX"])
    blocks = [(base + i * bs, bs, 0) for i in range(nb)]
    local = ag.prep_xfer_dlist("NIXL_INIT_AGENT", ag.get_xfer_descs(blocks, "DRAM"))
    return buf, ag, blocks, local


def wait_file(path, secs):
    end = time.time() + secs
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit(f"no {path}")
        time.sleep(0.02)


def serve(d, nb, bs, secs):
    buf, ag, blocks, _ = region("vllm-producer", nb, bs, True)
    open(d + "/nixl.desc", "wb").write(msgspec.msgpack.encode(blocks))
    open(d + "/nixl.md.tmp", "wb").write(ag.get_agent_metadata())
    os.rename(d + "/nixl.md.tmp", d + "/nixl.md")
    end = time.time() + secs
    while time.time() < end:
        for name, msgs in ag.get_new_notifs().items():
            for m in msgs:
                print("notif", name, m.decode(), flush=True)
                return
        time.sleep(0.005)
    sys.exit("no notification")


def read(d, nb, bs, text, idx):
    buf, ag, _, local = region("vllm-consumer", nb, bs, False)
    wait_file(d + "/ecx.md", 30)
    wait_file(d + "/ecx.desc", 30)
    name = ag.add_remote_agent(open(d + "/ecx.md", "rb").read())
    remote = DESC.decode(open(d + "/ecx.desc", "rb").read())
    rh = ag.prep_xfer_dlist(name, ag.get_xfer_descs(remote, "DRAM"))
    h = ag.make_prepped_xfer("READ", local, list(range(len(idx))), rh, idx, notif_msg=text.encode())
    t0 = time.time()
    ag.transfer(h)
    end = time.time() + 30
    st = "PROC"
    while st == "PROC" and time.time() < end:
        st = ag.check_xfer_state(h)
        time.sleep(0.001)
    ms = (time.time() - t0) * 1e3
    if st != "DONE":
        sys.exit(f"READ ended {st}")
    got = buf.raw
    for k, i in enumerate(idx):
        want = bytes(((j * 7 + 3) & 255) for j in range(i * bs, (i + 1) * bs))
        if got[k * bs:(k + 1) * bs] != want:
            sys.exit(f"block {i}: bytes differ")
    n = len(idx) * bs
    print(f"read ok {name.decode() if isinstance(name, bytes) else name} {len(idx)} blocks "
          f"({n} bytes in {ms:.1f} ms, {n / 1e3 / ms:.0f} MB/s)", flush=True)
    time.sleep(0.5)  # let the notification leave


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "serve":
        serve(a[2], int(a[3]), int(a[4]), float(a[5]))
    else:
        read(a[2], int(a[3]), int(a[4]), a[5], [int(x) for x in a[6:]])
    sys.stdout.flush()
    os._exit(0)
