/* SPDX-License-Identifier: Apache-2.0 */
/* dead_producers — issue 10's "sessions to dead producers never close", as
 * an engine would meet it, through the public API in one real process: ask
 * for items from 2,000 producers that never answer (ports on 127.0.0.1 that
 * are bound but not listening), let every one of them fall back, and then
 * fetch an item from a live producer (`ecx serve`, whose announcement is
 * argv[1]). Exit 0 only if every dead item ended "encode locally", the
 * process never held more than a bounded number of descriptors, and the
 * live item arrived. Every wait is bounded.
 *
 * With "batch" (issue 20, item 6), the live item is asked for in the same
 * batch, right after the dead ones, with more dead producers than the
 * session cap and a 10 s ack timeout: it must arrive within BATCH_LIVE_S,
 * not wait (or fall back) until the dead producers' ack timeout ends.
 *
 * Protocol version 1 on purpose (ecxt_config_v1; the live producer is `ecx
 * serve` with version 1's factors): every dead item must end on its ack
 * timeout (version 1 then leaves a tombstone; version 2 retries for the 60 s
 * per-item wait, as vLLM >= 0.32 re-requests), and the dead announcements are
 * 1000 bytes with no shape.
 *
 * usage: dead_producers ANNOUNCEMENT_JSON MM_HASH COUNT [batch] */
#include <dirent.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ecx.h"
#include "speak_v1.h"

/* The live item's limit in batch mode: well under the 10 s ack timeout. */
#define BATCH_LIVE_S 4.0

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ., .. and the DIR's own descriptor */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    bool batch = argc == 5 && !strcmp(argv[4], "batch");
    if (argc != 4 && !batch) {
        fprintf(stderr, "usage: dead_producers ANNOUNCEMENT_JSON MM_HASH COUNT [batch]\n");
        return 2;
    }
    int count = atoi(argv[3]);
    struct rlimit rl = {8192, 8192};
    setrlimit(RLIMIT_NOFILE, &rl); /* room for the COUNT placeholder sockets */
    int *fds = calloc((size_t)count, sizeof *fds), *ports = calloc((size_t)count, sizeof *ports);
    for (int i = 0; i < count; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) ||
            getsockname(fds[i], (struct sockaddr *)&a, &al)) {
            perror("placeholder socket");
            return 1;
        }
        ports[i] = ntohs(a.sin_port);
    }
    int base_fds = open_fds();
    ecx_config cfg;
    ecxt_config_v1(&cfg);
    cfg.role = ECX_ROLE_CONSUMER;
    cfg.block_bytes = 65536;
    cfg.region_bytes = 64 << 20;
    cfg.ack_timeout_ms = batch ? 10000 : 300;
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) {
        fprintf(stderr, "ecx_new: %s\n", ecx_strerror(rc));
        return 1;
    }
    int reason, local = 0, max_fds = 0, pending = 0, st = ECX_FETCH_PENDING;
    double live_s = -1, t0 = now_s();
    char hash[32], ann[160];
    for (int i = 0; i < count; i++) {
        snprintf(hash, sizeof hash, "dead%05d", i);
        snprintf(ann, sizeof ann,
                 "{\"peer_host\":\"127.0.0.1\",\"peer_port\":%d,\"size_bytes\":1000,\"metadata\":{}}",
                 ports[i]);
        if (ecx_fetch(ctx, hash, ann, 0, &reason) == ECX_FETCH_LOCAL) local++;
        if (i % 50 == 49) ecx_poll(ctx, 1);
        int n = open_fds();
        if (n > max_fds) max_fds = n;
    }
    if (batch) { /* the live item, in the same batch: it must not wait on the dead */
        double end = now_s() + BATCH_LIVE_S;
        t0 = now_s();
        while ((st = ecx_fetch(ctx, argv[2], argv[1], 0, &reason)) == ECX_FETCH_PENDING &&
               now_s() < end)
            ecx_poll(ctx, 10);
        live_s = now_s() - t0;
        if (st != ECX_FETCH_READY) {
            fprintf(stderr, "the live item in the batch: %s after %.2f s\n",
                    st == ECX_FETCH_LOCAL ? ecx_reason_name(reason) : "still pending", live_s);
            live_s = BATCH_LIVE_S; /* a failure below */
        }
    }
    /* Every dead item falls back within its ack timeout; ask until then. */
    double end = now_s() + 30;
    do {
        ecx_poll(ctx, 10);
        pending = 0;
        for (int i = 0; i < count; i++) {
            snprintf(hash, sizeof hash, "dead%05d", i);
            int st = ecx_fetch(ctx, hash, NULL, 0, &reason);
            if (st == ECX_FETCH_PENDING) pending++;
            if (st == ECX_FETCH_READY) {
                fprintf(stderr, "a dead producer's item is ready?\n");
                return 1;
            }
        }
        int n = open_fds();
        if (n > max_fds) max_fds = n;
    } while (pending && now_s() < end);
    /* The live producer (again, in batch mode: its answer is cached). */
    end = now_s() + 10;
    while ((st = ecx_fetch(ctx, argv[2], argv[1], 0, &reason)) == ECX_FETCH_PENDING &&
           now_s() < end)
        ecx_poll(ctx, 10);
    static char out[4 << 20];
    int64_t got = st == ECX_FETCH_READY ? ecx_read(ctx, argv[2], out, sizeof out) : -1;
    printf("dead=%d fell_back_at_once=%d still_pending=%d fds_before=%d max_fds_added=%d "
           "live=%s bytes=%lld live_s=%.2f\n",
           count, local, pending, base_fds, max_fds - base_fds,
           st == ECX_FETCH_READY ? "ready" : st == ECX_FETCH_LOCAL ? ecx_reason_name(reason) : "pending",
           (long long)got, live_s);
    ecx_free(ctx);
    for (int i = 0; i < count; i++)
        close(fds[i]);
    free(fds), free(ports);
    /* Sessions are capped (256): a few descriptors each, never one per producer. */
    return pending == 0 && st == ECX_FETCH_READY && got > 0 && max_fds - base_fds < 1500 &&
                   (!batch || live_s < BATCH_LIVE_S)
               ? 0
               : 1;
}
