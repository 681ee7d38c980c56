/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util — small helpers every layer uses: logging, UTF-8 validation, hex.
 *
 * Logging writes one line per event to the logger set with ecx_set_logger()
 * (default: stderr with a level prefix). The level is ecx_set_log_level()'s,
 * else ECX_LOG's (error, warn, info, debug; default warn). Anything a peer
 * can trigger must go through ECXI_LOG_RATELIMITED so a hostile peer cannot
 * flood the log.
 */
#ifndef ECXI_UTIL_H
#define ECXI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

#include "ecx.h" /* the log levels and the logger hook are public */


int ecxi_log_level(void);
void ecxi_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log at most `burst` lines per second from one call site (anything a peer
 * can trigger), and say how many were suppressed when it resumes. A call
 * site's limit is shared by every context and thread of the process
 * (ecxi_ratelimit_allow serialises them). */
#define ECXI_LOG_RATELIMITED(level, ...)                                                            \
    do {                                                                                           \
        static ecxi_ratelimit rl_;                                                                 \
        if (ecxi_log_level() >= (level)) {                                                         \
            uint64_t dropped_;                                                                     \
            if (ecxi_ratelimit_allow(&rl_, 5, &dropped_)) {                                        \
                if (dropped_) ecxi_log(level, "(%llu similar lines suppressed)",                  \
                                      (unsigned long long)dropped_);                              \
                ecxi_log(level, __VA_ARGS__);                                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)

typedef struct ecxi_ratelimit {
    int64_t window_start_ms;
    uint32_t in_window;
    uint64_t dropped;
} ecxi_ratelimit;

/* True if another event may be logged in this one-second window. When it
 * returns true, *dropped is how many were refused since the last allowed. */
bool ecxi_ratelimit_allow(ecxi_ratelimit *rl, uint32_t burst, uint64_t *dropped);

/* A clock in milliseconds. Sessions take one so tests can drive timeouts
 * with a fake clock; NULL (or a NULL now_ms) means CLOCK_MONOTONIC. */
typedef struct ecxi_clock {
    int64_t (*now_ms)(void *arg);
    void *arg;
} ecxi_clock;

int64_t ecxi_now_ms(const ecxi_clock *c);

/* CLOCK_MONOTONIC in nanoseconds: what time budgets (a poll's, a
 * data-plane slice's) are measured with. */
int64_t ecxi_now_ns(void);

/* True if the n bytes at s are well-formed UTF-8 (no overlongs, no
 * surrogates, nothing above U+10FFFF), as Python's strict decoder wants. */
bool ecxi_utf8_valid(const void *s, size_t n);

/* Decode one code point from s[0..n); returns bytes consumed (1..4) or 0 if
 * the sequence is not well-formed UTF-8. */
size_t ecxi_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Lowercase hex of n bytes into out (2n chars + NUL). */
void ecxi_hex_encode(const void *in, size_t n, char *out);

/* Grow the array *pp of *cap elements of elem bytes to hold need (doubling;
 * ECX_ENOMEM on failure, *pp unchanged). */
int ecxi_grow(void *pp, size_t *cap, size_t need, size_t elem);

/* Parse 2n hex digits (either case) into n bytes. Returns the byte count or
 * ECX_EINVAL on an odd length or a non-hex digit. out must hold len/2 bytes. */
long ecxi_hex_decode(const char *hex, size_t len, uint8_t *out);

/* Little-endian fields of ecx's own data-plane formats, at any alignment
 * (one load or store each, not a byte loop: the producer encodes a
 * descriptor per grant). */
static inline void ecxi_put_le16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}
static inline void ecxi_put_le32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}
static inline void ecxi_put_le64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}
static inline uint16_t ecxi_get_le16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}
static inline uint32_t ecxi_get_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}
static inline uint64_t ecxi_get_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

#endif
