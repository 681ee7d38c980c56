/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire — XferReq / XferAck encoding (msgpack-c's packer for requests, the
 * ack's fixed layout by hand) and a strict, allocation-free decoder. See
 * wire.h for why the decoder is our own.
 */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---------- encoding ---------- */

void ecx_req_init(ecx_req *r)
{
    memset(r, 0, sizeof *r);
    r->connector_version = ECX_CONNECTOR_VERSION;
}

void ecx_ack_init(ecx_ack *a) { memset(a, 0, sizeof *a); }

static int pack_key(msgpack_packer *pk, const char *key)
{
    size_t n = strlen(key);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, key, n);
}

/* A str field's size and pointer, without its UTF-8 (a decoder's span,
 * checked there). */
static int check_str_len(ecx_span s)
{
    if (s.n > UINT32_MAX) return ECX_EWIRE_TOO_LARGE;
    if (s.n && !s.p) return ECX_EINVAL;
    return 0;
}

static int check_str(ecx_span s)
{
    int rc = check_str_len(s);
    if (rc) return rc;
    return ecxi_utf8_valid(s.p, s.n) ? 0 : ECX_EUTF8;
}

static int check_bin(ecx_span s)
{
    if (s.n > UINT32_MAX) return ECX_EWIRE_TOO_LARGE;
    return s.n && !s.p ? ECX_EINVAL : 0;
}

static int pack_str(msgpack_packer *pk, const char *key, ecx_span s)
{
    return pack_key(pk, key) || msgpack_pack_str(pk, s.n) || msgpack_pack_str_body(pk, s.p, s.n);
}

static int check_req(const ecx_req *r)
{
    int rc;
    if ((rc = check_str(r->mm_hash)) || (rc = check_str(r->compatibility_hash)) ||
        (rc = check_str(r->session_id)))
        return rc;
    return 0;
}

static bool version_ok(int version)
{
    return version >= 1 && version <= ECX_CONNECTOR_VERSION_MAX;
}

/* connector_version is omitted when it equals the encoding peer's version
 * (msgspec's omit_defaults, the default being that version's constant). */
static int pack_req(const ecx_req *r, int version, msgpack_packer *pkp)
{
    msgpack_packer pk = *pkp;
    bool has_sid = r->session_id.n > 0;
    bool has_ver = r->connector_version != version;
    int fail = msgpack_pack_map(&pk, 3 + has_sid + has_ver) || pack_key(&pk, "type") ||
               pack_key(&pk, "req") || pack_str(&pk, "mm_hash", r->mm_hash) ||
               pack_str(&pk, "compatibility_hash", r->compatibility_hash) ||
               (has_sid && pack_str(&pk, "session_id", r->session_id)) ||
               (has_ver && (pack_key(&pk, "connector_version") ||
                            msgpack_pack_int64(&pk, r->connector_version)));
    return fail ? ECX_ENOMEM : 0;
}

/* strs_decoded: mm_hash and session_id are spans a decoder accepted, whose
 * UTF-8 is not checked again. */
static int check_ack(const ecx_ack *a, bool strs_decoded)
{
    int (*str)(ecx_span) = strs_decoded ? check_str_len : check_str;
    int rc;
    if ((rc = str(a->mm_hash)) || (rc = str(a->session_id)) ||
        (rc = check_bin(a->agent_metadata)) || (rc = check_bin(a->mem_descriptor)))
        return rc;
    if (a->status < 0 || a->status > ECX_STATUS_MAX) return ECX_EINVAL;
    if (a->n_indices > UINT32_MAX) return ECX_EWIRE_TOO_LARGE;
    if (a->n_indices && !a->indices) return ECX_EINVAL;
    return 0;
}

/*
 * The ack is encoded by hand: one pass to size it, one to write it, with
 * no packer callbacks (a producer sends one per request). The forms are
 * the ones msgpack-c's packer picks, so the bytes are the same as
 * encode_req's would be for the same layout (tests/unit/test_wire.c checks this
 * against msgpack-c on random acks, and tests/vectors against msgspec).
 */

/* Header bytes of a str, bin, or array/map of n. */
static size_t str_hdr(size_t n) { return n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5; }
static size_t bin_hdr(size_t n) { return n < 256 ? 2 : n < 65536 ? 3 : 5; }
static size_t cnt_hdr(size_t n) { return n < 16 ? 1 : n < 65536 ? 3 : 5; }

