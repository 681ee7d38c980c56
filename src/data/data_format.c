/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_format — the agent_metadata / mem_descriptor codec (data_format.h).
 *
 * Kept on its own because it is the one place where bytes from a peer
 * become data-plane structures: the front (data.c) and every backend see
 * only the parsed, validated forms, and the fuzz target (tests/fuzz/fuzz_data.c)
 * runs exactly this file's parser and encoder against each other.
 */
#include "data_format.h"

#include <netinet/in.h>
#include <sodium.h>
#include <string.h>

#include "region.h"
#include "util.h"

/*
 * Formats. Both are little-endian, start with a 24-byte head and carry
 * typed sections (u16 type, u16 length, body); sections of an unknown type
 * are skipped, so later versions can add paths without breaking older
 * consumers; a known section twice, a length that overruns, a total length
 * different from the bytes received, or any non-zero reserved field is
 * refused. Neither carries anything per block.
 *
 * agent_metadata  "ECXM" | u8 version=2 | u8 flags=0 | u16 nsections |
 *                 u32 total_len | u32 reserved=0 | u64 nonce | sections
 *   1 shm         16B boot_id | u64 st_dev | u64 st_ino | u16 path_len |
 *                 path | u16 sock_len | abstract socket name
 *   2 ucx         16B BLAKE2b of the address | packed ucp worker address
 *   4 tcp         u8 family (4 / 6) | u16 port (non-zero) | 4 / 16 address
 *                 bytes (network order; unicast: not any, multicast or
 *                 broadcast) — the section is exactly 7 or 19 bytes
 * mem_descriptor  "ECXD" | u8 version=2 | u8 flags=0 | u16 nsections |
 *                 u32 total_len | u32 reserved=0 | u64 nonce |
 *                 u64 block_bytes | u64 num_blocks | sections
 *   3 grant       16B token | u64 checksum | u64 nbytes | u32 lease_ms
 * The nonce is random per producer context: a descriptor is accepted only
 * with the metadata of the same producer. Every ack's descriptor carries
 * its grant's section (the ticket); a READ needs one. The digest guards the
 * UCX worker address, which UCX parses without a length: a truncated or
 * corrupted address is refused here and never reaches it.
 */
#define META_MAGIC "ECXM"
#define DESC_MAGIC "ECXD"
#define HEAD_LEN 24
#define DESC_HEAD_LEN 40
#define SEC_SHM 1
#define SEC_UCX 2
#define SEC_GRANT 3
#define SEC_TCP 4
#define GRANT_LEN (ECXI_DATA_TOKEN_LEN + 8 + 8 + 4)
#define DIGEST 16

static void digest(const uint8_t *b, size_t n, uint8_t out[DIGEST])
{
    crypto_generichash(out, DIGEST, b, n, NULL, 0);
}

static bool digest_ok(const uint8_t *want, const uint8_t *b, size_t n)
{
    uint8_t got[DIGEST];
    digest(b, n, got);
    return sodium_memcmp(got, want, DIGEST) == 0;
}

typedef struct wbuf {
    uint8_t *p;
    size_t cap, len;
    bool overflow;
} wbuf;

static uint8_t *wb_take(wbuf *w, size_t n)
{
    if (w->overflow || n > w->cap - w->len) {
        w->overflow = true;
        return NULL;
    }
    uint8_t *q = w->p + w->len;
    w->len += n;
    return q;
}
static void wb_bytes(wbuf *w, const void *b, size_t n)
{
    uint8_t *q = wb_take(w, n);
    if (q && n) memcpy(q, b, n);
}
static void wb16(wbuf *w, uint16_t v)
{
    uint8_t *q = wb_take(w, 2);
    if (q) ecxi_put_le16(q, v);
}
static void wb32(wbuf *w, uint32_t v)
{
    uint8_t *q = wb_take(w, 4);
    if (q) ecxi_put_le32(q, v);
}
static void wb64(wbuf *w, uint64_t v)
{
    uint8_t *q = wb_take(w, 8);
    if (q) ecxi_put_le64(q, v);
}

static void head(wbuf *w, const char *magic, uint16_t nsec, uint64_t nonce)
{
    wb_bytes(w, magic, 4);
    uint8_t *q = wb_take(w, 12);
    if (q) {
        q[0] = ECXI_DATA_FORMAT_VERSION, q[1] = 0;
        ecxi_put_le16(q + 2, nsec);
        ecxi_put_le32(q + 4, 0); /* total length, patched at the end */
        ecxi_put_le32(q + 8, 0);
    }
    wb64(w, nonce);
}

static long finish(wbuf *w)
{
    if (w->overflow || w->len > UINT32_MAX) return ECX_ERANGE;
    ecxi_put_le32(w->p + 8, (uint32_t)w->len);
    return (long)w->len;
}

