# SPDX-License-Identifier: Apache-2.0
"""Items between processes, byte-exact: Python to Python over every data
path, Python against the ecx CLI both ways, and the fallback reasons."""
import json
import os
import signal
import subprocess
import time

import pytest

import ecx
from conftest import V1, cli, item_bytes, item_hash, wait_fetch

BLOCK = 8192  # the default block: one row of llava-1.5's 4096 bf16
# The defaults (protocol version 2): whole blocks, from one to llava's 576 rows.
V2_SIZES = [BLOCK, 3 * BLOCK, 1 << 20, (1 << 20) + BLOCK, 403 * BLOCK, 576 * BLOCK] + \
    [BLOCK * k for k in range(1, 25)]
# Version 1 on purpose: items of any byte count, partial last blocks of 1 MiB.
V1_SIZES = [1, 1000, 1 << 20, (1 << 20) + 1, 3_300_007, 4_700_000] + [4096 * k + 7 for k in range(1, 25)]


@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize("data", ["auto", "shm", "tcp", "ucx"])
def test_two_python_processes(peer, data, version):
    seed = {"auto": 1, "shm": 2, "tcp": 3, "ucx": 4}[data] + (10 if version == "v1" else 0)
    SIZES, speak, config = (V1_SIZES, ["v1"], V1) if version == "v1" else (V2_SIZES, [], {})
    prod = peer("produce", str(seed), ",".join(map(str, SIZES)), data, *speak)
    anns = prod.info["announcements"]
    assert len(anns) == len(SIZES)
    if version == "v2":  # rows of one block
        assert [anns[item_hash(seed, i)]["shape"] for i in range(len(SIZES))] == \
            [[n // BLOCK, BLOCK // 2] for n in SIZES]
    else:  # version 1 announces no shape
        assert not [a for a in anns.values() if "shape" in a]
    with ecx.Context("consumer", data=data, region_bytes=128 << 20, **config) as c:
        left = {item_hash(seed, i): i for i in range(len(SIZES))}
        end = time.monotonic() + 60
        while left and time.monotonic() < end:
            for h, i in list(left.items()):
                r = c.fetch(h, anns[h], SIZES[i])
                if r.state == "pending":
                    continue
                assert (r.state, r.reason) == ("ready", None), (h, r)
                del left[h]
                want = item_bytes(seed, i, SIZES[i])
                with c.load(h) as views:  # zero-copy views of the segments, in order
                    assert sum(len(v) for v in views) == SIZES[i]
                    assert b"".join(views) == want
                assert c.read(h) == want
            c.poll(10)
        assert not left, f"still pending: {sorted(left)}"
    # and the other direction: a Python consumer process on this producer
    out = subprocess.run([os.sys.executable, os.path.join(os.path.dirname(__file__), "peer.py"),
                          "fetch", data, *speak],
                         input=json.dumps({"announcements": anns, "seed": seed,
                                           "sizes": SIZES}) + "\n",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"ok": len(SIZES), "bad": []}


def test_python_consumer_against_ecx_serve(tmp_path):
    d = tmp_path / "items"
    d.mkdir()
    want = {}
    for i, size in enumerate([BLOCK, 1 << 20, 305 * BLOCK]):  # whole rows of one block
        h = f"serve-item-{i}"
        want[h] = item_bytes(7, i, size)
        (d / h).write_bytes(want[h])
    ann_file = tmp_path / "ann.json"
    serve = subprocess.Popen([cli(), "serve", "--listen", "127.0.0.1:0", "--preload", str(d),
                              "--announce-out", str(ann_file)], stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if ann_file.exists() or serve.poll() is not None:
                break
            time.sleep(0.05)
        anns = json.loads(ann_file.read_text())
        assert {h: a["shape"] for h, a in anns.items()} == \
            {h: [len(b) // BLOCK, BLOCK // 2] for h, b in want.items()}
        with ecx.Context("consumer") as c:
            for h, b in want.items():
                r = wait_fetch(c, h, anns[h])
                assert r == ("ready", None)
                assert c.read(h) == b
            # one it does not hold
            other = dict(anns[h], size_bytes=BLOCK, shape=[1, BLOCK // 2])
            assert wait_fetch(c, "not-served", other) == ("local", "NACK_MISSING")
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0, serve.stderr.read()


def test_ecx_get_against_python_producer(tmp_path):
    with ecx.Context("producer", listen="127.0.0.1:0") as p:
        items = {f"get-{i}": item_bytes(8, i, size)
                 for i, size in enumerate([BLOCK, 1 << 20, 232 * BLOCK])}
        for h, b in items.items():
            p.save(h, b)
        for h, b in items.items():
            out = tmp_path / h
            r = subprocess.run([cli(), "get", "--peer", f"127.0.0.1:{p.port}", "--mm-hash", h,
                                "--size", str(len(b)), "--out", str(out)],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            assert out.read_bytes() == b
        # a hash it lacks: ecx get falls back (exit 3) with NACK_MISSING
        r = subprocess.run([cli(), "get", "--peer", f"127.0.0.1:{p.port}", "--mm-hash", "nope",
                            "--size", str(BLOCK), "--out", str(tmp_path / "nope")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "NACK_MISSING" in r.stderr


def wait_stopped(pid):
    """kill() returns before the stop takes effect: wait (bounded) until
    every thread of pid is stopped, so that a request sent next cannot be
    answered."""
    for _ in range(400):
        states = []
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s == "T" for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop: {states}")


def counter(metrics, name):
    return int(next(l.split()[1] for l in metrics.splitlines() if l.startswith(name + " ")))


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_fallback_reasons(peer, version):
    v1 = version == "v1"
    size, speak, config = (5000, ["v1"], V1) if v1 else (BLOCK, [], {})
    prod = peer("produce", "9", str(size), "auto", *speak)
    h = item_hash(9, 0)
    ann = prod.info["announcements"][h]
    with ecx.Context("consumer", ack_timeout_ms=300, item_wait_ms=1500, **config) as c:
        assert c.fetch("x", None) == ("local", "NO_PEER")
        assert c.fetch("x", {"metadata": {}}) == ("local", "NO_PEER")
        assert c.fetch("x", "{not json") == ("local", "INVALID")
        assert c.fetch("y", dict(ann, peer_port=99999)) == ("local", "INVALID")
        assert c.fetch("y", dict(ann, peer_port="5601")) == ("local", "INVALID")
        assert c.fetch(h, ann, size - 1) == ("local", "SIZE_MISMATCH")
        assert c.fetch(h, ann, 2 * size) == ("local", "SIZE_MISMATCH")
        assert wait_fetch(c, "missing", ann) == ("local", "NACK_MISSING")
        assert wait_fetch(c, h, json.dumps(ann)) == ("ready", None)  # JSON text works too
        # a producer that stops answering: no ack within ack_timeout_ms
        os.kill(prod.proc.pid, signal.SIGSTOP)
        wait_stopped(prod.proc.pid)
        try:
            retries = counter(c.metrics(), "ecx_consumer_retries_total")
            t0 = time.monotonic()
            assert wait_fetch(c, "stopped", ann) == ("local", "ACK_TIMEOUT")
            took = time.monotonic() - t0
            if v1:  # version 1 falls back at the first ack timeout
                assert took >= 0.25
                assert counter(c.metrics(), "ecx_consumer_retries_total") == retries
            else:  # version 2 asks again (as vLLM does) until item_wait_ms has passed
                assert took >= 1.45
                assert counter(c.metrics(), "ecx_consumer_retries_total") > retries
        finally:
            os.kill(prod.proc.pid, signal.SIGCONT)
    with ecx.Context("consumer", model="another/model", **config) as c:
        assert wait_fetch(c, h, ann) == ("local", "NACK_INCOMPAT")
