/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data — the data-plane front: the calls of data.h, which check what is
 * common to every backend and then dispatch through the vtable
 * (data_impl.h), the constructors, which reach each path through the
 * registration table (paths.c), and the helpers the backends share (peer
 * head, boot id, bind address).
 *
 * What lives elsewhere, and why: the agent_metadata / mem_descriptor codec
 * is data_format.c (the wire contract, fuzzed on its own); the "auto"
 * backend is data_auto.c (a policy over the real paths, not dispatch); the
 * "nixl" one is data_nixl.c (a wrapper over auto that answers and reads
 * NIXL's form of an ack itself); the real paths are data_shm.c,
 * data_tcp.c, data_ucx.c, and data_fault.c wraps any of them for tests.
 *
 * Why the checks live here: every backend gets the same guarantees (counts
 * equal and non-zero, every index below both block counts, block sizes
 * equal, descriptor and metadata from the same producer), so a backend
 * cannot forget one, and a malformed ack is refused before any backend
 * code sees it.
 */
#include "data.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data_impl.h"
#include "util.h"

/* ---- helpers the backends share ------------------------------------- */

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

int ecxi_data_peer_done(int rc, const ecxi_data_desc *desc, const uint8_t *meta, size_t meta_len,
                        ecxi_data_peer **out)
{
    if (rc) return rc;
    ecxi_data_peer *p = *out;
    ecxi_data_ops_check(p->owner->ops, true);
    p->num_blocks = desc->num_blocks;
    p->nonce = desc->nonce;
    p->meta = malloc(meta_len ? meta_len : 1);
    if (!p->meta) {
        p->owner->ops->peer_drop(p);
        *out = NULL;
        return ECX_ENOMEM;
    }
    if (meta_len) memcpy(p->meta, meta, meta_len);
    p->meta_len = meta_len;
    ecxi_log(ECX_LOG_DEBUG, "data: producer registered, path %s", p->backend);
    return 0;
}

/* ---- the vtable ------------------------------------------------------ */

void ecxi_data_ops_check(const struct ecxi_data_ops *ops, bool peer)
{
#define CONTEXT_SLOTS(X) X(name) X(free) X(progress) X(fd) X(arm) X(poll_notifs) X(peer_add)
#define PEER_SLOTS(X) X(peer_drop) X(read_post) X(read_poll) X(read_release)
#define MISSING(slot) !ops->slot ? #slot:
    const char *gap = peer ? PEER_SLOTS(MISSING) NULL : CONTEXT_SLOTS(MISSING) NULL;
#undef MISSING
#undef PEER_SLOTS
#undef CONTEXT_SLOTS
    if (!gap) return;
    ecxi_log(ECX_LOG_ERROR, "data: backend %s lacks its %s", ops->name ? ops->name : "?", gap);
    abort();
}

/* ---- constructors ---------------------------------------------------- */

enum { N_PATHS = sizeof ecxi_data_paths / sizeof *ecxi_data_paths };

/* The table's entry for backend, or NULL for a number no path has. */
static const ecxi_data_path *path_of(int backend)
{
    return backend >= 0 && backend < N_PATHS ? &ecxi_data_paths[backend] : NULL;
}

int ecxi_data_backend_parse(const char *s, int *out)
{
    if (!s || !out) return ECX_EINVAL;
#define PARSE_(name, v, str)                                                                       \
    if (!strcmp(s, str)) return *out = ECX_DATA_##name, 0;
    ECXI_DATA_BACKENDS(PARSE_)
#undef PARSE_
    return ECX_EINVAL;
}

const char *ecxi_data_backend_name(int backend)
{
    switch (backend) {
#define NAME_(name, v, str)                                                                        \
    case ECX_DATA_##name: return str;
        ECXI_DATA_BACKENDS(NAME_)
#undef NAME_
    }
    return "unknown";
}

bool ecxi_data_backend_built(int backend)
{
    const ecxi_data_path *p = path_of(backend);
    return p && p->start;
}

static int random_nonce(uint64_t *out)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ECX_ESYS;
    ssize_t n = read(fd, out, sizeof *out);
    close(fd);
    return n == (ssize_t)sizeof *out ? 0 : ECX_ESYS;
}

/* Start one backend for role through the registration table (paths.c);
 * the producer ones fill their part of *m and *dd. */
int ecxi_data_start(int backend, ecxi_region *region, const ecxi_data_opts *opts, int role,
                    ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out)
{
    const ecxi_data_path *p = path_of(backend);
    if (!p) return ECX_EINVAL;
    if (!p->start) {
        ECXI_LOG_RATELIMITED(ECX_LOG_ERROR, "data: %s is not built in (this libecx was built "
                            "without it: ECX_WITH_UCX, ECX_WITH_NIXL)",
                            ecxi_data_backend_name(backend));
        return ECX_EDATA_NOPATH;
    }
    int rc = p->start(region, opts, role, m, dd, out);
    if (rc) return rc;
    ecxi_data_ops_check((*out)->ops, false);
    (*out)->role = role;
    (*out)->region = region;
    (*out)->background = opts && opts->background;
    return 0;
}