/* Bytes of the shortest int form (positive values in unsigned forms). */
static inline size_t int_len(int64_t d)
{
    if (d >= -32 && d < 128) return 1;
    if (d < 0) return d >= INT8_MIN ? 2 : d >= INT16_MIN ? 3 : d >= INT32_MIN ? 5 : 9;
    return d < 256 ? 2 : d < 65536 ? 3 : d < 4294967296 ? 5 : 9;
}

static inline uint8_t *put_be(uint8_t *o, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        o[i] = (uint8_t)v;
    return o + n;
}

/* A length header: fix (with fix_max) or the 8/16/32-bit form t8/t16/t32
 * (t8 0 where the type has no 8-bit form). */
static inline uint8_t *put_hdr(uint8_t *o, size_t n, uint8_t fix, size_t fix_max, uint8_t t8,
                        uint8_t t16, uint8_t t32)
{
    if (n <= fix_max) {
        *o++ = (uint8_t)(fix | n);
    } else if (t8 && n < 256) {
        *o++ = t8;
        *o++ = (uint8_t)n;
    } else if (n < 65536) {
        *o++ = t16;
        o = put_be(o, n, 2);
    } else {
        *o++ = t32;
        o = put_be(o, n, 4);
    }
    return o;
}

static inline uint8_t *put_int(uint8_t *o, int64_t d)
{
    size_t n = int_len(d);
    if (n == 1) {
        *o++ = (uint8_t)d;
        return o;
    }
    static const uint8_t pos[] = {[2] = 0xcc, [3] = 0xcd, [5] = 0xce, [9] = 0xcf};
    static const uint8_t neg[] = {[2] = 0xd0, [3] = 0xd1, [5] = 0xd2, [9] = 0xd3};
    *o++ = d < 0 ? neg[n] : pos[n];
    return put_be(o, (uint64_t)d, (int)n - 1);
}

static inline uint8_t *put_bytes(uint8_t *o, const void *p, size_t n)
{
    if (n) memcpy(o, p, n);
    return o + n;
}

static inline uint8_t *put_str(uint8_t *o, ecx_span s)
{
    o = put_hdr(o, s.n, 0xa0, 31, 0xd9, 0xda, 0xdb);
    return put_bytes(o, s.p, s.n);
}

static inline uint8_t *put_bin(uint8_t *o, ecx_span s)
{
    o = put_hdr(o, s.n, 0, 0, 0xc4, 0xc5, 0xc6);
    return put_bytes(o, s.p, s.n);
}

/* A constant key, its fixstr header included: KEY("\xa4" "type"). */
#define KEY(o, k) put_bytes(o, k, sizeof k - 1)

static size_t ack_len(const ecx_ack *a)
{
    size_t n = cnt_hdr(3 + (a->session_id.n > 0) + (a->n_indices > 0) +
                       (a->agent_metadata.n > 0) + (a->mem_descriptor.n > 0));
    n += 5 + 4 + 8 + str_hdr(a->mm_hash.n) + a->mm_hash.n + 7 + int_len(a->status);
    if (a->session_id.n) n += 11 + str_hdr(a->session_id.n) + a->session_id.n;
    if (a->n_indices) {
        n += 18 + cnt_hdr(a->n_indices);
        for (size_t i = 0; i < a->n_indices; i++)
            n += int_len(a->indices[i]);
    }
    if (a->agent_metadata.n) n += 15 + bin_hdr(a->agent_metadata.n) + a->agent_metadata.n;
    if (a->mem_descriptor.n) n += 15 + bin_hdr(a->mem_descriptor.n) + a->mem_descriptor.n;
    return n;
}

