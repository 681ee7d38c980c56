/* SPDX-License-Identifier: Apache-2.0 */
/* data_fault — the fault-injecting wrapper backend (tests only); see
 * data_fault.h for what each fault does. Not in any hot path, so it simply
 * allocates per peer and per xfer. */
#include "data_fault.h"

#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "data_impl.h"

typedef struct fault_data {
    ecxi_data base;
    ecxi_data *inner;
    int kind, skip, count;
    unsigned posts, hits;
    unsigned epoch; /* bumped by every ecxi_data_fault_set(): ends DELAY holds */
} fault_data;

typedef struct fault_peer {
    ecxi_data_peer head;
    ecxi_data_peer *inner;
} fault_peer;

typedef struct fault_xfer {
    ecxi_data_xfer head;
    ecxi_data_xfer *inner; /* NULL when the fault replaced the READ */
    int kind, state;
    unsigned epoch; /* DELAY: held while the wrapper's epoch is this */
    bool corrupted;
    uint64_t nbytes, checksum;
    size_t n;
    ecxi_block_run local[]; /* CORRUPT: the runs the bytes went to, to check them again */
} fault_xfer;

static const struct ecxi_data_ops fault_ops;

int ecxi_data_fault_wrap(ecxi_data *inner, ecxi_data **out)
{
    if (!inner || !out) return ECX_EINVAL;
    fault_data *f = calloc(1, sizeof *f);
    if (!f) return ECX_ENOMEM;
    f->base.ops = &fault_ops;
    ecxi_data_ops_check(f->base.ops, false);
    f->base.role = inner->role;
    f->base.region = inner->region;
    /* The published metadata moves to the wrapper, which frees it. */
    f->base.meta = inner->meta, f->base.meta_len = inner->meta_len;
    f->base.layout = inner->layout;
    inner->meta = NULL;
    inner->meta_len = 0;
    f->inner = inner;
    *out = &f->base;
    return 0;
}

int ecxi_data_fault_set(ecxi_data *d, int kind, int skip, int count)
{
    if (!d || d->ops != &fault_ops || kind < ECXI_FAULT_NONE || kind > ECXI_FAULT_DELAY || skip < 0)
        return ECX_EINVAL;
    fault_data *f = (fault_data *)d;
    f->kind = kind, f->skip = skip, f->count = count;
    f->epoch++;
    f->posts = 0;
    return 0;
}

unsigned ecxi_data_fault_hits(const ecxi_data *d)
{
    return d && d->ops == &fault_ops ? ((const fault_data *)d)->hits : 0;
}

static void fault_free(ecxi_data *d)
{
    fault_data *f = (fault_data *)d;
    f->inner->ops->free(f->inner);
    free(f);
}

static int fault_progress(ecxi_data *d, ecxi_slice *sl)
{
    fault_data *f = (fault_data *)d;
    return f->inner->ops->progress(f->inner, sl);
}

static int fault_fd(ecxi_data *d)
{
    fault_data *f = (fault_data *)d;
    return f->inner->ops->fd(f->inner);
}

static int fault_arm(ecxi_data *d)
{
    fault_data *f = (fault_data *)d;
    return f->inner->ops->arm(f->inner);
}

static int fault_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    fault_data *f = (fault_data *)d;
    return f->inner->ops->poll_notifs(f->inner, sl, cb, arg);
}

static int fault_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                          ecxi_data_peer **out)
{
    fault_data *f = (fault_data *)d;
    fault_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    int rc = f->inner->ops->peer_add(f->inner, m, desc, &p->inner);
    if (rc) {
        free(p);
        return rc;
    }
    p->head.owner = d;
    p->head.backend = p->inner->backend;
    *out = &p->head;
    return 0;
}

static void fault_peer_drop(ecxi_data_peer *hp)
{
    fault_peer *p = (fault_peer *)hp;
    p->inner->owner->ops->peer_drop(p->inner);
    free(p);
}

static int fault_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    return ecxi_data_cut(((fault_data *)d)->inner, key, key_len, token);
}

static void fault_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg)
{
    ecxi_data_set_grant_fn(((fault_data *)d)->inner, fn, arg);
}

static void fault_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    ecxi_data_get_stats(((const fault_data *)d)->inner, st);
}

