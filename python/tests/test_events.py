# SPDX-License-Identifier: Apache-2.0
"""ecx.events against a real producer Context with events on (docs/EVENTS.md):
the snapshot, live saves and evictions (the cache's and the engine's), the async iterator, the metrics."""
import asyncio
import socket

import pytest

import ecx

pytest.importorskip("zmq")
pytest.importorskip("msgpack")
import ecx.events  # noqa: E402  (needs pyzmq and msgpack: ecx[events])


def free_pair() -> int:
    """A port P with P + 1 free too (events and replay), on loopback."""
    for _ in range(100):
        a = socket.socket()
        a.bind(("127.0.0.1", 0))
        p = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            pass
        finally:
            a.close()
            b.close()
    raise RuntimeError("no free port pair")


def test_events_follow_the_cache():
    port = free_pair()
    block = 8192  # the default: every item is whole blocks
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=4 * block,
                     events_endpoint=f"127.0.0.1:{port}", events_topic="enc") as c:
        c.save("a", b"x" * (2 * block))  # 2 blocks
        with ecx.events.Subscriber(f"127.0.0.1:{port}", "enc") as s:
            held = ecx.events.Holdings()
            first = s.poll(5000)
            assert first[0].type == "cleared" and first[0].reason == "snapshot"
            assert first[0].items == 1 and first[0].peer_port == c.port
            for e in first:
                held.apply(e)
            assert held.items == {"a": 2 * block}
            c.save("b", b"y" * (2 * block))  # 2 more: the region is full
            c.save("c", b"z" * block)        # evicts a

            async def take(n):
                got = []
                async for e in s:
                    got.append(e)
                    if len(got) == n:
                        return got

            got = asyncio.run(asyncio.wait_for(take(3), 10))
            assert [(e.type, e.mm_hash) for e in got] == [("stored", "b"), ("removed", "a"),
                                                          ("stored", "c")]
            assert got[1].reason == "evicted" and got[0].n_blocks == 2
            for e in got:
                held.apply(e)
            assert held.items == {"b": 2 * block, "c": block}
            c.evict("b")  # the engine's own eviction: the same event
            got = asyncio.run(asyncio.wait_for(take(1), 10))
            assert [(e.type, e.mm_hash, e.reason) for e in got] == [("removed", "b", "evicted")]
            held.apply(got[0])
            assert held.items == {"c": block}
        assert "ecx_events_total" in c.metrics()


def test_events_config_errors():
    with pytest.raises(Exception):
        ecx.Context("consumer", events_endpoint="127.0.0.1:5557")
    with pytest.raises(ValueError):
        ecx.events.Subscriber("no-port")
