/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_nixl — the `nixl` data path: ecx as a peer of vLLM's ECCPUConnector
 * on NIXL's data plane, with our own UCX and no NIXL library, the UCX run
 * in the NIXL agent process (nixl_proc.h). It is a wrapper, as auto is: it
 * also runs an inner auto context (shm, tcp) and picks the form of every
 * ack itself, NIXL's for vLLM peers and ecx's (tokens, checksums) for a
 * marked ecx session (session_id.h), so the sessions see one data plane.
 * It owns that choice (nixl_grant_ack, nixl_ack_register), the tokenless
 * grants and completions of NIXL peers, vLLM's descriptor list, the READ
 * as one piece per run of consecutive blocks, and the XXH3 of a finished
 * NIXL READ (NIXL_HASH_SLICE bytes per read_poll: it verifies nothing, it
 * is the item's checksum in our cache). What it gives up with NIXL peers
 * (one-sided: any block, any address over UCX's tcp; trusted networks
 * only, never chosen by auto): docs/NIXL.md §6–§8.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "checksum.h"
#include "data_impl.h"
#include "nixl_format.h"
#include "nixl_proc.h"
#include "util.h"

typedef struct nixl_peer {
    ecxi_data_peer head;
    uint64_t handle; /* the proc's */
    uint64_t base;   /* the remote's block 0 */
} nixl_peer;

typedef struct nixl_xfer {
    ecxi_data_xfer head;
    ecxi_nixl_proc_read *rd;
    int state;
    ecxi_block_run *runs; /* the local runs, for the checksum */
    ecxi_sum sum;         /* the checksum so far: their first hashed blocks */
    uint64_t hashed;
    size_t run_i;     /* the run the next block to hash is in */
    uint64_t run_off; /* and its place in it */
    bool hashing;     /* counted in nixl_data.hashing */
    uint64_t n;       /* blocks */
    uint64_t nbytes;
} nixl_xfer;

typedef struct nixl_data {
    ecxi_data base;
    ecxi_nixl_proc *proc;
    uint64_t gen;  /* the helper whose metadata and descriptor we publish */
    uint8_t *desc; /* vLLM's mem_descriptor of the whole region */
    size_t desc_len;
    uint64_t notifs;
    ecxi_data *ecx; /* ecx's own paths (auto), for ecx peers; NULL if none started */
    int epfd;       /* joins the agent's descriptor and ecx's */
    size_t hashing; /* finished READs whose bytes are being hashed */
} nixl_data;

static const struct ecxi_data_ops nixl_ops;

static void nixl_free(ecxi_data *d)
{
    nixl_data *x = (nixl_data *)d;
    ecxi_data_free(x->ecx);
    if (x->epfd >= 0) close(x->epfd);
    ecxi_nixl_proc_free(x->proc);
    free(x->base.meta); /* NULL once ecxi_data_free has taken it */
    free(x->desc);
    free(x);
}

/* A producer publishes its current helper's metadata and descriptor
 * (the helper's addresses); kept as they were while none runs. */
static int refresh(nixl_data *x)
{
    uint64_t gen = ecxi_nixl_proc_generation(x->proc), base;
    if (x->base.role == ECXI_DATA_CONSUMER || gen == 0 || gen == x->gen) return 0;
    size_t ml;
    const uint8_t *md = ecxi_nixl_proc_metadata(x->proc, &ml, &base);
    ecxi_region *r = x->base.region;
    uint64_t bs = ecxi_region_block_bytes(r), nb = ecxi_region_num_blocks(r);
    size_t cap = ecxi_nixl_desc_size((size_t)nb);
    ecxi_nixl_block *blk = calloc((size_t)nb, sizeof *blk);
    uint8_t *desc = malloc(cap), *meta = malloc(ml);
    int rc = blk && desc && meta ? 0 : ECX_ENOMEM;
    long k = 0;
    if (!rc) {
        for (uint64_t i = 0; i < nb; i++)
            blk[i] = (ecxi_nixl_block){base + i * bs, bs, 0};
        if ((k = ecxi_nixl_desc_encode(blk, (size_t)nb, desc, cap)) < 0) rc = (int)k;
    }
    free(blk);
    if (rc) {
        free(desc), free(meta);
        return rc;
    }
    memcpy(meta, md, ml);
    free(x->base.meta);
    free(x->desc);
    x->base.meta = meta, x->base.meta_len = ml;
    x->desc = desc, x->desc_len = (size_t)k;
    if (x->gen)
        ecxi_log(ECX_LOG_WARN, "data nixl: the new NIXL agent %s publishes new metadata",
                 ecxi_nixl_proc_name(x->proc));
    x->gen = gen;
    return 0;
}

static int nixl_progress(ecxi_data *d, ecxi_slice *sl)
{
    nixl_data *x = (nixl_data *)d;
    int n = ecxi_nixl_proc_progress(x->proc), m;
    if ((m = refresh(x)) < 0) return m;
    if (n < 0 || !x->ecx) return n;
    if ((m = x->ecx->ops->progress(x->ecx, sl)) < 0) return m;
    return n + m;
}

static int nixl_fd(ecxi_data *d)
{
    nixl_data *x = (nixl_data *)d;
    return x->epfd >= 0 ? x->epfd : ecxi_nixl_proc_fd(x->proc);
}

static int nixl_arm(ecxi_data *d)
{
    nixl_data *x = (nixl_data *)d;
    int rc = x->hashing ? 1 : ecxi_nixl_proc_arm(x->proc);
    if (rc != 0 || !x->ecx) return rc;
    return x->ecx->ops->arm(x->ecx);
}

/* ecx's own paths beside the agent: an auto context of the same role,
 * joined to one descriptor. Without it (a producer whose shm and tcp both
 * failed) every peer gets NIXL's form. */
static int start_ecx(nixl_data *x, ecxi_region *r, const ecxi_data_opts *opts, int role)
{
    ecxi_data_opts o = {.backend = ECX_DATA_AUTO,
                       .bind_host = opts ? opts->bind_host : NULL,
                       .background = opts && opts->background};
    int rc = role == ECXI_DATA_PRODUCER ? ecxi_data_new_producer(r, &o, &x->ecx)
                                       : ecxi_data_new_consumer(r, &o, &x->ecx);
    if (rc) {
        x->ecx = NULL;
        ecxi_log(ECX_LOG_WARN, "data nixl: ecx's own paths unavailable (%s): ecx peers get "
                 "NIXL's form", ecx_strerror(rc));
        return role == ECXI_DATA_PRODUCER ? 0 : rc;
    }
    x->epfd = epoll_create1(EPOLL_CLOEXEC);
    int fds[2] = {ecxi_nixl_proc_fd(x->proc), ecxi_data_fd(x->ecx)};
    for (int i = 0; i < 2 && x->epfd >= 0; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
        if (fds[i] >= 0 && epoll_ctl(x->epfd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            ecxi_log(ECX_LOG_WARN, "data nixl: epoll_ctl: %s", strerror(errno));
            close(x->epfd);
            x->epfd = -1;
        }
    }
    return x->epfd >= 0 ? 0 : ECX_ESYS;
}

/* Only ecx's own paths claim (NIXL's READs are one-sided: see the top). */
static int nixl_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    return ecxi_data_cut(((nixl_data *)d)->ecx, key, key_len, token);
}

static void nixl_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg)
{
    ecxi_data_set_grant_fn(((nixl_data *)d)->ecx, fn, arg);
}

