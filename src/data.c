/*
 * data — the data-plane front: the public calls (which check what is
 * common to every backend and then dispatch through the vtable), the
 * agent_metadata / mem_descriptor codec, and the "auto" backend, which
 * publishes the same-host and tcp paths and picks one per peer.
 *
 * Why the checks live here: every backend gets the same guarantees (counts
 * equal and non-zero, every index below both block counts, block sizes
 * equal, descriptor and metadata from the same producer), so a backend
 * cannot forget one, and a malformed ack is refused before any backend
 * code sees it.
 */
#include "data.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "data_impl.h"
#include "util.h"

/* ---- little-endian helpers ------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/*
 * Formats. Both are little-endian, start with a 24-byte head and carry
 * typed sections (u16 type, u16 length, body); sections of an unknown type
 * are skipped, so later versions can add paths without breaking older
 * consumers; a known section twice, a length that overruns, a total length
 * different from the bytes received, or any non-zero reserved field is
 * refused. Neither carries anything per block.
 *
 * agent_metadata  "ECXM" | u8 version=1 | u8 flags=0 | u16 nsections |
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
 * its grant's section (the ticket); a READ needs one. The digests guard the two UCX
 * blobs, which UCX parses without a length: a truncated or corrupted blob
 * is refused here and never reaches it.
 */
#define META_MAGIC "ECXM"
#define DESC_MAGIC "ECXD"
#define HEAD_LEN 24
#define DESC_HEAD_LEN 40
#define SEC_SHM 1
#define SEC_UCX 2
#define SEC_GRANT 3
#define SEC_TCP 4
#define GRANT_LEN (ECX_DATA_TOKEN_LEN + 8 + 8 + 4)
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
    if (q) put16(q, v);
}
static void wb32(wbuf *w, uint32_t v)
{
    uint8_t *q = wb_take(w, 4);
    if (q) put32(q, v);
}
static void wb64(wbuf *w, uint64_t v)
{
    uint8_t *q = wb_take(w, 8);
    if (q) put64(q, v);
}

static void head(wbuf *w, const char *magic, uint16_t nsec, uint64_t nonce)
{
    wb_bytes(w, magic, 4);
    uint8_t *q = wb_take(w, 12);
    if (q) {
        q[0] = ECX_DATA_FORMAT_VERSION, q[1] = 0;
        put16(q + 2, nsec);
        put32(q + 4, 0); /* total length, patched at the end */
        put32(q + 8, 0);
    }
    wb64(w, nonce);
}

static long finish(wbuf *w)
{
    if (w->overflow || w->len > UINT32_MAX) return ECX_ERANGE;
    put32(w->p + 8, (uint32_t)w->len);
    return (long)w->len;
}

long ecxi_data_meta_encode(const ecxi_data_meta *m, uint8_t *buf, size_t cap)
{
    if (!m || !buf) return ECX_EINVAL;
    if (m->has_shm && (m->path_len == 0 || m->path_len > ECX_DATA_PATH_MAX || m->sock_len == 0 ||
                       m->sock_len > ECX_DATA_SOCK_MAX))
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
        wb_bytes(&w, d->ticket.token, ECX_DATA_TOKEN_LEN);
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
    if (buf[4] != ECX_DATA_FORMAT_VERSION) return ECX_EDATA_VERSION;
    if (buf[5] != 0 || get32(buf + 12) != 0) return bad;
    if (get32(buf + 8) != len) return bad;
    *nsec = get16(buf + 6);
    return 0;
}