static int new_ctx(ecxi_region *region, const ecxi_data_opts *opts, int role, ecxi_data **out)
{
    if (!region || !out) return ECX_EINVAL;
    *out = NULL;
    int backend = opts ? opts->backend : ECX_DATA_AUTO;
    ecxi_data_meta m = {0};
    ecxi_data_desc dd = {0};
    int rc;
    if (role == ECXI_DATA_PRODUCER) {
        if ((rc = random_nonce(&m.nonce))) return rc;
        dd.nonce = m.nonce;
        dd.block_bytes = ecxi_region_block_bytes(region);
        dd.num_blocks = ecxi_region_num_blocks(region);
    }
    ecxi_data *d = NULL;
    if ((rc = ecxi_data_start(backend, region, opts, role, &m, &dd, &d))) return rc;
    /* (nixl publishes NIXL's metadata, made by the backend) */
    if (role == ECXI_DATA_PRODUCER && !d->meta) {
        uint8_t mb[ECXI_DATA_META_MAX];
        long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
        if (ml < 0) {
            ecxi_log(ECX_LOG_ERROR, "data: metadata does not fit (%ld)", ml);
            d->ops->free(d);
            return ECX_ERANGE;
        }
        if (!(d->meta = malloc((size_t)ml))) {
            d->ops->free(d);
            return ECX_ENOMEM;
        }
        memcpy(d->meta, mb, (size_t)ml);
        d->meta_len = (size_t)ml;
    }
    if (role == ECXI_DATA_PRODUCER) d->layout = dd;
    *out = d;
    return 0;
}


int ecxi_data_new_producer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out)
{
    return new_ctx(region, opts, ECXI_DATA_PRODUCER, out);
}

int ecxi_data_new_consumer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out)
{
    return new_ctx(region, opts, ECXI_DATA_CONSUMER, out);
}

/* ---- the calls of data.h ---------------------------------------------- */

const uint8_t *ecxi_data_agent_metadata(const ecxi_data *d, size_t *len)
{
    if (len) *len = d ? d->meta_len : 0;
    return d ? d->meta : NULL;
}

long ecxi_data_grant_descriptor(const ecxi_data *d, const ecxi_data_ticket *t, uint8_t *buf,
                               size_t cap)
{
    if (!d || !t || !buf) return ECX_EINVAL;
    if (d->role != ECXI_DATA_PRODUCER) return ECX_EROLE;
    ecxi_data_desc dd = d->layout;
    dd.has_ticket = true;
    dd.ticket = *t;
    return ecxi_data_desc_encode(&dd, buf, cap);
}

int ecxi_data_grant_ack(const ecxi_data *d, bool ecx_peer, const ecxi_data_ticket *t,
                        uint8_t *buf, size_t cap, ecxi_data_ack *out)
{
    if (!d || !t || !buf || !out) return ECX_EINVAL;
    if (d->role != ECXI_DATA_PRODUCER) return ECX_EROLE;
    if (d->ops->grant_ack) return d->ops->grant_ack(d, ecx_peer, t, buf, cap, out);
    long dl = ecxi_data_grant_descriptor(d, t, buf, cap);
    if (dl < 0) return (int)dl;
    *out = (ecxi_data_ack){d->meta, d->meta_len, buf, (size_t)dl, false};
    return 0;
}

int ecxi_data_cut(ecxi_data *d, const char *key, size_t key_len,
                  const uint8_t token[ECXI_DATA_TOKEN_LEN])
{
    if (!d || !key || !token || !d->ops->cut) return 0;
    return d->ops->cut(d, key, key_len, token);
}

void ecxi_data_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg)
{
    if (!d) return;
    d->grant_fn = fn;
    d->grant_arg = arg;
    if (d->ops->set_grant_fn) d->ops->set_grant_fn(d, fn, arg);
}

void ecxi_slice_start(ecxi_slice *sl, int64_t budget_ns)
{
    sl->start_ns = ecxi_now_ns();
    sl->budget_ns = budget_ns;
    sl->bytes = 0;
    sl->more = false;
}

/* Account for one finished slice. */
static void slice_end(ecxi_data *d, const ecxi_slice *sl)
{
    d->more = sl->more;
    if (!sl->bytes) return;
    int64_t ns = ecxi_now_ns() - sl->start_ns;
    d->slices++;
    d->slice_bytes += sl->bytes;
    if (sl->bytes > d->slice_max_bytes) d->slice_max_bytes = sl->bytes;
    if ((uint64_t)ns > d->slice_max_ns) d->slice_max_ns = (uint64_t)ns;
    d->slices_cut += sl->more;
}

