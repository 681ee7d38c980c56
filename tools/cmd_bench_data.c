/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx bench data — what a fetch costs an engine, through the public API
 * alone: for each data path asked for (shm, tcp, ucx), a producer context
 * and a consumer context in this process (distinct regions; both use that
 * path), and for each size and iteration:
 *
 *   1. the producer saves a fresh item of SIZE bytes under a new mm_hash
 *      (untimed; its region holds three items, so the oldest is evicted);
 *   2. the consumer fetches it: the clock runs from the first ecx_fetch_from()
 *      until it answers ECX_FETCH_READY, waiting in between in
 *      ecx_poll(cons, 10) as an engine with nothing else to do waits (no
 *      spinning: both contexts' progress threads do the work, and this
 *      thread sleeps until the consumer's reports an event). So the figure
 *      is fetch-to-ready: one control round trip (XferReq -> XferAck) plus
 *      the data-plane READ and its checksum check, as an engine sees it;
 *   3. the bytes are loaded, compared with what was saved, and released
 *      (untimed; a mismatch fails the run).
 *
 * Before the first iteration, every context's region is faulted in (as an
 * engine's is by its first request; ECX_PREFAULT=0: not waited for).
 * Each iteration first times a plain memcpy of the same size, then each
 * path in turn, so all see the same machine. The memcpy is timed the way
 * the paths are, on buffers like theirs: mappings of files where the
 * regions live ($ECX_SHM_DIR, else /dev/shm: the same page size), a source
 * of three item slots like the producer's region, the item written into
 * its slot just before (as the save writes the producer's blocks), and a
 * destination of two slots like the consumer's, checked after each copy
 * (as each fetch's blocks are); the same clock. Figures are medians, and
 * each path's is printed as a ratio to the memcpy's. With tcp, each
 * iteration also times raw TCP (bench_util.h: one plain loopback
 * connection into the same kind of destination), tcp's own baseline:
 * tcp_vs_raw = raw TCP's time / tcp's fetch-to-ready time. build/bench_data is the raw data-plane
 * benchmark (no control plane, no cache), on the library's internals.
 */
#include <errno.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_ctx.h"
#include "bench_util.h"
#include "cli.h"
#include "ecx.h"
#include "opts.h"

#define MAX_SIZES 8
#define FETCH_LIMIT_S 30.0 /* one fetch may take this long at most */
#define SAVE_LIMIT_S 10.0  /* waiting for the producer's pins to lapse */

typedef struct path {
    const char *name; /* "shm", "tcp", "ucx": the data path of both contexts */
    ecx_ctx *prod, *cons;
    char host[256]; /* the producer's announcement, minus the size */
    int port;
    double *t; /* timed fetches, seconds */
} path;

typedef struct bench {
    uint64_t bs;
    int iters, warmup;
    const ecx_config *base; /* compatibility factors, block size */
    uint8_t *expect;        /* the content */
    uint8_t *msrc, *mdst;   /* the memcpy baseline's: 3 and 2 slots of `slot` bytes */
    uint64_t slot;
    unsigned mit;           /* memcpys so far: which slots */
    double *tm;             /* timed memcpys */
    double *tr;             /* timed raw TCP transfers (tcp measured) */
    bench_raw_tcp raw;
    uint64_t seq; /* makes every mm_hash new */
    bool all;     /* --data all (the default): a path not built in is skipped */
} bench;

/* Start the producer and consumer of path `name`: 0, 1 when the path is not
 * built into this libecx and --data asked for all (skipped), -1 on error. */
static int path_open(path *ph, const char *name, bench *b, uint64_t max_size)
{
    memset(ph, 0, sizeof *ph);
    ph->name = name;
    if (!(ph->t = malloc((size_t)b->iters * sizeof *ph->t))) return -1;
    uint64_t item = bench_blocks_of(max_size, b->bs);
    ecx_config pc = *b->base, cc = *b->base;
    pc.role = ECX_ROLE_PRODUCER;
    pc.listen = "127.0.0.1:0";
    pc.advertise_host = NULL;
    pc.data = name;
    pc.region_bytes = 3 * item;
    pc.instance = NULL; /* a fresh region per context */
    cc.role = ECX_ROLE_CONSUMER;
    cc.data = name;
    cc.region_bytes = 2 * item;
    cc.instance = NULL;
    int e = ecx_new(&pc, &ph->prod);
    if (e == ECX_EDATA_NOPATH && b->all) {
        fprintf(stderr, "bench: %s is not built into this libecx; skipped\n", name);
        return 1;
    }
    if (e) {
        fprintf(stderr, "bench: %s path: cannot start the producer: %s\n", name, ecx_strerror(e));
        return -1;
    }
    if ((e = ecx_new(&cc, &ph->cons))) {
        fprintf(stderr, "bench: %s path: cannot start the consumer: %s\n", name, ecx_strerror(e));
        return -1;
    }
    int port = ecx_listen_port(ph->prod);
    if (port <= 0) {
        fprintf(stderr, "bench: %s path: no producer port: %s\n", name, ecx_strerror(port));
        return -1;
    }
    snprintf(ph->host, sizeof ph->host, "127.0.0.1");
    ph->port = port;
    return 0;
}

static void path_close(path *ph)
{
    ecx_free(ph->cons);
    ecx_free(ph->prod);
    free(ph->t);
    memset(ph, 0, sizeof *ph);
}

/* Save a fresh item of `size` bytes at the producer (untimed). Retries while the producer's region is still pinned
 * by grants it has not yet seen finish. */
static int save_fresh(path *ph, bench *b, uint64_t size, char *name, size_t cap)
{
    snprintf(name, cap, "ecx-bench-%s-%llu-%llu", ph->name, (unsigned long long)size,
             (unsigned long long)++b->seq);
    double limit = mono_s() + SAVE_LIMIT_S;
    for (;;) {
        const ecx_segment *segs;
        size_t n;
        int e = ecx_save_begin(ph->prod, name, size, &segs, &n);
        if (e == 0) {
            uint64_t off = 0;
            for (size_t i = 0; i < n; i++) {
                memcpy(segs[i].ptr, b->expect + off, segs[i].len);
                off += segs[i].len;
            }
            e = off == size ? ecx_save_commit(ph->prod, name) : ECX_ERANGE;
            if (e) ecx_save_abort(ph->prod, name);
        }
        if (e == 0) return 0;
        if (e != ECX_ECACHE_FULL || mono_s() > limit) {
            fprintf(stderr, "bench: %s path: cannot save %llu bytes: %s\n", ph->name,
                    (unsigned long long)size, ecx_strerror(e));
            return -1;
        }
        struct timespec ts = {0, 1000000}; /* let the producer see its pins end */
        nanosleep(&ts, NULL);
    }
}

/* One timed fetch of a fresh item, verified afterwards; seconds, or < 0. */
static double path_fetch(path *ph, bench *b, uint64_t size)
{
    char name[ECX_MM_HASH_MAX + 1];
    if (save_fresh(ph, b, size, name, sizeof name)) return -1;
    ecx_announcement from = {.peer_host = ph->host, .peer_port = ph->port, .size_bytes = size};
    int st, reason = 0;
    double t0 = mono_s(), limit = t0 + FETCH_LIMIT_S, t1;
    while ((st = ecx_fetch_from(ph->cons, name, &from, size, &reason)) == ECX_FETCH_PENDING &&
           mono_s() < limit)
        ecx_poll(ph->cons, 10);
    t1 = mono_s();
    if (st != ECX_FETCH_READY) {
        fprintf(stderr, "bench: %s fetch of %llu bytes: %s\n", ph->name, (unsigned long long)size,
                st == ECX_FETCH_PENDING ? "did not finish in 30 s"
                : st == ECX_FETCH_LOCAL ? ecx_reason_name(reason)
                                        : ecx_strerror(st));
        return -1;
    }
    const ecx_segment *segs;
    size_t n;
    uint64_t got;
    int e = ecx_load(ph->cons, name, &segs, &n, &got);
    if (e) {
        fprintf(stderr, "bench: %s fetch: cannot load: %s\n", ph->name, ecx_strerror(e));
        return -1;
    }
    bool same = got == size;
    uint64_t off = 0;
    for (size_t i = 0; same && i < n; i++) {
        same = off + segs[i].len <= size && !memcmp(segs[i].ptr, b->expect + off, segs[i].len);
        off += segs[i].len;
    }
    ecx_release(ph->cons, name);
    if (!same || off != size) {
        fprintf(stderr, "bench: %s fetch delivered wrong bytes\n", ph->name);
        return -1;
    }
    return t1 - t0;
}

/* A shared mapping of a fresh, unlinked file of len bytes where the
 * regions live, every page written once (as a region is); NULL on error. */
static uint8_t *map_like_region(uint64_t len)
{
    const char *dir = getenv("ECX_SHM_DIR") && *getenv("ECX_SHM_DIR") ? getenv("ECX_SHM_DIR")
                                                                      : "/dev/shm";
    char path[4096];
    if (snprintf(path, sizeof path, "%s/ecx-bench-memcpy-XXXXXX", dir) >= (int)sizeof path)
        return NULL;
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    unlink(path);
    void *p = ftruncate(fd, (off_t)len) == 0
                  ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return NULL;
    memset(p, 0, len);
    return p;
}

/* One timed memcpy of `size` bytes, set up as a fetch is (see the top);
 * seconds, or < 0 if it delivered wrong bytes. */
static double memcpy_once(bench *b, uint64_t size)
{
    uint8_t *src = b->msrc + (b->mit % 3) * b->slot, *dst = b->mdst + (b->mit % 2) * b->slot;
    b->mit++;
    memcpy(src, b->expect, size); /* as the save writes the item */
    double t0 = mono_s();
    memcpy(dst, src, size);
    __asm__ __volatile__("" ::"r"(dst) : "memory");
    double t = mono_s() - t0;
    if (memcmp(dst, b->expect, size) != 0) {
        fprintf(stderr, "bench: memcpy baseline delivered wrong bytes\n");
        return -1;
    }
    return t;
}

static int run(bench *b, const uint64_t *sizes, int nsizes, const bool want[3])
{
    static const char *const names[3] = {"shm", "ucx", "tcp"}; /* the output's order */
    uint64_t max = 0;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > max) max = sizes[i];
    path paths[3];
    memset(paths, 0, sizeof paths);
    int np = 0, ret = -1;
    b->slot = (max + 4095) / 4096 * 4096;
    b->expect = malloc(max);
    b->msrc = map_like_region(3 * b->slot);
    b->mdst = map_like_region(2 * b->slot);
    b->tm = malloc((size_t)b->iters * sizeof *b->tm);
    b->raw = (bench_raw_tcp){.fd = -1, .pid = -1};
    if (!b->expect || !b->msrc || !b->mdst || !b->tm) {
        fprintf(stderr, "bench: out of memory (or no room for the memcpy baseline's buffers "
                        "under $ECX_SHM_DIR or /dev/shm)\n");
        goto done;
    }
    bench_fill(b->expect, 0, max, max);
    if (want[2] && (!(b->tr = malloc((size_t)b->iters * sizeof *b->tr)) ||
                    bench_raw_tcp_open(&b->raw, b->expect, max) != 0)) {
        fprintf(stderr, "bench: raw TCP baseline: cannot set up: %s\n", strerror(errno));
        goto done;
    }
    /* shm first, then tcp, then ucx, as before. */
    static const int order[3] = {0, 2, 1};
    for (int k = 0; k < 3; k++) {
        int j = order[k];
        if (!want[j]) continue;
        int o = path_open(&paths[np], names[j], b, max);
        if (o == 1) { /* not built in: skipped */
            path_close(&paths[np]);
            continue;
        }
        np++;
        if (o) goto done;
    }
    /* Every region faulted in first, as an engine's is by its first
     * request (ecx bench stall waits the same way): no timed fetch shares
     * the machine with a region's background fault-in. */
    for (int k = 0; k < np; k++) {
        double w = bench_wait_backed(paths[k].prod, FETCH_LIMIT_S) +
                   bench_wait_backed(paths[k].cons, FETCH_LIMIT_S);
        fprintf(stderr, "bench: %s: regions faulted in after %.0f ms\n", paths[k].name, w * 1e3);
    }
    for (int s = 0; s < nsizes; s++) {
        uint64_t size = sizes[s];
        for (int it = 0; it < b->warmup + b->iters; it++) {
            double t = memcpy_once(b, size);
            if (t < 0) goto done;
            if (it >= b->warmup) b->tm[it - b->warmup] = t;
            for (int k = 0; k < np; k++) {
                if ((t = path_fetch(&paths[k], b, size)) < 0) goto done;
                if (it >= b->warmup) paths[k].t[it - b->warmup] = t;
            }
            if (b->tr) {
                uint8_t *dst = b->mdst + (b->mit++ % 2) * b->slot;
                if ((t = bench_raw_tcp_once(&b->raw, dst, b->expect, size)) < 0) goto done;
                if (it >= b->warmup) b->tr[it - b->warmup] = t;
            }
        }
        double g[4] = {0, 0, 0, 0}, lat[4] = {0, 0, 0, 0}; /* memcpy, shm, ucx, tcp */
        lat[0] = bench_median(b->tm, b->iters);
        g[0] = (double)size / lat[0] / 1e9;
        for (int k = 0; k < np; k++) {
            int j = !strcmp(paths[k].name, "shm") ? 1 : !strcmp(paths[k].name, "ucx") ? 2 : 3;
            lat[j] = bench_median(paths[k].t, b->iters);
            g[j] = (double)size / lat[j] / 1e9;
        }
        fprintf(stderr,
                "bench: size %llu: median memcpy %.3f ms; fetch-to-ready (one control round trip "
                "included) shm %.3f ms, tcp %.3f ms, ucx %.3f ms (UCX_TLS=%s, %d iterations)\n",
                (unsigned long long)size, lat[0] * 1e3, lat[1] * 1e3, lat[3] * 1e3, lat[2] * 1e3,
                getenv("UCX_TLS") ? getenv("UCX_TLS") : "UCX's choice", b->iters);
        double rawt = b->tr ? bench_median(b->tr, b->iters) : 0;
        printf("size=%llu shm_gbps=%.3f ucx_gbps=%.3f memcpy_gbps=%.3f shm_ratio=%.3f "
               "ucx_ratio=%.3f tcp_gbps=%.3f tcp_ratio=%.3f rawtcp_gbps=%.3f tcp_vs_raw=%.3f\n",
               (unsigned long long)size, g[1], g[2], g[0], g[1] / g[0], g[2] / g[0], g[3],
               g[3] / g[0], rawt > 0 ? (double)size / rawt / 1e9 : 0.0,
               rawt > 0 && lat[3] > 0 ? rawt / lat[3] : 0.0);
        fflush(stdout);
    }
    ret = 0;
done:
    for (int k = 0; k < np; k++)
        path_close(&paths[k]);
    bench_raw_tcp_close(&b->raw);
    free(b->expect), free(b->tm), free(b->tr);
    if (b->msrc) munmap(b->msrc, 3 * b->slot);
    if (b->mdst) munmap(b->mdst, 2 * b->slot);
    return ret;
}

int cmd_bench_data(int argc, char **argv, const char *help, const char *help_tail)
{
    enum { O_SIZE = 2000, O_COUNT, O_WARMUP };
    static const struct option opts[] = {{"size", required_argument, 0, O_SIZE},
                                         {"count", required_argument, 0, O_COUNT},
                                         {"warmup", required_argument, 0, O_WARMUP},
                                         {"help", no_argument, 0, 'h'},
                                         COMMON_LONG_OPTS,
                                         {0, 0, 0, 0}};
    ecx_config cfg;
    ecx_config_init(&cfg);
    uint64_t sizes[MAX_SIZES];
    int nsizes = 0;
    bool want[3] = {true, true, true}; /* shm, ucx, tcp */
    bench b = {.iters = 30, .warmup = 3, .all = true};
    int c;
    int64_t v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == OPT_DATA) { /* this one also takes "all" */
            bool all = b.all = !strcmp(optarg, "all") || !strcmp(optarg, "auto");
            want[0] = all || !strcmp(optarg, "shm");
            want[1] = all || !strcmp(optarg, "ucx");
            want[2] = all || !strcmp(optarg, "tcp");
            if (!want[0] && !want[1] && !want[2])
                return usage_error("--data takes all, shm, tcp or ucx, not '%s'", optarg);
            continue;
        }
        int r = common_opt(c, optarg, &cfg, NULL);
        if (r < 0) return EXIT_USAGE;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(help, stdout); fputs(help_tail, stdout); return EXIT_OK;
        case O_SIZE:
            if (nsizes == MAX_SIZES) return usage_error("--size: at most %d sizes", MAX_SIZES);
            if (parse_size("--size", optarg, &sizes[nsizes])) return EXIT_USAGE;
            if (sizes[nsizes] == 0 || sizes[nsizes] > (16ull << 30))
                return usage_error("--size must be 1 byte to 16Gi");
            nsizes++;
            break;
        case O_COUNT:
            if (parse_int("--count", optarg, 1, 100000, &v)) return EXIT_USAGE;
            b.iters = (int)v;
            break;
        case O_WARMUP:
            if (parse_int("--warmup", optarg, 0, 100000, &v)) return EXIT_USAGE;
            b.warmup = (int)v;
            break;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return usage_error("bench data takes no arguments ('%s'); try 'ecx bench data --help'",
                           argv[optind]);
    if (common_finish(&cfg)) return EXIT_USAGE;
    if (nsizes == 0) sizes[nsizes++] = 4718592, sizes[nsizes++] = 28835840;
    for (int i = 0; i < nsizes; i++)
        if (whole_blocks_check("bench data --size", sizes[i], &cfg)) return EXIT_USAGE;
    b.bs = cfg.block_bytes;
    b.base = &cfg;
    return run(&b, sizes, nsizes, want) ? EXIT_FAIL : EXIT_OK;
}
