#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ecx.vllm.ECXConnector (ec_enable_nixl) as one end of a real transfer, outside an engine.

Drives the connector's scheduler and worker halves in one process the way an engine does
(as tests/vllm/call_orders.py), with a real VllmConfig of the tiny model and a real ecx
context (ZeroMQ control plane, NIXL / shm / tcp data plane), against a peer in another
process: vLLM's own ECCPUConnector code (tests/nixl/vllm_peer.py) or another ECXConnector.
tests/shell/test_vllm_connector_interop.sh runs it.

  interop.py produce MODEL_DIR --announce-out FILE --status-file FILE [--items N] [--max-s S]
      ec_producer: for each of N items (16 rows of the model's width, float32, the content
      ecx's synthetic generator gives its mm_hash) the scheduler reserves it
      (update_state_after_alloc), the worker saves the tensor through vLLM's V1 wrapper
      (ECConnectorModelRunnerMixin), update_connector_output commits it and
      request_finished gives the announcement, written to FILE as ec_transfer_params. Then
      it serves until SIGTERM/SIGINT (or --max-s), writing the ecx metrics to the status
      file every 0.2 s.
  interop.py consume MODEL_DIR --params FILE [--params FILE ...] [--params-wait S] [--wait-s S]
      ec_consumer: for each announced item of each file (waited for, S seconds at most), a
      request carrying the file as ec_transfer_params: ensure_cache_available until
      admitted (--wait-s bound), has_cache_item, update_state_after_alloc,
      build_connector_meta, the worker's start_load_caches through vLLM's V1 wrapper, the
      loaded tensor's bytes against the synthetic content of its mm_hash,
      update_connector_output (the pin released). One JSON line per item, with the ecx
      consumer metrics' change over its fetch (fetches ready, bytes).
Both first print one JSON line {"factors": [...], "ecx_hash", "stock_hash"}: ecx's
compatibility hash for this engine config and the one vLLM 0.32's ECCPUConnector computes
from the same config (its own protocol module, its factors as its scheduler takes them).
Exit 0 all good, 1 a check failed, 2 usage.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import sys
import time
import types

import numpy as np
import torch
from vllm.distributed.ec_transfer import ec_transfer_state
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.engine.arg_utils import EngineArgs
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

import ecx
import ecx.vllm as ev

ROWS = 16
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def out(**kw):
    print(json.dumps(kw), flush=True)


def synthetic_hash(tag, i, nbytes):
    return hashlib.sha256(b"ecx-vllm-interop:%s:%d:%d" % (tag.encode(), i, nbytes)).hexdigest()


def synthetic_bytes(mm_hash, nbytes):
    """ecx's synthetic_fill (tools/opts.c) as tests/nixl/vllm_peer.py writes it: splitmix64
    words seeded by the hash's first 8 bytes (little-endian)."""
    seed = np.uint64(int.from_bytes(bytes.fromhex(mm_hash[:16]), "little"))
    k = np.arange(1, (nbytes + 7) // 8 + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = seed + k * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.astype("<u8").view(np.uint8)[:nbytes]


def engine_config(model_dir, role, extra):
    return EngineArgs(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=1024,
                      ec_transfer_config={
                          "ec_connector": "ECXConnector", "ec_connector_module_path": "ecx.vllm",
                          "ec_role": role,
                          "ec_connector_extra_config": dict(
                              {"ec_cpu_bytes": 1 << 22, "ec_enable_nixl": True}, **extra),
                      }).create_engine_config()


def print_hashes(cfg):
    """ecx's hash for this config, and vLLM 0.32's own: create_ec_shared_region's block
    size and ECCPUScheduler._setup_nixl's factors, hashed by its protocol module."""
    from vllm import __version__ as vllm_version
    from vllm.distributed.ec_transfer.ec_connector.cpu.protocol import (
        compute_ec_compatibility_hash,
    )

    s = ev._settings(cfg)
    mc = cfg.model_config
    block = mc.get_inputs_embeds_size() * torch.empty(0, dtype=mc.dtype).element_size()
    stock = compute_ec_compatibility_hash(vllm_version=vllm_version, model=str(mc.model),
                                          dtype=str(mc.dtype), block_size_bytes=block)
    mine = ecx.compat_hash(s["vllm_version"], s["model"], s["dtype"], s["block_bytes"])
    out(factors=[s["vllm_version"], s["model"], s["dtype"], s["block_bytes"]],
        stock_factors=[vllm_version, str(mc.model), str(mc.dtype), block],
        ecx_hash=mine, stock_hash=stock, data=s["data"], connector_version=s["connector_version"])
    return mine == stock


def request(rid, mm_hash, params=None):
    feat = MultiModalFeatureSpec(data=None, modality="image", identifier=mm_hash,
                                 mm_position=PlaceholderRange(offset=10, length=ROWS))
    return types.SimpleNamespace(request_id=rid, mm_features=[feat], ec_transfer_params=params)


def v1_step(meta, cache, produce):
    """vLLM 0.32's V1 runner around one step: the mixin's context (bind metadata, start
    saves / loads, build the worker report), the encoder's saves inside it."""
    from vllm.v1.worker.ec_connector_model_runner_mixin import ECConnectorModelRunnerMixin as M

    so = types.SimpleNamespace(ec_connector_metadata=meta, finished_req_ids=set())
    with M._get_ec_connector_output(so, encoder_cache=cache) as output:
        for h, t in produce.items():
            cache[h] = t
            M.maybe_save_ec_to_connector(cache, h)
    return output


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- producer


def run_produce(a):
    cfg = engine_config(a.model, "ec_producer",
                        {"side_channel_host": "127.0.0.1", "side_channel_port": 0})
    hashes_ok = print_hashes(cfg)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    sched = ev.ECXConnector(cfg, ECConnectorRole.SCHEDULER)
    worker = ev.ECXConnector(cfg, ECConnectorRole.WORKER)
    ec_transfer_state._EC_CONNECTOR_AGENT = worker
    rc = 0
    try:
        hidden = sched._sched.hidden
        nbytes = ROWS * hidden * 4
        items = {synthetic_hash("prod", i, nbytes): None for i in range(a.items)}
        reqs = {h: request(f"prod-{i}", h) for i, h in enumerate(items)}
        for req in reqs.values():
            sched.update_state_after_alloc(req, 0)
        meta = sched.build_connector_meta(None)
        if sorted(meta.saves) != sorted(items):
            out(error="saves handed to the worker", saves=sorted(meta.saves))
            return 1
        produce = {h: torch.frombuffer(bytearray(synthetic_bytes(h, nbytes).tobytes()),
                                       dtype=torch.float32).reshape(ROWS, hidden) for h in items}
        output = v1_step(meta, {}, produce)
        sched.update_connector_output(output)
        if sched.has_pending_push_work():
            out(error="saves not settled after update_connector_output")
            return 1
        params = {}
        for h, req in reqs.items():
            _, p = sched.request_finished(req)
            ann = (p or {}).get(h, {})
            if "peer_host" not in ann or ann.get("shape") != [ROWS, hidden] \
                    or ann.get("size_bytes") != nbytes:
                out(error="announcement", mm_hash=h, announcement=ann)
                rc = 1
            params[h] = ann
        write_atomic(a.announce_out, json.dumps(params))
        out(announced=params)
        ctx = sched._sched.ctx
        end = time.monotonic() + a.max_s
        while not stop and time.monotonic() < end:
            if a.status_file:
                write_atomic(a.status_file, ctx.metrics())
            time.sleep(0.2)
        if a.status_file:
            write_atomic(a.status_file, ctx.metrics())
    finally:
        ec_transfer_state._EC_CONNECTOR_AGENT = None
        worker.shutdown()
        sched.shutdown()
    return rc if hashes_ok else 1


# ---------------------------------------------------------------- consumer


def wait_file(path, seconds):
    end = time.monotonic() + seconds
    while True:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)


def consume_one(sched, worker, mm_hash, params, wait_s, rid):
    res = {"mm_hash": mm_hash, "ok": False}
    s = sched._sched
    ann = params[mm_hash]
    shape = ann.get("shape") or [ROWS, s.hidden]
    nbytes = int(shape[0]) * int(shape[1]) * s.elem
    before = s.ctx.metrics()
    req = request(rid, mm_hash, dict(params))
    t0 = time.monotonic()
    admitted = False
    steps = 0
    while time.monotonic() - t0 < wait_s:  # the engine's steps while the request waits
        steps += 1
        if sched.ensure_cache_available(req, 0):
            admitted = True
            break
        if req.request_id in sched.take_unavailable_requests():
            break
        time.sleep(0.05)
    res.update(admitted=admitted, steps=steps, admit_s=round(time.monotonic() - t0, 3))
    stats = sched.get_ec_connector_stats()
    res["stats"] = stats.data if stats is not None else {}
    if not admitted or mm_hash not in (req.ec_transfer_params or {}):
        res["why"] = "not admitted (or fell back)"
        return res
    if not sched.has_cache_item(mm_hash):
        res["why"] = "has_cache_item False after admission"
        return res
    sched.update_state_after_alloc(req, 0)
    meta = sched.build_connector_meta(None)
    if list(meta.loads) != [mm_hash]:
        res["why"] = f"loads handed to the worker: {list(meta.loads)}"
        return res
    cache = {}
    output = v1_step(meta, cache, {})
    t = cache.get(mm_hash)
    if t is None:
        res["why"] = "the worker loaded nothing"
        return res
    res["shape"] = list(t.shape)
    res["dtype"] = str(t.dtype)
    got = t.contiguous().view(torch.uint8).reshape(-1).numpy()
    res["verified"] = bool(got.size == nbytes
                           and np.array_equal(got, synthetic_bytes(mm_hash, nbytes)))
    del t, got
    cache.clear()
    sched.update_connector_output(output)
    after = s.ctx.metrics()
    res["pins_released"] = not sched.has_pending_push_work() and \
        metric(after, 'ecx_cache_entries{state="pinned"}') == 0
    res["metrics_delta"] = {
        k: (metric(after, k) or 0) - (metric(before, k) or 0)
        for k in ('ecx_consumer_fetches_total{outcome="ready"}', "ecx_consumer_bytes_total")}
    res["fetched_counted"] = res["metrics_delta"]['ecx_consumer_fetches_total{outcome="ready"}'] == 1 \
        and res["metrics_delta"]["ecx_consumer_bytes_total"] >= nbytes
    res["ok"] = bool(res["verified"] and res["shape"] == [int(d) for d in shape]
                     and res["pins_released"] and res["fetched_counted"])
    if not res["ok"]:
        res["why"] = "a check failed"
    return res


def run_consume(a):
    cfg = engine_config(a.model, "ec_consumer", {})
    hashes_ok = print_hashes(cfg)
    sched = ev.ECXConnector(cfg, ECConnectorRole.SCHEDULER)
    worker = ev.ECXConnector(cfg, ECConnectorRole.WORKER)
    ec_transfer_state._EC_CONNECTOR_AGENT = worker
    rc = 0 if hashes_ok else 1
    try:
        n = 0
        for path in a.params:
            if not wait_file(path, a.params_wait):
                out(params=path, ok=False, why="no params file")
                rc = 1
                continue
            with open(path) as f:
                params = json.load(f)
            for h in sorted(params):
                n += 1
                r = consume_one(sched, worker, h, params, a.wait_s, f"cons-{n}")
                r["params"] = path
                out(**r)
                if not r["ok"]:
                    rc = 1
        out(metrics=[l for l in sched._sched.ctx.metrics().splitlines()
                     if l.startswith(("ecx_consumer_fetches_total", "ecx_consumer_bytes_total",
                                      "ecx_consumer_requests_total", "ecx_consumer_retries_total"))])
    finally:
        ec_transfer_state._EC_CONNECTOR_AGENT = None
        worker.shutdown()
        sched.shutdown()
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    pr = sub.add_parser("produce")
    pr.add_argument("model")
    pr.add_argument("--announce-out", required=True)
    pr.add_argument("--status-file", default=None)
    pr.add_argument("--items", type=int, default=1)
    pr.add_argument("--max-s", type=float, default=600)
    co = sub.add_parser("consume")
    co.add_argument("model")
    co.add_argument("--params", action="append", required=True)
    co.add_argument("--params-wait", type=float, default=0)
    co.add_argument("--wait-s", type=float, default=60)
    a = p.parse_args()
    return run_produce(a) if a.mode == "produce" else run_consume(a)


if __name__ == "__main__":
    sys.exit(main())
