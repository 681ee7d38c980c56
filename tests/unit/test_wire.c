/* SPDX-License-Identifier: Apache-2.0 */
/* test_wire — the wire codec against the Python-made vectors, plus hostile
 * frames the vectors do not cover (huge claimed lengths, deep nesting,
 * every truncation of every valid frame). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"
#include "vectors.h"
#include "wire.h"
#include "wire_ref.h"

static uint8_t *unhex(const char *hex, size_t *len)
{
    size_t hl = strlen(hex);
    uint8_t *b = malloc(hl / 2 + 1);
    long n = ecxi_hex_decode(hex, hl, b);
    assert_true(n >= 0);
    *len = (size_t)n;
    return b;
}

static ecx_span jspan(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!v) return (ecx_span){NULL, 0};
    return (ecx_span){json_string_value(v), json_string_length(v)};
}

/* Encode a vector's "fields" with our encoder, as a peer of protocol
 * version `version`; returns lowercase hex. */
static char *encode_fields(json_t *f, int version)
{
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    const char *type = json_string_value(json_object_get(f, "type"));
    uint8_t *meta = NULL, *desc = NULL;
    int64_t *idx = NULL;
    int rc;
    if (!strcmp(type, "req")) {
        ecx_req r;
        ecx_req_init(&r);
        r.mm_hash = jspan(f, "mm_hash");
        r.compatibility_hash = jspan(f, "compatibility_hash");
        r.session_id = jspan(f, "session_id");
        json_t *v = json_object_get(f, "connector_version");
        if (v) r.connector_version = json_integer_value(v);
        rc = ecxi_wire_encode_req(&r, version, &buf);
    } else {
        ecx_ack a;
        ecx_ack_init(&a);
        a.mm_hash = jspan(f, "mm_hash");
        a.status = (int)json_integer_value(json_object_get(f, "status"));
        a.session_id = jspan(f, "session_id");
        json_t *list = json_object_get(f, "src_block_indices");
        if (list) {
            a.n_indices = json_array_size(list);
            idx = calloc(a.n_indices + 1, sizeof *idx);
            for (size_t i = 0; i < a.n_indices; i++)
                idx[i] = json_integer_value(json_array_get(list, i));
            a.indices = idx;
        }
        size_t n;
        if (json_object_get(f, "agent_metadata")) {
            meta = unhex(json_string_value(json_object_get(f, "agent_metadata")), &n);
            a.agent_metadata = (ecx_span){(char *)meta, n};
        }
        if (json_object_get(f, "mem_descriptor")) {
            desc = unhex(json_string_value(json_object_get(f, "mem_descriptor")), &n);
            a.mem_descriptor = (ecx_span){(char *)desc, n};
        }
        rc = ecxi_wire_encode_ack(&a, &buf);
    }
    assert_int_equal(rc, 0);
    char *hex = malloc(2 * buf.size + 1);
    ecxi_hex_encode(buf.data, buf.size, hex);
    msgpack_sbuffer_destroy(&buf);
    free(meta), free(desc), free(idx);
    return hex;
}

static bool span_eq(ecx_span s, const char *want)
{
    return s.n == strlen(want) && memcmp(s.p, want, s.n) == 0;
}

/* Every "encode" vector: our bytes equal msgspec's, and they decode back to
 * the same fields. */
static void test_encode_vectors(void **state)
{
    (void)state;
    json_t *v = load_vectors("wire.json");
    json_t *cases = json_object_get(v, "encode");
    assert_true(json_array_size(cases) >= 7);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        json_t *f = json_object_get(c, "fields");
        char *hex = encode_fields(f, ECX_CONNECTOR_VERSION);
        const char *want = json_string_value(json_object_get(c, "hex"));
        if (strcmp(hex, want))
            fail_msg("%s: got %s want %s", json_string_value(json_object_get(c, "name")), hex,
                     want);
        size_t len;
        uint8_t *frame = unhex(want, &len);
        if (!strcmp(json_string_value(json_object_get(f, "type")), "req")) {
            ecx_req r;
            assert_int_equal(ecx_wire_decode_req(frame, len, &r), 0);
            assert_true(span_eq(r.mm_hash, json_string_value(json_object_get(f, "mm_hash"))));
        } else {
            ecx_ack a;
            assert_int_equal(ecx_wire_decode_ack(frame, len, &a), 0);
            assert_int_equal(a.status, json_integer_value(json_object_get(f, "status")));
            json_t *list = json_object_get(f, "src_block_indices");
            assert_int_equal(a.n_indices, json_array_size(list));
            int64_t got[64];
            size_t n = ecx_wire_ack_indices(&a, got, 64);
            assert_int_equal(n, json_array_size(list));
            for (size_t k = 0; k < n; k++)
                assert_int_equal(got[k], json_integer_value(json_array_get(list, k)));
        }
        free(frame);
        free(hex);
    }
    json_decref(v);
}