/* A tcp section's body into m (family, port, a unicast address). */
static int tcp_section(const uint8_t *b, size_t slen, ecxi_data_meta *m)
{
    if (m->has_tcp || slen < 3) return ECX_EDATA_META;
    uint8_t fam = b[0];
    uint16_t port = get16(b + 1);
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
    if (len > ECX_DATA_META_MAX) return ECX_EDATA_META;
    m->nonce = get64(buf + 16);
    size_t off = HEAD_LEN;
    for (unsigned s = 0; s < nsec; s++) {
        if (len - off < 4) return ECX_EDATA_META;
        uint16_t type = get16(buf + off), slen = get16(buf + off + 2);
        off += 4;
        if (slen > len - off) return ECX_EDATA_META;
        const uint8_t *b = buf + off;
        if (type == SEC_SHM) {
            if (m->has_shm || slen < 16 + 8 + 8 + 2) return ECX_EDATA_META;
            memcpy(m->boot_id, b, 16);
            m->dev = get64(b + 16);
            m->ino = get64(b + 24);
            size_t q = 32;
            m->path_len = get16(b + q);
            q += 2;
            if (m->path_len == 0 || m->path_len > ECX_DATA_PATH_MAX || m->path_len > slen - q)
                return ECX_EDATA_META;
            m->path = (const char *)b + q;
            q += m->path_len;
            if (slen - q < 2) return ECX_EDATA_META;
            m->sock_len = get16(b + q);
            q += 2;
            if (m->sock_len == 0 || m->sock_len > ECX_DATA_SOCK_MAX || m->sock_len != slen - q)
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
    if (len > ECX_DATA_DESC_MAX) return ECX_EDATA_DESC;
    d->nonce = get64(buf + 16);
    d->block_bytes = get64(buf + 24);
    d->num_blocks = get64(buf + 32);
    if (d->block_bytes == 0 || d->num_blocks == 0 || d->num_blocks > ECX_REGION_MAX_BLOCKS ||
        d->block_bytes > UINT64_MAX / d->num_blocks ||
        d->block_bytes * d->num_blocks > (uint64_t)SIZE_MAX)
        return ECX_EDATA_DESC;
    size_t off = DESC_HEAD_LEN;
    for (unsigned s = 0; s < nsec; s++) {
        if (len - off < 4) return ECX_EDATA_DESC;
        uint16_t type = get16(buf + off), slen = get16(buf + off + 2);
        off += 4;
        if (slen > len - off) return ECX_EDATA_DESC;
        const uint8_t *b = buf + off;
        if (type == SEC_GRANT) {
            if (d->has_ticket || slen != GRANT_LEN) return ECX_EDATA_DESC;
            memcpy(d->ticket.token, b, ECX_DATA_TOKEN_LEN);
            d->ticket.checksum = get64(b + ECX_DATA_TOKEN_LEN);
            d->ticket.nbytes = get64(b + ECX_DATA_TOKEN_LEN + 8);
            d->ticket.lease_ms = get32(b + ECX_DATA_TOKEN_LEN + 16);
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

int ecxi_data_boot_id(uint8_t out[16])
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ECX_ESYS;
    char txt[64];
    ssize_t n = read(fd, txt, sizeof txt - 1);
    close(fd);
    if (n < 36) return ECX_ESYS;
    char hex[32];
    size_t k = 0;
    for (ssize_t i = 0; i < 36 && k < 32; i++)
        if (txt[i] != '-') hex[k++] = txt[i];
    if (k != 32 || ecxi_hex_decode(hex, 32, out) != 16) return ECX_ESYS;
    return 0;
}

int ecxi_data_bind_addr(const char *host, struct sockaddr_storage *bind,
                       struct sockaddr_storage *publish, bool *any)
{
    memset(bind, 0, sizeof *bind);
    memset(publish, 0, sizeof *publish);
    *any = !host || !*host || !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
    if (*any) {
        bind->ss_family = AF_INET;
        struct sockaddr_in *in = (struct sockaddr_in *)publish;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct ifaddrs *ifs;
        if (getifaddrs(&ifs) == 0) {
            for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
                    !(i->ifa_flags & IFF_LOOPBACK)) {
                    in->sin_addr = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
                    break;
                }
            freeifaddrs(ifs);
        }
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e != 0) {
        ecxi_log(ECX_LOG_WARN, "data: cannot resolve %s: %s", host, gai_strerror(e));
        return ECX_EINVAL;
    }
    int rc = ECX_EINVAL;
    for (struct addrinfo *r = res; r && rc; r = r->ai_next)
        if ((r->ai_family == AF_INET || r->ai_family == AF_INET6) &&
            r->ai_addrlen <= sizeof *bind) {
            memcpy(bind, r->ai_addr, r->ai_addrlen);
            memcpy(publish, r->ai_addr, r->ai_addrlen);
            rc = 0;
        }
    freeaddrinfo(res);
    return rc;
}

/* ---- peer head ------------------------------------------------------- */

int ecxi_data_peer_head_init(ecxi_data_peer *p, const ecxi_data_desc *desc, const uint8_t *meta,
                            size_t meta_len)
{
    p->num_blocks = desc->num_blocks;
    p->nonce = desc->nonce;
    p->meta = malloc(meta_len ? meta_len : 1);
    if (!p->meta) return ECX_ENOMEM;
    if (meta_len) memcpy(p->meta, meta, meta_len);
    p->meta_len = meta_len;
    return 0;
}

void ecxi_data_peer_head_fini(ecxi_data_peer *p)
{
    free(p->meta);
    p->meta = NULL;
}

/* ---- auto: the paths a producer publishes, chosen per peer ---------- */

/* The inner contexts, in the order a consumer prefers them. */
enum { IN_SHM, IN_TCP, IN_UCX, IN_N };

typedef struct auto_data {
    ecxi_data base;
    ecxi_data *in[IN_N]; /* any may be NULL */
    int epfd;           /* joins the inner descriptors */
} auto_data;

static const struct ecxi_data_ops auto_ops;

static void auto_join_fd(auto_data *a, ecxi_data *inner)
{
    if (!inner || a->epfd < 0) return;
    int fd = inner->ops->fd(inner);
    if (fd < 0) return;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST)
        ecxi_log(ECX_LOG_WARN, "data: epoll_ctl: %s", strerror(errno));
}

static void auto_free(ecxi_data *d)
{
    auto_data *a = (auto_data *)d;
    for (int i = 0; i < IN_N; i++)
        if (a->in[i]) a->in[i]->ops->free(a->in[i]);
    if (a->epfd >= 0) close(a->epfd);
    free(a);
}

static int auto_progress(ecxi_data *d)
{
    auto_data *a = (auto_data *)d;
    int n = 0, rc;
    for (int i = 0; i < IN_N; i++) {
        if (!a->in[i]) continue;
        if ((rc = a->in[i]->ops->progress(a->in[i])) < 0) return rc;
        n += rc;
    }
    return n;
}

static int auto_fd(ecxi_data *d)
{
    return ((auto_data *)d)->epfd;
}

static int auto_arm(ecxi_data *d)
{
    auto_data *a = (auto_data *)d;
    int rc;
    for (int i = 0; i < IN_N; i++)
        if (a->in[i] && (rc = a->in[i]->ops->arm(a->in[i])) != 0) return rc;
    return 0;
}

static int auto_poll_notifs(ecxi_data *d, ecxi_data_notif_cb cb, void *arg)
{
    auto_data *a = (auto_data *)d;
    int n = 0, rc;
    for (int i = 0; i < IN_N; i++) {
        if (!a->in[i]) continue;
        if ((rc = a->in[i]->ops->poll_notifs(a->in[i], cb, arg)) < 0) return rc;
        n += rc;
    }
    return n;
}

/* The same-host path when it reaches the producer, else tcp if the
 * producer publishes it, else UCX. The tcp and UCX contexts are created
 * on first need (a consumer that only ever talks to local producers never
 * starts UCX). Peers returned are the inner backend's own. */
static int auto_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                         ecxi_data_peer **out)
{
    auto_data *a = (auto_data *)d;
    int rc = ECX_EDATA_NOPATH;
    if (a->in[IN_SHM] && m->has_shm) {
        rc = a->in[IN_SHM]->ops->peer_add(a->in[IN_SHM], m, desc, out);
        if (rc == 0) return 0;
        ecxi_log(ECX_LOG_DEBUG, "data: same-host path not usable (%s); trying the network",
                ecx_strerror(rc));
    }
    int k = m->has_tcp ? IN_TCP : m->has_ucx ? IN_UCX : -1;
    if (k < 0) return rc;
    if (!a->in[k]) {
        int r2 = k == IN_TCP ? ecxi_data_tcp_new_consumer(d->region, &a->in[k])
                             : ecxi_data_ucx_new_consumer(d->region, &a->in[k]);
        if (r2) return r2;
        a->in[k]->role = ECX_DATA_CONSUMER;
        a->in[k]->region = d->region;
        auto_join_fd(a, a->in[k]);
    }
    return a->in[k]->ops->peer_add(a->in[k], m, desc, out);
}

static void auto_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg)
{
    auto_data *a = (auto_data *)d;
    for (int i = 0; i < IN_N; i++)
        if (a->in[i]) ecxi_data_set_grant_fn(a->in[i], fn, arg);
}

