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
