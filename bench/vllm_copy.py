#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The ecx vLLM connector's own copy cost per MB of embedding, against memcpy.

The worker half of ecx.vllm.ECXConnector saves an encoder output by copying the
tensor into the item's blocks through ecx.Region.write, and loads one by
copying the blocks into a new tensor (ecx.Region.tensor). Baseline, same run:
torch's own copy of the same tensor into a preallocated one (a memcpy) and a
clone (allocate + memcpy, what a load must do too). Sizes: 4.7 MB (LLaVA-1.5),
28.8 MB (Qwen3-VL-8B at 1280x720), float32/bfloat16 tensors of those bytes.

    python bench/vllm_copy.py [ROUNDS]
One line per size and operation: ms median / min, MB/s, ratio to the baseline.
"""
import statistics
import sys
import time

import torch

import ecx

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
BLOCK = 8192


def timed(fn, rounds):
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out), min(out)


def main():
    torch.set_num_threads(1)
    with ecx.Context("producer", listen="127.0.0.1:0", region_bytes=256 << 20,
                     block_bytes=BLOCK) as ctx:
        info = ctx.region_info()
        with ecx.Region(info.path, info.block_bytes) as region:
            for mb in (4.7, 28.8):
                nbytes = int(mb * 1e6) // BLOCK * BLOCK
                src = torch.randn(nbytes // 4 // 1024, 1024)
                dst = torch.empty_like(src)
                hold = ctx.save_into(f"b{mb}", nbytes)
                places = hold.places
                region.write(places, src)  # fault the pages in once
                base_save = timed(lambda: dst.copy_(src), ROUNDS)
                save = timed(lambda: region.write(places, src), ROUNDS)
                base_load = timed(lambda: src.clone(), ROUNDS)
                load = timed(lambda: region.tensor(places, src.dtype, src.shape), ROUNDS)
                assert torch.equal(region.tensor(places, src.dtype, src.shape), src)
                hold.abort()
                for name, (med, lo), (bmed, _) in (("save", save, base_save),
                                                   ("load", load, base_load)):
                    print(f"op={name} size_mb={mb} ms_median={med * 1e3:.3f} ms_min={lo * 1e3:.3f} "
                          f"mb_s={nbytes / 1e6 / med:.0f} baseline_ms={bmed * 1e3:.3f} "
                          f"ratio={med / bmed:.2f} segments={len(places)}", flush=True)


if __name__ == "__main__":
    main()
