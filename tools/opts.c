/* SPDX-License-Identifier: Apache-2.0 */
/* opts — shared option parsing and synthetic content; see opts.h. */
#include "opts.h"

#include <errno.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ecx: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

int parse_size(const char *opt, const char *s, uint64_t *out)
{
    if (!parse_size_quiet(s, out)) return 0;
    fprintf(stderr, "ecx: %s: '%s' is not a size (e.g. 4096, 64Ki, 4.7M, 1Gi; fractions must "
            "come to whole bytes)\n", opt, s);
    return -1;
}

int parse_size_quiet(const char *s, uint64_t *out)
{
    const char *p = s;
    uint64_t whole = 0, frac = 0, frac_div = 1;
    bool digits = false;
    for (; *p >= '0' && *p <= '9'; p++, digits = true) {
        if (whole > (UINT64_MAX - 9) / 10) goto bad;
        whole = whole * 10 + (uint64_t)(*p - '0');
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits = true) {
            if (frac_div > UINT64_MAX / 100) goto bad;
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_div *= 10;
        }
    }
    if (!digits) goto bad;
    uint64_t mult = 1;
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"K", 1000ull},
                 {"M", 1000000ull},
                 {"G", 1000000000ull},
                 {"T", 1000000000000ull},
                 {"Ki", 1ull << 10},
                 {"Mi", 1ull << 20},
                 {"Gi", 1ull << 30},
                 {"Ti", 1ull << 40}};
    size_t u = 0;
    for (; u < sizeof units / sizeof *units; u++)
        if (!strcmp(p, units[u].suffix)) break;
    if (u == sizeof units / sizeof *units) goto bad;
    mult = units[u].mult;
    if (whole > UINT64_MAX / mult) goto bad;
    /* frac / frac_div * mult must be a whole number of bytes. */
    if (frac > UINT64_MAX / mult || (frac * mult) % frac_div) goto bad;
    uint64_t v = whole * mult + frac * mult / frac_div;
    if (v < whole * mult) goto bad;
    *out = v;
    return 0;
bad:
    return -1;
}