static void auto_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const auto_data *a = (const auto_data *)d;
    for (int i = 0; i < IN_N; i++)
        if (a->in[i]) ecxi_data_get_stats(a->in[i], st);
}

static const struct ecxi_data_ops auto_ops = {
    .name = "auto",
    .set_grant_fn = auto_set_grant_fn,
    .stats = auto_stats,
    .free = auto_free,
    .progress = auto_progress,
    .fd = auto_fd,
    .arm = auto_arm,
    .poll_notifs = auto_poll_notifs,
    .peer_add = auto_peer_add,
    /* peers and xfers are the inner backends' own: never dispatched here */
};

/* ---- public calls ---------------------------------------------------- */

int ecxi_data_backend_parse(const char *s, int *out)
{
    if (!s || !out) return ECX_EINVAL;
    if (strcmp(s, "auto") == 0)
        *out = ECX_DATA_AUTO;
    else if (strcmp(s, "shm") == 0)
        *out = ECX_DATA_SHM;
    else if (strcmp(s, "ucx") == 0)
        *out = ECX_DATA_UCX;
    else if (strcmp(s, "tcp") == 0)
        *out = ECX_DATA_TCP;
    else
        return ECX_EINVAL;
    return 0;
}

const char *ecxi_data_backend_name(int backend)
{
    switch (backend) {
    case ECX_DATA_AUTO: return "auto";
    case ECX_DATA_SHM: return "shm";
    case ECX_DATA_UCX: return "ucx";
    case ECX_DATA_TCP: return "tcp";
    }
    return "unknown";
}