static void nixl_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const nixl_data *x = (const nixl_data *)d;
    st->nixl_agent_restarts += ecxi_nixl_proc_restarts(x->proc);
    ecxi_data_get_stats(x->ecx, st);
}

static int nixl_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                         ecxi_data_peer **out)
{
    ecxi_data *e = ((nixl_data *)d)->ecx;
    return e ? e->ops->peer_add(e, m, desc, out) : ECX_EDATA_NOPATH; /* the inner path's own peer */
}

static int nixl_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    nixl_data *x = (nixl_data *)d;
    int rc = nixl_progress(d, sl);
    if (rc < 0) return rc;
    char name[ECXI_NIXL_NAME_MAX + 1], msg[ECXI_NIXL_MSG_MAX + 1];
    int n = 0;
    /* bounded per call, like every other path's poll */
    while (n < 4096 && ecxi_nixl_proc_notif_pop(x->proc, name, msg)) {
        size_t len = strlen(msg);
        x->notifs++;
        if (len > ECXI_DATA_NOTIF_MAX) continue;
        cb(arg, msg, len, NULL, 0);
        n++;
    }
    if (!x->ecx) return n;
    rc = x->ecx->ops->poll_notifs(x->ecx, sl, cb, arg);
    return rc < 0 ? rc : n + rc;
}

