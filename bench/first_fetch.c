/* SPDX-License-Identifier: Apache-2.0 */
/*
 * first_fetch — what an engine's calls pay on its first fetch from a
 * fresh consumer context, whose region its background thread has not
 * faulted in yet (issue 26, first row), through the public API and
 * libecx.so alone, so that one source built against two libraries
 * (bench/first_fetch_before_after.sh) compares them.
 *
 *   first_fetch [--size BYTES] [--data PATH]
 *
 * A producer context (PATH, default shm; a region of 2 x BYTES) saves one
 * item of BYTES (default 256000000: 31250 rows of 4096 bf16, whole blocks
 * of the default 8 KiB), then 1 s passes (its region is faulted in); then
 * a consumer context of 4 x BYTES is made and at once fetches the item as
 * an engine does: ecx_fetch_from() every 1 ms until READY (at most 30 s),
 * each call timed. Prints one line:
 *   size=B status=S longest_fetch_ms=X ready_ms=X calls=N
 * status 0 is READY (1 pending, 2 local, negative an error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ecx.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    uint64_t size = 256000000ull;
    const char *data = "shm";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else {
            fprintf(stderr, "usage: first_fetch [--size BYTES] [--data PATH]\n");
            return 2;
        }
    }
    if (!size) {
        fprintf(stderr, "first_fetch: --size must be at least 1\n");
        return 2;
    }
    ecx_config pc;
    ecx_config_init(&pc);
    pc.role = ECX_ROLE_PRODUCER;
    pc.data = data;
    pc.listen = "127.0.0.1:0";
    pc.region_bytes = 2 * size;
    ecx_ctx *p = NULL, *c = NULL;
    char *buf = malloc(size);
    int e = buf ? ecx_new(&pc, &p) : ECX_ENOMEM;
    if (!e) memset(buf, 7, size), e = ecx_save(p, "first-fetch-item", buf, size);
    free(buf);
    if (e) {
        fprintf(stderr, "first_fetch: producer: %s\n", ecx_strerror(e));
        ecx_free(p);
        return 1;
    }
    nanosleep(&(struct timespec){1, 0}, NULL);
    ecx_config cc;
    ecx_config_init(&cc);
    cc.role = ECX_ROLE_CONSUMER;
    cc.data = data;
    cc.region_bytes = 4 * size;
    if ((e = ecx_new(&cc, &c))) {
        fprintf(stderr, "first_fetch: consumer: %s\n", ecx_strerror(e));
        ecx_free(p);
        return 1;
    }
    ecx_announcement from = {.peer_host = "127.0.0.1", .peer_port = ecx_listen_port(p),
                             .size_bytes = size};
    double t0 = now_s(), worst = 0;
    int st, reason = 0, calls = 0;
    do {
        double a = now_s();
        st = ecx_fetch_from(c, "first-fetch-item", &from, size, &reason);
        if (now_s() - a > worst) worst = now_s() - a;
        calls++;
        if (st == ECX_FETCH_PENDING) nanosleep(&(struct timespec){0, 1000000}, NULL);
    } while (st == ECX_FETCH_PENDING && now_s() - t0 < 30);
    printf("size=%llu status=%d longest_fetch_ms=%.3f ready_ms=%.1f calls=%d\n",
           (unsigned long long)size, st, worst * 1e3, (now_s() - t0) * 1e3, calls);
    ecx_free(c);
    ecx_free(p);
    return st == ECX_FETCH_READY ? 0 : 1;
}