static int random_nonce(uint64_t *out)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ECX_ESYS;
    ssize_t n = read(fd, out, sizeof *out);
    close(fd);
    return n == (ssize_t)sizeof *out ? 0 : ECX_ESYS;
}

static int make_auto(ecxi_region *r, int role, ecxi_data *const in[IN_N], ecxi_data **out)
{
    auto_data *a = calloc(1, sizeof *a);
    if (!a) return ECX_ENOMEM;
    a->base.ops = &auto_ops;
    a->base.role = role;
    a->base.region = r;
    a->epfd = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < IN_N; i++) {
        a->in[i] = in[i];
        auto_join_fd(a, in[i]);
    }
    *out = &a->base;
    return 0;
}

static void free_inner(ecxi_data *const in[IN_N])
{
    for (int i = 0; i < IN_N; i++)
        if (in[i]) in[i]->ops->free(in[i]);
}

/* Start inner context k for role; 0 or its error. */
static int start_inner(int k, ecxi_region *region, const ecxi_data_opts *opts, int role,
                       ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out)
{
    bool p = role == ECX_DATA_PRODUCER;
    switch (k) {
    case IN_SHM:
        return p ? ecxi_data_shm_new_producer(region, m, dd, out)
                 : ecxi_data_shm_new_consumer(region, out);
    case IN_TCP:
        return p ? ecxi_data_tcp_new_producer(region, opts, m, out)
                 : ecxi_data_tcp_new_consumer(region, out);
    default:
        return p ? ecxi_data_ucx_new_producer(region, opts, m, dd, out)
                 : ecxi_data_ucx_new_consumer(region, out);
    }
}