/* Write the ack (ack_len(a) bytes) at o; returns the end. */
static uint8_t *put_ack(uint8_t *o, const ecx_ack *a)
{
    bool has_sid = a->session_id.n > 0, has_idx = a->n_indices > 0;
    bool has_meta = a->agent_metadata.n > 0, has_desc = a->mem_descriptor.n > 0;
    o = put_hdr(o, 3 + has_sid + has_idx + has_meta + has_desc, 0x80, 15, 0, 0xde, 0xdf);
    o = KEY(o, "\xa4" "type" "\xa3" "ack" "\xa7" "mm_hash");
    o = put_str(o, a->mm_hash);
    o = KEY(o, "\xa6" "status");
    o = put_int(o, a->status);
    if (has_sid) o = put_str(KEY(o, "\xaa" "session_id"), a->session_id);
    if (has_idx) {
        o = KEY(o, "\xb1" "src_block_indices");
        o = put_hdr(o, a->n_indices, 0x90, 15, 0, 0xdc, 0xdd);
        for (size_t i = 0; i < a->n_indices; i++)
            o = put_int(o, a->indices[i]);
    }
    if (has_meta) o = put_bin(KEY(o, "\xae" "agent_metadata"), a->agent_metadata);
    if (has_desc) o = put_bin(KEY(o, "\xae" "mem_descriptor"), a->mem_descriptor);
    return o;
}