/* An ecx consumer gets ecx's own form (with a ticket), from the auto
 * context; anyone else NIXL's: our agent's metadata and the one list of
 * every block, tokenless. */
static int nixl_grant_ack(const ecxi_data *d, bool ecx_peer, const ecxi_data_ticket *t,
                          uint8_t *buf, size_t cap, ecxi_data_ack *out)
{
    const nixl_data *x = (const nixl_data *)d;
    if (ecx_peer && x->ecx) return ecxi_data_grant_ack(x->ecx, true, t, buf, cap, out);
    *out = (ecxi_data_ack){d->meta, d->meta_len, x->desc, x->desc_len, true};
    return 0;
}

/* The helper over the region's file: read-only for a producer. */
static int start_proc(nixl_data *x, ecxi_region *r, bool producer)
{
    int fd = open(ecxi_region_path(r), (producer ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (fd < 0) {
        ecxi_log(ECX_LOG_ERROR, "data nixl: cannot open the region file %s: %s",
                 ecxi_region_path(r), strerror(errno));
        return ECX_ESYS;
    }
    int rc = ecxi_nixl_proc_new(fd, ecxi_region_size(r), producer, &x->proc);
    close(fd);
    return rc;
}

int ecxi_data_nixl_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data **out)
{
    nixl_data *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->base.ops = &nixl_ops;
    x->base.role = ECXI_DATA_PRODUCER; /* data.c sets it too; refresh needs it now */
    x->base.region = r;
    x->epfd = -1;
    int rc = start_proc(x, r, true);
    if (!rc) rc = refresh(x);
    if (!rc) rc = start_ecx(x, r, opts, ECXI_DATA_PRODUCER);
    if (rc) {
        nixl_free(&x->base);
        return rc;
    }
    ecxi_log(ECX_LOG_WARN, "data nixl: NIXL agent %s (process %d) offers the whole region (%llu "
             "bytes) to one-sided READs: trusted networks only", ecxi_nixl_proc_name(x->proc),
             ecxi_nixl_proc_pid(x->proc), (unsigned long long)ecxi_region_size(r));
    *out = &x->base;
    return 0;
}

/* ---- consumer ----------------------------------------------------------- */

/* vLLM's list (buf) as a grant of nbytes: see the top. */
static int nixl_desc(const ecxi_data *d, const uint8_t *buf, size_t len, uint64_t nbytes,
                     ecxi_data_desc *dd)
{
    memset(dd, 0, sizeof *dd);
    uint64_t bs = ecxi_region_block_bytes(d->region);
    size_t n;
    int rc = ecxi_nixl_desc_count(buf, len, ECXI_REGION_MAX_BLOCKS, &n);
    if (rc) return rc;
    ecxi_nixl_block *b = malloc(n * sizeof *b);
    if (!b) return ECX_ENOMEM;
    if ((rc = ecxi_nixl_desc_decode(buf, len, b, n, &n))) goto out;
    rc = ECX_EDATA_MISMATCH;
    for (size_t i = 0; i < n; i++)
        if (b[i].len != bs) goto out;
    rc = ECX_EDATA_DESC;
    if (n > UINT64_MAX / bs || b[0].addr > UINT64_MAX - n * bs) goto out;
    for (size_t i = 0; i < n; i++)
        if (b[i].addr != b[0].addr + i * bs || b[i].dev_id != 0) goto out;
    if (nbytes == 0 || nbytes > n * bs) goto out;
    dd->block_bytes = bs;
    dd->num_blocks = n;
    dd->has_ticket = true;
    dd->ticket.nbytes = nbytes;
    dd->ticket.lease_ms = ECXI_NIXL_LEASE_MS;
    dd->unverified = true;
    dd->remote_base = b[0].addr;
    rc = 0;
out:
    free(b);
    return rc;
}

/* A peer from NIXL's metadata, for the list desc (nixl_desc's). */
static int nixl_peer_new(ecxi_data *d, const uint8_t *meta, size_t meta_len,
                         const ecxi_data_desc *desc, ecxi_data_peer **out)
{
    nixl_data *x = (nixl_data *)d;
    ecxi_nixl_meta m;
    if (ecxi_nixl_meta_decode(meta, meta_len, &m)) return ECX_EDATA_META;
    /* The blocks of the list must be what the metadata registered. */
    if (!ecxi_nixl_meta_covers(&m, desc->remote_base, desc->num_blocks * desc->block_bytes)) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data nixl: the descriptor list of %.*s lies outside "
                            "its registered memory", (int)m.name_len, m.name);
        return ECX_EDATA_MISMATCH;
    }
    nixl_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    int rc = ecxi_nixl_proc_remote_add(x->proc, meta, meta_len, &p->handle);
    if (rc) {
        free(p);
        return rc;
    }
    p->base = desc->remote_base;
    p->head.owner = d;
    p->head.backend = "nixl";
    *out = &p->head;
    return 0;
}

