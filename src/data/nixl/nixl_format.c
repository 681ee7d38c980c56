/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_format — NIXL's agent metadata, vLLM's descriptor list and NIXL's
 * notification (nixl_format.h; the layouts are docs/NIXL.md's).
 *
 * Kept apart from data_format.c: that file is ecx's own versioned format,
 * this one is someone else's, unversioned, and followed byte for byte (the
 * tests compare it with what the real nixl package writes).
 */
#include "nixl_format.h"

#include <string.h>

#include "util.h"

#define SERDES "nixlSerDes|"
#define SERDES_LEN 11

/* ---- nixlSerDes --------------------------------------------------------
 * "nixlSerDes|" then fields: tag (raw) | u64 len | value | '|'. */

typedef struct rd {
    const uint8_t *p;
    size_t len, off;
} rd;

/* The next field, which must carry `tag`, with a value of min..max bytes;
 * false if anything does not hold (the trailing '|' included). */
static bool field(rd *r, const char *tag, size_t min, size_t max, const uint8_t **v, size_t *vlen)
{
    size_t t = strlen(tag);
    if (r->len - r->off < t + 8 || memcmp(r->p + r->off, tag, t) != 0) return false;
    uint64_t n = ecxi_get_le64(r->p + r->off + t);
    size_t at = r->off + t + 8;
    if (n < min || n > max || n > r->len - at || r->len - at - n < 1 || r->p[at + n] != '|')
        return false;
    *v = r->p + at;
    *vlen = (size_t)n;
    r->off = at + (size_t)n + 1;
    return true;
}

/* A field holding exactly the string s. */
static bool field_is(rd *r, const char *tag, const char *s)
{
    const uint8_t *v;
    size_t n, k = strlen(s);
    return field(r, tag, k, k, &v, &n) && memcmp(v, s, k) == 0;
}

/* A field holding a u64 (8 bytes) in 0..max. */
static bool field_u64(rd *r, const char *tag, uint64_t max, uint64_t *out)
{
    const uint8_t *v;
    size_t n;
    if (!field(r, tag, 8, 8, &v, &n)) return false;
    *out = ecxi_get_le64(v);
    return *out <= max;
}

typedef struct wr {
    uint8_t *p;
    size_t cap, len;
    bool overflow;
} wr;

static void put(wr *w, const void *b, size_t n)
{
    if (w->overflow || n > w->cap - w->len) {
        w->overflow = true;
        return;
    }
    if (n) memcpy(w->p + w->len, b, n);
    w->len += n;
}

/* Start a field's value of n bytes (the value follows, then end()). */
static void begin(wr *w, const char *tag, size_t n)
{
    uint8_t le[8];
    ecxi_put_le64(le, n);
    put(w, tag, strlen(tag));
    put(w, le, 8);
}
static void end(wr *w)
{
    put(w, "|", 1);
}
static void add(wr *w, const char *tag, const void *v, size_t n)
{
    begin(w, tag, n);
    put(w, v, n);
    end(w);
}
static void add_u64(wr *w, const char *tag, uint64_t v)
{
    uint8_t le[8];
    ecxi_put_le64(le, v);
    add(w, tag, le, 8);
}

/* ---- agent metadata ---------------------------------------------------- */

#define DESC_HEAD 24 /* addr, len, dev_id */

static int meta_bad(const char *what)
{
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: agent metadata refused: %s", what);
    return ECX_EDATA_META;
}