/* wire_v2.json (tests/vectors/gen_wire_v2.py: msgspec and vLLM 0.34.0's
 * protocol.py): version-2 encodings byte for byte, and every request one
 * version's peer encodes as the other decodes it: the version it concludes. */
static void test_version_vectors(void **state)
{
    (void)state;
    json_t *v = load_vectors("wire_v2.json");
    json_t *cases = json_object_get(v, "encode");
    assert_true(json_array_size(cases) >= 6);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        json_t *f = json_object_get(c, "fields");
        int version = (int)json_integer_value(json_object_get(c, "version"));
        char *hex = encode_fields(f, version);
        const char *want = json_string_value(json_object_get(c, "hex"));
        if (strcmp(hex, want))
            fail_msg("%s: got %s want %s", json_string_value(json_object_get(c, "name")), hex,
                     want);
        size_t len;
        uint8_t *frame = unhex(want, &len);
        if (!strcmp(json_string_value(json_object_get(f, "type")), "req")) {
            ecx_req r;
            assert_int_equal(ecx_wire_decode_req_v(frame, len, version, &r), 0);
            assert_int_equal(r.connector_version,
                             json_integer_value(json_object_get(f, "connector_version")));
        }
        free(frame);
        free(hex);
    }
    cases = json_object_get(v, "cross");
    assert_true(json_array_size(cases) >= 16);
    json_array_foreach(cases, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        int enc = (int)json_integer_value(json_object_get(c, "encoder"));
        int dec = (int)json_integer_value(json_object_get(c, "decoder"));
        size_t len;
        uint8_t *frame = unhex(json_string_value(json_object_get(c, "hex")), &len);
        ecx_req r;
        assert_int_equal(ecx_wire_decode_req_v(frame, len, dec, &r), 0);
        if (r.connector_version != json_integer_value(json_object_get(c, "decoded_version")))
            fail_msg("%s: concluded version %lld", name, (long long)r.connector_version);
        /* What the producer of version dec answers: NACK_VERSION iff it differs. */
        assert_int_equal(r.connector_version != dec,
                         json_is_true(json_object_get(c, "nack_version")));
        /* And our encoder of version enc makes the same bytes. */
        r.connector_version = json_integer_value(json_object_get(c, "sent_version"));
        uint8_t out[512];
        size_t olen;
        assert_int_equal(ecx_wire_encode_req_v(&r, enc, out, sizeof out, &olen), 0);
        if (olen != len || memcmp(out, frame, len)) fail_msg("%s: our bytes differ", name);
        free(frame);
    }
    ecx_req r;
    uint8_t b[8];
    size_t n;
    ecx_req_init(&r);
    assert_int_equal(ecx_wire_encode_req_v(&r, 0, b, sizeof b, &n), ECX_EINVAL);
    assert_int_equal(ecx_wire_encode_req_v(&r, ECX_CONNECTOR_VERSION_MAX + 1, b, sizeof b, &n),
                     ECX_EINVAL);
    assert_int_equal(ecx_wire_decode_req_v(b, 0, 3, &r), ECX_EINVAL);
    json_decref(v);
}

static int decode_as(const char *as, const uint8_t *frame, size_t len)
{
    ecx_req r;
    ecx_ack a;
    return !strcmp(as, "req") ? ecx_wire_decode_req(frame, len, &r)
                              : ecx_wire_decode_ack(frame, len, &a);
}

static void test_decode_ok_vectors(void **state)
{
    (void)state;
    json_t *v = load_vectors("wire.json");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, "decode_ok"), i, c)
    {
        size_t len;
        uint8_t *frame = unhex(json_string_value(json_object_get(c, "hex")), &len);
        int rc = decode_as(json_string_value(json_object_get(c, "as")), frame, len);
        if (rc) fail_msg("%s: %s", json_string_value(json_object_get(c, "name")), ecx_strerror(rc));
        free(frame);
    }
    json_decref(v);
}

