# SPDX-License-Identifier: Apache-2.0
"""ecx.Region: another process's view of a context's region file.

A context's items live in one shared-memory file of whole blocks
(``Context.region_info().path``). An engine whose scheduler and workers are
different processes keeps the context in one of them and lets the others map
the same file: the context reserves or pins an item (``save_into`` /
``load``), hands the item's ``Hold.places`` (offset, length pairs) to a worker,
the worker copies straight between its tensors and the region through a
``Region``, and reports back; the context then commits or releases.

The file is checked as libecx checks a region it joins (a regular file of
ours, mode 0600, not a symlink, a whole number of blocks) and held with a
shared lock while mapped, so ``ecx.reap_regions`` never takes it from under
a live mapping.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import stat
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

__all__ = ["Region", "as_buffer", "tensor_view"]

Place = Tuple[int, int]


class Region:
    """Map a region file read-write (or read-only) in this process.

    ``Region(path, block_bytes)``; ``view(places)`` gives memoryviews of an
    item's segments; ``tensor(places, dtype, shape)`` copies an item out into
    a new CPU tensor; ``write(places, data)`` copies a buffer or tensor in.
    A context manager (``close()`` on exit).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], block_bytes: int,
                 writable: bool = True) -> None:
        if not isinstance(block_bytes, int) or isinstance(block_bytes, bool) or block_bytes < 1:
            raise ValueError("block_bytes must be a positive int")
        self.path = os.fspath(path)
        self.block_bytes = block_bytes
        self.writable = writable
        self._mm: Optional[mmap.mmap] = None
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags)
        except OSError as e:
            raise OSError(e.errno, f"ecx.Region: cannot open {self.path!r}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or \
                    (st.st_mode & 0o777) != 0o600:
                raise ValueError(f"ecx.Region: {self.path!r} is not a region file of ours "
                                 "(a regular file, owned by this user, mode 0600)")
            if st.st_size == 0 or st.st_size % block_bytes:
                raise ValueError(f"ecx.Region: {self.path!r} holds {st.st_size} bytes, not a "
                                 f"whole non-zero number of {block_bytes}-byte blocks")
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, prot)
            self.size_bytes = st.st_size
            self._fd = fd
        except BaseException:
            os.close(fd)
            raise

    @property
    def num_blocks(self) -> int:
        return self.size_bytes // self.block_bytes

    @property
    def closed(self) -> bool:
        return self._mm is None

    def _check(self, places: Iterable[Place]) -> list[Place]:
        if self._mm is None:
            raise ValueError("ecx.Region: closed")
        out = []
        for p in places:
            off, n = int(p[0]), int(p[1])
            if off < 0 or n < 0 or off + n > self.size_bytes:
                raise ValueError(f"ecx.Region: place ({off}, {n}) lies outside the region "
                                 f"({self.size_bytes} bytes)")
            out.append((off, n))
        return out

    def view(self, places: Iterable[Place]) -> list[memoryview]:
        """Memoryviews of the places, in order (writable if the region is).
        Release them before close()."""
        places = self._check(places)
        mv = memoryview(self._mm)  # type: ignore[arg-type]
        return [mv[o:o + n] for o, n in places]

    def write(self, places: Sequence[Place], data: Any) -> int:
        """Copy data (a buffer, or a tensor of any dtype) into the places, in
        order, and zero what the places hold beyond it. Returns the bytes
        copied. ValueError if data is longer than the places."""
        src = memoryview(as_buffer(data)).cast("B")
        places = self._check(places)
        if src.nbytes > sum(n for _, n in places):
            raise ValueError(f"ecx.Region: {src.nbytes} bytes do not fit the item's places")
        mm = self._mm
        assert mm is not None
        pos = 0
        for off, n in places:
            k = max(0, min(n, src.nbytes - pos))
            if k:
                mm[off:off + k] = src[pos:pos + k]
            if k < n:
                mm[off + k:off + n] = bytes(n - k)
            pos += k
        return src.nbytes

    def read_into(self, places: Sequence[Place], dst: Any) -> int:
        """Copy the places' bytes, in order, into dst (a writable buffer or a
        contiguous CPU tensor), up to dst's size. Returns the bytes copied."""
        out = memoryview(as_buffer(dst, writable=True)).cast("B")
        places = self._check(places)
        with memoryview(self._mm) as mm:  # type: ignore[arg-type]  # no temporary copy
            pos = 0
            for off, n in places:
                k = min(n, out.nbytes - pos)
                if k <= 0:
                    break
                out[pos:pos + k] = mm[off:off + k]
                pos += k
        return pos

    def tensor(self, places: Sequence[Place], dtype: Any, shape: Sequence[int]) -> Any:
        """A new CPU torch tensor of dtype and shape holding the item's first
        bytes (the places must hold at least that many)."""
        import torch

        t = torch.empty(tuple(int(d) for d in shape), dtype=dtype)
        need = t.numel() * t.element_size()
        if need > sum(n for _, n in self._check(places)):
            raise ValueError(f"ecx.Region: shape {tuple(shape)} of {dtype} needs {need} bytes, "
                             "more than the item holds")
        if need:
            self.read_into(places, t)
        return t

    def close(self) -> None:
        """Unmap (fails with BufferError while views are still exported) and
        drop the lock."""
        if self._mm is None:
            return
        self._mm.close()
        self._mm = None
        os.close(self._fd)

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<ecx.Region {self.path!r} {'closed' if self.closed else self.size_bytes}>"


def _is_tensor(obj: Any) -> bool:
    t = type(obj)
    return t.__module__.split(".")[0] == "torch" and hasattr(obj, "untyped_storage")


def as_buffer(obj: Any, writable: bool = False) -> Any:
    """A buffer over obj's bytes: obj itself if it has the buffer protocol,
    else, for a torch tensor (any dtype, bfloat16 included), a zero-copy
    byte view of it. A tensor to read from may live on any device or be
    non-contiguous (it is then copied to contiguous CPU memory first); a
    tensor to write into must be a contiguous CPU tensor."""
    if not _is_tensor(obj):
        return obj
    t = obj.detach()
    if writable:
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("ecx: a tensor to copy into must be a contiguous CPU tensor")
    else:
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
    n = t.numel() * t.element_size()
    if n == 0:
        return bytearray(0) if writable else b""
    import ctypes

    buf = (ctypes.c_char * n).from_address(t.data_ptr())
    # The ctypes array keeps the tensor (and so its memory) alive.
    buf._ecx_owner = t  # type: ignore[attr-defined]
    return buf


def tensor_view(src: Any, dtype: Any, shape: Sequence[int]) -> Any:
    """A zero-copy torch tensor of dtype and shape over an item's bytes: src
    is a Hold of one segment (``Context.load`` / ``save_into``) or one of its
    views. Valid only while the hold is: release the tensor before the hold
    ends. An item of several segments has no single view: copy it with
    ``Context.read_into(mm_hash, tensor)`` or ``Region.tensor``."""
    import warnings

    import torch

    views = getattr(src, "views", None)
    if views is not None:
        if len(views) != 1:
            raise ValueError(f"ecx: the item spans {len(views)} segments; a zero-copy tensor "
                             "needs one (copy it with read_into)")
        src = views[0]
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        count *= d
    with warnings.catch_warnings():  # a load's view is read-only, as torch says
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(src, dtype=dtype, count=count)
    return t.reshape(shape)
