# SPDX-License-Identifier: Apache-2.0
"""Contexts dropped with work in flight leak nothing: no region file (so no
blocks), no file descriptors; exported buffers keep memory valid."""
import gc
import os

import numpy as np
import pytest

import ecx
from conftest import item_bytes, open_fds


def regions(shm_dir):
    return sorted(f for f in os.listdir(shm_dir) if f.endswith(".mmap"))


def test_gc_with_transfers_in_flight(shm_dir, peer):
    prod = peer("produce", "21", ",".join([str(366 * 8192)] * 8), "auto")  # whole blocks
    anns = prod.info["announcements"]
    # warm up: libraries' one-time descriptors (UCX, ZeroMQ) are not leaks
    with ecx.Context("consumer") as c:
        for h, a in anns.items():
            c.fetch(h, a)
    gc.collect()
    fds0, files0 = open_fds(), regions(shm_dir)
    for _ in range(3):
        c = ecx.Context("consumer")
        for h, a in anns.items():
            c.fetch(h, a)  # requests out, READs starting
        p = ecx.Context("both", listen="127.0.0.1:0")
        p.save("mine", b"x" * 8192)
        held = p.load("mine")  # a load, never released
        saving = p.save_into("half", 2 * 8192)  # a save, never committed
        cycle = [c, p, held, saving]
        cycle.append(cycle)  # and a reference cycle, for the collector
        assert len(regions(shm_dir)) == len(files0) + 2
        del c, p, held, saving, cycle
        gc.collect()
        assert regions(shm_dir) == files0
        assert open_fds() == fds0


def test_exported_buffer_outlives_close(shm_dir):
    files0 = regions(shm_dir)
    c = ecx.Context("both", listen="127.0.0.1:0")
    data = item_bytes(22, 0, 244 * 8192)  # whole blocks
    c.save("a", data)
    with c.load("a") as views:
        arr = np.frombuffer(views[0], dtype=np.uint8)
        part = views[0][10:20]  # a slice: a second view on the same export
    c.close()  # deferred: arr and part still point into the region
    assert len(regions(shm_dir)) == len(files0) + 1
    assert arr.tobytes() == data[: len(arr)]
    assert bytes(part) == data[10:20]
    with pytest.raises(ValueError):
        c.read("a")
    del arr
    gc.collect()
    assert len(regions(shm_dir)) == len(files0) + 1  # the slice still holds it
    part.release()
    assert regions(shm_dir) == files0
