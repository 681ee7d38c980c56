/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_bench — the data-plane benchmark behind `build/bench_data` (`ecx
 * bench data` measures through the public API instead): throughput of
 * the same-host (shm), tcp and UCX paths against a plain memcpy of the same
 * sizes, measured interleaved in one run (see bench/data_bench.c for the
 * method).
 *
 * Output on stdout, one line per size, the last line being the last size:
 *   size=<bytes> shm_gbps=<x> ucx_gbps=<x> memcpy_gbps=<x> shm_ratio=<x> ucx_ratio=<x>
 *   tcp_gbps=<x> tcp_ratio=<x>            (one line; tcp last, added later)
 *   rawtcp_gbps=<x> tcp_vs_raw=<x>        (the same line: tcp's baseline,
 *                                          one plain loopback TCP connection)
 * tcp_vs_raw is raw TCP's time / tcp's fetch time (1.0: tcp moves bytes as
 * fast as the bare connection). A path that is not measured reports 0. With cold (--cold), each size's
 * line is preceded by
 *   size=<bytes> cold_ratio=<x> cold_other_ratio=<x> prefaulted_ratio=<x> warm_ratio=<x>
 * (fetch time / memcpy time: a fresh context's first fetch; other blocks
 * at once; other blocks after idle pre-fault; the first blocks again).
 */
#ifndef ECX_DATA_BENCH_H
#define ECX_DATA_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#define ECX_DATA_BENCH_MAX_SIZES 8

typedef struct ecxi_data_bench_opts {
    uint64_t sizes[ECX_DATA_BENCH_MAX_SIZES]; /* bytes per fetch; nsizes of them */
    int nsizes;                               /* 0: 4,700,000 and 28,800,000 */
    int iters;                                /* timed fetches per size and path */
    int warmup;                               /* untimed fetches first */
    uint64_t block_bytes;                     /* region block size */
    bool shm, tcp, ucx;                       /* which paths to measure */
    bool cold; /* also first fetches on fresh shm contexts (a line before each size's) */
} ecxi_data_bench_opts;

/* Defaults: both sizes, 30 iterations, 3 warm-up, 1 MiB blocks, every path. */
void ecxi_data_bench_opts_init(ecxi_data_bench_opts *o);

/* Run it. 0 on success; -1 on failure (message on stderr), including a
 * fetch or memcpy that delivered wrong bytes. Bounded: every wait has a
 * deadline. */
int ecxi_data_bench_run(const ecxi_data_bench_opts *o);

#endif
