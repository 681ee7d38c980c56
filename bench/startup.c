/* SPDX-License-Identifier: Apache-2.0 */
/*
 * startup — what a new context costs before its first item is in
 * (issue 23 §4), through the public API and libecx.so alone, so that one
 * source built against two libraries (bench/startup_before_after.sh)
 * compares them.
 *
 *   startup [--rounds N] [--size BYTES] [--idle-ms MS]
 *
 * Each round: ecx_new() of a default producer context (listen 127.0.0.1:0,
 * every other field as ecx_config_init() leaves it: a 1 GiB region), then
 * ecx_save() of a fresh BYTES item (default 28835840: llava-1.5's 3520 rows
 * of 4096 bf16; whole blocks of the default 8 KiB, as protocol version 2,
 * the default, saves only whole blocks) at once, then MS
 * milliseconds idle (default 500) once the region file is held whole
 * (its allocated size, st_blocks, is its size: whatever the library
 * faults in in the background is in; at most 60 s), then ecx_save() of a
 * second fresh item, then ecx_free(). Prints one line of key=value with
 * the medians over N rounds (default 5):
 *   create_ms      ecx_new()
 *   first_save_ms  the save right after ecx_new()
 *   held_ms        from ecx_new() until the region file was held whole
 *   idle_save_ms   the save after that and the idle time (steady state)
 *   free_ms        ecx_free()
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ecx.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
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

static int usage(void)
{
    fprintf(stderr, "usage: startup [--rounds N (1..100)] [--size BYTES (1..1e9, whole blocks of "
                    "%llu)] [--idle-ms MS (0..60000)]\n", (unsigned long long)ECX_DEFAULT_BLOCK_BYTES);
    return 2;
}

static int num(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    long long rounds = 5, size = 28835840, idle = 500;
    for (int i = 1; i < argc; i++) {
        long long *dst = !strcmp(argv[i], "--rounds")    ? &rounds
                         : !strcmp(argv[i], "--size")    ? &size
                         : !strcmp(argv[i], "--idle-ms") ? &idle
                                                         : NULL;
        long long hi = dst == &rounds ? 100 : dst == &size ? 1000000000 : 60000;
        if (!dst || i + 1 == argc || num(argv[++i], dst == &idle ? 0 : 1, hi, dst)) return usage();
    }
    /* The default context speaks protocol version 2: an item is whole blocks. */
    if ((uint64_t)size % ECX_DEFAULT_BLOCK_BYTES) return usage();
    char *buf = malloc((size_t)size);
    if (!buf) return 1;
    memset(buf, 0x5a, (size_t)size);
    double *t = calloc(5 * (size_t)rounds, sizeof *t);
    if (!t) return 1;
    for (long long r = 0; r < rounds; r++) {
        ecx_config cfg;
        ecx_config_init(&cfg);
        cfg.role = ECX_ROLE_PRODUCER;
        cfg.listen = "127.0.0.1:0";
        ecx_ctx *ctx;
        double t0 = now_ms();
        int rc = ecx_new(&cfg, &ctx);
        double t1 = now_ms();
        if (rc) {
            fprintf(stderr, "startup: ecx_new: %s\n", ecx_strerror(rc));
            return 1;
        }
        char h1[64], h2[64];
        snprintf(h1, sizeof h1, "startup-%lld-a", r);
        snprintf(h2, sizeof h2, "startup-%lld-b", r);
        double t2 = now_ms();
        rc = ecx_save(ctx, h1, buf, (uint64_t)size);
        double t3 = now_ms();
        ecx_region_layout lay;
        if (!rc) rc = ecx_region_info(ctx, &lay);
        struct stat st;
        for (int i = 0; !rc && i < 6000; i++) {
            if (stat(lay.path, &st) == 0 && (uint64_t)st.st_blocks * 512 >= lay.size_bytes)
                break;
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
        double held = now_ms() - t0;
        struct timespec ts = {idle / 1000, (idle % 1000) * 1000000};
        nanosleep(&ts, NULL);
        double t4 = now_ms();
        if (!rc) rc = ecx_save(ctx, h2, buf, (uint64_t)size);
        double t5 = now_ms();
        if (rc) {
            fprintf(stderr, "startup: ecx_save: %s\n", ecx_strerror(rc));
            return 1;
        }
        ecx_free(ctx);
        double t6 = now_ms();
        t[r] = t1 - t0;
        t[rounds + r] = t3 - t2;
        t[2 * rounds + r] = t5 - t4;
        t[3 * rounds + r] = t6 - t5;
        t[4 * rounds + r] = held;
    }
    printf("create_ms=%.2f first_save_ms=%.2f held_ms=%.2f idle_save_ms=%.2f free_ms=%.2f "
           "size=%lld rounds=%lld\n",
           median(t, (int)rounds), median(t + rounds, (int)rounds),
           median(t + 4 * rounds, (int)rounds),
           median(t + 2 * rounds, (int)rounds), median(t + 3 * rounds, (int)rounds), size,
           rounds);
    free(t);
    free(buf);
    return 0;
}
