# SPDX-License-Identifier: Apache-2.0
"""One side of a test transfer, as its own process.

  peer.py produce SEED SIZES DATA [v1]
                                    save items SEED/i of the comma-separated
                                    SIZES with data path DATA, print
                                    {"announcements": {mm_hash: ann}} and serve
                                    until stdin closes
  peer.py fetch DATA [v1]           read JSON {"announcements", "seed", "sizes"}
                                    from stdin, fetch and check every item,
                                    print {"ok": n, "bad": [...]}

The library's defaults speak protocol version 2: SIZES must be whole blocks
(8 KiB). "v1": both speak version 1 (conftest.V1), items of any byte count.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ecx  # noqa: E402
from conftest import V1, item_bytes, item_hash  # noqa: E402


def produce(seed: int, sizes: list[int], data: str, config: dict) -> None:
    with ecx.Context("producer", listen="127.0.0.1:0", data=data,
                     region_bytes=max(256 << 20, 4 * sum(sizes)), **config) as p:
        anns = {}
        for i, size in enumerate(sizes):
            h = item_hash(seed, i)
            if i % 2:
                p.save(h, item_bytes(seed, i, size))
            else:  # the other way in: straight into the region
                with p.save_into(h, size) as views:
                    b, off = item_bytes(seed, i, size), 0
                    for v in views:
                        v[:] = b[off:off + len(v)]
                        off += len(v)
            anns[h] = p.announce(h)
        print(json.dumps({"announcements": anns, "port": p.port}), flush=True)
        sys.stdin.read()  # serve (the progress thread does) until stdin closes


def fetch(data: str, config: dict) -> None:
    job = json.loads(sys.stdin.readline())
    seed, sizes, anns = job["seed"], job["sizes"], job["announcements"]
    bad = []
    with ecx.Context("consumer", data=data, region_bytes=max(64 << 20, 2 * sum(sizes)),
                     **config) as c:
        left = {item_hash(seed, i): i for i in range(len(sizes))}
        end = time.monotonic() + 60
        while left and time.monotonic() < end:
            for h, i in list(left.items()):
                r = c.fetch(h, anns[h], sizes[i])
                if r.state == "pending":
                    continue
                del left[h]
                if r.state != "ready" or c.read(h) != item_bytes(seed, i, sizes[i]):
                    bad.append([h, r.state, r.reason])
            c.poll(10)
        bad += [[h, "pending", None] for h in left]
    print(json.dumps({"ok": len(sizes) - len(bad), "bad": bad}), flush=True)


def speak(rest: list[str]) -> dict:
    """The Context keywords the optional last argument names."""
    if rest not in ([], ["v1"]):
        sys.exit(f"peer.py: unknown arguments {rest} (only 'v1')")
    return V1 if rest else {}


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")], sys.argv[4],
                speak(sys.argv[5:]))
    else:
        fetch(sys.argv[2], speak(sys.argv[3:]))