int ecxi_nixl_meta_decode(const uint8_t *buf, size_t len, ecxi_nixl_meta *m)
{
    if (!m) return ECX_EINVAL;
    memset(m, 0, sizeof *m);
    if (!buf || len < SERDES_LEN || len > ECXI_NIXL_META_MAX || memcmp(buf, SERDES, SERDES_LEN))
        return meta_bad("not a nixlSerDes string of a bounded size");
    rd r = {buf, len, SERDES_LEN};
    const uint8_t *v;
    size_t n;
    if (!field(&r, "Agent", 1, ECXI_NIXL_NAME_MAX, &v, &n)) return meta_bad("agent name");
    m->name = (const char *)v, m->name_len = n;
    uint64_t conns;
    if (!field_u64(&r, "Conns", ECXI_NIXL_CONNS_MAX, &conns) || conns == 0)
        return meta_bad("connection count");
    for (uint64_t i = 0; i < conns; i++) {
        const uint8_t *b, *c;
        size_t bn, cn;
        if (!field(&r, "t", 1, ECXI_NIXL_BACKEND_MAX, &b, &bn) ||
            !field(&r, "c", 1, ECXI_NIXL_CONN_MAX, &c, &cn))
            return meta_bad("connection entry");
        if (bn == 3 && memcmp(b, "UCX", 3) == 0) {
            if (m->ucx_addr) return meta_bad("two UCX connections");
            m->ucx_addr = c, m->ucx_addr_len = cn;
        }
    }
    if (!m->ucx_addr) return meta_bad("no UCX connection");
    uint64_t secs;
    if (!field_is(&r, "", "MemSection") || !field_u64(&r, "nixlSecElms", ECXI_NIXL_SECS_MAX, &secs))
        return meta_bad("memory section head");
    for (uint64_t s = 0; s < secs; s++) {
        const uint8_t *b, *t;
        size_t bn, tn;
        uint64_t nd;
        if (!field(&r, "bknd", 1, ECXI_NIXL_BACKEND_MAX, &b, &bn) ||
            !field_is(&r, "nixlDList", "nixlSDList") || !field(&r, "t", 4, 4, &t, &tn) ||
            !field_u64(&r, "n", ECXI_NIXL_SEC_DESCS_MAX, &nd) || nd == 0)
            return meta_bad("section head");
        bool keep = bn == 3 && memcmp(b, "UCX", 3) == 0 && ecxi_get_le32(t) == ECXI_NIXL_DRAM_SEG;
        for (uint64_t i = 0; i < nd; i++) {
            if (!field(&r, "", DESC_HEAD + 1, DESC_HEAD + ECXI_NIXL_RKEY_MAX, &v, &n))
                return meta_bad("section descriptor");
            if (!keep) continue;
            if (m->nregs == ECXI_NIXL_REGS_MAX) return meta_bad("too many ranges");
            ecxi_nixl_reg *g = &m->regs[m->nregs++];
            g->addr = ecxi_get_le64(v);
            g->len = ecxi_get_le64(v + 8);
            g->dev_id = ecxi_get_le64(v + 16);
            g->rkey = v + DESC_HEAD;
            g->rkey_len = n - DESC_HEAD;
            if (g->len == 0 || g->addr + g->len < g->addr) return meta_bad("empty or wrapping range");
        }
    }
    if (m->nregs == 0) return meta_bad("no UCX DRAM range");
    if (r.off != len) return meta_bad("trailing bytes");
    return 0;
}

long ecxi_nixl_meta_encode(const ecxi_nixl_meta *m, uint8_t *buf, size_t cap)
{
    if (!m || !buf || !m->name_len || m->name_len > ECXI_NIXL_NAME_MAX || !m->ucx_addr_len ||
        m->ucx_addr_len > ECXI_NIXL_CONN_MAX || !m->nregs || m->nregs > ECXI_NIXL_SEC_DESCS_MAX)
        return ECX_EINVAL;
    for (size_t i = 0; i < m->nregs; i++)
        if (!m->regs[i].rkey_len || m->regs[i].rkey_len > ECXI_NIXL_RKEY_MAX || !m->regs[i].len)
            return ECX_EINVAL;
    wr w = {buf, cap, 0, false};
    uint8_t t[4];
    ecxi_put_le32(t, ECXI_NIXL_DRAM_SEG);
    put(&w, SERDES, SERDES_LEN);
    add(&w, "Agent", m->name, m->name_len);
    add_u64(&w, "Conns", 1);
    add(&w, "t", "UCX", 3);
    add(&w, "c", m->ucx_addr, m->ucx_addr_len);
    add(&w, "", "MemSection", 10);
    add_u64(&w, "nixlSecElms", 1);
    add(&w, "bknd", "UCX", 3);
    add(&w, "nixlDList", "nixlSDList", 10);
    add(&w, "t", t, 4);
    add_u64(&w, "n", m->nregs);
    for (size_t i = 0; i < m->nregs; i++) {
        const ecxi_nixl_reg *g = &m->regs[i];
        uint8_t h[DESC_HEAD];
        ecxi_put_le64(h, g->addr);
        ecxi_put_le64(h + 8, g->len);
        ecxi_put_le64(h + 16, g->dev_id);
        begin(&w, "", DESC_HEAD + g->rkey_len);
        put(&w, h, DESC_HEAD);
        put(&w, g->rkey, g->rkey_len);
        end(&w);
    }
    return w.overflow ? ECX_ERANGE : (long)w.len;
}

