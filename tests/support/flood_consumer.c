/* SPDX-License-Identifier: Apache-2.0 */
/* flood_consumer — a library consumer (the public API, one real process)
 * that asks a hostile producer for one item while it is slow: the producer
 * (tests/support/flood_peer.py) answers with a flood of acks nobody asked for, and
 * this consumer stalls for STALL_MS, longer than the control plane's
 * heartbeat timeout, either in the middle of reading them (its log callback
 * sleeps on the first ignored ack, as a consumer busy with each ack would)
 * or right after asking, before it reads any. Then it goes on polling: the hostile item must end
 * in a reason, and an item from a well-behaved producer (`ecx serve`, whose
 * announcement is GOOD_ANN) must still arrive. Prints one line of results,
 * the peak RSS among them. Every wait is bounded.
 *
 * Protocol version 1 on purpose (ecxt_config_v1; the good producer is `ecx
 * serve` with version 1's factors): the hostile item, announced as 1000 bytes
 * with no shape, must end in a reason within 30 s, on the 2 s ack timeout
 * if nothing else (version 2 retries an ack timeout for the 60 s per-item wait).
 *
 * usage: flood_consumer HOSTILE_PORT GOOD_ANN GOOD_HASH STALL_MS mid|between */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ecx.h"
#include "speak_v1.h"

static int stall_ms, stall_armed;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Print every line; sleep once, inside the read loop, on the first ack the
 * library ignores (mid mode). */
static void logger(void *arg, int level, const char *line)
{
    (void)arg;
    fprintf(stderr, "ecx %d: %s\n", level, line);
    if (stall_armed && strstr(line, "ignored an ack")) {
        stall_armed = 0;
        fprintf(stderr, "stalling %d ms in the read loop\n", stall_ms);
        sleep_ms(stall_ms);
    }
}

static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

/* Ask for hash until it is no longer pending (at most secs). */
static int fetch_until_done(ecx_ctx *ctx, const char *hash, const char *ann, double secs,
                            int *reason)
{
    int st;
    double end = now_s() + secs;
    while ((st = ecx_fetch(ctx, hash, ann, 0, reason)) == ECX_FETCH_PENDING && now_s() < end)
        ecx_poll(ctx, 10);
    return st;
}

static const char *state_name(int st, int reason)
{
    return st == ECX_FETCH_READY   ? "ready"
           : st == ECX_FETCH_LOCAL ? ecx_reason_name(reason)
                                   : "pending";
}

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[5], "mid") && strcmp(argv[5], "between"))) {
        fprintf(stderr, "usage: flood_consumer HOSTILE_PORT GOOD_ANN GOOD_HASH STALL_MS "
                        "mid|between\n");
        return 2;
    }
    stall_ms = atoi(argv[4]);
    bool mid = !strcmp(argv[5], "mid");
    ecx_set_logger(logger, NULL);
    ecx_set_log_level(ECX_LOG_INFO);
    ecx_config cfg;
    ecxt_config_v1(&cfg);
    cfg.role = ECX_ROLE_CONSUMER;
    cfg.block_bytes = 65536;
    cfg.region_bytes = 64 << 20;
    cfg.progress_thread = 0; /* the stall is this thread's */
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) {
        fprintf(stderr, "ecx_new: %s\n", ecx_strerror(rc));
        return 1;
    }
    char ann[200];
    snprintf(ann, sizeof ann,
             "{\"peer_host\":\"127.0.0.1\",\"peer_port\":%d,\"size_bytes\":1000,\"metadata\":{}}",
             atoi(argv[1]));
    int reason = 0, st;
    stall_armed = mid;
    st = ecx_fetch(ctx, "victim", ann, 0, &reason);
    if (!mid) { /* the request is on its way: stop before reading any ack */
        fprintf(stderr, "stalling %d ms before reading\n", stall_ms);
        sleep_ms(stall_ms);
    }
    double t0 = now_s();
    st = fetch_until_done(ctx, "victim", NULL, 30, &reason);
    double hostile_s = now_s() - t0;
    int hreason = reason;
    int gst = fetch_until_done(ctx, argv[3], argv[2], 15, &reason);
    char metrics[1 << 16];
    size_t mlen = 0;
    long floods = -1, stale = -1;
    if (!ecx_metrics(ctx, metrics, sizeof metrics, &mlen)) {
        const char *p = strstr(metrics, "\necx_consumer_ack_floods_total ");
        if (p) floods = atol(strchr(p + 1, ' '));
        if ((p = strstr(metrics, "\necx_consumer_stale_acks_total "))) stale = atol(strchr(p + 1, ' '));
    }
    printf("hostile=%s after=%.1fs good=%s ack_floods=%ld stale_acks=%ld peak_rss_kib=%ld\n",
           state_name(st, hreason), hostile_s, state_name(gst, reason), floods, stale,
           peak_rss_kib());
    ecx_free(ctx);
    return st != ECX_FETCH_PENDING && gst == ECX_FETCH_READY ? 0 : 1;
}
