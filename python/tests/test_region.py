# SPDX-License-Identifier: Apache-2.0
"""The pieces an engine with separate scheduler and worker processes needs:
a save reserved in one process, filled by another through ecx.Region, then
committed and fetched by a consumer; a load pinned in one process and read
by another; hostile region files and places refused; torch tensors."""
import multiprocessing as mp
import os

import pytest

import ecx
from conftest import wait_fetch

BLOCK = 4096  # the contexts' blocks (protocol version 2, the default: items of whole blocks)


def _fill(path, block, places, seed, q):
    """A worker process: map the region, write the item's bytes."""
    try:
        with ecx.Region(path, block) as r:
            size = sum(n for _, n in places)
            r.write(places, bytes((seed + i) % 251 for i in range(size)))
        q.put("ok")
    except Exception as e:  # reported to the test
        q.put(repr(e))


def _read(path, block, places, q):
    try:
        with ecx.Region(path, block, writable=False) as r:
            q.put(b"".join(bytes(v) for v in r.view(places)))
    except Exception as e:
        q.put(repr(e))


def _in_process(target, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    out = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    return out


def test_save_filled_by_another_process_is_fetched():
    size = 4 * BLOCK
    want = bytes((7 + i) % 251 for i in range(size))
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=64 * BLOCK,
                     block_bytes=BLOCK) as prod, ecx.Context("consumer", block_bytes=BLOCK) as cons:
        hold = prod.save_into("x", size)
        places = hold.places
        assert sum(n for _, n in places) == size
        assert all(0 <= off and off + n <= 64 * BLOCK for off, n in places)
        info = prod.region_info()
        ann = prod.announce("x")
        # Not ready until committed: a consumer is told to wait, not given bytes.
        assert cons.fetch("x", ann).state == "pending"
        assert _in_process(_fill, info.path, BLOCK, places, 7) == "ok"
        hold.commit()
        assert not hold.active
        r = wait_fetch(cons, "x", ann)
        assert (r.state, r.reason) == ("ready", None)
        assert cons.read("x") == want


def test_load_read_by_another_process_and_pin_held():
    data = os.urandom(5 * BLOCK)
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=8 * BLOCK,
                     block_bytes=BLOCK) as prod:
        prod.save("y", data)
        hold = prod.load("y")
        got = _in_process(_read, prod.region_info().path, BLOCK, hold.places)
        assert got == data
        # Pinned: filling the region with new items cannot evict it.
        with pytest.raises(ecx.Error) as e:
            prod.save("z", os.urandom(4 * BLOCK))
        assert e.value.name == "ECX_ECACHE_FULL"
        hold.release()
        with pytest.raises(ValueError):
            hold.places  # ended
        prod.save("z", os.urandom(4 * BLOCK))  # evicts y now


def test_region_refuses_bad_files_and_places(tmp_path):
    good = tmp_path / "r.mmap"
    good.write_bytes(bytes(4 * BLOCK))
    os.chmod(good, 0o600)
    with ecx.Region(good, BLOCK) as r:
        assert r.num_blocks == 4
        for bad in ([(-1, 10)], [(0, 4 * BLOCK + 1)], [(4 * BLOCK, 1)]):
            with pytest.raises(ValueError, match="outside the region"):
                r.view(bad)
        with pytest.raises(ValueError, match="do not fit"):
            r.write([(0, 10)], bytes(11))
    with pytest.raises(ValueError, match="closed"):
        r.view([(0, 1)])
    link = tmp_path / "link.mmap"
    link.symlink_to(good)
    with pytest.raises(OSError):
        ecx.Region(link, BLOCK)
    with pytest.raises(ValueError, match="whole non-zero number"):
        ecx.Region(good, 3000)
    os.chmod(good, 0o644)
    with pytest.raises(ValueError, match="not a region file of ours"):
        ecx.Region(good, BLOCK)
    with pytest.raises(OSError):
        ecx.Region(tmp_path / "missing", BLOCK)
    with pytest.raises(ValueError):
        ecx.Region(good, 0)


def test_write_zeroes_the_rest_of_the_places():
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=8 * BLOCK,
                     block_bytes=BLOCK) as prod:
        prod.save("old", b"\xff" * (2 * BLOCK))
        prod.save("evicts", b"\x01" * (7 * BLOCK))  # old's blocks are free again
        hold = prod.save_into("new", 2 * BLOCK)
        with ecx.Region(prod.region_info().path, BLOCK) as r:
            assert r.write(hold.places, b"abc") == 3
        hold.commit()
        assert prod.read("new") == b"abc" + bytes(2 * BLOCK - 3)


try:
    import torch
except ImportError:  # the package does not need it; tests/shell/test_vllm_connector.sh has it
    torch = None


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "uint8"])
def test_torch_tensors(dtype):
    dt = getattr(torch, dtype)
    src = (torch.arange(4096) % 200).to(dt).reshape(64, 64)
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=1 << 20,
                     block_bytes=BLOCK) as p:
        p.save("t", src)
        out = torch.empty_like(src)
        assert p.read_into("t", out) == src.numel() * src.element_size()
        assert torch.equal(out, src)
        with p.load("t") as _views:
            pass
        hold = p.load("t")
        if len(hold.views) == 1:
            view = ecx.tensor_view(hold, dt, [64, 64])
            assert torch.equal(view, src)
            del view
        hold.release()
        p.save("t2", src.t())  # non-contiguous: copied contiguous first
        assert torch.equal(torch.frombuffer(bytearray(p.read("t2")), dtype=dt).reshape(64, 64),
                           src.t().contiguous())