int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || (*s != '-' && (*s < '0' || *s > '9')) || v < lo || v > hi) {
        fprintf(stderr, "ecx: %s: '%s' is not an integer in %lld..%lld\n", opt, s, (long long)lo,
                (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int common_opt(int c, const char *arg, ecx_config *cfg, bool *region_given)
{
    switch (c) {
    case OPT_BLOCK_BYTES:
        if (parse_size("--block-bytes", arg, &cfg->block_bytes)) return -1;
        if (cfg->block_bytes == 0) {
            fprintf(stderr, "ecx: --block-bytes must be at least 1\n");
            return -1;
        }
        return 1;
    case OPT_REGION_BYTES:
        if (region_given) *region_given = true;
        return parse_size("--region-bytes", arg, &cfg->region_bytes) ? -1 : 1;
    case OPT_VLLM_VERSION: cfg->vllm_version = arg; return 1;
    case OPT_MODEL: cfg->model = arg; return 1;
    case OPT_DTYPE:
        if (!ecx_dtype_name(arg)) {
            fprintf(stderr, "ecx: --dtype '%s' is not one ecx knows; accepted: %s\n", arg,
                    ecx_dtype_names());
            return -1;
        }
        cfg->dtype = arg;
        return 1;
    case OPT_CONNECTOR_VERSION: {
        int64_t v;
        if (parse_int("--connector-version", arg, 0, ECX_CONNECTOR_VERSION_MAX, &v)) return -1;
        cfg->connector_version = (int)v;
        return 1;
    }
    case OPT_DATA:
        if (!data_path_ok(arg)) {
            fprintf(stderr, "ecx: --data takes one of %s, not '%s'\n", ECX_DATA_PATHS, arg);
            return -1;
        }
        cfg->data = arg;
        return 1;
    }
    return 0;
}

bool data_path_ok(const char *s)
{
    static const char all[] = ECX_DATA_PATHS;
    size_t n = strlen(s);
    for (const char *p = all; n && (p = strstr(p, s)); p += n)
        if ((p == all || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

int common_finish(ecx_config *cfg)
{
    int spoken = ecx_protocol_version_of(cfg->vllm_version);
    if (cfg->connector_version == 0) cfg->connector_version = spoken;
    if (cfg->connector_version == 1 && spoken == 2) {
        fprintf(stderr, "ecx: --vllm-version %s speaks protocol version 2, not the "
                "--connector-version 1 given: drop --connector-version, or give 2\n",
                cfg->vllm_version);
        return -1;
    }
    return 0;
}

int whole_blocks_ok(const char *opt, const ecx_config *cfg, uint64_t bytes)
{
    if (cfg->connector_version != 2 || !cfg->block_bytes || bytes % cfg->block_bytes == 0)
        return 0;
    uint64_t b = (bytes + cfg->block_bytes - 1) / cfg->block_bytes;
    fprintf(stderr, "ecx: %s: %llu bytes are not whole blocks of %llu: protocol version 2 "
            "(--vllm-version %s) stores whole rows; give %llu (%llu blocks), or "
            "--vllm-version 0.31.0 for version 1\n", opt, (unsigned long long)bytes,
            (unsigned long long)cfg->block_bytes, cfg->vllm_version,
            (unsigned long long)(b * cfg->block_bytes), (unsigned long long)b);
    return -1;
}

void print_factors(const char *who, const ecx_config *cfg)
{
    const char *dt = ecx_dtype_name(cfg->dtype);
    char h[ECX_COMPAT_HASH_HEX + 1] = "?";
    if (dt)
        ecx_compat_hash(cfg->vllm_version, strlen(cfg->vllm_version), cfg->model,
                        strlen(cfg->model), dt, strlen(dt), (int64_t)cfg->block_bytes, h);
    fprintf(stderr, "ecx: %s: vllm-version %s, model %s, dtype %s, block-bytes %llu, protocol "
            "version %d, compat hash %s\n", who, cfg->vllm_version, cfg->model, dt ? dt : "?",
            (unsigned long long)cfg->block_bytes, cfg->connector_version, h);
}

bool item_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > ECX_MM_HASH_MAX || !strcmp(s, ".") || !strcmp(s, "..")) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

void synthetic_hash(uint64_t i, uint64_t bytes, char out[65])
{
    char text[64];
    int n = snprintf(text, sizeof text, "ecx-synthetic:%llu:%llu", (unsigned long long)i,
                     (unsigned long long)bytes);
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)text, (unsigned long long)n);
    hex_encode(h, sizeof h, out);
}

uint64_t synthetic_seed(const char *mm_hash)
{
    uint8_t b[8];
    if (strlen(mm_hash) != 64 || hex_decode(mm_hash, 16, b) != 8) return 0;
    uint64_t s = 0;
    for (int i = 7; i >= 0; i--) s = s << 8 | b[i];
    return s;
}

static uint64_t splitmix64_at(uint64_t seed, uint64_t k)
{
    uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void synthetic_fill(const char *mm_hash, uint8_t *dst, uint64_t offset, size_t len)
{
    uint64_t seed = synthetic_seed(mm_hash);
    size_t i = 0;
    /* Head: bytes before the next 8-byte boundary. */
    while (i < len && (offset + i) % 8) {
        uint64_t w = splitmix64_at(seed, (offset + i) / 8);
        dst[i] = (uint8_t)(w >> (8 * ((offset + i) % 8)));
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = splitmix64_at(seed, (offset + i) / 8);
        for (int b = 0; b < 8; b++) dst[i + b] = (uint8_t)(w >> (8 * b));
    }
    for (; i < len; i++) {
        uint64_t w = splitmix64_at(seed, (offset + i) / 8);
        dst[i] = (uint8_t)(w >> (8 * ((offset + i) % 8)));
    }
}

void hex_encode(const void *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

long hex_decode(const char *hex, size_t len, uint8_t *out)
{
    if (len % 2) return -1;
    for (size_t i = 0; i < len; i += 2) {
        int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return (long)(len / 2);
}

int parse_host_port(const char *addr, char host[256], int *port)
{
    if (!addr) return -1;
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr) return -1;
    const char *h = addr, *hend = colon;
    if (addr[0] == '[') { /* [v6]:port */
        if (hend[-1] != ']') return -1;
        h++, hend--;
    } else if (memchr(addr, ':', (size_t)(colon - addr))) {
        return -1; /* a bare v6 address needs brackets when a port follows */
    }
    size_t hl = hend > h ? (size_t)(hend - h) : 0;
    if (hl == 0 || hl > 255) return -1;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end || errno || p < 0 || p > 65535) return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *shm_dir(void)
{
    const char *d = getenv("ECX_SHM_DIR");
    return d && *d ? d : "/dev/shm";
}