int ecxi_data_poll_notifs(ecxi_data *d, ecxi_data_notif_cb cb, void *arg)
{
    if (!d || !cb) return ECX_EINVAL;
    if (d->role != ECXI_DATA_PRODUCER) return ECX_EROLE;
    ecxi_slice sl;
    ecxi_slice_start(&sl, ECXI_DATA_SLICE_NS);
    int rc = d->ops->poll_notifs(d, &sl, cb, arg);
    slice_end(d, &sl);
    return rc;
}

int ecxi_data_peer_add(ecxi_data *d, const uint8_t *meta, size_t meta_len,
                       const ecxi_data_desc *desc, ecxi_data_peer **out)
{
    if (!d || !out) return ECX_EINVAL;
    *out = NULL;
    if (d->role != ECXI_DATA_CONSUMER) return ECX_EROLE;
    if (!desc || desc->unverified) return ECX_EDATA_DESC;
    ecxi_data_meta m;
    int rc = ecxi_data_meta_decode(meta, meta_len, &m);
    if (rc) return rc;
    if (m.nonce != desc->nonce || desc->block_bytes != ecxi_region_block_bytes(d->region))
        return ECX_EDATA_MISMATCH;
    return ecxi_data_peer_done(d->ops->peer_add(d, &m, desc, out), desc, meta, meta_len, out);
}

int ecxi_data_ack_register_ecx(ecxi_data *d, const ecxi_data_ack *a, ecxi_data_desc *dd,
                               ecxi_data_peer **peer)
{
    int rc = ecxi_data_desc_decode(a->desc, a->desc_len, dd);
    if (!rc && !dd->has_ticket) rc = ECX_EDATA_DESC; /* an ack's carries its grant's */
    if (rc || *peer) return rc;
    return ecxi_data_peer_add(d, a->meta, a->meta_len, dd, peer);
}

int ecxi_data_ack_register(ecxi_data *d, const ecxi_data_ack *a, uint64_t nbytes,
                           ecxi_data_desc *dd, ecxi_data_peer **peer)
{
    if (!d || !a || !dd || !peer) return ECX_EINVAL;
    if (d->role != ECXI_DATA_CONSUMER) return ECX_EROLE;
    if (d->ops->ack_register) return d->ops->ack_register(d, a, nbytes, dd, peer);
    return ecxi_data_ack_register_ecx(d, a, dd, peer);
}

bool ecxi_data_read_checksum(const ecxi_data_xfer *x, uint64_t *sum)
{
    if (!x || !sum || !x->has_sum) return false;
    *sum = x->sum;
    return true;
}

bool ecxi_data_peer_same(const ecxi_data_peer *p, const uint8_t *meta, size_t meta_len)
{
    return p && meta && p->meta_len == meta_len && memcmp(p->meta, meta, meta_len) == 0;
}

bool ecxi_data_peer_overlaps(const ecxi_data_peer *p, const uint8_t *meta, size_t meta_len)
{
    if (!p || !meta) return false;
    if (ecxi_data_peer_same(p, meta, meta_len)) return true;
    ecxi_data_meta a, b;
    if (ecxi_data_meta_decode(p->meta, p->meta_len, &a) ||
        ecxi_data_meta_decode(meta, meta_len, &b))
        return false; /* NIXL's own form: only the same bytes are known to match */
    if (a.nonce == b.nonce) return true; /* random per producer context */
    if (a.has_shm && b.has_shm && !memcmp(a.boot_id, b.boot_id, 16) &&
        ((a.dev == b.dev && a.ino == b.ino) ||
         (a.sock_len == b.sock_len && !memcmp(a.sock, b.sock, a.sock_len))))
        return true;
    if (a.has_tcp && b.has_tcp && a.tcp_family == b.tcp_family && a.tcp_port == b.tcp_port &&
        !memcmp(a.tcp_addr, b.tcp_addr, a.tcp_family == 4 ? 4 : 16))
        return true;
    return a.has_ucx && b.has_ucx && a.ucx_addr_len == b.ucx_addr_len &&
           !memcmp(a.ucx_addr, b.ucx_addr, a.ucx_addr_len);
}

const char *ecxi_data_peer_backend(const ecxi_data_peer *p)
{
    return p ? p->backend : "none";
}

void ecxi_data_peer_drop(ecxi_data_peer *p)
{
    if (!p) return;
    /* The head's copy goes first: the backend frees the peer itself. */
    free(p->meta);
    p->meta = NULL;
    p->owner->ops->peer_drop(p);
}

size_t ecxi_block_runs_of(const uint64_t *blocks, size_t n, ecxi_block_run *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k && out[k - 1].first + out[k - 1].count == blocks[i])
            out[k - 1].count++;
        else
            out[k++] = (ecxi_block_run){blocks[i], 1};
    return k;
}

