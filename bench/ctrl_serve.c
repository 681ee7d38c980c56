/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrl_serve — the ecx producer as bench/ctrl_instr.sh measures it: a
 * producer context (public API, the same as `ecx serve` runs) holding COUNT
 * ready items of BYTES each, served (by the context's progress thread, or
 * by ecx_poll() without one) until SIGTERM or SIGINT.
 *
 * usage: ctrl_serve ANNOUNCE_OUT [COUNT [BYTES [BLOCK_BYTES]]]
 *   (defaults 32 items of 327680 bytes in 64 KiB blocks: 5 block indices
 *   per ack, as 4.7 MB items in 1 MiB blocks have)
 * Writes {mm_hash: announcement} to ANNOUNCE_OUT once listening (atomically,
 * `ecx bench ctrl --params` reads it) and, at exit, one line on stderr:
 *   ctrl_serve: requests=<n> grants=<n> regrants=<n> expired=<n>
 * mm_hash of item i: 64 hex characters, like a SHA-256 hex digest.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ecx.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* The value of the Prometheus counter NAME in text, or -1. */
static long long counter(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return atoll(p + n + 1);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: ctrl_serve ANNOUNCE_OUT [COUNT [BYTES [BLOCK_BYTES]]]\n");
        return 2;
    }
    const char *out = argv[1];
    int count = argc > 2 ? atoi(argv[2]) : 32;
    long long bytes = argc > 3 ? atoll(argv[3]) : 327680;
    long long block = argc > 4 ? atoll(argv[4]) : 65536;
    if (count < 1 || count > 100000 || bytes < 1 || block < 4096) {
        fprintf(stderr, "ctrl_serve: bad COUNT, BYTES or BLOCK_BYTES\n");
        return 2;
    }
    long long blocks_per = (bytes + block - 1) / block;
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_PRODUCER;
    cfg.listen = "127.0.0.1:0";
    cfg.block_bytes = (uint64_t)block;
    /* Four times what the items need: one connection may pin half the
     * region (ECX_DEFAULT_MAX_CONN_PIN_PCT), and the bench's one DEALER
     * holds a grant of every item. */
    cfg.region_bytes = (uint64_t)(blocks_per * count * 4) * (uint64_t)block;
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) {
        fprintf(stderr, "ctrl_serve: ecx_new: %s\n", ecx_strerror(rc));
        return 1;
    }
    uint8_t *content = calloc(1, (size_t)bytes);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!content || !f) {
        fprintf(stderr, "ctrl_serve: cannot write %s\n", tmp);
        return 1;
    }
    fputc('{', f);
    for (int i = 0; i < count; i++) {
        char hash[65], ann[512];
        size_t len;
        /* 64 hex characters, distinct per item. */
        snprintf(hash, sizeof hash, "%016llx%048x", 0x9e3779b97f4a7c15ull * (unsigned)(i + 1),
                 i);
        memcpy(content, &i, sizeof i); /* distinct content, distinct checksums */
        if ((rc = ecx_save(ctx, hash, content, (uint64_t)bytes)) ||
            (rc = ecx_announce(ctx, hash, ann, sizeof ann, &len))) {
            fprintf(stderr, "ctrl_serve: item %d: %s\n", i, ecx_strerror(rc));
            return 1;
        }
        fprintf(f, "%s\"%s\":%s", i ? "," : "", hash, ann);
    }
    fputs("}\n", f);
    free(content);
    if (fclose(f) || rename(tmp, out)) {
        fprintf(stderr, "ctrl_serve: cannot write %s\n", out);
        return 1;
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* A wait of at most 1 s: a signal between the flag test and the wait
     * costs one idle wake-up, not a hang. */
    while (!stop)
        ecx_poll(ctx, 1000);

    static char m[1 << 16];
    size_t ml;
    if (ecx_metrics(ctx, m, sizeof m, &ml) == 0)
        fprintf(stderr, "ctrl_serve: requests=%lld grants=%lld regrants=%lld expired=%lld\n",
                counter(m, "ecx_producer_requests_total"), counter(m, "ecx_producer_grants_total"),
                counter(m, "ecx_producer_regrants_total"),
                counter(m, "ecx_producer_expired_leases_total"));
    ecx_free(ctx);
    return 0;
}