bool ecxi_nixl_meta_covers(const ecxi_nixl_meta *m, uint64_t addr, uint64_t len)
{
    if (addr + len < addr) return false;
    for (size_t i = 0; i < m->nregs; i++)
        if (addr >= m->regs[i].addr && addr + len <= m->regs[i].addr + m->regs[i].len) return true;
    return false;
}

/* ---- vLLM's mem_descriptor (msgpack) ------------------------------------ */

/* An array head: fixarray, array16, array32 (big-endian counts). */
static bool mp_array(rd *r, uint64_t *n)
{
    if (r->off >= r->len) return false;
    uint8_t b = r->p[r->off];
    size_t left = r->len - r->off - 1;
    if ((b & 0xf0) == 0x90) {
        *n = b & 0x0f;
        r->off += 1;
    } else if (b == 0xdc && left >= 2) {
        *n = (uint64_t)r->p[r->off + 1] << 8 | r->p[r->off + 2];
        r->off += 3;
    } else if (b == 0xdd && left >= 4) {
        const uint8_t *q = r->p + r->off + 1;
        *n = (uint64_t)q[0] << 24 | (uint64_t)q[1] << 16 | (uint64_t)q[2] << 8 | q[3];
        r->off += 5;
    } else {
        return false;
    }
    return true;
}

/* A non-negative integer in any msgpack form (msgspec decodes an int from
 * any of them; a negative one is refused here: no address, length or
 * device is negative). */
static bool mp_uint(rd *r, uint64_t *v)
{
    if (r->off >= r->len) return false;
    uint8_t b = r->p[r->off];
    size_t k;
    bool sign = false;
    if (b <= 0x7f) {
        *v = b;
        r->off += 1;
        return true;
    }
    switch (b) {
    case 0xcc: k = 1; break;
    case 0xcd: k = 2; break;
    case 0xce: k = 4; break;
    case 0xcf: k = 8; break;
    case 0xd0: k = 1, sign = true; break;
    case 0xd1: k = 2, sign = true; break;
    case 0xd2: k = 4, sign = true; break;
    case 0xd3: k = 8, sign = true; break;
    default: return false;
    }
    if (r->len - r->off - 1 < k) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < k; i++)
        x = x << 8 | r->p[r->off + 1 + i];
    if (sign && (x >> (8 * k - 1)) & 1) return false;
    *v = x;
    r->off += 1 + k;
    return true;
}

static int desc_bad(const char *what)
{
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: descriptor list refused: %s", what);
    return ECX_EDATA_DESC;
}

/* Walk the list; out may be NULL (count only). */
static int desc_walk(const uint8_t *buf, size_t len, size_t max_blocks, ecxi_nixl_block *out,
                     size_t *n)
{
    if (!buf || !n) return ECX_EINVAL;
    rd r = {buf, len, 0};
    uint64_t cnt;
    if (!mp_array(&r, &cnt)) return desc_bad("not an array");
    /* Each tuple takes at least 4 bytes: a count beyond that is a lie. */
    if (cnt == 0 || cnt > max_blocks || cnt > (len - r.off) / 4) return desc_bad("block count");
    for (uint64_t i = 0; i < cnt; i++) {
        uint64_t k, a, l, d;
        if (!mp_array(&r, &k) || k != 3 || !mp_uint(&r, &a) || !mp_uint(&r, &l) || !mp_uint(&r, &d))
            return desc_bad("a tuple is not 3 non-negative integers");
        if (l == 0 || a + l < a) return desc_bad("empty or wrapping block");
        if (out) out[i] = (ecxi_nixl_block){a, l, d};
    }
    if (r.off != len) return desc_bad("trailing bytes");
    *n = (size_t)cnt;
    return 0;
}