static int new_ctx(ecxi_region *region, const ecxi_data_opts *opts, int role, ecxi_data **out)
{
    if (!region || !out) return ECX_EINVAL;
    *out = NULL;
    int backend = opts ? opts->backend : ECX_DATA_AUTO;
    static const int inner_of[] = {[ECX_DATA_SHM] = IN_SHM, [ECX_DATA_TCP] = IN_TCP,
                                   [ECX_DATA_UCX] = IN_UCX};
    if (backend != ECX_DATA_AUTO && backend != ECX_DATA_SHM && backend != ECX_DATA_UCX &&
        backend != ECX_DATA_TCP)
        return ECX_EINVAL;
    ecxi_data_meta m = {0};
    ecxi_data_desc dd = {0};
    ecxi_data *in[IN_N] = {0};
    int rc = 0;
    if (role == ECX_DATA_PRODUCER) {
        if ((rc = random_nonce(&m.nonce))) return rc;
        dd.nonce = m.nonce;
        dd.block_bytes = ecxi_region_block_bytes(region);
        dd.num_blocks = ecxi_region_num_blocks(region);
    }
    /* What starts now: the one path asked for; for auto, the producer's
     * shm and tcp (UCX only when asked: its tcp transport is open to
     * writes, data_ucx.c), the consumer's shm (tcp / UCX start on first
     * need, auto_peer_add). */
    bool want[IN_N] = {0};
    if (backend != ECX_DATA_AUTO)
        want[inner_of[backend]] = true;
    else
        want[IN_SHM] = true, want[IN_TCP] = role == ECX_DATA_PRODUCER;
    static const char *const what[IN_N] = {"same-host", "tcp", "UCX"};
    int started = 0;
    for (int k = 0; k < IN_N; k++) {
        if (!want[k]) continue;
        int rk = start_inner(k, region, opts, role, &m, &dd, &in[k]);
        if (rk && backend != ECX_DATA_AUTO) return rk;
        if (rk) {
            ecxi_log(ECX_LOG_WARN, "data: %s path unavailable: %s", what[k], ecx_strerror(rk));
            rc = rk;
            continue;
        }
        in[k]->role = role, in[k]->region = region;
        started++;
    }
    /* An auto consumer without shm still has the network, started later. */
    if (!started && !(backend == ECX_DATA_AUTO && role == ECX_DATA_CONSUMER)) return rc;
    ecxi_data *d = NULL;
    if (backend == ECX_DATA_AUTO) {
        rc = make_auto(region, role, in, &d);
        if (rc) {
            free_inner(in);
            return rc;
        }
    } else {
        d = in[inner_of[backend]];
    }
    if (role == ECX_DATA_PRODUCER) {
        uint8_t mb[ECX_DATA_META_MAX], db[ECX_DATA_DESC_MAX];
        long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
        long dl = ecxi_data_desc_encode(&dd, db, sizeof db);
        if (ml < 0 || dl < 0) {
            ecxi_log(ECX_LOG_ERROR, "data: metadata does not fit (%ld / %ld)", ml, dl);
            d->ops->free(d);
            return ECX_ERANGE;
        }
        if (!(d->meta = malloc((size_t)ml))) {
            d->ops->free(d);
            return ECX_ENOMEM;
        }
        memcpy(d->meta, mb, (size_t)ml);
        d->meta_len = (size_t)ml;
        d->layout = dd;
    }
    *out = d;
    return 0;
}

int ecxi_data_new_producer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out)
{
    return new_ctx(region, opts, ECX_DATA_PRODUCER, out);
}

int ecxi_data_new_consumer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out)
{
    return new_ctx(region, opts, ECX_DATA_CONSUMER, out);
}

const uint8_t *ecxi_data_agent_metadata(const ecxi_data *d, size_t *len)
{
    if (len) *len = d ? d->meta_len : 0;
    return d ? d->meta : NULL;
}

long ecxi_data_grant_descriptor(const ecxi_data *d, const ecxi_data_ticket *t, uint8_t *buf,
                               size_t cap)
{
    if (!d || !t || !buf) return ECX_EINVAL;
    if (d->role != ECX_DATA_PRODUCER) return ECX_EDATA_ROLE;
    ecxi_data_desc dd = d->layout;
    dd.has_ticket = true;
    dd.ticket = *t;
    return ecxi_data_desc_encode(&dd, buf, cap);
}

void ecxi_data_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg)
{
    if (!d) return;
    d->grant_fn = fn;
    d->grant_arg = arg;
    if (d->ops->set_grant_fn) d->ops->set_grant_fn(d, fn, arg);
}

int ecxi_data_desc_ticket(const uint8_t *desc, size_t desc_len, ecxi_data_ticket *t)
{
    ecxi_data_desc dd;
    int rc = ecxi_data_desc_decode(desc, desc_len, &dd);
    if (rc) return rc;
    if (!dd.has_ticket) return ECX_EDATA_DESC;
    if (t) *t = dd.ticket;
    return 0;
}

int ecxi_data_poll_notifs(ecxi_data *d, ecxi_data_notif_cb cb, void *arg)
{
    if (!d || !cb) return ECX_EINVAL;
    if (d->role != ECX_DATA_PRODUCER) return ECX_EDATA_ROLE;
    return d->ops->poll_notifs(d, cb, arg);
}

