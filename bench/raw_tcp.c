/* SPDX-License-Identifier: Apache-2.0 */
/*
 * raw_tcp — plain TCP between two processes, the baseline for ecx's tcp
 * path between hosts (bench/tcp_vs_raw.sh runs it across two network
 * namespaces, or on loopback, beside `ecx serve` / `ecx get`):
 *
 *   raw_tcp serve HOST:PORT MAX_BYTES
 *       listen, take one connection, and answer each request (an 8-byte
 *       size, little-endian) with that many bytes of bench_util's content
 *       (bench_fill, whole words) in one blocking send loop; exit when the peer closes
 *       (or after 60 s with nobody connecting). Prints "listening" once
 *       ready.
 *   raw_tcp get HOST:PORT SIZE ROUNDS
 *       connect (TCP_NODELAY), then ROUNDS times: send SIZE, read the SIZE
 *       bytes with blocking reads straight into a warm buffer (timed: the
 *       request and the reads), check them (untimed). Prints
 *       "round=N ms=X" per round, then "raw_tcp: size=S rounds=R median_ms=X".
 *
 * No header, no checksum, no slices, no threads: the most one connection
 * moves. Exit 0, 1 on a failure (said on stderr), 2 on a usage error.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_ROUNDS 100000
#define MAX_SIZE (4ull << 30)
#define ACCEPT_WAIT_S 60

static int usage(void)
{
    fprintf(stderr, "usage: raw_tcp serve HOST:PORT MAX_BYTES\n"
                    "       raw_tcp get HOST:PORT SIZE ROUNDS\n");
    return 2;
}

/* HOST:PORT ([v6]:PORT too) resolved, numeric only; NULL after a message. */
static struct addrinfo *resolve(const char *spec, int passive)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    size_t hl = colon ? (size_t)(colon - spec) : 0;
    if (!colon || hl == 0 || hl >= sizeof host || !colon[1]) {
        fprintf(stderr, "raw_tcp: %s: not HOST:PORT\n", spec);
        return NULL;
    }
    memcpy(host, spec, hl);
    host[hl] = 0;
    char *h = host;
    if (h[0] == '[' && h[hl - 1] == ']') h[hl - 1] = 0, h++;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *ai;
    int rc = getaddrinfo(h, colon + 1, &hints, &ai);
    if (rc) {
        fprintf(stderr, "raw_tcp: %s: %s\n", spec, gai_strerror(rc));
        return NULL;
    }
    return ai;
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end || errno || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int serve(const char *spec, uint64_t max)
{
    uint64_t words = (max + 7) / 8 * 8; /* all whole words: any prefix is the same content */
    uint8_t *content = malloc(words);
    struct addrinfo *ai = resolve(spec, 1);
    if (!content || !ai) {
        if (!content) fprintf(stderr, "raw_tcp: cannot allocate %llu bytes\n", (unsigned long long)max);
        free(content);
        if (ai) freeaddrinfo(ai);
        return 1;
    }
    bench_fill(content, 0, words, words);
    int one = 1, lfd = socket(ai->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = ACCEPT_WAIT_S};
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
        bind(lfd, ai->ai_addr, ai->ai_addrlen) || listen(lfd, 1)) {
        fprintf(stderr, "raw_tcp: cannot listen on %s: %s\n", spec, strerror(errno));
        if (lfd >= 0) close(lfd);
        freeaddrinfo(ai);
        free(content);
        return 1;
    }
    freeaddrinfo(ai);
    printf("listening\n");
    fflush(stdout);
    int c = accept(lfd, NULL, NULL);
    close(lfd);
    if (c < 0) {
        fprintf(stderr, "raw_tcp: nobody connected: %s\n", strerror(errno));
        free(content);
        return 1;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = bench_raw_serve(c, content, max);
    close(c);
    free(content);
    return rc;
}

static int get(const char *spec, uint64_t size, int rounds)
{
    struct addrinfo *ai = resolve(spec, 0);
    uint8_t *dst = malloc(size);
    double *t = malloc((size_t)rounds * sizeof *t);
    int fd = -1, one = 1, rc = 1;
    if (!ai || !dst || !t) {
        if (ai) fprintf(stderr, "raw_tcp: cannot allocate %llu bytes\n", (unsigned long long)size);
        goto out;
    }
    memset(dst, 0x5a, size); /* warm, as ecx's region is after its first round */
    if ((fd = socket(ai->ai_family, SOCK_STREAM, 0)) < 0 ||
        connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "raw_tcp: cannot connect to %s: %s\n", spec, strerror(errno));
        goto out;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = bench_now_ns();
        if (bench_io_all(fd, &size, sizeof size, true) || bench_io_all(fd, dst, size, false)) {
            fprintf(stderr, "raw_tcp: round %d: connection lost\n", r + 1);
            goto out;
        }
        t[r] = (double)(bench_now_ns() - t0) / 1e6;
        if (!bench_check(dst, 0, size, (size + 7) / 8 * 8)) {
            fprintf(stderr, "raw_tcp: round %d: wrong bytes\n", r + 1);
            goto out;
        }
        printf("round=%d ms=%.3f\n", r + 1, t[r]);
        memset(dst, 0x5a, size);
    }
    printf("raw_tcp: size=%llu rounds=%d median_ms=%.3f\n", (unsigned long long)size, rounds,
           bench_median(t, rounds));
    rc = 0;
out:
    if (fd >= 0) close(fd);
    if (ai) freeaddrinfo(ai);
    free(dst);
    free(t);
    return rc;
}

int main(int argc, char **argv)
{
    uint64_t size, rounds;
    if (argc == 4 && !strcmp(argv[1], "serve")) {
        if (parse_u64(argv[3], 1, MAX_SIZE, &size)) return usage();
        return serve(argv[2], size);
    }
    if (argc == 5 && !strcmp(argv[1], "get")) {
        if (parse_u64(argv[3], 1, MAX_SIZE, &size) || parse_u64(argv[4], 1, MAX_ROUNDS, &rounds))
            return usage();
        return get(argv[2], size, (int)rounds);
    }
    return usage();
}
