# SPDX-License-Identifier: Apache-2.0
"""ecx: peer-to-peer encoder-cache transfer for disaggregated multimodal LLM serving.

The Python face of libecx (which ships inside this package). A producer keeps
encoder outputs in a shared-memory region and announces them; a consumer
fetches them by mm_hash, or is told to encode locally. See python/README.md.

    import ecx
    with ecx.Context("producer", listen="127.0.0.1:0") as p:
        p.save("h1", b"...")
        ann = p.announce("h1")          # hand this to the consumer
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Callable, Literal, Union

from . import _ecx
from .region import Region, as_buffer, tensor_view
from ._ecx import (
    ERRORS,
    REASONS,
    Error,
    FetchResult,
    Hold,
    RegionInfo,
    compat_hash,
    errname,
    library_version,
    reap_regions,
    strerror,
)

__all__ = [
    "Context", "Region", "tensor_view", "Error", "FetchResult", "Hold", "RegionInfo",
    "ERRORS", "REASONS", "DATA_PATHS",
    "compat_hash", "errname", "strerror", "library_version", "reap_regions",
    "set_logger", "set_log_level", "cli_path", "__version__",
]

#: The version of the package and of the libecx inside it.
__version__: str = _ecx.VERSION

#: Every value of ``Context(data=...)``, in the library's order (its
#: ``ECX_DATA_PATHS``).
DATA_PATHS: "tuple[str, ...]" = tuple(_ecx.DATA_PATHS.split(", "))

_Z85 = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def _read_keys(path: Union[str, "os.PathLike[str]"], what: str, secret: bool = False) -> list[str]:
    """Keys of a key file as `ecx keygen` writes them: one Z85 key (40
    characters) a line; blank lines and lines starting with '#' skipped. A
    file whose keygen header names the other role (a .pub where a secret key
    is expected, a .key where public keys are) is refused."""
    with open(path, encoding="ascii", errors="strict") as f:
        text = f.read(1 << 20)
    keys = []
    wrong = "# ecx CURVE public key" if secret else "# ecx CURVE secret key"
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.startswith(wrong):
            raise ValueError(f"{what}: {os.fspath(path)!r} is a {'public' if secret else 'secret'} "
                             f"key (ecx keygen's {'.pub' if secret else '.key'}); {what} wants "
                             f"{'a secret key (.key)' if secret else 'public keys (.pub)'}")
        k = line.strip(" \t\r\n")
        if not k or k.startswith("#"):
            continue
        if len(k) != 40 or not set(k) <= _Z85:
            # Say where, never what: the line may be a secret.
            raise ValueError(f"{what}: {os.fspath(path)!r} line {lineno} is not a Z85 CURVE key")
        keys.append(k)
    return keys


def _read_key(path: Union[str, "os.PathLike[str]"], what: str, secret: bool) -> str:
    keys = _read_keys(path, what, secret)
    if len(keys) != 1:
        raise ValueError(f"{what}: {os.fspath(path)!r} must hold exactly one key")
    return keys[0]


class Context(_ecx.Context):
    """An ecx context: a region, a cache, and a producer, a consumer or both.

    ``Context(role="consumer", **config)``: the keyword arguments are the
    fields of ``ecx_config`` (``listen``, ``advertise_host``, ``region_bytes``,
    ``block_bytes``, ``vllm_version``, ``model``, ``dtype``, ``data``,
    ``progress_thread``, ``instance``, ``rank``, ``ack_timeout_ms``,
    ``read_timeout_ms``, ``quarantine_ms``, ``item_wait_ms``,
    ``tombstone_ttl_ms``, ``session_idle_ms``, ``max_sessions``, ``lease_ms``,
    ``max_grants``, ``max_conn_grants``, ``max_conn_pin_pct``, ``max_pin_pct``,
    ``max_connections``, ``curve_secret_key``, ``curve_server_key``,
    ``curve_allow``, ``connector_version``, ``events_endpoint``, ``events_topic``: encoder-cache
    events, docs/EVENTS.md; subscribe with ``ecx.events``); omitted ones keep the library's defaults. CURVE keys
    may also come from files as ``ecx keygen`` writes them:
    ``curve_secret_key_file``, ``curve_server_key_file``, ``curve_allow_file``.

    A context manager (close() on exit). Its methods may be called from any
    thread; poll() waits without the GIL.
    """

    def __init__(self, role: Literal["producer", "consumer", "both"] = "consumer",
                 **config: object) -> None:
        for name, many in (("curve_secret_key", False), ("curve_server_key", False),
                           ("curve_allow", True)):
            path = config.pop(name + "_file", None)
            if path is None:
                continue
            if config.get(name) is not None:
                raise TypeError(f"give {name} or {name}_file, not both")
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"{name}_file must be a path")
            config[name] = (_read_keys(path, name + "_file") if many else
                            _read_key(path, name + "_file", name == "curve_secret_key"))
            if many and not config[name]:
                raise ValueError(f"{name}_file: {os.fspath(path)!r} holds no key")
        super().__init__(role, **config)

    def save(self, mm_hash: str, data: object) -> None:
        """Save data (any buffer, or a torch tensor of any dtype and device)
        under mm_hash, ready at once."""
        super().save(mm_hash, as_buffer(data))

    def read_into(self, mm_hash: str, buffer: object) -> int:
        """Copy a ready item into buffer (a writable buffer, or a contiguous
        CPU torch tensor); returns its size."""
        return super().read_into(mm_hash, as_buffer(buffer, writable=True))

    def __repr__(self) -> str:
        if self.closed:
            return "<ecx.Context closed>"
        return f"<ecx.Context region={self.region_info().path!r}>"


_LEVELS = {"error": 0, "warn": 1, "warning": 1, "info": 2, "debug": 3}
_logger = logging.getLogger("ecx")


class _Unconfigured(logging.Handler):
    """Lines of logger "ecx" while the application has configured no logging
    (the root logger has no handler): "ecx warn: ..." on stderr, as the
    library itself writes them, rather than logging's bare last resort. Once
    the root logger has a handler, it does nothing and the records propagate."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        tag = {"WARNING": "warn"}.get(record.levelname, record.levelname.lower())
        try:
            sys.stderr.write(f"ecx {tag}: {record.getMessage()}\n")
        except Exception:
            self.handleError(record)