/* The checksum of the item in the runs local[0..n) of base, nbytes long. */
static uint64_t runs_sum(const uint8_t *base, uint64_t bs, const ecxi_block_run *local, size_t n,
                         uint64_t nbytes)
{
    ecxi_sum s;
    ecxi_sum_reset(&s);
    for (size_t i = 0; i < n && nbytes; i++) {
        uint64_t len = local[i].count * bs < nbytes ? local[i].count * bs : nbytes;
        ecxi_sum_update(&s, base + local[i].first * bs, (size_t)len);
        nbytes -= len;
    }
    return ecxi_sum_digest(&s);
}

static int fault_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t,
                           const ecxi_block_run *remote, size_t nremote,
                           const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                           const char *key, size_t key_len, ecxi_data_xfer **out)
{
    fault_peer *p = (fault_peer *)hp;
    fault_data *f = (fault_data *)hp->owner;
    f->posts++;
    int kind = ECXI_FAULT_NONE;
    if (f->kind != ECXI_FAULT_NONE && f->posts > (unsigned)f->skip &&
        (f->count < 0 || f->posts <= (unsigned)f->skip + (unsigned)f->count))
        kind = f->kind;
    if (kind != ECXI_FAULT_NONE) f->hits++;
    if (kind == ECXI_FAULT_POST_FAIL) return ECX_EDATA_FAULT;
    size_t keep = kind == ECXI_FAULT_CORRUPT ? nlocal : 0;
    fault_xfer *x = calloc(1, sizeof *x + keep * sizeof *local);
    if (!x) return ECX_ENOMEM;
    x->head.owner = hp->owner;
    x->kind = kind;
    x->epoch = f->epoch;
    x->n = keep;
    memcpy(x->local, local, keep * sizeof *local);
    x->nbytes = nbytes;
    x->checksum = t->checksum;
    if (kind == ECXI_FAULT_READ_FAIL) {
        x->state = ECXI_XFER_FAILED;
    } else if (kind == ECXI_FAULT_HANG) {
        x->state = ECXI_XFER_RUNNING;
    } else {
        int rc = p->inner->owner->ops->read_post(p->inner, t, remote, nremote, local, nlocal,
                                                 nbytes, key, key_len, &x->inner);
        if (rc) {
            free(x);
            return rc;
        }
    }
    *out = &x->head;
    return 0;
}

static int fault_read_poll(ecxi_data_xfer *hx)
{
    fault_xfer *x = (fault_xfer *)hx;
    if (!x->inner) return x->state;
    int st = x->inner->owner->ops->read_poll(x->inner);
    if (x->kind == ECXI_FAULT_DELAY && x->epoch == ((fault_data *)hx->owner)->epoch)
        return ECXI_XFER_RUNNING;
    if (st == ECXI_XFER_DONE && x->kind == ECXI_FAULT_CORRUPT) {
        /* A byte changed after the copy: the check is run again on what
         * is there now, as the backend ran it on what it wrote. */
        ecxi_region *r = hx->owner->region;
        uint8_t *base = ecxi_region_base(r);
        uint64_t bs = ecxi_region_block_bytes(r);
        if (!x->corrupted) base[x->local[0].first * bs] ^= 0xff;
        x->corrupted = true;
        if (runs_sum(base, bs, x->local, x->n, x->nbytes) != x->checksum)
            st = ECXI_XFER_CORRUPT;
    }
    return st;
}

static void fault_read_release(ecxi_data_xfer *hx)
{
    fault_xfer *x = (fault_xfer *)hx;
    if (x->inner) x->inner->owner->ops->read_release(x->inner);
    free(x);
}

static const struct ecxi_data_ops fault_ops = {
    .name = "fault",
    .free = fault_free,
    .progress = fault_progress,
    .fd = fault_fd,
    .arm = fault_arm,
    .poll_notifs = fault_poll_notifs,
    .set_grant_fn = fault_set_grant_fn,
    .cut = fault_cut,
    .stats = fault_stats,
    .peer_add = fault_peer_add,
    .peer_drop = fault_peer_drop,
    .read_post = fault_read_post,
    .read_poll = fault_read_poll,
    .read_release = fault_read_release,
};