/* An ack whose metadata is ecx's goes to ecx's own paths (the descriptor
 * must then be ecx's too); anything else is NIXL's (and so must be the
 * descriptor: vLLM's list). */
static int nixl_ack_register(ecxi_data *d, const ecxi_data_ack *a, uint64_t nbytes,
                             ecxi_data_desc *dd, ecxi_data_peer **peer)
{
    ecxi_data *e = ((nixl_data *)d)->ecx;
    if (ecxi_data_meta_is_ecx(a->meta, a->meta_len))
        return e ? ecxi_data_ack_register_ecx(e, a, dd, peer) : ECX_EDATA_NOPATH;
    int rc = nixl_desc(d, a->desc, a->desc_len, nbytes, dd);
    if (rc || *peer) return rc;
    rc = nixl_peer_new(d, a->meta, a->meta_len, dd, peer);
    return ecxi_data_peer_done(rc, dd, a->meta, a->meta_len, peer);
}

static void nixl_peer_drop(ecxi_data_peer *hp)
{
    nixl_peer *p = (nixl_peer *)hp;
    ecxi_nixl_proc_remote_drop(((nixl_data *)hp->owner)->proc, p->handle);
    free(p);
}

static int nixl_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t,
                          const ecxi_block_run *remote, size_t nremote,
                          const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                          const char *key, size_t key_len, ecxi_data_xfer **out)
{
    (void)t;
    nixl_peer *p = (nixl_peer *)hp;
    ecxi_data *d = hp->owner;
    ecxi_nixl_proc *proc = ((nixl_data *)d)->proc;
    /* Registered with a helper that died since: again, with the current one. */
    if (!ecxi_nixl_proc_remote_live(proc, p->handle)) {
        int rc = ecxi_nixl_proc_remote_add(proc, hp->meta, hp->meta_len, &p->handle);
        if (rc) return rc;
    }
    uint64_t bs = ecxi_region_block_bytes(d->region);
    size_t cap = nremote + nlocal; /* pieces: a run ends on one side or the other */
    nixl_xfer *x = calloc(1, sizeof *x);
    uint64_t *raddr = calloc(cap, sizeof *raddr), *loff = calloc(cap, sizeof *loff),
             *len = calloc(cap, sizeof *len);
    int rc = ECX_ENOMEM;
    if (x && raddr && loff && len && (x->runs = malloc(nlocal * sizeof *x->runs))) {
        /* whole blocks, as NIXL's descriptors are; a piece that is one
         * run on both sides goes as one (runs checked by the front) */
        size_t k = 0;
        uint64_t r, l, m;
        for (ecxi_block_zip z = ecxi_block_zip_start(remote, nremote, local, nlocal);
             ecxi_block_zip_next(&z, &r, &l, &m); k++) {
            raddr[k] = p->base + r * bs;
            loff[k] = l * bs;
            len[k] = m * bs;
            x->n += m;
        }
        memcpy(x->runs, local, nlocal * sizeof *local);
        x->nbytes = nbytes;
        x->head.owner = d;
        rc = ecxi_nixl_proc_read_post(proc, p->handle, raddr, loff, len, k, key, key_len, &x->rd);
    }
    free(raddr), free(loff), free(len);
    if (rc) {
        if (x) free(x->runs);
        free(x);
        return rc;
    }
    *out = &x->head;
    return 0;
}

