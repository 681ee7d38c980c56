/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_nixl_format — src/data/nixl/nixl_format.c against blobs the real nixl package
 * wrote at test time (tests/nixl/nixl_blobs.py, run by
 * tests/shell/test_nixl_format.sh under a python with nixl; each argument is one
 * such JSON file):
 *   - every agent metadata parses, to the name and ranges the agent was
 *     given, and our encoder writes back the very same bytes;
 *   - every proper prefix of it, and every one-byte mutation of it, either
 *     is refused (ECX_EDATA_META) or parses to something our encoder
 *     writes back identically (never a crash: the sanitizer build runs
 *     this too); the length fields set to huge values are refused;
 *   - every vLLM mem_descriptor (msgspec's bytes) parses to its blocks, and
 *     our encoder writes msgspec's bytes exactly; prefixes are refused;
 *   - the notification codec round-trips and refuses what NIXL would not
 *     write.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nixl_format.h"

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static uint8_t *unhex(const char *h, size_t *n)
{
    size_t k = strlen(h) / 2;
    uint8_t *b = malloc(k ? k : 1);
    for (size_t i = 0; i < k; i++) {
        char two[3] = {h[2 * i], h[2 * i + 1], 0};
        b[i] = (uint8_t)strtoul(two, NULL, 16);
    }
    *n = k;
    return b;
}

/* Decode; if it succeeds, our encoder must write back exactly what a
 * one-section agent would (a decode of that must give the same fields). */
static int decode_reencode(const uint8_t *b, size_t n)
{
    ecxi_nixl_meta m, m2;
    int rc = ecxi_nixl_meta_decode(b, n, &m);
    if (rc) return rc;
    static uint8_t out[ECXI_NIXL_META_MAX];
    long k = ecxi_nixl_meta_encode(&m, out, sizeof out);
    CHECK(k > 0, "re-encode %ld", k);
    if (k <= 0) return 0;
    CHECK(ecxi_nixl_meta_decode(out, (size_t)k, &m2) == 0, "decode of our own encoding");
    CHECK(m.nregs == m2.nregs && m.name_len == m2.name_len &&
              m.ucx_addr_len == m2.ucx_addr_len && !memcmp(m.name, m2.name, m.name_len),
          "fields differ after a round trip");
    return 0;
}

static void check_meta(json_t *c)
{
    size_t n;
    uint8_t *b = unhex(json_string_value(json_object_get(c, "hex")), &n);
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *ranges = json_object_get(c, "ranges");
    ecxi_nixl_meta m;
    int rc = ecxi_nixl_meta_decode(b, n, &m);
    CHECK(rc == 0, "real metadata of %s refused (%d)", name, rc);
    if (rc) {
        free(b);
        return;
    }
    CHECK(m.name_len == strlen(name) && !memcmp(m.name, name, m.name_len), "name");
    CHECK(m.nregs == json_array_size(ranges), "%zu ranges, want %zu", m.nregs,
          json_array_size(ranges));
    for (size_t i = 0; i < m.nregs && i < json_array_size(ranges); i++) {
        json_t *r = json_array_get(ranges, i);
        uint64_t a = (uint64_t)json_integer_value(json_array_get(r, 0));
        uint64_t l = (uint64_t)json_integer_value(json_array_get(r, 1));
        CHECK(m.regs[i].addr == a && m.regs[i].len == l && m.regs[i].dev_id == 0,
              "range %zu: %#llx+%llu", i, (unsigned long long)m.regs[i].addr,
              (unsigned long long)m.regs[i].len);
        CHECK(m.regs[i].rkey_len > 0, "empty rkey");
        CHECK(ecxi_nixl_meta_covers(&m, a, l) && !ecxi_nixl_meta_covers(&m, a, l + 1) &&
                  !ecxi_nixl_meta_covers(&m, a - 1, 1),
              "covers");
    }
    size_t nregs = m.nregs;
    static uint8_t out[ECXI_NIXL_META_MAX];
    long k = ecxi_nixl_meta_encode(&m, out, sizeof out);
    CHECK(k == (long)n && !memcmp(out, b, n), "our encoding differs from nixl's (%ld vs %zu)", k,
          n);
    CHECK(ecxi_nixl_meta_encode(&m, out, n - 1) == ECX_ERANGE, "short buffer");

    /* Every proper prefix is refused. */
    for (size_t p = 0; p < n; p++)
        CHECK(ecxi_nixl_meta_decode(b, p, &m) == ECX_EDATA_META, "prefix %zu accepted", p);
    /* Every byte flipped: refused, or a well-formed blob that round-trips. */
    uint8_t *mut = malloc(n);
    size_t refused = 0;
    for (size_t p = 0; p < n; p++)
        for (int x = 0; x < 3; x++) {
            static const uint8_t flips[] = {0xff, 0x01, 0x80};
            memcpy(mut, b, n);
            mut[p] ^= flips[x];
            refused += decode_reencode(mut, n) == ECX_EDATA_META;
        }
    /* Every 8-byte window set to a huge value: refused or round-trips
     * (inside an address or rkey it is just bytes); as the name's length
     * it must be refused. */
    for (size_t p = 0; p + 8 <= n; p++) {
        memcpy(mut, b, n);
        memset(mut + p, 0xff, 8);
        decode_reencode(mut, n);
    }
    memcpy(mut, b, n);
    memset(mut + 16, 0xff, 8); /* "nixlSerDes|Agent" | u64 len */
    CHECK(decode_reencode(mut, n) == ECX_EDATA_META, "huge name length accepted");
    printf("meta %s: %zu bytes, %zu ranges; prefixes refused; %zu of %zu mutations refused, "
           "the rest round-trip\n",
           name, n, nregs, refused, 3 * n);
    CHECK(refused > n / 2, "too few mutations refused");
    free(mut);
    free(b);
}

static void check_desc(json_t *c)
{
    size_t n;
    uint8_t *b = unhex(json_string_value(json_object_get(c, "hex")), &n);
    size_t cnt = 0;
    int rc = ecxi_nixl_desc_count(b, n, 1u << 20, &cnt);
    CHECK(rc == 0, "real descriptor list refused (%d)", rc);
    if (rc) {
        free(b);
        return;
    }
    ecxi_nixl_block *blk = calloc(cnt, sizeof *blk), *want = calloc(cnt, sizeof *want);
    size_t got = 0;
    CHECK(ecxi_nixl_desc_decode(b, n, blk, cnt, &got) == 0 && got == cnt, "decode");
    json_t *list = json_object_get(c, "list");
    if (list) {
        CHECK(cnt == json_array_size(list), "count");
        for (size_t i = 0; i < cnt && i < json_array_size(list); i++) {
            json_t *t = json_array_get(list, i);
            /* decimal strings: jansson's integers stop at int64 */
            uint64_t v[3];
            for (int f = 0; f < 3; f++)
                v[f] = strtoull(json_string_value(json_array_get(t, (size_t)f)), NULL, 10);
            want[i] = (ecxi_nixl_block){v[0], v[1], v[2]};
        }
    } else {
        uint64_t base = (uint64_t)json_integer_value(json_object_get(c, "base"));
        uint64_t bs = (uint64_t)json_integer_value(json_object_get(c, "block"));
        CHECK(cnt == (size_t)json_integer_value(json_object_get(c, "n")), "count");
        for (size_t i = 0; i < cnt; i++)
            want[i] = (ecxi_nixl_block){base + i * bs, bs, 0};
    }
    CHECK(!memcmp(blk, want, cnt * sizeof *blk), "blocks differ");
    size_t cap = ecxi_nixl_desc_size(cnt);
    uint8_t *out = malloc(cap);
    long k = ecxi_nixl_desc_encode(want, cnt, out, cap);
    CHECK(k == (long)n && !memcmp(out, b, n), "our encoding differs from msgspec's");
    CHECK(ecxi_nixl_desc_count(b, n, cnt - 1, &got) == ECX_EDATA_DESC || cnt == 0, "max blocks");
    size_t step = n > 4096 ? n / 509 : 1; /* every prefix of the small, a spread of the big */
    for (size_t p = 0; p < n; p += step)
        CHECK(ecxi_nixl_desc_count(b, p, 1u << 20, &got) == ECX_EDATA_DESC, "prefix %zu", p);
    printf("desc: %zu bytes, %zu blocks, byte-identical\n", n, cnt);
    free(out);
    free(blk);
    free(want);
    free(b);
}

static void check_notif(void)
{
    uint8_t b[2048];
    const char *name, *msg;
    size_t nl, ml;
    long k = ecxi_nixl_notif_encode("cons", 4, "s9:mmhash", 9, b, sizeof b);
    /* What a nixl 1.5.1 agent sent us (captured from its active message). */
    static const char real[] = "nixlSerDes|name\x04\0\0\0\0\0\0\0cons|msg\x09\0\0\0\0\0\0\0s9:mmhash|";
    CHECK(k == (long)sizeof real - 1 && !memcmp(b, real, (size_t)k), "notification bytes");
    CHECK(ecxi_nixl_notif_decode(b, (size_t)k, &name, &nl, &msg, &ml) == 0 && nl == 4 && ml == 9 &&
              !memcmp(msg, "s9:mmhash", 9),
          "notification decode");
    for (long p = 0; p < k; p++)
        CHECK(ecxi_nixl_notif_decode(b, (size_t)p, &name, &nl, &msg, &ml) == ECX_EDATA_NOTIF,
              "notif prefix %ld", p);
    b[k - 1] = 'x';
    CHECK(ecxi_nixl_notif_decode(b, (size_t)k, &name, &nl, &msg, &ml) == ECX_EDATA_NOTIF,
          "missing '|'");
    CHECK(ecxi_nixl_notif_encode("c", 1, "", 0, b, sizeof b) == ECX_EINVAL, "empty text");
}

int main(int argc, char **argv)
{
    ecx_set_log_level(ECX_LOG_ERROR); /* the refusals are expected */
    check_notif();
    for (int i = 1; i < argc; i++) {
        json_error_t err;
        json_t *j = json_load_file(argv[i], 0, &err);
        if (!j) {
            fprintf(stderr, "%s: %s\n", argv[i], err.text);
            return 1;
        }
        size_t k;
        json_t *c;
        json_array_foreach(json_object_get(j, "meta"), k, c) check_meta(c);
        json_array_foreach(json_object_get(j, "desc"), k, c) check_desc(c);
        json_decref(j);
    }
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("ok\n");
    return failures != 0;
}