long ecxi_data_meta_encode(const ecxi_data_meta *m, uint8_t *buf, size_t cap)
{
    if (!m || !buf) return ECX_EINVAL;
    if (m->has_shm && (m->path_len == 0 || m->path_len > ECXI_DATA_PATH_MAX || m->sock_len == 0 ||
                       m->sock_len > ECXI_DATA_SOCK_MAX))
        return ECX_EINVAL;
    if (m->has_ucx && (m->ucx_addr_len == 0 || m->ucx_addr_len > UINT16_MAX - DIGEST))
        return ECX_EINVAL;
    if (m->has_tcp && ((m->tcp_family != 4 && m->tcp_family != 6) || m->tcp_port == 0))
        return ECX_EINVAL;
    wbuf w = {buf, cap, 0, false};
    head(&w, META_MAGIC, (uint16_t)(m->has_shm + m->has_ucx + m->has_tcp), m->nonce);
    if (m->has_shm) {
        wb16(&w, SEC_SHM);
        wb16(&w, (uint16_t)(16 + 8 + 8 + 2 + m->path_len + 2 + m->sock_len));
        wb_bytes(&w, m->boot_id, 16);
        wb64(&w, m->dev);
        wb64(&w, m->ino);
        wb16(&w, (uint16_t)m->path_len);
        wb_bytes(&w, m->path, m->path_len);
        wb16(&w, (uint16_t)m->sock_len);
        wb_bytes(&w, m->sock, m->sock_len);
    }
    if (m->has_ucx) {
        wb16(&w, SEC_UCX);
        wb16(&w, (uint16_t)(DIGEST + m->ucx_addr_len));
        uint8_t dg[DIGEST];
        digest(m->ucx_addr, m->ucx_addr_len, dg);
        wb_bytes(&w, dg, DIGEST);
        wb_bytes(&w, m->ucx_addr, m->ucx_addr_len);
    }
    if (m->has_tcp) {
        size_t alen = m->tcp_family == 4 ? 4 : 16;
        wb16(&w, SEC_TCP);
        wb16(&w, (uint16_t)(3 + alen));
        wb_bytes(&w, &m->tcp_family, 1);
        wb16(&w, m->tcp_port);
        wb_bytes(&w, m->tcp_addr, alen);
    }
    return finish(&w);
}

long ecxi_data_desc_encode(const ecxi_data_desc *d, uint8_t *buf, size_t cap)
{
    if (!d || !buf) return ECX_EINVAL;
    wbuf w = {buf, cap, 0, false};
    head(&w, DESC_MAGIC, (uint16_t)d->has_ticket, d->nonce);
    wb64(&w, d->block_bytes);
    wb64(&w, d->num_blocks);
    if (d->has_ticket) {
        wb16(&w, SEC_GRANT);
        wb16(&w, GRANT_LEN);
        wb_bytes(&w, d->ticket.token, ECXI_DATA_TOKEN_LEN);
        wb64(&w, d->ticket.checksum);
        wb64(&w, d->ticket.nbytes);
        wb32(&w, d->ticket.lease_ms);
    }
    return finish(&w);
}

/* Common head check; on success *p points at the first section. */
static int check_head(const uint8_t *buf, size_t len, const char *magic, size_t head_len, int bad,
                      uint16_t *nsec)
{
    if (!buf || len < head_len || len > UINT32_MAX) return bad;
    if (memcmp(buf, magic, 4) != 0) return bad;
    if (buf[4] != ECXI_DATA_FORMAT_VERSION) return ECX_EDATA_VERSION;
    if (buf[5] != 0 || ecxi_get_le32(buf + 12) != 0) return bad;
    if (ecxi_get_le32(buf + 8) != len) return bad;
    *nsec = ecxi_get_le16(buf + 6);
    return 0;
}

/* A tcp section's body into m (family, port, a unicast address). */
static int tcp_section(const uint8_t *b, size_t slen, ecxi_data_meta *m)
{
    if (m->has_tcp || slen < 3) return ECX_EDATA_META;
    uint8_t fam = b[0];
    uint16_t port = ecxi_get_le16(b + 1);
    if (port == 0 || !((fam == 4 && slen == 7) || (fam == 6 && slen == 19))) return ECX_EDATA_META;
    if (fam == 4) {
        uint32_t a = (uint32_t)b[3] << 24 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 8 | b[6];
        if (a == INADDR_ANY || a == INADDR_BROADCAST || IN_MULTICAST(a)) return ECX_EDATA_META;
    } else {
        struct in6_addr a6;
        memcpy(&a6, b + 3, 16);
        if (IN6_IS_ADDR_UNSPECIFIED(&a6) || IN6_IS_ADDR_MULTICAST(&a6)) return ECX_EDATA_META;
    }
    m->tcp_family = fam;
    m->tcp_port = port;
    memcpy(m->tcp_addr, b + 3, slen - 3);
    m->has_tcp = true;
    return 0;
}