/* The specific code each reject vector must produce. */
static const struct {
    const char *name;
    int code;
} REJECT_CODES[] = {
    {"empty frame", ECX_EWIRE_EMPTY},
    {"not a map", ECX_EWIRE_NOT_MAP},
    {"wrong tag for req", ECX_EWIRE_TAG},
    {"missing mm_hash", ECX_EWIRE_MISSING},
    {"mm_hash not str", ECX_EWIRE_TYPE},
    {"version not int", ECX_EWIRE_TYPE},
    {"truncated", ECX_EWIRE_TRUNCATED},
    {"trailing bytes", ECX_EWIRE_TRAILING},
    {"invalid utf-8 in mm_hash", ECX_EWIRE_UTF8},
    {"nil session_id", ECX_EWIRE_TYPE},
    {"status out of enum", ECX_EWIRE_STATUS},
    {"status negative", ECX_EWIRE_STATUS},
    {"block index not int", ECX_EWIRE_TYPE},
    {"agent_metadata as str", ECX_EWIRE_TYPE},
    {"status missing", ECX_EWIRE_MISSING},
};

static void test_decode_reject_vectors(void **state)
{
    (void)state;
    json_t *v = load_vectors("wire.json");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, "decode_reject"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        size_t len;
        uint8_t *frame = unhex(json_string_value(json_object_get(c, "hex")), &len);
        int rc = decode_as(json_string_value(json_object_get(c, "as")), frame, len);
        int want = 0;
        for (size_t k = 0; k < sizeof REJECT_CODES / sizeof *REJECT_CODES; k++)
            if (!strcmp(name, REJECT_CODES[k].name)) want = REJECT_CODES[k].code;
        if (want == 0) fail_msg("reject vector '%s' has no expected code in this test", name);
        if (rc != want)
            fail_msg("%s: got %d (%s), want %d (%s)", name, rc, ecx_strerror(rc), want,
                     ecx_strerror(want));
        free(frame);
    }
    json_decref(v);
}

/* Field values the vectors do not pin: defaults and explicit fields. */
static void test_decode_fields(void **state)
{
    (void)state;
    /* {"mm_hash":"h","compatibility_hash":"c"}: defaults fill in. */
    const uint8_t req[] = {0x82, 0xa7, 'm', 'm', '_', 'h', 'a', 's', 'h', 0xa1, 'h',
                           0xb2, 'c',  'o', 'm', 'p', 'a', 't', 'i', 'b', 'i', 'l',
                           'i',  't',  'y', '_', 'h', 'a', 's', 'h', 0xa1, 'c'};
    ecx_req r;
    assert_int_equal(ecx_wire_decode_req(req, sizeof req, &r), 0);
    assert_true(span_eq(r.mm_hash, "h"));
    assert_true(span_eq(r.compatibility_hash, "c"));
    assert_int_equal(r.session_id.n, 0);
    assert_int_equal(r.connector_version, 1);
}

/* Build a req frame with extra bytes for one field's value. */
static size_t req_with_version(uint8_t *out, const uint8_t *val, size_t vlen)
{
    static const uint8_t head[] = {0x83, 0xa7, 'm', 'm', '_', 'h', 'a', 's', 'h', 0xa1, 'h',
                                   0xb2, 'c',  'o', 'm', 'p', 'a', 't', 'i', 'b', 'i', 'l',
                                   'i',  't',  'y', '_', 'h', 'a', 's', 'h', 0xa1, 'c', 0xb1,
                                   'c',  'o',  'n', 'n', 'e', 'c', 't', 'o', 'r', '_', 'v',
                                   'e',  'r',  's', 'i', 'o', 'n'};
    memcpy(out, head, sizeof head);
    memcpy(out + sizeof head, val, vlen);
    return sizeof head + vlen;
}

