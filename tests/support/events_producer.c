/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events_producer — a real producer driven line by line on stdin, for
 * test_events and bench/events.sh: it saves, evicts (a small region) and
 * says what it holds, with encoder-cache events on or off.
 *
 * usage: events_producer EVENTS_ENDPOINT|- REGION_BYTES BLOCK_BYTES [TOPIC [CURVE_SECRET_Z85]]
 * commands (one per line; each answered with one line on stdout):
 *   save HASH SIZE       save SIZE bytes under HASH -> "ok" or "error NAME"
 *   fill PREFIX N SIZE   save PREFIX0..PREFIX(N-1) -> "ok N"
 *   held                 -> "held H1 H2 ..." (the last 4096 hashes saved that are
 *                           still held; may repeat one)
 *   rss                  -> "rss KIB" (VmRSS)
 *   metric NAME          -> "metric VALUE" (from ecx_metrics; -1 if absent)
 *   bench N SIZE         N saves of SIZE bytes, timed -> "bench SAVES_PER_S"
 *   pace N SIZE US       N saves of SIZE bytes, one every US microseconds -> "ok N"
 *   quit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ecx.h"

/* The last KEYS hashes saved (a region of the tests holds far fewer). */
#define KEYS 4096

static char *keys[KEYS];
static size_t n_keys; /* saves so far */
static unsigned char buf[64 << 20];

static void remember(const char *h)
{
    free(keys[n_keys % KEYS]);
    keys[n_keys++ % KEYS] = strdup(h);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: events_producer ENDPOINT|- REGION_BYTES BLOCK_BYTES [TOPIC]\n");
        return 2;
    }
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_PRODUCER;
    cfg.listen = "127.0.0.1:0";
    cfg.region_bytes = strtoull(argv[2], NULL, 0);
    cfg.block_bytes = strtoull(argv[3], NULL, 0);
    if (strcmp(argv[1], "-")) cfg.events_endpoint = argv[1];
    if (argc > 4) cfg.events_topic = argv[4];
    if (argc > 5) cfg.curve_secret_key = argv[5];
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) {
        printf("error %s\n", ecx_errname(rc));
        return 1;
    }
    memset(buf, 0x5a, sizeof buf);
    printf("ready %d\n", ecx_listen_port(ctx));
    fflush(stdout);
    char line[1024], a[512];
    unsigned long long n, size, pace;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "save %511s %llu", a, &size) == 2 && size <= sizeof buf) {
            rc = ecx_save(ctx, a, buf, size);
            if (!rc) remember(a);
            printf(rc ? "error %s\n" : "ok\n", ecx_errname(rc));
        } else if (sscanf(line, "fill %400s %llu %llu", a, &n, &size) == 3 && size <= sizeof buf) {
            unsigned long long ok = 0;
            for (unsigned long long i = 0; i < n; i++) {
                char h[600];
                snprintf(h, sizeof h, "%s%llu", a, i);
                if (!ecx_save(ctx, h, buf, size)) ok++, remember(h);
            }
            printf("ok %llu\n", ok);
        } else if (!strncmp(line, "held", 4)) {
            fputs("held", stdout);
            for (size_t i = 0; i < KEYS && i < n_keys; i++) {
                ecx_announcement an;
                if (!ecx_announce_info(ctx, keys[i], &an)) printf(" %s", keys[i]);
            }
            putchar('\n');
        } else if (!strncmp(line, "rss", 3)) {
            FILE *f = fopen("/proc/self/status", "r");
            char l[256];
            long kib = -1;
            while (f && fgets(l, sizeof l, f))
                if (sscanf(l, "VmRSS: %ld", &kib) == 1) break;
            if (f) fclose(f);
            printf("rss %ld\n", kib);
        } else if (sscanf(line, "metric %200s", a) == 1) {
            static char m[1 << 16];
            size_t len;
            double v = -1;
            if (!ecx_metrics(ctx, m, sizeof m, &len)) {
                size_t al = strlen(a);
                for (char *p = m; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
                    if (!strncmp(p, a, al) && p[al] == ' ') v = atof(p + al + 1);
            }
            printf("metric %.0f\n", v);
        } else if (sscanf(line, "bench %llu %llu", &n, &size) == 2 && size <= sizeof buf) {
            double t0 = now();
            for (unsigned long long i = 0; i < n; i++) {
                char h[64];
                snprintf(h, sizeof h, "bench-%llu-%.6f", i, t0);
                ecx_save(ctx, h, buf, size);
            }
            printf("bench %.0f\n", n / (now() - t0));
        } else if (sscanf(line, "pace %llu %llu %llu", &n, &size, &pace) == 3 &&
                   size <= sizeof buf) {
            double t0 = now();
            for (unsigned long long i = 0; i < n; i++) {
                char h[64];
                snprintf(h, sizeof h, "pace-%llu-%.6f", i, t0);
                ecx_save(ctx, h, buf, size);
                struct timespec ts = {0, (long)pace * 1000};
                nanosleep(&ts, NULL);
            }
            printf("ok %llu\n", n);
        } else if (!strncmp(line, "quit", 4)) {
            break;
        } else {
            printf("error usage\n");
        }
        fflush(stdout);
    }
    ecx_free(ctx);
    for (size_t i = 0; i < KEYS; i++) free(keys[i]);
    return 0;
}
