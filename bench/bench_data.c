/* SPDX-License-Identifier: Apache-2.0 */
/* bench_data — the data-plane benchmark as its own program: throughput of
 * the same-host (shm), tcp and UCX paths against a plain memcpy of the same
 * sizes, measured in the same run. The benchmark itself lives in
 * bench/data_bench.c; this file only parses
 * the options it has always taken.
 *
 * Output: one line per size, the last line being the last size:
 *   size=<bytes> shm_gbps=<x> ucx_gbps=<x> memcpy_gbps=<x> shm_ratio=<x> ucx_ratio=<x>
 *   tcp_gbps=<x> tcp_ratio=<x> rawtcp_gbps=<x> tcp_vs_raw=<x>  (on the same line;
 *   raw TCP: one plain loopback connection, tcp's baseline; data_bench.h)
 *
 *   bench_data [--size BYTES]... [--iters N] [--warmup N] [--block-bytes B]
 *              [--path shm|tcp|ucx|both|all]   (both: shm and ucx, as before;
 *                                               all and both: ucx if built in)
 *              [--cold]   (shm first fetches on fresh contexts, and after
 *                          idle pre-fault: data_bench.h)
 * Defaults: sizes 4700000 and 28800000, 30 iterations, 3 warm-up,
 * 1 MiB blocks, both paths. Regions go under $ECX_SHM_DIR (default
 * /dev/shm), as the library's do. Bounded: every wait has a deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdint.h>

#include "data.h"
#include "data_bench.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_data [--size BYTES]... [--iters N] [--warmup N] "
                    "[--block-bytes B] [--path shm|tcp|ucx|both|all] [--cold]\n");
    return 2;
}

/* A whole decimal number, or -1 (no suffixes here; `ecx bench data` takes 4.7M). */
static long long number(const char *v)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || errno || n > (1ull << 40)) return -1;
    return (long long)n;
}

int main(int argc, char **argv)
{
    ecxi_data_bench_opts o;
    ecxi_data_bench_opts_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--cold") == 0) {
            o.cold = true;
            continue;
        }
        if (!v) return usage();
        if (strcmp(a, "--size") == 0 && o.nsizes < ECX_DATA_BENCH_MAX_SIZES)
            o.sizes[o.nsizes++] = (uint64_t)(number(v) > 0 ? number(v) : 0);
        else if (strcmp(a, "--iters") == 0)
            o.iters = (int)(number(v) >= 0 && number(v) <= 100000 ? number(v) : 0);
        else if (strcmp(a, "--warmup") == 0)
            o.warmup = (int)(number(v) >= 0 && number(v) <= 100000 ? number(v) : -1);
        else if (strcmp(a, "--block-bytes") == 0)
            o.block_bytes = (uint64_t)(number(v) > 0 ? number(v) : 0);
        else if (strcmp(a, "--path") == 0) {
            bool all = strcmp(v, "all") == 0, both = strcmp(v, "both") == 0;
            o.shm = all || both || strcmp(v, "shm") == 0;
            o.tcp = all || strcmp(v, "tcp") == 0;
            o.ucx = ((all || both) && ecxi_data_backend_built(ECX_DATA_UCX)) || strcmp(v, "ucx") == 0;
            if (!o.shm && !o.tcp && !o.ucx) return usage();
        } else
            return usage();
        i++;
    }
    if (o.iters < 1 || o.iters > 100000 || o.warmup < 0 || o.block_bytes == 0) return usage();
    for (int i = 0; i < o.nsizes; i++)
        if (o.sizes[i] == 0) return usage();
    return ecxi_data_bench_run(&o) ? 1 : 0;
}