static void test_int_forms(void **state)
{
    (void)state;
    uint8_t f[128];
    ecx_req r;
    struct {
        uint8_t b[9];
        size_t n;
        int rc;
        int64_t v;
    } cases[] = {
        {{0x02}, 1, 0, 2},
        {{0xff}, 1, 0, -1},
        {{0xd0, 0x80}, 2, 0, -128},
        {{0xd1, 0xff, 0x00}, 3, 0, -256},
        {{0xce, 0xff, 0xff, 0xff, 0xff}, 5, 0, 4294967295LL},
        {{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, 0, INT64_MIN},
        {{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 9, 0, INT64_MAX},
        {{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}, 9, ECX_EWIRE_INT, 0},
        {{0xc3}, 1, ECX_EWIRE_TYPE, 0},                         /* true is not an int */
        {{0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, 9, ECX_EWIRE_TYPE, 0}, /* 1.0 is not an int */
        {{0xc0}, 1, ECX_EWIRE_TYPE, 0},                         /* nil */
        {{0xc1}, 1, ECX_EWIRE_INVALID, 0},                      /* never used */
        {{0xcd, 0x01}, 2, ECX_EWIRE_TRUNCATED, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = req_with_version(f, cases[i].b, cases[i].n);
        int rc = ecx_wire_decode_req(f, n, &r);
        if (rc != cases[i].rc) fail_msg("case %zu: rc %d want %d", i, rc, cases[i].rc);
        if (!rc) assert_int_equal(r.connector_version, cases[i].v);
    }
}

/* Claimed lengths far beyond the frame are refused at once, not attempted. */
static void test_huge_claims(void **state)
{
    (void)state;
    ecx_req r;
    ecx_ack a;
    const uint8_t big_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(ecx_wire_decode_req(big_map, sizeof big_map, &r), ECX_EWIRE_TRUNCATED);
    const uint8_t big_str_key[] = {0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'};
    assert_int_equal(ecx_wire_decode_req(big_str_key, sizeof big_str_key, &r),
                     ECX_EWIRE_TRUNCATED);
    /* {"mm_hash":"h","status":0,"src_block_indices": array32 claiming 2^32-1} */
    const uint8_t big_arr[] = {0x83, 0xa7, 'm', 'm', '_', 'h', 'a', 's', 'h', 0xa1, 'h', 0xa6,
                               's',  't',  'a', 't', 'u', 's', 0x00, 0xb1, 's', 'r', 'c', '_',
                               'b',  'l',  'o', 'c', 'k', '_', 'i', 'n', 'd', 'i', 'c', 'e',
                               's',  0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_int_equal(ecx_wire_decode_ack(big_arr, sizeof big_arr, &a), ECX_EWIRE_TRUNCATED);
    /* Unknown key whose value claims a 4 GB bin. */
    const uint8_t big_bin[] = {0x81, 0xa1, 'z', 0xc6, 0xff, 0xff, 0xff, 0xff, 0x00};
    assert_int_equal(ecx_wire_decode_req(big_bin, sizeof big_bin, &r), ECX_EWIRE_TRUNCATED);
    /* Unknown value: nested maps claiming 2^32-1 entries each. */
    const uint8_t nested[] = {0x81, 0xa1, 'z', 0xdf, 0xff, 0xff, 0xff, 0xff, 0xdf,
                              0xff, 0xff, 0xff, 0xff};
    assert_int_equal(ecx_wire_decode_req(nested, sizeof nested, &r), ECX_EWIRE_TRUNCATED);
}

/* An unknown field holding a deeply nested value is skipped without
 * recursion; then the required fields still decode. */
static void test_deep_unknown_value(void **state)
{
    (void)state;
    size_t depth = 200000;
    uint8_t *f = malloc(depth + 64);
    size_t n = 0;
    f[n++] = 0x83;
    f[n++] = 0xa1, f[n++] = 'z';
    for (size_t i = 0; i < depth; i++) f[n++] = 0x91; /* [[[[...]]]] */
    f[n++] = 0xc0;
    const uint8_t tail[] = {0xa7, 'm', 'm', '_', 'h', 'a', 's', 'h', 0xa1, 'h', 0xb2, 'c', 'o',
                            'm',  'p', 'a', 't', 'i', 'b', 'i', 'l', 'i', 't', 'y', '_', 'h',
                            'a',  's', 'h', 0xa1, 'c'};
    memcpy(f + n, tail, sizeof tail);
    n += sizeof tail;
    ecx_req r;
    assert_int_equal(ecx_wire_decode_req(f, n, &r), 0);
    assert_true(span_eq(r.mm_hash, "h"));
    free(f);
}

/* A repeated key: the last value wins, as in msgspec. A non-str key is a
 * type error; a tag that is not a str is a type error. */
static void test_keys(void **state)
{
    (void)state;
    ecx_ack a;
    const uint8_t dup[] = {0x83, 0xa7, 'm', 'm', '_', 'h', 'a', 's', 'h', 0xa1, 'a', 0xa6, 's', 't',
                           'a',  't',  'u', 's', 0x05, 0xa6, 's', 't', 'a', 't', 'u', 's', 0x01};
    assert_int_equal(ecx_wire_decode_ack(dup, sizeof dup, &a), 0);
    assert_int_equal(a.status, 1);
    const uint8_t intkey[] = {0x81, 0x01, 0x02};
    assert_int_equal(ecx_wire_decode_ack(intkey, sizeof intkey, &a), ECX_EWIRE_TYPE);
    const uint8_t inttag[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0x01};
    assert_int_equal(ecx_wire_decode_ack(inttag, sizeof inttag, &a), ECX_EWIRE_TYPE);
}

/* Every proper prefix of every valid frame is refused, and no prefix or
 * single-byte corruption ever reads outside the frame (ASan checks that:
 * each prefix is copied into a buffer of exactly its size). */
static void test_prefixes_and_flips(void **state)
{
    (void)state;
    json_t *v = load_vectors("wire.json");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, "encode"), i, c)
    {
        size_t len;
        uint8_t *frame = unhex(json_string_value(json_object_get(c, "hex")), &len);
        const char *as = json_string_value(json_object_get(json_object_get(c, "fields"), "type"));
        for (size_t k = 0; k < len; k++) {
            uint8_t *p = malloc(k ? k : 1);
            memcpy(p, frame, k);
            assert_int_not_equal(decode_as(as, p, k), 0);
            free(p);
        }
        for (size_t k = 0; k < len; k++)
            for (int bit = 0; bit < 8; bit++) {
                uint8_t *p = malloc(len);
                memcpy(p, frame, len);
                p[k] ^= (uint8_t)(1u << bit);
                ecx_ack a;
                if (!strcmp(as, "ack") && ecx_wire_decode_ack(p, len, &a) == 0) {
                    int64_t idx[64];
                    assert_true(ecx_wire_ack_indices(&a, idx, 64) <= a.n_indices);
                } else {
                    (void)decode_as(as, p, len);
                }
                free(p);
            }
        free(frame);
    }
    json_decref(v);
}

/* Encoder input checks. */
static void test_encode_refuses(void **state)
{
    (void)state;
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    ecx_req r;
    ecx_req_init(&r);
    r.mm_hash = (ecx_span){"\xc3\x28", 2};
    r.compatibility_hash = (ecx_span){"c", 1};
    assert_int_equal(ecxi_wire_encode_req(&r, ECX_CONNECTOR_VERSION, &buf), ECX_EUTF8);
    ecx_ack a;
    ecx_ack_init(&a);
    a.mm_hash = (ecx_span){"h", 1};
    a.status = 6;
    assert_int_equal(ecxi_wire_encode_ack(&a, &buf), ECX_EINVAL);
    a.status = 0;
    a.n_indices = 3; /* indices missing */
    assert_int_equal(ecxi_wire_encode_ack(&a, &buf), ECX_EINVAL);
    msgpack_sbuffer_destroy(&buf);
}

/* Random acks round-trip: decode(encode(x)) == x. */
static void test_roundtrip_random(void **state)
{
    (void)state;
    msgpack_sbuffer buf;
    msgpack_sbuffer_init(&buf);
    srand(12345);
    for (int iter = 0; iter < 2000; iter++) {
        char hash[300], sid[40];
        uint8_t meta[600];
        int64_t idx[200], got[200];
        size_t hl = (size_t)(rand() % 300), sl = (size_t)(rand() % 40), ml = (size_t)(rand() % 600);
        for (size_t k = 0; k < hl; k++) hash[k] = (char)(' ' + rand() % 95);
        for (size_t k = 0; k < sl; k++) sid[k] = (char)('a' + rand() % 26);
        for (size_t k = 0; k < ml; k++) meta[k] = (uint8_t)rand();
        ecx_ack a;
        ecx_ack_init(&a);
        a.mm_hash = (ecx_span){hash, hl};
        a.session_id = (ecx_span){sid, sl};
        a.status = rand() % 6;
        a.n_indices = (size_t)(rand() % 200);
        for (size_t k = 0; k < a.n_indices; k++)
            idx[k] = (int64_t)(((uint64_t)rand() << 20) ^ (uint64_t)rand()) ^ (rand() % 2 ? 0 : -1);
        a.indices = idx;
        a.agent_metadata = (ecx_span){(char *)meta, ml};
        assert_int_equal(ecxi_wire_encode_ack(&a, &buf), 0);
        ecx_ack d;
        assert_int_equal(ecx_wire_decode_ack(buf.data, buf.size, &d), 0);
        assert_int_equal(d.mm_hash.n, hl);
        assert_memory_equal(d.mm_hash.p, hash, hl);
        assert_int_equal(d.session_id.n, sl);
        assert_int_equal(d.status, a.status);
        assert_int_equal(d.agent_metadata.n, ml);
        if (ml) assert_memory_equal(d.agent_metadata.p, meta, ml);
        assert_int_equal(d.mem_descriptor.n, 0);
        assert_int_equal(ecx_wire_ack_indices(&d, got, 200), a.n_indices);
        for (size_t k = 0; k < a.n_indices; k++) assert_int_equal(got[k], idx[k]);
    }
    msgpack_sbuffer_destroy(&buf);
}

/* The hand-written ack encoder against msgpack-c's packer (wire_ref.h):
 * the same bytes for random acks whose lengths and values sit on every
 * boundary between msgpack forms (fix/8/16/32-bit headers, every int
 * form), through both the sbuffer and the caller-buffer encoders. */
static void test_ack_matches_msgpack_c(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536, 70000};
    static const int64_t ints[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295LL,
                                   4294967296LL, INT64_MAX, -1, -32, -33, -128, -129, -32768,
                                   -32769, INT32_MIN, (int64_t)INT32_MIN - 1, INT64_MIN};
    const size_t nl = sizeof lens / sizeof *lens, ni = sizeof ints / sizeof *ints;
    static char text[70000];
    static int64_t idx[70000];
    memset(text, 'x', sizeof text);
    msgpack_sbuffer ours, ref;
    msgpack_sbuffer_init(&ours);
    msgpack_sbuffer_init(&ref);
    uint8_t *flat = malloc(1 << 20); /* the largest ack here: ~880 KB */
    assert_non_null(flat);
    srand(4242);
    for (int iter = 0; iter < 3000; iter++) {
        ecx_ack a;
        ecx_ack_init(&a);
        a.mm_hash = (ecx_span){text, lens[rand() % nl]};
        a.session_id = (ecx_span){text, rand() % 3 ? lens[rand() % 6] : lens[rand() % nl]};
        a.status = rand() % 6;
        a.n_indices = rand() % 4 ? (size_t)(rand() % 40) : lens[rand() % nl];
        for (size_t k = 0; k < a.n_indices; k++)
            idx[k] = rand() % 2 ? ints[rand() % ni] : (int64_t)rand() - RAND_MAX / 2;
        a.indices = idx;
        a.agent_metadata = (ecx_span){text, rand() % 2 ? 0 : lens[rand() % nl]};
        a.mem_descriptor = (ecx_span){text, rand() % 2 ? 0 : lens[rand() % nl]};
        assert_int_equal(ecxi_wire_encode_ack(&a, &ours), 0);
        assert_int_equal(ref_encode_ack(&a, &ref), 0);
        assert_int_equal(ours.size, ref.size);
        assert_memory_equal(ours.data, ref.data, ref.size);
        size_t len = 0;
        assert_int_equal(ecx_wire_encode_ack(&a, flat, 1 << 20, &len), 0);
        assert_int_equal(len, ref.size);
        assert_memory_equal(flat, ref.data, ref.size);
        /* One byte short: ERANGE, and the length still said. */
        assert_int_equal(ecx_wire_encode_ack(&a, flat, len - 1, &len), ECX_ERANGE);
        assert_int_equal(len, ref.size);
    }
    free(flat);
    msgpack_sbuffer_destroy(&ours);
    msgpack_sbuffer_destroy(&ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_vectors),   cmocka_unit_test(test_decode_ok_vectors),
        cmocka_unit_test(test_version_vectors),
        cmocka_unit_test(test_decode_reject_vectors), cmocka_unit_test(test_decode_fields),
        cmocka_unit_test(test_int_forms),        cmocka_unit_test(test_huge_claims),
        cmocka_unit_test(test_deep_unknown_value), cmocka_unit_test(test_keys),
        cmocka_unit_test(test_prefixes_and_flips), cmocka_unit_test(test_encode_refuses),
        cmocka_unit_test(test_roundtrip_random), cmocka_unit_test(test_ack_matches_msgpack_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
