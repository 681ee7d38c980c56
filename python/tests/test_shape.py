# SPDX-License-Identifier: Apache-2.0
"""Context.save_shape: a version-2 item announced with its true shape."""
import numpy as np
import pytest

import ecx
from conftest import V1, wait_fetch

BLOCK = 8192  # one row of a 4096-wide bfloat16 hidden state, as vLLM sizes its blocks
KW = dict(listen="127.0.0.1:0", region_bytes=8 << 20, block_bytes=BLOCK, dtype="bfloat16",
          connector_version=2)


def test_save_shape_wider_than_a_block():
    rows, width = 88, 16384  # DeepStack-like: 4 blocks a row
    data = np.random.default_rng(7).integers(0, 256, rows * width * 2, dtype=np.uint8)
    assert data.nbytes % BLOCK == 0
    with ecx.Context("producer", **KW) as p, ecx.Context("consumer", **KW) as c:
        hold = p.save_into("wide", data.nbytes)
        with hold as views:
            off = 0
            for v in views:
                v[:] = data[off:off + len(v)].tobytes()
                off += len(v)
            p.save_shape("wide", rows, width)  # between save_into and its commit
        ann = p.announce("wide")
        assert ann["shape"] == [rows, width] and ann["size_bytes"] == data.nbytes
        r = wait_fetch(c, "wide", ann)
        assert r.state == "ready", r
        assert c.read("wide") == data.tobytes()

        # After the commit, with rows that end inside a block (zero padding).
        p.save("pad", bytes(3 * 1000 * 2) + bytes(BLOCK - 6000))
        p.save_shape(mm_hash="pad", rows=3, width=1000)
        assert p.announce("pad")["shape"] == [3, 1000]

        # A shape whose whole blocks are not the item's size.
        for bad in [(rows, width + 1), (rows + 1, width), (0, width), (rows, 0), (2**63, 4)]:
            with pytest.raises(ecx.Error) as e:
                p.save_shape("wide", *bad)
            assert e.value.name == "ECX_EINVAL", bad
        assert p.announce("wide")["shape"] == [rows, width]  # unchanged
        with pytest.raises(ecx.Error) as e:
            p.save_shape("never", 1, 4096)
        assert e.value.name == "ECX_ECACHE_MISSING"
        with pytest.raises(ValueError):
            p.save_shape("wide", -1, width)
        with pytest.raises(TypeError):
            p.save_shape("wide", rows)


def test_save_shape_version_1_raises():
    kw = dict(KW, **V1)  # version 1 on purpose: it announces no shape
    with ecx.Context("producer", **kw) as p:
        p.save("a", bytes(BLOCK))
        with pytest.raises(ecx.Error) as e:
            p.save_shape("a", 1, 4096)
        assert e.value.name == "ECX_EINVAL"
        assert "shape" not in p.announce("a")
