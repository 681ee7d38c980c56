# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: a private region directory, peers in other processes."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import ecx

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")

# The one place the Python tests name protocol version 1. The library's
# defaults speak version 2 (vLLM 0.34.0, 8 KiB blocks: one row of llava-1.5's
# 4096 bf16), where every item is whole blocks (a save of another size is
# ECX_EINVAL, a fetch of another size SIZE_MISMATCH), an announcement carries
# a shape and a consumer asks again after an ack timeout, within item_wait_ms
# (60 s). A test that speaks version 1 on purpose (items of any byte count, its
# 2 s ack timeout with no second request, save_shape refused) gives **V1 to
# both ends' Contexts (and "v1" to peer.py): vLLM 0.31.0's factors with 1 MiB
# blocks, the defaults before version 2; dict(V1, block_bytes=...) to set its
# own blocks. (tests/support/speak_v1.h and tests/shell/lib.sh's V1 are the
# same for the C tests.)
V1 = dict(vllm_version="0.31.0", block_bytes=1 << 20, connector_version=1)


@pytest.fixture(autouse=True, scope="session")
def shm_dir():
    """Every region of the run (this process and its children) in one
    private directory, checked empty at the end."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="ecx-pytest-", dir=base)
    old = os.environ.get("ECX_SHM_DIR")
    os.environ["ECX_SHM_DIR"] = d
    yield d
    if old is None:
        del os.environ["ECX_SHM_DIR"]
    else:
        os.environ["ECX_SHM_DIR"] = old
    shutil.rmtree(d, ignore_errors=True)


def item_bytes(seed: int, i: int, size: int) -> bytes:
    """The content of item i of a peer started with seed: reproducible."""
    import numpy as np
    return np.random.default_rng([seed, i]).integers(0, 256, size, dtype=np.uint8).tobytes()


def item_hash(seed: int, i: int) -> str:
    return f"py-{seed}-{i}"


class Peer:
    """python peer.py ARGS in another process; its first stdout line is JSON."""

    def __init__(self, *args: str, env=None):
        self.proc = subprocess.Popen([sys.executable, PEER, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"peer {args} exited {self.proc.returncode} before it was ready")
        self.info = json.loads(line)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the peer's signal to stop
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def peer():
    started = []

    def start(*args, env=None):
        p = Peer(*args, env=env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def wait_fetch(ctx, h, ann=None, expected_size=0, timeout=30.0):
    """fetch() until it is not pending (polling in between)."""
    end = time.monotonic() + timeout
    while True:
        r = ctx.fetch(h, ann, expected_size)
        if r.state != "pending" or time.monotonic() > end:
            return r
        ctx.poll(20)


def cli():
    return ecx.cli_path()


def open_fds():
    return sorted(int(f) for f in os.listdir("/proc/self/fd"))