int ecxi_wire_encode_req(const ecx_req *r, int version, msgpack_sbuffer *buf)
{
    if (!version_ok(version)) return ECX_EINVAL;
    int rc = check_req(r);
    if (rc) return rc;
    msgpack_sbuffer_clear(buf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
    return pack_req(r, version, &pk);
}

/* At least ack_len(a), without looking at each index (9 bytes is the
 * longest int). */
static size_t ack_len_bound(const ecx_ack *a)
{
    return 1 + 17 + 5 + a->mm_hash.n + 7 + 1 + 11 + 5 + a->session_id.n + 18 + 5 +
           9 * a->n_indices + 15 + 5 + a->agent_metadata.n + 15 + 5 + a->mem_descriptor.n;
}

int ecxi_wire_encode_ack(const ecx_ack *a, msgpack_sbuffer *buf)
{
    return ecxi_wire_encode_ack_of(a, false, buf);
}

int ecxi_wire_encode_ack_of(const ecx_ack *a, bool strs_decoded, msgpack_sbuffer *buf)
{
    int rc = check_ack(a, strs_decoded);
    if (rc) return rc;
    size_t n = ack_len_bound(a); /* room enough; put_ack says how much it took */
    if (n > buf->alloc) {
        char *p = realloc(buf->data, n);
        if (!p) return ECX_ENOMEM;
        buf->data = p, buf->alloc = n;
    }
    buf->size = (size_t)((char *)put_ack((uint8_t *)buf->data, a) - buf->data);
    return 0;
}

/* The public encoders write into the caller's buffer: the packer's writes
 * are counted always and copied only while they fit. */
typedef struct fixed_out {
    char *p;
    size_t cap, len;
} fixed_out;

static int fixed_write(void *data, const char *buf, size_t len)
{
    fixed_out *o = data;
    if (len <= o->cap && o->len <= o->cap - len) memcpy(o->p + o->len, buf, len);
    o->len += len;
    return 0;
}

int ecx_wire_encode_req_v(const ecx_req *r, int version, void *buf, size_t cap, size_t *len)
{
    if (!r || !len || (!buf && cap) || !version_ok(version)) return ECX_EINVAL;
    int rc = check_req(r);
    if (rc) return rc;
    fixed_out o = {buf, cap, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &o, fixed_write);
    rc = pack_req(r, version, &pk);
    *len = o.len;
    return rc ? rc : o.len > cap ? ECX_ERANGE : 0;
}

int ecx_wire_encode_req(const ecx_req *r, void *buf, size_t cap, size_t *len)
{
    return ecx_wire_encode_req_v(r, ECX_CONNECTOR_VERSION, buf, cap, len);
}

int ecx_wire_encode_ack(const ecx_ack *a, void *buf, size_t cap, size_t *len)
{
    if (!a || !len || (!buf && cap)) return ECX_EINVAL;
    int rc = check_ack(a, false);
    if (rc) return rc;
    *len = ack_len(a);
    if (*len > cap) return ECX_ERANGE;
    put_ack(buf, a);
    return 0;
}

/* ---------- decoding ---------- */

typedef struct cursor {
    const uint8_t *p, *end;
} cursor;

static size_t left(const cursor *c) { return (size_t)(c->end - c->p); }

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Read a big-endian length of n bytes that follows the type byte. */
static int take_len(cursor *c, int n, uint64_t *out)
{
    if (left(c) < (size_t)n) return ECX_EWIRE_TRUNCATED;
    *out = be(c->p, n);
    c->p += n;
    return 0;
}

/* Advance over n payload bytes, returning a view of them. */
static int take_body(cursor *c, uint64_t n, ecx_span *out)
{
    if (left(c) < n) return ECX_EWIRE_TRUNCATED;
    out->p = (const char *)c->p;
    out->n = (size_t)n;
    c->p += n;
    return 0;
}

/* A str value (fixstr, str8/16/32); UTF-8 is checked by the caller. */
static int read_str_raw(cursor *c, ecx_span *out)
{
    if (!left(c)) return ECX_EWIRE_TRUNCATED;
    uint8_t t = *c->p++;
    uint64_t n;
    int rc = 0;
    if (t >= 0xa0 && t <= 0xbf)
        n = t & 0x1f;
    else if (t >= 0xd9 && t <= 0xdb)
        rc = take_len(c, 1 << (t - 0xd9), &n);
    else
        return t == 0xc1 ? ECX_EWIRE_INVALID : ECX_EWIRE_TYPE;
    return rc ? rc : take_body(c, n, out);
}

static int read_str(cursor *c, ecx_span *out)
{
    int rc = read_str_raw(c, out);
    if (rc) return rc;
    return ecxi_utf8_valid(out->p, out->n) ? 0 : ECX_EWIRE_UTF8;
}

static int read_bin(cursor *c, ecx_span *out)
{
    if (!left(c)) return ECX_EWIRE_TRUNCATED;
    uint8_t t = *c->p++;
    uint64_t n;
    if (t < 0xc4 || t > 0xc6) return t == 0xc1 ? ECX_EWIRE_INVALID : ECX_EWIRE_TYPE;
    int rc = take_len(c, 1 << (t - 0xc4), &n);
    return rc ? rc : take_body(c, n, out);
}

/* Any msgpack int form; bool, float, nil and the rest are not ints. */
static int read_int(cursor *c, int64_t *out)
{
    if (!left(c)) return ECX_EWIRE_TRUNCATED;
    uint8_t t = *c->p++;
    uint64_t u;
    int rc;
    if (t <= 0x7f) {
        *out = t;
        return 0;
    }
    if (t >= 0xe0) {
        *out = (int8_t)t;
        return 0;
    }
    if (t >= 0xcc && t <= 0xcf) { /* uint 8/16/32/64 */
        if ((rc = take_len(c, 1 << (t - 0xcc), &u))) return rc;
        if (u > INT64_MAX) return ECX_EWIRE_INT;
        *out = (int64_t)u;
        return 0;
    }
    if (t >= 0xd0 && t <= 0xd3) { /* int 8/16/32/64, sign-extended */
        int n = 1 << (t - 0xd0);
        if ((rc = take_len(c, n, &u))) return rc;
        int shift = 64 - 8 * n;
        *out = (int64_t)(u << shift) >> shift;
        return 0;
    }
    return t == 0xc1 ? ECX_EWIRE_INVALID : ECX_EWIRE_TYPE;
}

/* Array header; the claimed count can never exceed the bytes left, since
 * every element takes at least one byte. */
static int read_array(cursor *c, uint64_t *n)
{
    if (!left(c)) return ECX_EWIRE_TRUNCATED;
    uint8_t t = *c->p++;
    int rc = 0;
    if (t >= 0x90 && t <= 0x9f)
        *n = t & 0x0f;
    else if (t == 0xdc || t == 0xdd)
        rc = take_len(c, t == 0xdc ? 2 : 4, n);
    else
        return t == 0xc1 ? ECX_EWIRE_INVALID : ECX_EWIRE_TYPE;
    if (!rc && *n > left(c)) rc = ECX_EWIRE_TRUNCATED;
    return rc;
}

/*
 * Skip values without recursion: `pending` counts the values still to be
 * skipped; containers add their elements to it. Since each pending value
 * needs at least one byte, pending > bytes left means truncation, which
 * also bounds the counter.
 */
static int skip_values(cursor *c, uint64_t pending)
{
    while (pending) {
        if (pending > left(c)) return ECX_EWIRE_TRUNCATED;
        pending--;
        uint8_t t = *c->p++;
        uint64_t n = 0;
        int rc = 0;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) continue;
        if (t >= 0x80 && t <= 0x8f) {
            pending += 2u * (t & 0x0f);
            continue;
        }
        if (t >= 0x90 && t <= 0x9f) {
            pending += t & 0x0f;
            continue;
        }
        if (t >= 0xa0 && t <= 0xbf) {
            n = t & 0x1f;
        } else {
            switch (t) {
            case 0xc1: return ECX_EWIRE_INVALID;
            case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
                rc = take_len(c, 1 << (t - 0xc4), &n);
                break;
            case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
                rc = take_len(c, 1 << (t - 0xd9), &n);
                break;
            case 0xc7: case 0xc8: case 0xc9: /* ext 8/16/32: type byte + data */
                rc = take_len(c, 1 << (t - 0xc7), &n);
                n += 1;
                break;
            case 0xca: n = 4; break; /* float32 */
            case 0xcb: n = 8; break; /* float64 */
            case 0xcc: case 0xcd: case 0xce: case 0xcf: n = 1u << (t - 0xcc); break;
            case 0xd0: case 0xd1: case 0xd2: case 0xd3: n = 1u << (t - 0xd0); break;
            case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext */
                n = 1 + (1u << (t - 0xd4));
                break;
            case 0xdc: case 0xdd: /* array 16/32 */
            case 0xde: case 0xdf: /* map 16/32 */
                rc = take_len(c, (t & 1) ? 4 : 2, &n);
                if (rc) return rc;
                pending += t >= 0xde ? 2 * n : n;
                continue;
            }
        }
        if (rc) return rc;
        if (left(c) < n) return ECX_EWIRE_TRUNCATED;
        c->p += n;
    }
    return 0;
}

