# SPDX-License-Identifier: Apache-2.0
"""The CUDA side of ecx.vllm's worker: imported only by a worker whose
engine runs on a CUDA device, never on a CPU-only machine.

The region is registered once as pinned host memory (cudaHostRegister), so
copies between it and the device are real DMA: saves (device -> region) and
loads (region -> device) run on a side stream, each ordered after the
engine's current stream, and end in an event. A save is reported (and the
scheduler commits it) only once its event has completed; a load's tensor is
handed to the engine at once, the engine's stream waits for the load's event
before it can read it, and the load is reported (and its pin released) only
once the event has completed. Untested on a GPU in CI: see docs/VLLM.md.
"""
from __future__ import annotations

from typing import Any

import torch

from ecx.region import Region


class CudaCopier:
    def __init__(self, region: Region) -> None:
        self.region = region
        # A CPU tensor over the whole mapping (no copy), registered as pinned.
        self.host = torch.frombuffer(region.view([(0, region.size_bytes)])[0], dtype=torch.uint8)
        rc = torch.cuda.cudart().cudaHostRegister(self.host.data_ptr(), region.size_bytes, 0)
        self.registered = int(rc) == 0 if not isinstance(rc, tuple) else int(rc[0]) == 0
        self.stream = torch.cuda.Stream()
        self.saves: list[tuple[str, Any, torch.Tensor]] = []
        self.loads: list[tuple[int, Any]] = []

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=self.registered)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def save(self, mm_hash: str, places: list, tensor: torch.Tensor, report: Any) -> None:
        src = tensor.contiguous().view(-1).view(torch.uint8)
        pairs, pos = [], 0
        for off, n in places:
            k = min(n, src.numel() - pos)
            if k <= 0:
                break
            pairs.append((self.host[off:off + k], src[pos:pos + k]))
            pos += k
        # The source stays referenced until the event completes.
        self.saves.append((mm_hash, self._copy(pairs), src))

    def load(self, tid: int, places: list, dtype: torch.dtype, shape: list,
             device: torch.device, report: Any) -> torch.Tensor:
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        dst = out.view(-1).view(torch.uint8)
        pairs, pos = [], 0
        for off, n in places:
            k = min(n, dst.numel() - pos)
            if k <= 0:
                break
            pairs.append((dst[pos:pos + k], self.host[off:off + k]))
            pos += k
        ev = self._copy(pairs)
        torch.cuda.current_stream().wait_event(ev)  # the model reads it after the copy
        self.loads.append((tid, ev))
        return out

    def collect(self, report: Any) -> None:
        left = []
        for mm_hash, ev, src in self.saves:
            if ev.query():
                report.saved.append(mm_hash)
            else:
                left.append((mm_hash, ev, src))
        self.saves = left
        still = []
        for tid, ev in self.loads:
            (report.loaded.append(tid) if ev.query() else still.append((tid, ev)))
        self.loads = still
