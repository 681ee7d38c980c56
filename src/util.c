/* SPDX-License-Identifier: Apache-2.0 */
/* util — logging, UTF-8 validation and hex helpers shared by every layer. */
#include "util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ecx.h"

/* The log level and the logger are process-wide (ecx.h): the level is read
 * on every would-be line, so it is an atomic; the sink is swapped and called
 * under one mutex, so a logger never runs twice at once. */
static _Atomic int log_level = -1;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static ecx_log_fn log_fn;
static void *log_arg;

int ecxi_log_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l >= 0) return l;
    const char *e = getenv("ECX_LOG");
    static const char *names[] = {"error", "warn", "info", "debug"};
    int want = ECX_LOG_WARN;
    for (int i = 0; e && i < 4; i++)
        if (strcasecmp(e, names[i]) == 0) want = i;
    /* A level set by ecx_set_log_level meanwhile wins over the environment. */
    atomic_compare_exchange_strong(&log_level, &l, want);
    return atomic_load(&log_level);
}

void ecx_set_log_level(int level)
{
    atomic_store(&log_level, level < ECX_LOG_ERROR ? ECX_LOG_ERROR
                             : level > ECX_LOG_DEBUG ? ECX_LOG_DEBUG
                                                     : level);
}

void ecx_set_logger(ecx_log_fn fn, void *arg)
{
    pthread_mutex_lock(&log_mu);
    log_fn = fn, log_arg = arg;
    pthread_mutex_unlock(&log_mu);
}

void ecxi_log(int level, const char *fmt, ...)
{
    static const char *tags[] = {"error", "warn", "info", "debug"};
    if (level > ecxi_log_level()) return;
    if (level < ECX_LOG_ERROR) level = ECX_LOG_ERROR;
    if (level > ECX_LOG_DEBUG) level = ECX_LOG_DEBUG;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    if (log_fn)
        log_fn(log_arg, level, line);
    else
        fprintf(stderr, "ecx %s: %s\n", tags[level], line);
    pthread_mutex_unlock(&log_mu);
}

int64_t ecxi_now_ms(const ecxi_clock *c)
{
    if (c && c->now_ms) return c->now_ms(c->arg);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ecxi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Every call site's limiter is process-wide (a static in the macro), and
 * the contexts' threads reach the same sites: one lock for them all. It is
 * taken only on a path that is about to log, held for a few compares. */
static pthread_mutex_t ratelimit_mu = PTHREAD_MUTEX_INITIALIZER;

bool ecxi_ratelimit_allow(ecxi_ratelimit *rl, uint32_t burst, uint64_t *dropped)
{
    int64_t now = ecxi_now_ms(NULL);
    bool ok = false;
    pthread_mutex_lock(&ratelimit_mu);
    if (now - rl->window_start_ms >= 1000) {
        rl->window_start_ms = now;
        rl->in_window = 0;
    }
    if (rl->in_window >= burst) {
        rl->dropped++;
    } else {
        rl->in_window++;
        *dropped = rl->dropped;
        rl->dropped = 0;
        ok = true;
    }
    pthread_mutex_unlock(&ratelimit_mu);
    return ok;
}

size_t ecxi_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c, min;
    if (b >= 0xc2 && b <= 0xdf) {
        len = 2, c = b & 0x1f, min = 0x80;
    } else if (b >= 0xe0 && b <= 0xef) {
        len = 3, c = b & 0x0f, min = 0x800;
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4, c = b & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
    *cp = c;
    return len;
}

/* True if p[0..n) is all ASCII: 16 bytes a step, the tail as one load
 * that overlaps what was already seen. */
static bool all_ascii(const uint8_t *p, size_t n)
{
    const uint64_t high = 0x8080808080808080ull;
    uint64_t acc = 0, a, b;
    if (n < 8) {
        for (size_t i = 0; i < n; i++)
            acc |= p[i];
        return !(acc & 0x80);
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(&a, p + i, 8);
        memcpy(&b, p + i + 8, 8);
        acc |= a | b;
    }
    if (i + 8 <= n) {
        memcpy(&a, p + i, 8);
        acc |= a;
    }
    memcpy(&a, p + n - 8, 8);
    return !((acc | a) & high);
}

bool ecxi_utf8_valid(const void *s, size_t n)
{
    const uint8_t *p = s;
    /* mm_hash and session ids are all ASCII: settle those in one pass. */
    if (all_ascii(p, n)) return true;
    while (n) {
        /* ASCII runs 8 bytes at a time. */
        uint64_t w;
        if (n >= 8 && (memcpy(&w, p, 8), !(w & 0x8080808080808080ull))) {
            p += 8, n -= 8;
            continue;
        }
        if (*p < 0x80) {
            p++, n--;
            continue;
        }
        uint32_t cp;
        size_t k = ecxi_utf8_next(p, n, &cp);
        if (k == 0) return false;
        p += k, n -= k;
    }
    return true;
}

void ecxi_hex_encode(const void *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

long ecxi_hex_decode(const char *hex, size_t len, uint8_t *out)
{
    if (len % 2) return ECX_EINVAL;
    for (size_t i = 0; i < len / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return ECX_EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return (long)(len / 2);
}

int ecxi_grow(void *pp, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *m = realloc(*(void **)pp, c * elem);
    if (!m) return ECX_ENOMEM;
    *(void **)pp = m, *cap = c;
    return 0;
}
