# SPDX-License-Identifier: Apache-2.0
"""The package's surface: install, names, argument errors, views, logging."""
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import ecx
from conftest import wait_fetch

BLOCK = 8192  # the default block (protocol version 2: every item is whole blocks)


def test_installed_package():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ecx.__version__)
    assert ecx.__version__ == ecx.library_version()
    d = os.path.dirname(ecx.__file__)
    assert os.path.exists(os.path.join(d, "py.typed"))
    assert os.path.exists(os.path.join(d, "libecx.so.2"))
    r = subprocess.run([sys.executable, "-m", "ecx", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: ecx" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ecx", "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    script = shutil.which("ecx", path=os.path.dirname(sys.executable))
    assert script, "pip put no ecx script next to python"
    r = subprocess.run([script, "nonsense-command"], capture_output=True, text=True)
    assert r.returncode == 2


def test_compat_hash_matches_reference():
    for v, m, d, b in [("0.11.0", "llava-hf/llava-1.5-7b-hf", "bfloat16", 1 << 20),
                       ("x", "ünïcode\x00nul", "", -5)]:
        want = hashlib.sha256(json.dumps([v, m, d, b], separators=(",", ":")).encode()).hexdigest()
        assert ecx.compat_hash(v, m, d, b) == want


def test_errors_and_names():
    assert ecx.errname(-50) == "ECX_ECACHE_FULL" and ecx.ERRORS["ECX_ECACHE_FULL"] == -50
    assert "NACK_MISSING" in ecx.REASONS and ecx.REASONS[0] == "NONE"
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=4 << 20) as p:
        p.save("a", b"1" * BLOCK)
        with pytest.raises(ecx.Error) as e:
            p.save("a", b"2" * BLOCK)
        assert (e.value.code, e.value.name) == (-51, "ECX_ECACHE_EXISTS")
        with pytest.raises(ecx.Error) as e:
            p.save("big", bytes(5 << 20))
        assert e.value.name == "ECX_ECACHE_FULL"
        with pytest.raises(ecx.Error) as e:
            p.read("never")
        assert e.value.name == "ECX_ECACHE_MISSING"
        with pytest.raises(ecx.Error) as e:
            p.fetch("a")  # a producer is not a consumer
        assert e.value.name == "ECX_EROLE"
    with ecx.Context() as c, pytest.raises(ecx.Error) as e:
        c.port
    assert e.value.name == "ECX_EROLE"
    with pytest.raises(ecx.Error) as e:
        ecx.Context(data="carrier-pigeon")
    assert e.value.code == ecx.ERRORS["ECX_EINVAL"]
    with pytest.raises(ecx.Error, match="block_bytes"):  # the log line says which field
        ecx.Context(block_bytes=0)


def test_bad_arguments_raise_before_the_library():
    with pytest.raises(TypeError):
        ecx.Context(bogus=1)
    with pytest.raises(ValueError):
        ecx.Context("server")
    with pytest.raises(TypeError):
        ecx.Context(region_bytes="1G")
    with pytest.raises(ValueError):
        ecx.Context(region_bytes=-1)
    with pytest.raises(TypeError):
        ecx.Context(progress_thread=1)
    with pytest.raises(TypeError):
        ecx.Context(curve_allow="not-a-list")
    with pytest.raises(TypeError):
        ecx.compat_hash("v", "m", "d", "1")
    with ecx.Context("both", listen="127.0.0.1:0") as c:
        for bad in [b"bytes", 5, None]:
            with pytest.raises(TypeError):
                c.fetch(bad)
        for bad in ["", "x" * 256, "nul\x00in"]:
            with pytest.raises(ValueError):
                c.save(bad, b"data")
        with pytest.raises(TypeError):
            c.save("a", "a str is not a buffer")
        with pytest.raises(ValueError):
            c.save("a", b"")
        with pytest.raises(ValueError):
            c.save("a", np.zeros((10, 10))[:, 1])  # not contiguous
        with pytest.raises(TypeError):
            c.fetch("a", 42)
        with pytest.raises(ValueError):
            c.fetch("a", None, -1)
        with pytest.raises(TypeError):
            c.poll("1")
        with pytest.raises(ValueError):
            c.poll(-2)
        with pytest.raises(ValueError):
            c.save_into("a", 0)
        with pytest.raises(TypeError):
            c.read_into("a", b"immutable")
        with pytest.raises(TypeError):
            c.fetch("a", announcement=None, nope=1)
        c.save("a", np.arange(1024, dtype=np.int64))  # any C-contiguous buffer (one block)
        assert c.read("a") == np.arange(1024, dtype=np.int64).tobytes()
        out = bytearray(BLOCK + 20)
        assert c.read_into("a", out) == BLOCK and out[:BLOCK] == c.read("a")
        with pytest.raises(ecx.Error) as e:
            c.read_into("a", bytearray(BLOCK - 1))
        assert e.value.name == "ECX_ERANGE"


def test_save_into_aborted_by_an_exception_leaves_nothing():
    with ecx.Context("both", listen="127.0.0.1:0", region_bytes=8 << 20) as c:
        with pytest.raises(RuntimeError):
            with c.save_into("s", 8 << 20) as views:  # the whole region
                views[0][:4] = b"half"
                raise RuntimeError("the encoder failed")
        assert c.announce("s") == {"metadata": {}}
        with ecx.Context("consumer") as other:
            assert wait_fetch(other, "s", {"peer_host": "127.0.0.1", "peer_port": c.port,
                                           "size_bytes": BLOCK, "shape": [1, BLOCK // 2],
                                           "metadata": {}}) == ("local", "NACK_MISSING")
        with pytest.raises(ValueError):
            bytes(views[0])  # released with the save
        c.save("whole", bytes(8 << 20))  # all its blocks are free again
        assert c.announce("whole")["size_bytes"] == 8 << 20


def test_connector_version_2():
    """vLLM >= 0.32's protocol: the announcement carries the shape, whole rows only."""
    kw = dict(listen="127.0.0.1:0", region_bytes=4 << 20, block_bytes=8192, dtype="bfloat16",
              connector_version=2)
    with ecx.Context("producer", **kw) as p, ecx.Context("consumer", **kw) as c:
        p.save("rows", bytes(range(256)) * 320)  # 10 rows of 4096 bfloat16
        ann = p.announce("rows")
        assert ann["shape"] == [10, 4096] and ann["size_bytes"] == 81920
        assert wait_fetch(c, "rows", ann)[0] == "ready"
        with pytest.raises(ecx.Error):
            p.save("partial", bytes(1000))
    with pytest.raises(ecx.Error):
        ecx.Context("consumer", connector_version=3)


def test_evict_removes_only_a_ready_unheld_item():
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=4 * BLOCK) as p:
        p.save("a", b"1" * (2 * BLOCK))
        with p.load("a"):
            with pytest.raises(ecx.Error) as e:
                p.evict("a")
            assert e.value.name == "ECX_ECACHE_STATE"
        p.evict("a")
        for call in (p.read, p.evict):
            with pytest.raises(ecx.Error) as e:
                call("a")
            assert e.value.name == "ECX_ECACHE_MISSING"
        with p.save_into("b", BLOCK) as views:
            with pytest.raises(ecx.Error) as e:
                p.evict("b")
            assert e.value.name == "ECX_ECACHE_NOT_READY"
            views[0][:] = b"2" * BLOCK
        p.save("c", b"3" * (3 * BLOCK))  # fits only because a left
        assert "ecx_cache_evicted_by_engine_total 1" in p.metrics()
        assert "ecx_cache_evictions_total 0" in p.metrics()


def test_views_after_release_raise_and_exports_defer():
    with ecx.Context("both", listen="127.0.0.1:0", region_bytes=8 << 20) as c:
        c.save("v", (b"abcdef" * 2000)[:BLOCK])
        with c.load("v") as views:
            assert views[0].readonly and bytes(views[0][:6]) == b"abcdef"
            with pytest.raises(TypeError):
                views[0][0] = 1  # read-only
        with pytest.raises(ValueError):
            views[0][0]
        with c.load("v") as views:  # the list is the caller's: the hold keeps its own
            v0 = views.pop()
            views.append(object())
        with pytest.raises(ValueError):
            v0[0]
        ld = c.load("v")
        v = ld.views[0]
        c.release("v")  # by hash, as in C
        with pytest.raises(ValueError):
            v.tobytes()
        assert not ld.active
        with pytest.raises(ecx.Error):
            c.release("v")  # no load of it left
        # save_into committed with a buffer still exported: refused, aborted
        with pytest.raises(BufferError):
            with c.save_into("w", BLOCK) as views:
                kept = np.frombuffer(views[0], dtype=np.uint8)
        assert c.announce("w")["size_bytes"] == BLOCK  # reserved until kept goes
        del kept
        assert c.announce("w") == {"metadata": {}}
        # explicit commit, without a with block
        s = c.save_into("x", BLOCK)
        s.views[0][:] = (b"xyz" * 3000)[:BLOCK]
        s.commit()
        assert c.read("x") == (b"xyz" * 3000)[:BLOCK]
        with pytest.raises(ValueError):
            s.commit()


def test_metrics_region_info_fd():
    with ecx.Context("both", listen="127.0.0.1:0", region_bytes=4 << 20) as c:
        info = c.region_info()
        assert (info.size_bytes, info.block_bytes, info.num_blocks) == (4 << 20, BLOCK, 512)
        assert os.path.exists(info.path) and info.base > 0
        c.save("m", b"1" * BLOCK)
        with c.load("m") as views:  # every view lies inside the region
            addr = np.frombuffer(views[0], dtype=np.uint8).ctypes.data
            assert info.base <= addr < info.base + info.size_bytes
            del addr
        text = c.metrics()
        assert "# TYPE" in text and "ecx_" in text
        assert c.fileno() >= 0 and c.next_timeout() >= -1
        assert c.poll(0) >= 0


def _refused_fetch():
    """A fetch from a port nothing listens on: the library logs a warning."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with ecx.Context("consumer", region_bytes=4 << 20) as c:
        ann = dict(peer_host="127.0.0.1", peer_port=port, size_bytes=BLOCK, shape=[1, BLOCK // 2])
        assert wait_fetch(c, "h", ann) == ("local", "REFUSED")
    return port


def test_logger_routes_lines():
    lines = []
    ecx.set_logger(lambda level, line: lines.append((level, line)))
    try:
        with pytest.raises(ecx.Error, match="max_conn_pin_pct"):
            ecx.Context(max_conn_pin_pct=0)
        port = _refused_fetch()
        assert (logging.WARNING, f"consumer: 127.0.0.1:{port} refused the connection (nothing "
                                 "listening); session closed") in lines
        # the raised error is the exception's message, not also a log line
        assert not [l for l in lines if "max_conn_pin_pct" in l[1]]
    finally:
        ecx.set_logger()


def test_logging_default(caplog):
    with caplog.at_level(logging.INFO, logger="ecx"):
        with pytest.raises(ecx.Error, match="lease_ms"):
            ecx.Context(lease_ms=0)
        _refused_fetch()
    assert any(r.name == "ecx" and "refused the connection" in r.getMessage() for r in caplog.records)
    assert not any("lease_ms" in r.getMessage() for r in caplog.records)
    ecx.set_log_level("info")
    ecx.set_log_level(logging.WARNING)
    with pytest.raises(ValueError):
        ecx.set_log_level("loud")


def test_curve_key_files(tmp_path):
    r = subprocess.run([ecx.cli_path(), "keygen", str(tmp_path / "prod")], capture_output=True)
    assert r.returncode == 0
    r = subprocess.run([ecx.cli_path(), "keygen", str(tmp_path / "cons")], capture_output=True)
    assert r.returncode == 0
    allow = tmp_path / "allow"
    allow.write_text("# consumers\n" + (tmp_path / "cons.pub").read_text())
    with ecx.Context("producer", listen="127.0.0.1:0", curve_secret_key_file=tmp_path / "prod.key",
                     curve_allow_file=allow) as p, \
         ecx.Context("consumer", curve_server_key_file=tmp_path / "prod.pub",
                     curve_secret_key_file=tmp_path / "cons.key") as c, \
         ecx.Context("consumer", curve_server_key_file=tmp_path / "prod.pub") as stranger:
        p.save("k", b"secret" + bytes(BLOCK - 6))
        assert wait_fetch(c, "k", p.announce("k")) == ("ready", None)
        assert c.read("k") == b"secret" + bytes(BLOCK - 6)
        # Not in the allow-list: the producer hangs up in the handshake, and the item
        # falls back at once, not after the ack timeout or version 2's 60 s per-item wait.
        t0 = time.monotonic()
        assert wait_fetch(stranger, "k", p.announce("k")) == ("local", "HANDSHAKE")
        assert time.monotonic() - t0 < 10
        assert 'ecx_consumer_fetches_total{outcome="HANDSHAKE"} 1' in stranger.metrics()
    bad = tmp_path / "bad"
    bad.write_text("not a key\n")
    with pytest.raises(ValueError):
        ecx.Context(curve_server_key_file=bad)


def test_docs_list_every_data_path():
    # The library's list of data paths (ECX_DATA_PATHS) is the one the READMEs print.
    assert ecx.DATA_PATHS[0] == "auto" and "nixl" in ecx.DATA_PATHS
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "README.md")) as f:
        m = re.search(r"`data` \(one of\s+((?:`\"\w+\"`[,\s]*)+)", f.read())
    assert m, "python/README.md names no `data` (one of ...) list"
    assert tuple(re.findall(r'"(\w+)"', m.group(1))) == ecx.DATA_PATHS
    with open(os.path.join(here, "..", "..", "README.md")) as f:
        top = " ".join(f.read().split())
    assert "`--data` (one of " + ", ".join(ecx.DATA_PATHS) + ")" in top


def test_docs_list_every_config_field():
    # Context's keyword arguments are the binding's one table (ecx._ecx.CONFIG_FIELDS):
    # the README and Context's docstring name each of them.
    fields = ecx._ecx.CONFIG_FIELDS
    assert "listen" in fields and "events_topic" in fields
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "README.md")) as f:
        readme = f.read()
    para = readme[readme.index("`ecx.Context(role="):readme.index("| call | what it does |")]
    doc = ecx.Context.__doc__
    assert [n for n in fields if "`%s`" % n not in para] == []
    assert [n for n in fields if "``%s``" % n not in doc] == []
