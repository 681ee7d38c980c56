# SPDX-License-Identifier: Apache-2.0
"""ecx.events — subscribe to a producer's encoder-cache events (docs/EVENTS.md).

Pure Python on pyzmq and msgpack (``pip install ecx[events]``); it does not
load the library, so a router needs neither libecx nor a region.

    for ev in ecx.events.Subscriber("10.0.0.5:7100"):
        print(ev.type, ev.mm_hash)

A Subscriber yields Event objects in sequence order. It asks for a snapshot
of the producer's contents first (a "cleared" event with reason
"snapshot", then one "stored" event per item held), and on a gap in the
sequence numbers asks the replay socket (PORT + 1) for the missed batches,
or for a new snapshot when they are older than the producer's ring or the
producer restarted. Applying the events in order therefore always gives
exactly what the producer holds. ``async for`` works too (it runs the
blocking receive in a thread).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Optional

import msgpack
import zmq

FORMAT_VERSION = 1
SEQ_END = (1 << 64) - 1
SEQ_RESYNC = (1 << 64) - 2
SEQ_ERROR = (1 << 64) - 3
SNAPSHOT = (1 << 64) - 1

_TYPES = {"EncoderCacheStored": "stored", "EncoderCacheRemoved": "removed",
          "EncoderCacheCleared": "cleared"}


@dataclass
class Event:
    """One event. type is "stored", "removed" or "cleared"; seq the batch's
    number; ts the time the event happened (seconds since the epoch)."""
    type: str
    seq: int
    ts: float
    mm_hash: Optional[str] = None
    size_bytes: int = 0
    n_blocks: int = 0
    reason: Optional[str] = None        # removed: "evicted"; cleared: start/stop/snapshot
    version: int = 0                    # cleared: the format version
    peer_host: Optional[str] = None     # cleared: the producer's control-plane address
    peer_port: int = 0
    block_bytes: int = 0
    items: int = 0                      # cleared "snapshot": stored events that follow


class ProtocolError(ValueError):
    """A message that does not follow docs/EVENTS.md."""


def decode_batch(seq: int, payload: bytes) -> list[Event]:
    """The events of one batch payload ([ts, [event, ...]])."""
    try:
        b = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types
        raise ProtocolError(f"batch {seq}: not msgpack: {e}") from None
    if not isinstance(b, list) or len(b) < 2 or not isinstance(b[1], list):
        raise ProtocolError(f"batch {seq}: not [ts, events]")
    bts = float(b[0])
    out = []
    for e in b[1]:
        if not isinstance(e, list) or not e or e[0] not in _TYPES:
            raise ProtocolError(f"batch {seq}: unknown event {e!r:.80}")
        t = _TYPES[e[0]]
        try:
            if t == "stored":
                out.append(Event(t, seq, float(e[4]), mm_hash=e[1], size_bytes=int(e[2]),
                                 n_blocks=int(e[3])))
            elif t == "removed":
                out.append(Event(t, seq, float(e[3]), mm_hash=e[1], reason=e[2]))
            else:
                out.append(Event(t, seq, bts, reason=e[1], version=int(e[2]), peer_host=e[3],
                                 peer_port=int(e[4]), block_bytes=int(e[5]), items=int(e[6])))
        except (IndexError, TypeError, ValueError):
            raise ProtocolError(f"batch {seq}: malformed {e[0]}") from None
    return out


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65534:
        raise ValueError(f"{addr!r} is not HOST:PORT (PORT 1..65534)")
    return host.strip("[]"), int(port)


class Subscriber:
    """Events of one producer, in order, gaps filled (see the module's doc).

    addr: the producer's events endpoint "HOST:PORT"; topic: the topic it
    publishes under; curve_server_key: the producer's CURVE public key (Z85)
    when CURVE is on; curve_secret_key: this subscriber's own secret key (Z85),
    for a producer with an allow-list (None: a fresh keypair); timeout_s: how long one replay or snapshot answer may
    take before it is asked again; snapshot: start with the current contents
    (False: only what happens from now on).
    """

    def __init__(self, addr: str, topic: str = "", *, curve_server_key: Optional[str] = None,
                 curve_secret_key: Optional[str] = None, timeout_s: float = 2.0, snapshot: bool = True,
                 context: Optional[zmq.Context] = None) -> None:
        host, port = _split(addr)
        fmt = "tcp://[%s]:%d" if ":" in host else "tcp://%s:%d"
        self._ctx = context or zmq.Context.instance()
        self._topic = topic.encode()
        self._timeout = timeout_s
        self._replay_ep = fmt % (host, port + 1)
        self._curve = curve_server_key
        self._secret = curve_secret_key
        self.sub = self._socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self.sub.connect(fmt % (host, port))
        self._replay: Optional[zmq.Socket] = None
        self.last_seq: Optional[int] = None
        self._queue: list[Event] = []
        self._need_snapshot = snapshot
        self._stopped = False  # the last batch said "stop"
        self.resyncs = 0   # snapshots taken after the first
        self.replays = 0   # gaps filled from the ring

    def _socket(self, kind: int) -> zmq.Socket:
        s = self._ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IPV6, 1)
        s.setsockopt(zmq.MAXMSGSIZE, 64 << 20)  # a batch is ~16 KiB: a larger frame is hostile
        if self._curve:
            if self._secret:
                sec = self._secret.encode()
                pub = zmq.curve_public(sec)
            else:
                pub, sec = zmq.curve_keypair()
            s.curve_serverkey = self._curve.encode()
            s.curve_publickey, s.curve_secretkey = pub, sec
        return s

    def close(self) -> None:
        self.sub.close(0)
        if self._replay is not None:
            self._replay.close(0)

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- replay ----

    def _ask(self, since: int) -> Optional[list[tuple[int, bytes]]]:
        """[(seq, payload)] up to the end marker, or None for "resync"."""
        for _ in range(5):
            if self._replay is None:
                self._replay = self._socket(zmq.DEALER)
                self._replay.connect(self._replay_ep)
            self._replay.send_multipart([b"", since.to_bytes(8, "big")])
            got: list[tuple[int, bytes]] = []
            resync = False
            deadline = time.monotonic() + self._timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._replay.poll(int(left * 1000) + 1):
                    break  # cut or lost: ask again on a fresh socket
                f = self._replay.recv_multipart()
                if len(f) != 3 or len(f[1]) != 8:
                    raise ProtocolError("replay reply is not [\"\", seq, payload]")
                s = int.from_bytes(f[1], "big")
                if s == SEQ_END:
                    return None if resync else got
                if s == SEQ_RESYNC:
                    resync = True  # the end marker follows
                    continue
                if s == SEQ_ERROR:
                    raise ProtocolError("replay refused: " + f[2].decode(errors="replace"))
                got.append((s, f[2]))
            self._replay.close(0)
            self._replay = None
            if got and since != SNAPSHOT:
                since = got[-1][0] + 1  # keep what came
                self._apply_raw(got)
        raise TimeoutError(f"no answer from {self._replay_ep}")

    def _apply_raw(self, msgs: list[tuple[int, bytes]]) -> None:
        for s, p in msgs:
            if self.last_seq is None or s == self.last_seq + 1:
                self._queue.extend(decode_batch(s, p))
                self.last_seq = s

    def _snapshot(self) -> None:
        for _ in range(5):
            msgs = self._ask(SNAPSHOT)
            evs = [e for s, p in (msgs or []) for e in decode_batch(s, p)]
            if msgs and evs and evs[0].type == "cleared" and evs[0].reason == "snapshot" \
                    and len(evs) == evs[0].items + 1:
                self._queue.extend(evs)
                self.last_seq = msgs[0][0]
                return
        raise ProtocolError(f"no complete snapshot from {self._replay_ep}")

    def _resync(self) -> None:
        self.resyncs += 1
        self._snapshot()

    def _on_batch(self, seq: int, payload: bytes, depth: int = 0) -> None:
        if self.last_seq is None:
            self.last_seq = seq - 1
        if self._stopped:
            # The producer said "stop": whatever comes now is a new life, whose
            # numbers may even be lower (its clock went back): start over.
            self._stopped = False
            self._resync()
        if seq <= self.last_seq:
            return  # had it (from a replay, a snapshot, or a repeat of the newest)
        if seq > self.last_seq + 1:
            if depth > 3:
                raise ProtocolError(f"cannot fill the gap before batch {seq}")
            msgs = self._ask(self.last_seq + 1)
            if msgs is None:
                self._resync()
            else:
                self.replays += 1
                self._apply_raw([m for m in msgs if m[0] < seq])
                if self.last_seq + 1 < seq:  # the ring moved on meanwhile
                    self._resync()
            self._on_batch(seq, payload, depth + 1)
            return
        evs = decode_batch(seq, payload)
        self._stopped = any(e.type == "cleared" and e.reason == "stop" for e in evs)
        self._queue.extend(evs)
        self.last_seq = seq

    # ---- iteration ----

    def poll(self, timeout_ms: int = -1) -> list[Event]:
        """Events available now, or within timeout_ms if none is (-1: wait
        for some), in order."""
        if self._need_snapshot:
            self._need_snapshot = False
            self._snapshot()
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        for _ in range(1000):  # at most this many batches per call
            if self._queue:
                wait = 0  # take what is there, wait no more
            elif deadline is None:
                wait = -1
            else:
                wait = max(0, int((deadline - time.monotonic()) * 1000))
            if not self.sub.poll(wait):
                break
            f = self.sub.recv_multipart()
            if len(f) != 3 or len(f[1]) != 8:
                raise ProtocolError("event message is not [topic, seq, payload]")
            self._on_batch(int.from_bytes(f[1], "big"), f[2])
        out, self._queue = self._queue, []
        return out

    def __iter__(self) -> Iterator[Event]:
        while True:
            yield from self.poll(-1)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            for e in await asyncio.to_thread(self.poll, 200):
                yield e


@dataclass
class Holdings:
    """What one producer holds, from its events: apply() each in order."""
    items: dict[str, int] = field(default_factory=dict)  # mm_hash -> size_bytes
    peer: Optional[tuple[str, int]] = None
    up: bool = False

    def apply(self, e: Event) -> None:
        if e.type == "stored":
            self.items[str(e.mm_hash)] = e.size_bytes
        elif e.type == "removed":
            self.items.pop(str(e.mm_hash), None)
        else:
            self.items.clear()
            self.peer = (str(e.peer_host), e.peer_port)
            self.up = e.reason != "stop"