/* Open the top-level map; returns its entry count in *n. */
static int open_map(cursor *c, uint64_t *n)
{
    if (!left(c)) return ECX_EWIRE_EMPTY;
    uint8_t t = *c->p++;
    int rc = 0;
    if (t >= 0x80 && t <= 0x8f)
        *n = t & 0x0f;
    else if (t == 0xde || t == 0xdf)
        rc = take_len(c, t == 0xde ? 2 : 4, n);
    else
        return ECX_EWIRE_NOT_MAP;
    if (!rc && *n > left(c) / 2) rc = ECX_EWIRE_TRUNCATED;
    return rc;
}

/* k equals the string literal name (length known at compile time). */
#define key_is(k, name) ((k).n == sizeof name - 1 && memcmp((k).p, name, sizeof name - 1) == 0)

/* The "type" tag is optional, but when present must be a str naming us
 * ("req" or "ack"). */
static int read_tag(cursor *c, const char want[4])
{
    ecx_span v;
    int rc = read_str(c, &v);
    if (rc) return rc;
    return v.n == 3 && memcmp(v.p, want, 3) == 0 ? 0 : ECX_EWIRE_TAG;
}

/* A literal's bytes at the cursor (then skipped): true, else false with
 * the cursor where it was. */
#define take_lit(c, lit)                                                                           \
    (left(c) >= sizeof lit - 1 && memcmp((c)->p, lit, sizeof lit - 1) == 0                         \
         ? ((c)->p += sizeof lit - 1, true)                                                        \
         : false)

/*
 * The request as ecx and msgspec encode it, {"type": "req", "mm_hash": s,
 * "compatibility_hash": s[, "session_id": s]} in that order, read with
 * three compares for the keys instead of the general loop. true: *r is
 * decoded (with the same checks); false: not that shape or not valid, and
 * the general decoder decides (so errors are reported the same way).
 */
static bool decode_req_canonical(cursor c, int version, ecx_req *r)
{
    if (!left(&c) || (*c.p != 0x83 && *c.p != 0x84)) return false;
    bool has_sid = *c.p++ == 0x84;
    ecx_req_init(r);
    r->connector_version = version;
    if (!take_lit(&c, "\xa4" "type" "\xa3" "req" "\xa7" "mm_hash") || read_str(&c, &r->mm_hash) ||
        !take_lit(&c, "\xb2" "compatibility_hash") || read_str(&c, &r->compatibility_hash))
        return false;
    if (has_sid && (!take_lit(&c, "\xaa" "session_id") || read_str(&c, &r->session_id)))
        return false;
    return left(&c) == 0;
}