_logger.addHandler(_Unconfigured(logging.WARNING))


def _to_logging(level: int, line: str) -> None:
    _logger.log(level, "%s", line)


_DEFAULT = object()


def set_logger(fn: Union[Callable[[int, str], None], None, object] = _DEFAULT) -> None:
    """Where the library's log lines go.

    ``set_logger()`` (the default at import): Python's ``logging``, logger
    ``"ecx"``. ``set_logger(fn)``: ``fn(level, line)`` with ``level`` a
    ``logging`` level. ``set_logger(None)``: the library writes to stderr.
    Lines reach Python after the ecx call that logged them returns (or, from
    the library's own threads, soon on the main thread): library threads
    never wait for the GIL. ``fn`` must not call into ecx.
    """
    _ecx.set_logger(_to_logging if fn is _DEFAULT else fn)


def set_log_level(level: Union[int, str]) -> None:
    """Drop library lines above level: a ``logging`` level (``logging.INFO``)
    or a name (``"error"``, ``"warn"``, ``"info"``, ``"debug"``). The default
    is warn, or what the ECX_LOG environment variable says."""
    if isinstance(level, str):
        try:
            n = _LEVELS[level.lower()]
        except KeyError:
            raise ValueError(f"log level must be one of {sorted(_LEVELS)}, not {level!r}") from None
    elif isinstance(level, int) and not isinstance(level, bool):
        n = 0 if level >= logging.ERROR else 1 if level >= logging.WARNING else \
            2 if level >= logging.INFO else 3
    else:
        raise TypeError("level must be a logging level (int) or a name (str)")
    _ecx.set_log_level(n)


def cli_path() -> str:
    """The ecx command-line program inside the package (``python -m ecx``)."""
    return os.path.join(os.path.dirname(__file__), "_bin", "ecx")


set_logger()
atexit.register(_ecx._shutdown)