int ecxi_data_peer_add(ecxi_data *d, const uint8_t *meta, size_t meta_len, const uint8_t *desc,
                      size_t desc_len, ecxi_data_peer **out)
{
    if (!d || !out) return ECX_EINVAL;
    *out = NULL;
    if (d->role != ECX_DATA_CONSUMER) return ECX_EDATA_ROLE;
    ecxi_data_meta m;
    ecxi_data_desc dd;
    int rc = ecxi_data_meta_decode(meta, meta_len, &m);
    if (rc) return rc;
    if ((rc = ecxi_data_desc_decode(desc, desc_len, &dd))) return rc;
    if (m.nonce != dd.nonce || dd.block_bytes != ecxi_region_block_bytes(d->region))
        return ECX_EDATA_MISMATCH;
    rc = d->ops->peer_add(d, &m, &dd, out);
    if (rc == 0) {
        ecxi_data_peer *p = *out;
        rc = ecxi_data_peer_head_init(p, &dd, meta, meta_len);
        if (rc) {
            p->owner->ops->peer_drop(p);
            *out = NULL;
        }
    }
    return rc;
}

bool ecxi_data_peer_same(const ecxi_data_peer *p, const uint8_t *meta, size_t meta_len)
{
    return p && meta && p->meta_len == meta_len && memcmp(p->meta, meta, meta_len) == 0;
}

const char *ecxi_data_peer_backend(const ecxi_data_peer *p)
{
    return p ? p->backend : "none";
}

void ecxi_data_peer_drop(ecxi_data_peer *p)
{
    if (!p) return;
    /* The head's copies go first: the backend frees the peer itself. */
    ecxi_data_peer_head_fini(p);
    p->owner->ops->peer_drop(p);
}

int ecxi_data_read_post(ecxi_data_peer *p, const uint8_t *desc, size_t desc_len,
                       const uint64_t *remote, const uint64_t *local, size_t n, uint64_t nbytes,
                       const char *key, size_t key_len, ecxi_data_xfer **out)
{
    if (!p || !out || (n && (!remote || !local)) || (key_len && !key)) return ECX_EINVAL;
    *out = NULL;
    ecxi_data_desc dd;
    int rc = ecxi_data_desc_decode(desc, desc_len, &dd);
    if (rc) return rc;
    if (!dd.has_ticket) return ECX_EDATA_DESC;
    uint64_t lblocks = ecxi_region_num_blocks(p->owner->region);
    uint64_t bs = ecxi_region_block_bytes(p->owner->region);
    if (dd.nonce != p->nonce || dd.num_blocks != p->num_blocks || dd.block_bytes != bs)
        return ECX_EDATA_MISMATCH;
    if (nbytes == 0) nbytes = dd.ticket.nbytes;
    if (nbytes != dd.ticket.nbytes) return ECX_EDATA_MISMATCH;
    if (n == 0) return ECX_EDATA_COUNT;
    if (key_len == 0 || key_len > ECX_DATA_NOTIF_MAX) return ECX_EDATA_NOTIF;
    if (n > lblocks || n > p->num_blocks) return ECX_EDATA_COUNT;
    if (nbytes <= (n - 1) * bs || nbytes > n * bs) return ECX_EDATA_COUNT;
    for (size_t i = 0; i < n; i++)
        if (remote[i] >= p->num_blocks || local[i] >= lblocks) return ECX_EDATA_INDEX;
    return p->owner->ops->read_post(p, &dd.ticket, remote, local, n, nbytes, key, key_len, out);
}

int ecxi_data_read_poll(ecxi_data_xfer *x)
{
    if (!x) return ECX_EINVAL;
    return x->owner->ops->read_poll(x);
}

void ecxi_data_read_release(ecxi_data_xfer *x)
{
    if (x) x->owner->ops->read_release(x);
}

int ecxi_data_progress(ecxi_data *d)
{
    if (!d) return ECX_EINVAL;
    return d->ops->progress(d);
}

int ecxi_data_fd(ecxi_data *d)
{
    return d ? d->ops->fd(d) : -1;
}

int ecxi_data_arm(ecxi_data *d)
{
    if (!d) return ECX_EINVAL;
    return d->ops->arm(d);
}

void ecxi_data_get_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    if (d && st && d->ops->stats) d->ops->stats(d, st);
}

const char *ecxi_data_name(const ecxi_data *d)
{
    return d ? d->ops->name : "none";
}

void ecxi_data_free(ecxi_data *d)
{
    if (!d) return;
    free(d->meta);
    d->meta = NULL;
    d->ops->free(d);
}
