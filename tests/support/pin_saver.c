/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pin_saver — a busy encoder for the pin tests (issue 20, items 1 and 4): a
 * producer context on the public API that keeps saving new items while
 * consumers hold grants, so that blocks unpinned too early are reused at
 * once. Every item's bytes are 8-byte little-endian words (tag << 56) | i,
 * i the word's index in the item, so a reader can tell whose bytes it got.
 *
 *   pin_saver churn DIR DATA LEASE_MS
 *     Region 64 MiB of 64 KiB blocks, data path DATA (tcp / ucx). Saves
 *     "victim" (16 MiB, tag 1), writes DIR/compat and DIR/ann.json, then
 *     saves a 4 MiB "filler-N" (tag 2 + N) every 20 ms (evicting what is
 *     unpinned) until DIR/stop exists; then saves "good" (8 MiB, tag 0xaa),
 *     writes DIR/good.json and waits for DIR/quit.
 *   pin_saver fill DIR PIN_PCT
 *     Region 64 MiB of 64 KiB blocks, tcp, max_pin_pct PIN_PCT (0: the
 *     default), lease 8 s. Saves "a0".."a7" (8 MiB each: the whole region),
 *     writes DIR/compat and DIR/ann.json, waits for DIR/go, then saves
 *     "n0".."n7" (8 MiB each), writes DIR/good.json ("n7") and waits for
 *     DIR/quit.
 *
 * Both print "saves N failed F", then the producer's pin metrics, and exit
 * 0 (1 on a setup error). Every wait is bounded (120 s).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ecx.h"

#define MIB (1u << 20)

static char dir[512];

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int exists(const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Wait (polling the context) until DIR/name exists; 0, or -1 after 120 s. */
static int wait_for(ecx_ctx *ctx, const char *name)
{
    for (int64_t end = now_ms() + 120000; now_ms() < end;) {
        if (exists(name)) return 0;
        ecx_poll(ctx, 20);
    }
    fprintf(stderr, "pin_saver: no %s after 120 s\n", name);
    return -1;
}

/* Write text to DIR/name atomically. */
static void put_file(const char *name, const char *text)
{
    char p[600], q[620];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(q, sizeof q, "%s.tmp", p);
    FILE *f = fopen(q, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(q, p);
}

static void fill(uint8_t *b, size_t n, uint64_t tag)
{
    for (size_t i = 0; i < n / 8; i++) {
        uint64_t w = tag << 56 | i;
        for (int k = 0; k < 8; k++)
            b[i * 8 + k] = (uint8_t)(w >> 8 * k);
    }
}

static int saves, failed;

static void save(ecx_ctx *ctx, const char *name, uint8_t *buf, size_t n, uint64_t tag)
{
    fill(buf, n, tag);
    saves++;
    int rc = ecx_save(ctx, name, buf, n);
    if (rc) {
        failed++;
        fprintf(stderr, "pin_saver: save %s: %s\n", name, ecx_errname(rc));
    }
}

/* {"name": announcement, ...} of names[0..n) into DIR/file. */
static int announce(ecx_ctx *ctx, const char *file, const char *const *names, int n)
{
    static char out[1 << 16];
    size_t o = 0;
    o += (size_t)snprintf(out + o, sizeof out - o, "{");
    for (int i = 0; i < n; i++) {
        char a[1024];
        size_t len;
        if (ecx_announce(ctx, names[i], a, sizeof a, &len)) return -1;
        o += (size_t)snprintf(out + o, sizeof out - o, "%s\"%s\": %s", i ? ", " : "", names[i], a);
    }
    snprintf(out + o, sizeof out - o, "}\n");
    put_file(file, out);
    return 0;
}

static void report(ecx_ctx *ctx)
{
    printf("saves %d failed %d\n", saves, failed);
    static char m[1 << 20];
    size_t len;
    if (ecx_metrics(ctx, m, sizeof m, &len)) return;
    for (char *l = strtok(m, "\n"); l; l = strtok(NULL, "\n"))
        if (l[0] != '#' && (strstr(l, "_pins_total") || strstr(l, "cut_sends") ||
                            strstr(l, "draining") || strstr(l, "expired_leases")))
            printf("%s\n", l);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: pin_saver churn DIR DATA LEASE_MS | fill DIR PIN_PCT 0\n");
        return 2;
    }
    int churn = strcmp(argv[1], "churn") == 0;
    snprintf(dir, sizeof dir, "%s", argv[2]);
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_PRODUCER;
    cfg.listen = "127.0.0.1:0";
    cfg.region_bytes = 64 * MIB;
    cfg.block_bytes = 64 << 10;
    cfg.data = churn ? argv[3] : "tcp";
    if (churn) {
        cfg.lease_ms = atoi(argv[4]);
    } else {
        cfg.lease_ms = 8000;
        if (atoi(argv[3]) > 0) cfg.max_pin_pct = (uint32_t)atoi(argv[3]);
    }
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) {
        fprintf(stderr, "pin_saver: ecx_new: %s\n", ecx_errname(rc));
        return 1;
    }
    char compat[ECX_COMPAT_HASH_HEX + 2];
    ecx_compat_hash(cfg.vllm_version, strlen(cfg.vllm_version), cfg.model, strlen(cfg.model),
                    cfg.dtype, strlen(cfg.dtype), (int64_t)cfg.block_bytes, compat);
    strcat(compat, "\n");
    put_file("compat", compat);
    uint8_t *buf = malloc(16 * MIB);
    if (!buf) return 1;
    if (churn) {
        const char *v = "victim", *g = "good";
        save(ctx, v, buf, 16 * MIB, 1);
        if (announce(ctx, "ann.json", &v, 1)) return 1;
        saves = failed = 0; /* count the busy part only */
        if (wait_for(ctx, "go")) return 1;
        int64_t end = now_ms() + 120000;
        for (int n = 0; !exists("stop") && now_ms() < end; n++) {
            char name[32];
            snprintf(name, sizeof name, "filler-%d", n);
            save(ctx, name, buf, 4 * MIB, 2 + (uint64_t)(n % 200));
            ecx_poll(ctx, 20);
        }
        save(ctx, g, buf, 8 * MIB, 0xaa);
        if (announce(ctx, "good.json", &g, 1)) return 1;
    } else {
        const char *names[8];
        char nb[8][8];
        for (int i = 0; i < 8; i++) {
            snprintf(nb[i], sizeof nb[i], "a%d", i);
            names[i] = nb[i];
            save(ctx, nb[i], buf, 8 * MIB, 0x10 + (uint64_t)i);
        }
        if (announce(ctx, "ann.json", names, 8)) return 1;
        saves = failed = 0;
        if (wait_for(ctx, "go")) return 1;
        for (int i = 0; i < 8; i++) {
            snprintf(nb[i], sizeof nb[i], "n%d", i);
            save(ctx, nb[i], buf, 8 * MIB, 0x20 + (uint64_t)i);
        }
        const char *last = nb[7];
        if (!failed && announce(ctx, "good.json", &last, 1)) return 1;
    }
    report(ctx);
    if (wait_for(ctx, "quit")) return 1;
    report(ctx);
    free(buf);
    ecx_free(ctx);
    return 0;
}
