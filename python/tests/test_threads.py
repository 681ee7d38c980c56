# SPDX-License-Identifier: Apache-2.0
"""Threads: some poll (without the GIL) while another fetches, as the
library's threading rule allows; with and without the progress thread."""
import threading
import time

import pytest

import ecx
from conftest import item_bytes


@pytest.mark.parametrize("progress_thread", [True, False])
def test_poll_threads_while_fetching(progress_thread):
    sizes = [12 * 8192 * (k + 1) for k in range(24)]  # whole blocks
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=256 << 20) as p, \
         ecx.Context("consumer", region_bytes=256 << 20, progress_thread=progress_thread) as c:
        for i, s in enumerate(sizes):
            p.save(f"t{i}", item_bytes(11, i, s))
        anns = {f"t{i}": p.announce(f"t{i}") for i in range(len(sizes))}
        stop = threading.Event()
        polls = [0, 0]
        errors = []

        def poller(k):
            try:
                while not stop.is_set():
                    c.poll(20)
                    polls[k] += 1
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=poller, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            left = set(anns)
            end = time.monotonic() + 60
            while left and time.monotonic() < end:  # this thread never polls
                for h in list(left):
                    r = c.fetch(h, anns[h])
                    if r.state != "pending":
                        assert r == ("ready", None), (h, r)
                        i = int(h[1:])
                        assert c.read(h) == item_bytes(11, i, sizes[i])
                        left.discard(h)
                time.sleep(0.002)
            assert not left
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        assert not errors
        assert all(polls)


def test_close_while_another_thread_polls():
    c = ecx.Context("consumer")
    t = threading.Thread(target=lambda: c.poll(-1))
    t.start()
    time.sleep(0.1)
    c.close()  # waits for the poller's slice; it then returns
    t.join(5)
    assert not t.is_alive()
    with pytest.raises(ValueError):
        c.poll(0)