int ecxi_data_meta_decode(const uint8_t *buf, size_t len, ecxi_data_meta *m)
{
    if (!m) return ECX_EINVAL;
    memset(m, 0, sizeof *m);
    uint16_t nsec;
    int rc = check_head(buf, len, META_MAGIC, HEAD_LEN, ECX_EDATA_META, &nsec);
    if (rc) return rc;
    if (len > ECXI_DATA_META_MAX) return ECX_EDATA_META;
    m->nonce = ecxi_get_le64(buf + 16);
    size_t off = HEAD_LEN;
    for (unsigned s = 0; s < nsec; s++) {
        if (len - off < 4) return ECX_EDATA_META;
        uint16_t type = ecxi_get_le16(buf + off), slen = ecxi_get_le16(buf + off + 2);
        off += 4;
        if (slen > len - off) return ECX_EDATA_META;
        const uint8_t *b = buf + off;
        if (type == SEC_SHM) {
            if (m->has_shm || slen < 16 + 8 + 8 + 2) return ECX_EDATA_META;
            memcpy(m->boot_id, b, 16);
            m->dev = ecxi_get_le64(b + 16);
            m->ino = ecxi_get_le64(b + 24);
            size_t q = 32;
            m->path_len = ecxi_get_le16(b + q);
            q += 2;
            if (m->path_len == 0 || m->path_len > ECXI_DATA_PATH_MAX || m->path_len > slen - q)
                return ECX_EDATA_META;
            m->path = (const char *)b + q;
            q += m->path_len;
            if (slen - q < 2) return ECX_EDATA_META;
            m->sock_len = ecxi_get_le16(b + q);
            q += 2;
            if (m->sock_len == 0 || m->sock_len > ECXI_DATA_SOCK_MAX || m->sock_len != slen - q)
                return ECX_EDATA_META;
            m->sock = (const char *)b + q;
            /* The path is used with open(): no NUL inside, absolute. */
            if (memchr(m->path, 0, m->path_len) || m->path[0] != '/') return ECX_EDATA_META;
            m->has_shm = true;
        } else if (type == SEC_UCX) {
            if (m->has_ucx || slen <= DIGEST || !digest_ok(b, b + DIGEST, slen - DIGEST))
                return ECX_EDATA_META;
            m->ucx_addr = b + DIGEST;
            m->ucx_addr_len = slen - DIGEST;
            m->has_ucx = true;
        } else if (type == SEC_TCP) {
            if ((rc = tcp_section(b, slen, m))) return rc;
        }
        off += slen;
    }
    if (off != len) return ECX_EDATA_META;
    return 0;
}

int ecxi_data_desc_decode(const uint8_t *buf, size_t len, ecxi_data_desc *d)
{
    if (!d) return ECX_EINVAL;
    memset(d, 0, sizeof *d);
    uint16_t nsec;
    int rc = check_head(buf, len, DESC_MAGIC, DESC_HEAD_LEN, ECX_EDATA_DESC, &nsec);
    if (rc) return rc;
    if (len > ECXI_DATA_DESC_MAX) return ECX_EDATA_DESC;
    d->nonce = ecxi_get_le64(buf + 16);
    d->block_bytes = ecxi_get_le64(buf + 24);
    d->num_blocks = ecxi_get_le64(buf + 32);
    if (d->block_bytes == 0 || d->num_blocks == 0 || d->num_blocks > ECXI_REGION_MAX_BLOCKS ||
        d->block_bytes > UINT64_MAX / d->num_blocks ||
        d->block_bytes * d->num_blocks > (uint64_t)SIZE_MAX)
        return ECX_EDATA_DESC;
    size_t off = DESC_HEAD_LEN;
    for (unsigned s = 0; s < nsec; s++) {
        if (len - off < 4) return ECX_EDATA_DESC;
        uint16_t type = ecxi_get_le16(buf + off), slen = ecxi_get_le16(buf + off + 2);
        off += 4;
        if (slen > len - off) return ECX_EDATA_DESC;
        const uint8_t *b = buf + off;
        if (type == SEC_GRANT) {
            if (d->has_ticket || slen != GRANT_LEN) return ECX_EDATA_DESC;
            memcpy(d->ticket.token, b, ECXI_DATA_TOKEN_LEN);
            d->ticket.checksum = ecxi_get_le64(b + ECXI_DATA_TOKEN_LEN);
            d->ticket.nbytes = ecxi_get_le64(b + ECXI_DATA_TOKEN_LEN + 8);
            d->ticket.lease_ms = ecxi_get_le32(b + ECXI_DATA_TOKEN_LEN + 16);
            if (d->ticket.nbytes == 0 || d->ticket.nbytes > d->block_bytes * d->num_blocks ||
                d->ticket.lease_ms == 0)
                return ECX_EDATA_DESC;
            d->has_ticket = true;
        }
        off += slen;
    }
    if (off != len) return ECX_EDATA_DESC;
    return 0;
}

bool ecxi_data_meta_is_ecx(const uint8_t *buf, size_t len)
{
    return buf && len >= 4 && memcmp(buf, META_MAGIC, 4) == 0;
}

bool ecxi_data_desc_is_ecx(const uint8_t *buf, size_t len)
{
    return buf && len >= 4 && memcmp(buf, DESC_MAGIC, 4) == 0;
}