int ecx_wire_decode_req_v(const void *frame, size_t len, int version, ecx_req *r)
{
    if (!version_ok(version)) return ECX_EINVAL;
    cursor c = {frame, (const uint8_t *)frame + len};
    if (decode_req_canonical(c, version, r)) return 0;
    uint64_t n;
    int rc = open_map(&c, &n);
    if (rc) return rc;
    ecx_req_init(r);
    r->connector_version = version; /* absent: the decoding peer's own */
    bool have_hash = false, have_compat = false;
    for (uint64_t i = 0; i < n; i++) {
        ecx_span k;
        if ((rc = read_str_raw(&c, &k))) return rc;
        if (key_is(k, "type"))
            rc = read_tag(&c, "req");
        else if (key_is(k, "mm_hash"))
            rc = read_str(&c, &r->mm_hash), have_hash = true;
        else if (key_is(k, "compatibility_hash"))
            rc = read_str(&c, &r->compatibility_hash), have_compat = true;
        else if (key_is(k, "session_id"))
            rc = read_str(&c, &r->session_id);
        else if (key_is(k, "connector_version"))
            rc = read_int(&c, &r->connector_version);
        else
            rc = skip_values(&c, 1);
        if (rc) return rc;
    }
    if (left(&c)) return ECX_EWIRE_TRAILING;
    return have_hash && have_compat ? 0 : ECX_EWIRE_MISSING;
}

int ecx_wire_decode_req(const void *frame, size_t len, ecx_req *r)
{
    return ecx_wire_decode_req_v(frame, len, ECX_CONNECTOR_VERSION, r);
}

static int read_status(cursor *c, int *status)
{
    int64_t v;
    int rc = read_int(c, &v);
    if (rc) return rc == ECX_EWIRE_INT ? ECX_EWIRE_STATUS : rc;
    if (v < 0 || v > ECX_STATUS_MAX) return ECX_EWIRE_STATUS;
    *status = (int)v;
    return 0;
}

static int read_indices(cursor *c, ecx_ack *a)
{
    uint64_t n;
    int rc = read_array(c, &n);
    if (rc) return rc;
    const uint8_t *body = c->p;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        if ((rc = read_int(c, &v))) return rc;
    }
    a->indices_raw = (ecx_span){(const char *)body, (size_t)(c->p - body)};
    a->n_indices = (size_t)n;
    return 0;
}

int ecx_wire_decode_ack(const void *frame, size_t len, ecx_ack *a)
{
    cursor c = {frame, (const uint8_t *)frame + len};
    uint64_t n;
    int rc = open_map(&c, &n);
    if (rc) return rc;
    ecx_ack_init(a);
    bool have_hash = false, have_status = false;
    for (uint64_t i = 0; i < n; i++) {
        ecx_span k;
        if ((rc = read_str_raw(&c, &k))) return rc;
        if (key_is(k, "type"))
            rc = read_tag(&c, "ack");
        else if (key_is(k, "mm_hash"))
            rc = read_str(&c, &a->mm_hash), have_hash = true;
        else if (key_is(k, "status"))
            rc = read_status(&c, &a->status), have_status = true;
        else if (key_is(k, "session_id"))
            rc = read_str(&c, &a->session_id);
        else if (key_is(k, "src_block_indices"))
            rc = read_indices(&c, a);
        else if (key_is(k, "agent_metadata"))
            rc = read_bin(&c, &a->agent_metadata);
        else if (key_is(k, "mem_descriptor"))
            rc = read_bin(&c, &a->mem_descriptor);
        else
            rc = skip_values(&c, 1);
        if (rc) return rc;
    }
    if (left(&c)) return ECX_EWIRE_TRAILING;
    return have_hash && have_status ? 0 : ECX_EWIRE_MISSING;
}

size_t ecx_wire_ack_indices(const ecx_ack *a, int64_t *out, size_t cap)
{
    if (a->n_indices == 0 || !a->indices_raw.p) return 0;
    const uint8_t *body = (const uint8_t *)a->indices_raw.p;
    cursor c = {body, body + a->indices_raw.n};
    size_t n = a->n_indices < cap ? a->n_indices : cap;
    for (size_t i = 0; i < n; i++)
        if (read_int(&c, &out[i])) return i;
    return n;
}