int ecxi_nixl_desc_count(const uint8_t *buf, size_t len, size_t max_blocks, size_t *n)
{
    return desc_walk(buf, len, max_blocks, NULL, n);
}

int ecxi_nixl_desc_decode(const uint8_t *buf, size_t len, ecxi_nixl_block *out, size_t cap,
                          size_t *n)
{
    if (!out) return ECX_EINVAL;
    return desc_walk(buf, len, cap, out, n);
}

static void mp_put_uint(wr *w, uint64_t v)
{
    uint8_t b[9];
    size_t k;
    if (v <= 0x7f) {
        b[0] = (uint8_t)v;
        put(w, b, 1);
        return;
    }
    if (v <= 0xff)
        b[0] = 0xcc, k = 1;
    else if (v <= 0xffff)
        b[0] = 0xcd, k = 2;
    else if (v <= 0xffffffffu)
        b[0] = 0xce, k = 4;
    else
        b[0] = 0xcf, k = 8;
    for (size_t i = 0; i < k; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (k - 1 - i)));
    put(w, b, 1 + k);
}

size_t ecxi_nixl_desc_size(size_t n)
{
    return 5 + n * (1 + 3 * 9);
}

long ecxi_nixl_desc_encode(const ecxi_nixl_block *b, size_t n, uint8_t *buf, size_t cap)
{
    if ((!b && n) || !buf || n > UINT32_MAX) return ECX_EINVAL;
    wr w = {buf, cap, 0, false};
    uint8_t h[5];
    if (n <= 15) {
        h[0] = (uint8_t)(0x90 | n);
        put(&w, h, 1);
    } else if (n <= 0xffff) {
        h[0] = 0xdc, h[1] = (uint8_t)(n >> 8), h[2] = (uint8_t)n;
        put(&w, h, 3);
    } else {
        h[0] = 0xdd, h[1] = (uint8_t)(n >> 24), h[2] = (uint8_t)(n >> 16);
        h[3] = (uint8_t)(n >> 8), h[4] = (uint8_t)n;
        put(&w, h, 5);
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t t = 0x93;
        put(&w, &t, 1);
        mp_put_uint(&w, b[i].addr);
        mp_put_uint(&w, b[i].len);
        mp_put_uint(&w, b[i].dev_id);
    }
    return w.overflow ? ECX_ERANGE : (long)w.len;
}

/* ---- notification ------------------------------------------------------ */

int ecxi_nixl_notif_decode(const uint8_t *buf, size_t len, const char **name, size_t *name_len,
                           const char **msg, size_t *msg_len)
{
    if (!buf || len < SERDES_LEN || memcmp(buf, SERDES, SERDES_LEN)) return ECX_EDATA_NOTIF;
    rd r = {buf, len, SERDES_LEN};
    const uint8_t *a, *b;
    size_t an, bn;
    if (!field(&r, "name", 1, ECXI_NIXL_NAME_MAX, &a, &an) ||
        !field(&r, "msg", 1, ECXI_NIXL_MSG_MAX, &b, &bn) || r.off != len)
        return ECX_EDATA_NOTIF;
    *name = (const char *)a, *name_len = an;
    *msg = (const char *)b, *msg_len = bn;
    return 0;
}

long ecxi_nixl_notif_encode(const char *name, size_t name_len, const char *msg, size_t msg_len,
                            uint8_t *buf, size_t cap)
{
    if (!name || !msg || !buf || !name_len || name_len > ECXI_NIXL_NAME_MAX || !msg_len ||
        msg_len > ECXI_NIXL_MSG_MAX)
        return ECX_EINVAL;
    wr w = {buf, cap, 0, false};
    put(&w, SERDES, SERDES_LEN);
    add(&w, "name", name, name_len);
    add(&w, "msg", msg, msg_len);
    return w.overflow ? ECX_ERANGE : (long)w.len;
}