/* The blocks runs[0..n) name (saturating: a hostile list cannot wrap). */
static uint64_t runs_blocks(const ecxi_block_run *runs, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total = runs[i].count > UINT64_MAX - total ? UINT64_MAX : total + runs[i].count;
    return total;
}

/* Every run non-empty and inside [0, nblocks). */
static bool runs_inside(const ecxi_block_run *runs, size_t n, uint64_t nblocks)
{
    for (size_t i = 0; i < n; i++)
        if (!runs[i].count || runs[i].first >= nblocks || runs[i].count > nblocks - runs[i].first)
            return false;
    return true;
}

int ecxi_data_read_post(ecxi_data_peer *p, const ecxi_data_desc *desc,
                        const ecxi_block_run *remote, size_t nremote, const ecxi_block_run *local,
                        size_t nlocal, uint64_t nbytes, const char *key, size_t key_len,
                        ecxi_data_xfer **out)
{
    if (!p || !out || (nremote && !remote) || (nlocal && !local) || (key_len && !key))
        return ECX_EINVAL;
    *out = NULL;
    /* desc was parsed (ecxi_data_desc_decode: block size, count and ticket
     * bounds hold); what is checked here is what ties it to this peer, our
     * region and this READ. Backends get runs checked here, and only here. */
    if (!desc || !desc->has_ticket) return ECX_EDATA_DESC;
    uint64_t lblocks = ecxi_region_num_blocks(p->owner->region);
    uint64_t bs = ecxi_region_block_bytes(p->owner->region);
    if (desc->nonce != p->nonce || desc->num_blocks != p->num_blocks || desc->block_bytes != bs)
        return ECX_EDATA_MISMATCH;
    if (nbytes == 0) nbytes = desc->ticket.nbytes;
    if (nbytes != desc->ticket.nbytes) return ECX_EDATA_MISMATCH;
    uint64_t n = runs_blocks(remote, nremote);
    if (n == 0 || runs_blocks(local, nlocal) != n) return ECX_EDATA_COUNT;
    if (key_len == 0 || key_len > ECXI_DATA_NOTIF_MAX) return ECX_EDATA_NOTIF;
    if (n > lblocks || n > p->num_blocks) return ECX_EDATA_COUNT;
    if (nbytes <= (n - 1) * bs || nbytes > n * bs) return ECX_EDATA_COUNT;
    if (!runs_inside(remote, nremote, p->num_blocks) || !runs_inside(local, nlocal, lblocks))
        return ECX_EDATA_INDEX;
    return p->owner->ops->read_post(p, &desc->ticket, remote, nremote, local, nlocal, nbytes, key,
                                    key_len, out);
}

int ecxi_data_decline(ecxi_data_peer *p, const ecxi_data_desc *desc, const char *key,
                      size_t key_len)
{
    if (!p || (key_len && !key)) return ECX_EINVAL;
    if (!desc || !desc->has_ticket) return ECX_EDATA_DESC;
    if (desc->nonce != p->nonce || desc->num_blocks != p->num_blocks ||
        desc->block_bytes != ecxi_region_block_bytes(p->owner->region))
        return ECX_EDATA_MISMATCH;
    if (key_len == 0 || key_len > ECXI_DATA_NOTIF_MAX) return ECX_EDATA_NOTIF;
    if (!p->owner->ops->decline) return ECX_EDATA_NOPATH;
    return p->owner->ops->decline(p, &desc->ticket, key, key_len);
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

int ecxi_data_progress(ecxi_data *d, int64_t budget_ns, bool *more)
{
    if (more) *more = false;
    if (!d) return ECX_EINVAL;
    ecxi_slice sl;
    ecxi_slice_start(&sl, budget_ns);
    int rc = d->ops->progress(d, &sl);
    slice_end(d, &sl);
    if (more) *more = sl.more || (rc >= 0 && d->ops->arm(d) == 1);
    return rc;
}

bool ecxi_data_moving(const ecxi_data *d)
{
    return d && d->more;
}

int ecxi_data_fd(ecxi_data *d)
{
    return d ? d->ops->fd(d) : -1;
}

int ecxi_data_arm(ecxi_data *d)
{
    if (!d) return ECX_EINVAL;
    if (d->more) return 1;
    return d->ops->arm(d);
}

void ecxi_data_get_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    if (!d || !st) return;
    if (d->ops->stats) d->ops->stats(d, st);
    st->slices += d->slices;
    st->slice_bytes += d->slice_bytes;
    st->slices_cut += d->slices_cut;
    if (d->slice_max_bytes > st->slice_max_bytes) st->slice_max_bytes = d->slice_max_bytes;
    if (d->slice_max_ns > st->slice_max_ns) st->slice_max_ns = d->slice_max_ns;
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
