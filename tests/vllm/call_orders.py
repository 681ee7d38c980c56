#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ecx.vllm.ECXConnector under both of vLLM's worker call orders, in one process.

vLLM 0.32's V1 model runner saves inside the encoder loop (its mixin,
ECConnectorModelRunnerMixin._get_ec_connector_output, wraps the encoder); 0.34's
V2 runner only has ActiveECConnector (vllm/v1/worker/gpu/ec_connector.py),
which calls start_save_caches before the step and save_caches after it for
every key the step added. Both wrappers are vLLM's own code, driven here on
the CPU with a real VllmConfig of the tiny model and real ecx contexts (one
ec_both connector: its scheduler half and its worker half), the way an engine
drives them: scheduler hooks -> metadata -> the wrapper -> worker report ->
scheduler. Checked for each order: the item saved in the step is committed,
announced with its true shape, loaded back by the worker byte-exact into a
fresh encoder cache, and its pin released; an item whose encoder output does
not match the reservation is reported failed and never announced; an item the
step never produced is dropped; an item already in the worker's cache at the
step's start (V2's start_save_caches) is saved too.

    python call_orders.py MODEL_DIR
Prints one line per check; exit 0 when all pass.
"""
import json
import sys
import types

import torch
from vllm.distributed.ec_transfer import ec_transfer_state
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.engine.arg_utils import EngineArgs
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

import ecx.vllm as ev

ROWS, HIDDEN = 16, 128
failures = []


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f" ({detail})" if detail and not ok else ""),
          flush=True)
    if not ok:
        failures.append(what)


def request(rid, *hashes):
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=h,
                                   mm_position=PlaceholderRange(offset=10 + 20 * i, length=ROWS))
             for i, h in enumerate(hashes)]
    return types.SimpleNamespace(request_id=rid, mm_features=feats, ec_transfer_params=None)


def sched_output(meta):
    return types.SimpleNamespace(ec_connector_metadata=meta, finished_req_ids=set())


def v1_step(worker, meta, cache, produce):
    """The V1 runner: the mixin's context, the encoder (and its saves) inside."""
    from vllm.v1.worker.ec_connector_model_runner_mixin import ECConnectorModelRunnerMixin as M

    with M._get_ec_connector_output(sched_output(meta), encoder_cache=cache) as out:
        for h, t in produce.items():
            cache[h] = t
            M.maybe_save_ec_to_connector(cache, h)
    return out


def v2_step(worker, meta, cache, produce, vllm_config):
    """The V2 runner: ActiveECConnector around the step; new keys saved after it."""
    from vllm.v1.worker.gpu.ec_connector import ActiveECConnector

    wrapper = ActiveECConnector(vllm_config, cache)
    with wrapper.maybe_get_output(sched_output(meta)) as out:
        for h, t in produce.items():
            cache[h] = t
    return out


def run(order, model_dir):
    cfg = EngineArgs(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=1024,
                     ec_transfer_config={
                         "ec_connector": "ECXConnector", "ec_connector_module_path": "ecx.vllm",
                         "ec_role": "ec_both",
                         "ec_connector_extra_config": {
                             "ec_cpu_bytes": 1 << 22, "side_channel_port": 0,
                             "side_channel_host": "127.0.0.1"}}).create_engine_config()
    sched = ev.ECXConnector(cfg, ECConnectorRole.SCHEDULER)
    worker = ev.ECXConnector(cfg, ECConnectorRole.WORKER)
    ec_transfer_state._EC_CONNECTOR_AGENT = worker
    step = (lambda m, c, p: v1_step(worker, m, c, p)) if order == "v1" else \
        (lambda m, c, p: v2_step(worker, m, c, p, cfg))
    try:
        good = torch.randn(ROWS, HIDDEN, generator=torch.Generator().manual_seed(1))
        early = torch.randn(ROWS, HIDDEN, generator=torch.Generator().manual_seed(2))
        req = request(f"{order}-r1", "good", "wrongshape", "neverrun", "early")
        # Scheduling: all four encoder inputs allocated this step.
        for i in range(4):
            sched.update_state_after_alloc(req, i)
        meta = sched.build_connector_meta(None)
        check(f"{order}: four saves handed to the worker", sorted(meta.saves) ==
              ["early", "good", "neverrun", "wrongshape"], sorted(meta.saves))
        cache = {"early": early}  # already encoded in an earlier step (V2's start_save_caches)
        out = step(meta, cache, {"good": good, "wrongshape": torch.zeros(3, HIDDEN)})
        sched.update_connector_output(out)
        check(f"{order}: nothing left unsettled", not sched.has_pending_push_work())
        ok, params = sched.request_finished(req)
        anns = {h: params[h] for h in params}
        check(f"{order}: good announced with its shape", anns["good"].get("shape") == [ROWS, HIDDEN]
              and "peer_host" in anns["good"], json.dumps(anns["good"]))
        check(f"{order}: early (cached before the step) announced", "peer_host" in anns["early"],
              json.dumps(anns["early"]))
        for h in ("wrongshape", "neverrun"):
            check(f"{order}: {h} not announced", "peer_host" not in anns[h], json.dumps(anns[h]))
        # A later request: local hits, loaded by the worker into a fresh encoder cache.
        req2 = request(f"{order}-r2", "good", "early")
        check(f"{order}: has_cache_item on both", sched.has_cache_item("good")
              and sched.has_cache_item("early"))
        sched.update_state_after_alloc(req2, 0)
        sched.update_state_after_alloc(req2, 1)
        meta2 = sched.build_connector_meta(None)
        check(f"{order}: two loads handed to the worker", sorted(meta2.loads) == ["early", "good"])
        fresh = {}
        out2 = step(meta2, fresh, {})
        check(f"{order}: loads byte-exact", torch.equal(fresh.get("good"), good)
              and torch.equal(fresh.get("early"), early))
        sched.update_connector_output(out2)
        pinned = 'ecx_cache_entries{state="pinned"} 0' in sched._sched.ctx.metrics()
        check(f"{order}: pins released after the report",
              not sched.has_pending_push_work() and pinned)
        stats = sched.get_ec_connector_stats()
        check(f"{order}: stats", stats is not None and stats.data.get("saved") == 2
              and stats.data.get("save_failed") == 2 and stats.data.get("loaded") == 2,
              stats and stats.data)
    finally:
        ec_transfer_state._EC_CONNECTOR_AGENT = None
        worker.shutdown()
        sched.shutdown()


def main():
    model_dir = sys.argv[1]
    for order in ("v1", "v2"):
        run(order, model_dir)
    print(f"call_orders: {'FAILED ' + str(len(failures)) if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
