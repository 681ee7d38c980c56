/* SPDX-License-Identifier: Apache-2.0 */
/* bench_util — helpers the bench subcommands share; see bench_util.h. */
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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
