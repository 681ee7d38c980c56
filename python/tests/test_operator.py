# SPDX-License-Identifier: Apache-2.0
"""A new operator's mistakes from Python (issue 23): each made on purpose, and
what the operator is told checked."""
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

import ecx
from conftest import wait_fetch

KW = dict(region_bytes=4 << 20)
BLOCK = 8192  # the default block (protocol version 2: every item is whole blocks)
ONE_BLOCK = dict(size_bytes=BLOCK, shape=[1, BLOCK // 2])  # as a version-2 announcement says it


def dead_port() -> int:
    """A loopback port nothing listens on (bound and closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_not_a_zeromq_peer_with_its_own_reason():
    assert "NOT_ZMQ" in ecx.REASONS
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        with ecx.Context("consumer", **KW) as c:
            t0 = time.monotonic()
            ann = dict(peer_host="127.0.0.1", peer_port=srv.getsockname()[1], **ONE_BLOCK)
            assert wait_fetch(c, "h", ann) == ("local", "NOT_ZMQ")
            assert time.monotonic() - t0 < 1.9  # the greeting's 1 s, not the 2 s ack timeout
            # (nor version 2's asking again after it for item_wait_ms)
            assert 'ecx_consumer_fetches_total{outcome="NOT_ZMQ"} 1' in c.metrics()
    finally:
        srv.close()


def test_refused_at_the_producers_cap_at_once():
    # The producer's connection cap refuses a newcomer in the handshake: its item falls
    # back HANDSHAKE at once, not after version 2's 60 s per-item wait.
    assert "HANDSHAKE" in ecx.REASONS
    with ecx.Context("producer", listen="127.0.0.1:0", max_connections=1, **KW) as p, \
         ecx.Context("consumer", **KW) as a, ecx.Context("consumer", **KW) as b:
        p.save("k", bytes(BLOCK))
        assert wait_fetch(a, "k", p.announce("k")) == ("ready", None)  # holds the one
        t0 = time.monotonic()
        assert wait_fetch(b, "k", p.announce("k")) == ("local", "HANDSHAKE")
        assert time.monotonic() - t0 < 10
        assert 'ecx_consumer_fetches_total{outcome="HANDSHAKE"} 1' in b.metrics()


def test_refused_at_once_with_its_own_reason():
    assert "REFUSED" in ecx.REASONS
    with ecx.Context("consumer", **KW) as c:
        t0 = time.monotonic()
        ann = dict(peer_host="127.0.0.1", peer_port=dead_port(), **ONE_BLOCK)
        assert wait_fetch(c, "h", ann) == ("local", "REFUSED")
        assert time.monotonic() - t0 < 1.0  # not the 2 s ack timeout
        assert 'ecx_consumer_fetches_total{outcome="REFUSED"} 1' in c.metrics()


def test_dtype_spellings_are_one_dtype():
    with ecx.Context("producer", listen="127.0.0.1:0", dtype="bf16", **KW) as p, \
         ecx.Context("consumer", dtype="torch.bfloat16", **KW) as c:
        p.save("h", b"x" * BLOCK)
        assert wait_fetch(c, "h", p.announce("h")) == ("ready", None)
        assert 'dtype="torch.bfloat16"' in p.metrics()
        # the defaults: vLLM 0.34.0, which speaks protocol version 2, 8 KiB blocks
        assert 'vllm_version="0.34.0"' in p.metrics() and 'block_bytes="8192"' in p.metrics()
        assert 'protocol_version="2"} 1' in p.metrics()
    with pytest.raises(ecx.Error, match="accepted: .*torch.bfloat16"):
        ecx.Context("consumer", dtype="bfloat17", **KW)
    with pytest.raises(ecx.Error, match="speaks protocol version 2"):
        ecx.Context("consumer", vllm_version="0.34.0", connector_version=1, **KW)


def test_a_raised_error_is_not_also_logged():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    h = Keep()
    logging.getLogger("ecx").addHandler(h)
    try:
        with pytest.raises(ecx.Error, match="bfloat17"):
            ecx.Context("consumer", dtype="bfloat17", **KW)
        # protocol version 2's whole blocks: the save's own line is the exception's
        with ecx.Context("producer", listen="127.0.0.1:0", **KW) as p:
            with pytest.raises(ecx.Error, match="100 bytes are not whole blocks of 8192"):
                p.save("a", b"x" * 100)
            with pytest.raises(ecx.Error, match="1000 bytes are not whole blocks of 8192"):
                p.save_into("b", 1000)
            p.save("c", bytes(BLOCK))
            with pytest.raises(ecx.Error, match=r"\[3, 4096\] of 2-byte elements"):
                p.save_shape("c", 3, 4096)
        ecx.Context("consumer", **KW).close()  # a later call drains the queue
    finally:
        logging.getLogger("ecx").removeHandler(h)
    assert not [m for m in seen if "bfloat17" in m or "not whole blocks" in m or "[3, 4096]" in m]


def test_unconfigured_logging_prints_tagged_lines():
    code = ("import ecx, socket, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "c = ecx.Context('consumer', region_bytes=4 << 20)\n"
            "ann = dict(peer_host='127.0.0.1', peer_port=port, size_bytes=8192, shape=[1, 4096])\n"
            "for _ in range(200):\n"
            "    if c.fetch('h', ann).state != 'pending': break\n"
            "    c.poll(10)\n"
            "c.close()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if "REFUSED" in l]
    assert lines and all(l.startswith("ecx warn: ") for l in lines), r.stderr


def test_a_forked_child_is_told_and_leaves_the_parent_alone():
    with ecx.Context("producer", listen="127.0.0.1:0", **KW) as p:
        p.save("h", b"abc" + bytes(BLOCK - 3))
        region = p.region_info().path
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: any call raises; exiting frees nothing of the parent's
            os.close(r)
            try:
                p.announce("h")
                msg = b"no error"
            except RuntimeError as e:
                msg = str(e).encode()
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                msg = repr(e).encode()
            os.write(w, msg)
            ecx._ecx._shutdown()  # what the child's atexit does
            os._exit(0)
        os.close(w)
        msg = b""
        while chunk := os.read(r, 4096):
            msg += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert b"fork()ed child" in msg and b"its own Context" in msg, msg
        assert os.path.exists(region)  # the child did not remove the parent's region
        assert p.announce("h")["size_bytes"] == BLOCK  # and the parent works on


def test_key_files_in_the_wrong_role(tmp_path):
    cli = ecx.cli_path()
    subprocess.run([cli, "keygen", str(tmp_path / "k")], check=True, capture_output=True)
    with pytest.raises(ValueError, match=r"k\.pub'? is a public key"):
        ecx.Context("producer", listen="127.0.0.1:0", curve_secret_key_file=tmp_path / "k.pub",
                    **KW)
    with pytest.raises(ValueError, match=r"k\.key'? is a secret key"):
        ecx.Context("consumer", curve_server_key_file=tmp_path / "k.key", **KW)


def test_malformed_announcements_are_invalid():
    with ecx.Context("consumer", **KW) as c:
        assert c.fetch("x", "{not json") == ("local", "INVALID")
        assert c.fetch("x", dict(peer_host="127.0.0.1", peer_port="5601", **ONE_BLOCK)) == \
            ("local", "INVALID")
        assert c.fetch("x", {"metadata": {}}) == ("local", "NO_PEER")


def test_entry_states_are_disjoint():
    def entries(text):
        return {s: int(next(l.split()[1] for l in text.splitlines()
                            if l.startswith(f'ecx_cache_entries{{state="{s}"}}')))
                for s in ("not_ready", "ready", "pinned")}

    with ecx.Context("producer", listen="127.0.0.1:0", **KW) as p:
        p.save("a", b"1" * BLOCK)
        p.save("b", b"2" * BLOCK)
        assert entries(p.metrics()) == {"not_ready": 0, "ready": 2, "pinned": 0}
        with p.load("a"):  # a load pins the entry
            assert entries(p.metrics()) == {"not_ready": 0, "ready": 1, "pinned": 1}
        assert entries(p.metrics()) == {"not_ready": 0, "ready": 2, "pinned": 0}
