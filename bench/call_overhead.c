/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call_overhead — the C side of bench/py_overhead.py (issue 14): what the
 * calls an engine makes every step cost from C, through the public API and
 * libecx.so alone, so that the Python binding's figures have a baseline
 * measured the same way in the same run.
 *
 *   call_overhead [--calls N] [--items K] [--size BYTES] [--xfer-iters M] [--data PATH]
 *
 * Prints one line of key=value:
 *   fetch_pending_ns  ecx_fetch_from() of K items that stay pending (their
 *                     producer never answers: a listening socket that never
 *                     speaks), cycled, N calls; per call
 *   poll0_ns          ecx_poll(ctx, 0) with nothing to do (progress thread on)
 *   poll0_nothread_ns the same with progress_thread = 0
 *   save_ms fetch_ms read_ms xfer_ms
 *                     medians over M rounds of: ecx_save() of a fresh BYTES
 *                     item into a producer context, ecx_fetch_from() +
 *                     ecx_poll(c, 1) until ready in a consumer context of
 *                     this process, ecx_read() into a buffer; xfer_ms is the
 *                     median of the three together
 * The Python script runs the same loops through `import ecx`.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ecx.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "call_overhead: %s: %s\n", what, rc < 0 ? ecx_errname(rc) : "failed");
    exit(1);
}

static ecx_ctx *make(int role, int thread, uint64_t region, const char *data)
{
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = role;
    cfg.listen = "127.0.0.1:0";
    cfg.region_bytes = region;
    cfg.progress_thread = thread;
    cfg.ack_timeout_ms = 600000; /* pending items stay pending */
    cfg.data = data;
    ecx_ctx *c;
    int rc = ecx_new(&cfg, &c);
    if (rc < 0) die("ecx_new", rc);
    return c;
}

/* A TCP port that accepts connections (the kernel does) but never speaks. */
static int silent_port(int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof a) || listen(*fd, 64) ||
        getsockname(*fd, (struct sockaddr *)&a, &len))
        die("silent socket", 0);
    return ntohs(a.sin_port);
}

static double time_poll0(int thread, long calls)
{
    ecx_ctx *c = make(ECX_ROLE_CONSUMER, thread, 8 << 20, "auto");
    for (long i = 0; i < calls / 10; i++) ecx_poll(c, 0); /* warm */
    double t = now_ns();
    for (long i = 0; i < calls; i++) ecx_poll(c, 0);
    t = (now_ns() - t) / calls;
    ecx_free(c);
    return t;
}

int main(int argc, char **argv)
{
    long calls = 200000;
    int items = 100, iters = 10;
    uint64_t size = 28835840; /* llava-1.5's 3520 rows of 4096 bf16 */
    const char *data = "auto";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--calls")) calls = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--items")) items = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--size")) size = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--xfer-iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--data")) data = argv[i + 1];
        else break;
    }
    /* The default contexts speak protocol version 2: an item is whole blocks. */
    if (argc % 2 == 0 || calls < 1 || items < 1 || items > 10000 || iters < 1 || iters > 1000 ||
        size < 1 || size % ECX_DEFAULT_BLOCK_BYTES) {
        fprintf(stderr, "usage: call_overhead [--calls N] [--items K] [--size BYTES] "
                        "[--xfer-iters M] [--data PATH]\nBYTES: whole blocks of %llu "
                        "(protocol version 2); PATH: one of " ECX_DATA_PATHS "\n",
                (unsigned long long)ECX_DEFAULT_BLOCK_BYTES);
        return 2;
    }

    /* fetch of pending items */
    int sfd, port = silent_port(&sfd);
    ecx_ctx *c = make(ECX_ROLE_CONSUMER, 1, (uint64_t)(items + 8) << 20, data); /* a block each */
    /* One block: under version 2 a size that is not whole blocks is refused
     * locally (SIZE_MISMATCH) and never pends. */
    ecx_announcement from = {.peer_host = "127.0.0.1", .peer_port = port,
                             .size_bytes = ECX_DEFAULT_BLOCK_BYTES};
    char (*h)[32] = malloc((size_t)items * sizeof *h);
    int reason;
    for (int k = 0; k < items; k++) {
        snprintf(h[k], sizeof h[k], "pending-%d", k);
        if (ecx_fetch_from(c, h[k], &from, 0, &reason) != ECX_FETCH_PENDING) die("not pending", 0);
    }
    for (long i = 0; i < calls / 10; i++) ecx_fetch_from(c, h[i % items], &from, 0, &reason);
    double t = now_ns();
    for (long i = 0; i < calls; i++) {
        if (ecx_fetch_from(c, h[i % items], &from, 0, &reason) != ECX_FETCH_PENDING)
            die("fetch left pending", 0);
    }
    double fetch_ns = (now_ns() - t) / calls;
    ecx_free(c);
    close(sfd);
    free(h);

    double poll0 = time_poll0(1, calls), poll0_nt = time_poll0(0, calls);

    /* save + fetch + read of one item of size */
    /* Room for every round: no eviction (whose freed blocks fault in again) in the timing. */
    uint64_t region = size * (uint64_t)(iters + 3) + (64 << 20);
    ecx_ctx *p = make(ECX_ROLE_PRODUCER, 1, region, data);
    c = make(ECX_ROLE_CONSUMER, 1, region, data);
    uint8_t *src = malloc(size), *dst = malloc(size);
    if (!src || !dst) die("malloc", 0);
    for (uint64_t i = 0; i < size; i++) src[i] = (uint8_t)(i * 131 + 7);
    memset(dst, 0, size);
    double *sv = calloc((size_t)iters, sizeof *sv), *fv = calloc((size_t)iters, sizeof *fv),
           *rv = calloc((size_t)iters, sizeof *rv), *xv = calloc((size_t)iters, sizeof *xv);
    ecx_announcement a;
    for (int it = -2; it < iters; it++) { /* two warm-up rounds */
        char name[32];
        snprintf(name, sizeof name, "xfer-%d", it + 2);
        double t0 = now_ns();
        int rc = ecx_save(p, name, src, size);
        if (rc < 0) die("ecx_save", rc);
        double t1 = now_ns();
        if ((rc = ecx_announce_info(p, name, &a)) < 0) die("announce", rc);
        int st;
        for (int n = 0; (st = ecx_fetch_from(c, name, &a, size, &reason)) == ECX_FETCH_PENDING; n++) {
            if (n > 100000) die("fetch never ready", 0);
            ecx_poll(c, 1);
        }
        if (st != ECX_FETCH_READY) die(ecx_reason_name(reason), 0);
        double t2 = now_ns();
        int64_t got = ecx_read(c, name, dst, size);
        if (got != (int64_t)size) die("ecx_read", (int)got);
        double t3 = now_ns();
        if (it >= 0) {
            sv[it] = (t1 - t0) / 1e6, fv[it] = (t2 - t1) / 1e6, rv[it] = (t3 - t2) / 1e6;
            xv[it] = (t3 - t0) / 1e6;
        }
    }
    if (memcmp(src, dst, size)) die("bytes differ", 0);
    printf("c fetch_pending_ns=%.1f poll0_ns=%.1f poll0_nothread_ns=%.1f size=%llu "
           "save_ms=%.3f fetch_ms=%.3f read_ms=%.3f xfer_ms=%.3f\n",
           fetch_ns, poll0, poll0_nt, (unsigned long long)size, median(sv, iters),
           median(fv, iters), median(rv, iters), median(xv, iters));
    ecx_free(c);
    ecx_free(p);
    free(src), free(dst), free(sv), free(fv), free(rv), free(xv);
    return 0;
}