/* Bytes of a finished READ hashed per read_poll call (~0.4 ms). */
#define NIXL_HASH_SLICE (4u << 20)

static int nixl_read_poll(ecxi_data_xfer *hx)
{
    nixl_xfer *x = (nixl_xfer *)hx;
    if (x->state != ECXI_XFER_RUNNING) return x->state;
    int st = ecxi_nixl_proc_read_poll(x->rd);
    if (st == 0) return ECXI_XFER_RUNNING;
    if (st < 0) return x->state = ECXI_XFER_FAILED;
    /* The READ is done: hash what it wrote, NIXL_HASH_SLICE bytes a call,
     * so no poll stalls on a large item (~0.1 ms per MB). */
    const ecxi_region *r = hx->owner->region;
    const uint8_t *base = ecxi_region_base(r);
    uint64_t bs = ecxi_region_block_bytes(r), left = x->nbytes - x->hashed * bs;
    nixl_data *d = (nixl_data *)hx->owner;
    if (!x->hashing) {
        ecxi_sum_reset(&x->sum);
        x->hashing = true, d->hashing++; /* busy until hashed: no sleeping in between */
    }
    for (uint64_t done = 0; x->hashed < x->n && done < NIXL_HASH_SLICE; x->hashed++) {
        uint64_t len = left < bs ? left : bs;
        const ecxi_block_run *q = &x->runs[x->run_i];
        ecxi_sum_update(&x->sum, base + (q->first + x->run_off) * bs, (size_t)len);
        if (++x->run_off == q->count) x->run_i++, x->run_off = 0;
        left -= len, done += len;
    }
    if (x->hashed < x->n) return ECXI_XFER_RUNNING;
    x->hashing = false, d->hashing--;
    hx->sum = ecxi_sum_digest(&x->sum);
    hx->has_sum = true;
    return x->state = ECXI_XFER_DONE;
}

static void nixl_read_release(ecxi_data_xfer *hx)
{
    nixl_xfer *x = (nixl_xfer *)hx;
    if (x->hashing) ((nixl_data *)hx->owner)->hashing--;
    ecxi_nixl_proc_read_release(((nixl_data *)hx->owner)->proc, x->rd);
    free(x->runs);
    free(x);
}

int ecxi_data_nixl_new_consumer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data **out)
{
    nixl_data *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->base.ops = &nixl_ops;
    x->base.role = ECXI_DATA_CONSUMER;
    x->epfd = -1;
    int rc = start_proc(x, r, false);
    if (!rc) rc = start_ecx(x, r, opts, ECXI_DATA_CONSUMER);
    if (rc) {
        nixl_free(&x->base);
        return rc;
    }
    *out = &x->base;
    return 0;
}

static const struct ecxi_data_ops nixl_ops = {
    .name = "nixl",
    .set_grant_fn = nixl_set_grant_fn,
    .cut = nixl_cut,
    .stats = nixl_stats,
    .peer_add = nixl_peer_add,
    .free = nixl_free,
    .progress = nixl_progress,
    .fd = nixl_fd,
    .arm = nixl_arm,
    .poll_notifs = nixl_poll_notifs,
    .grant_ack = nixl_grant_ack,
    .ack_register = nixl_ack_register,
    .peer_drop = nixl_peer_drop,
    .read_post = nixl_read_post,
    .read_poll = nixl_read_poll,
    .read_release = nixl_read_release,
};
