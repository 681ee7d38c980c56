/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_auto — the "auto" backend (the default): a wrapper over the real
 * paths. A producer publishes shm and tcp (UCX only when asked for by
 * name: its tcp transport is open to writes, see data_ucx.c); a consumer
 * starts shm at once and tcp / UCX on first need, and for each producer
 * uses shm when it reaches it (same boot id, its socket answers: same
 * network namespace, its process has our uid), else tcp if published,
 * else UCX if published.
 *
 * It is a backend like the others (it fills the vtable of data_impl.h),
 * kept apart from the front (data.c) because it is a policy, not a
 * dispatch: which paths to start and which to pick per peer. Peers and
 * xfers it hands out are its inner backends' own, so the front dispatches
 * them straight to those and never back here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "data_impl.h"
#include "util.h"

/* The inner contexts, in the order a consumer prefers them. */
enum { IN_SHM, IN_TCP, IN_UCX, IN_N };
static const int backend_of[IN_N] = {ECX_DATA_SHM, ECX_DATA_TCP, ECX_DATA_UCX};

typedef struct auto_data {
    ecxi_data base;
    ecxi_data *in[IN_N]; /* any may be NULL */
    int epfd;            /* joins the inner descriptors */
} auto_data;

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

static int auto_progress(ecxi_data *d, ecxi_slice *sl)
{
    auto_data *a = (auto_data *)d;
    int n = 0, rc;
    for (int i = 0; i < IN_N; i++) {
        if (!a->in[i]) continue;
        if ((rc = a->in[i]->ops->progress(a->in[i], sl)) < 0) return rc;
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

static int auto_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    auto_data *a = (auto_data *)d;
    int n = 0, rc;
    for (int i = 0; i < IN_N; i++) {
        if (!a->in[i]) continue;
        if ((rc = a->in[i]->ops->poll_notifs(a->in[i], sl, cb, arg)) < 0) return rc;
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
        ecxi_data_opts io = {.background = d->background};
        int r2 = ecxi_data_start(backend_of[k], d->region, &io, ECXI_DATA_CONSUMER, NULL, NULL,
                                 &a->in[k]);
        if (r2) return r2;
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

static int auto_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    auto_data *a = (auto_data *)d;
    int n = 0;
    for (int i = 0; i < IN_N; i++)
        if (a->in[i]) n |= ecxi_data_cut(a->in[i], key, key_len, token) > 0;
    return n;
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
    .cut = auto_cut,
    .stats = auto_stats,
    .free = auto_free,
    .progress = auto_progress,
    .fd = auto_fd,
    .arm = auto_arm,
    .poll_notifs = auto_poll_notifs,
    .peer_add = auto_peer_add,
    /* peers and xfers are the inner backends' own: never dispatched here */
};

int ecxi_data_auto_new(ecxi_region *region, const ecxi_data_opts *opts, int role,
                       ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out)
{
    /* What starts now: the producer's shm and tcp, the consumer's shm. */
    bool want[IN_N] = {[IN_SHM] = true, [IN_TCP] = role == ECXI_DATA_PRODUCER};
    static const char *const what[IN_N] = {"same-host", "tcp", "UCX"};
    ecxi_data *in[IN_N] = {0};
    int rc = 0, started = 0;
    for (int k = 0; k < IN_N; k++) {
        if (!want[k]) continue;
        int rk = ecxi_data_start(backend_of[k], region, opts, role, m, dd, &in[k]);
        if (rk) {
            ecxi_log(ECX_LOG_WARN, "data: %s path unavailable: %s", what[k], ecx_strerror(rk));
            rc = rk;
            continue;
        }
        started++;
    }
    /* A producer needs a path now; a consumer without shm still has the
     * network, started on first need. */
    if (!started && role == ECXI_DATA_PRODUCER) return rc;
    auto_data *a = calloc(1, sizeof *a);
    if (!a) {
        for (int k = 0; k < IN_N; k++)
            if (in[k]) in[k]->ops->free(in[k]);
        return ECX_ENOMEM;
    }
    a->base.ops = &auto_ops;
    a->base.role = role;
    a->base.region = region;
    a->epfd = epoll_create1(EPOLL_CLOEXEC);
    for (int k = 0; k < IN_N; k++) {
        a->in[k] = in[k];
        auto_join_fd(a, in[k]);
    }
    *out = &a->base;
    return 0;
}
