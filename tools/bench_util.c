/* SPDX-License-Identifier: Apache-2.0 */
/* bench_util — helpers the bench subcommands share; see bench_util.h. */
#include "bench_util.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PATTERN_MUL 0x9e3779b97f4a7c15ull

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t bench_blocks_of(uint64_t bytes, uint64_t bs)
{
    return (bytes + bs - 1) / bs * bs;
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Byte k of an item whose whole words end at `full`. */
static uint8_t byte_at(uint64_t k, uint64_t full)
{
    if (k >= full) return (uint8_t)k;
    uint64_t w = (k / 8 + 1) * PATTERN_MUL;
    uint8_t b[8];
    memcpy(b, &w, 8); /* the word as memory holds it */
    return b[k % 8];
}

void bench_fill(uint8_t *dst, uint64_t off, uint64_t len, uint64_t total)
{
    uint64_t full = total / 8 * 8, k = off, end = off + len;
    for (; k < end && k % 8; k++)
        dst[k - off] = byte_at(k, full);
    for (; k + 8 <= end && k + 8 <= full; k += 8) {
        uint64_t w = (k / 8 + 1) * PATTERN_MUL;
        memcpy(dst + (k - off), &w, 8);
    }
    for (; k < end; k++)
        dst[k - off] = byte_at(k, full);
}

bool bench_check(const uint8_t *p, uint64_t off, uint64_t len, uint64_t total)
{
    uint64_t full = total / 8 * 8, k = off, end = off + len;
    for (; k < end && k % 8; k++)
        if (p[k - off] != byte_at(k, full)) return false;
    for (; k + 8 <= end && k + 8 <= full; k += 8) {
        uint64_t w = (k / 8 + 1) * PATTERN_MUL, got;
        memcpy(&got, p + (k - off), 8);
        if (got != w) return false;
    }
    for (; k < end; k++)
        if (p[k - off] != byte_at(k, full)) return false;
    return true;
}

double bench_time_memcpy(uint8_t *dst, const uint8_t *src, uint64_t size)
{
    memset(dst, 0x5a, size);
    uint64_t t0 = bench_now_ns();
    memcpy(dst, src, size);
    __asm__ __volatile__("" ::"r"(dst) : "memory");
    return (double)(bench_now_ns() - t0) / 1e9;
}

int bench_io_all(int fd, void *b, size_t n, bool wr)
{
    uint8_t *p = b;
    while (n) {
        ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

int bench_raw_serve(int c, const uint8_t *content, uint64_t max)
{
    uint64_t size;
    while (bench_io_all(c, &size, sizeof size, false) == 0) {
        if (size == 0 || size > max) {
            fprintf(stderr, "raw TCP sender: asked for %llu bytes (most: %llu)\n",
                    (unsigned long long)size, (unsigned long long)max);
            return 1;
        }
        if (bench_io_all(c, (void *)content, size, true)) break; /* the peer went away */
    }
    return 0;
}

static int raw_sender(int lfd, const uint8_t *content, uint64_t max)
{
    int c = accept(lfd, NULL, NULL);
    close(lfd);
    if (c < 0) return 1;
    int rc = bench_raw_serve(c, content, max);
    close(c);
    return rc;
}

int bench_raw_tcp_open(bench_raw_tcp *r, const uint8_t *content, uint64_t max)
{
    r->fd = r->pid = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &al)) {
        if (lfd >= 0) close(lfd);
        return -1;
    }
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) _exit(raw_sender(lfd, content, max));
    close(lfd);
    r->pid = pid;
    if (pid < 0 || (r->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(r->fd, (struct sockaddr *)&a, sizeof a)) {
        bench_raw_tcp_close(r);
        return -1;
    }
    setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

double bench_raw_tcp_once(bench_raw_tcp *r, uint8_t *dst, const uint8_t *expect, uint64_t size)
{
    memset(dst, 0x5a, size);
    uint64_t t0 = bench_now_ns();
    if (bench_io_all(r->fd, &size, sizeof size, true) || bench_io_all(r->fd, dst, size, false))
        return -1;
    double t = (double)(bench_now_ns() - t0) / 1e9;
    if (memcmp(dst, expect, size) != 0) {
        fprintf(stderr, "bench: raw TCP delivered wrong bytes\n");
        return -1;
    }
    return t;
}

void bench_raw_tcp_close(bench_raw_tcp *r)
{
    if (r->fd >= 0) close(r->fd); /* the sender reads EOF and exits */
    if (r->pid > 0) waitpid(r->pid, NULL, 0);
    r->fd = r->pid = -1;
}
