/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop — the context's threading model: who takes which lock, how a caller
 * waits, and the progress thread that drives the sessions and the data plane.
 *
 * Threads (ecx.h's rule): public calls take ctx->mu, so calls from several
 * threads are serialised, except the ones an engine makes every step or
 * item, which never wait for it: ecx_fetch answers from the consumer's
 * front and the cache (fetch() in connector.c), ecx_load / ecx_release take only
 * omu (the open items) and the cache's own lock, and ecx_poll with the
 * progress thread reads what the thread did. ecx_poll waits without mu, on ctx->epfd:
 * an epoll set of every socket's ZMQ_FD, the data plane's descriptors and
 * ctx->kick, an eventfd another thread writes when its call may have
 * changed what the waiter should wait for (a new session socket, or a send
 * that consumed a socket's edge). ZMQ_FD is edge-like: it says "look", not
 * "a message is here", so before any wait every socket's ZMQ_EVENTS is
 * checked (wait_ms), and a wake only leads to a step.
 *
 * With the progress thread (the default) it steps under mu in bounded
 * slices and the engine's ecx_poll only reports what it did (poll_threaded,
 * waiting on the `done` eventfd); without it, ecx_poll steps for at most
 * POLL_BUDGET_NS and then waits on epfd itself.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "context.h"
#include "util.h"

/* Test seam (tests/unit/test_integration.c, test_engine_calls_take_no_lock):
 * hold or release mu from the caller's thread, as a progress thread busy
 * with a long step would hold it. Not exported. */
void ecxi_ctx_hold_lock(ecx_ctx *ctx, bool hold)
{
    if (hold)
        ecxi_ctx_lock(ctx);
    else
        ecxi_ctx_unlock(ctx);
}

int ecxi_loop_init(ecx_ctx *ctx)
{
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->kick = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->kick < 0) return ECX_ESYS;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->kick};
    return epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->kick, &ev) ? ECX_ESYS : 0;
}

void ecxi_loop_fini(ecx_ctx *ctx)
{
    if (ctx->epfd >= 0) close(ctx->epfd);
    if (ctx->kick >= 0) close(ctx->kick);
    ctx->epfd = ctx->kick = -1;
    free(ctx->watched);
    free(ctx->fds);
    free(ctx->items);
}

static int step(ecx_ctx *ctx)
{
    int ev = 0;
    if (ctx->prod) ev += ecxi_producer_poll(ctx->prod);
    if (ctx->cons) ev += ecxi_consumer_poll(ctx->cons);
    return ev;
}

/* An eventfd with a flag that says a write is in it or on its way: the
 * first signal after a drain writes, the others see the flag and need not
 * (the descriptor is readable, or about to be); a drain reads only when
 * the flag is set, and clears it only once its read took the write, so a
 * readable descriptor always has the flag set (else a level-triggered
 * waiter on it would spin), and a read that came before the write leaves
 * the flag for the next drain. Whoever signals changed the state first,
 * and whoever drains looks at the state after: nothing is missed. */
static void signal_fd(int fd, atomic_bool *flag)
{
    uint64_t one = 1;
    if (atomic_exchange(flag, true)) return;
    if (write(fd, &one, sizeof one) < 0) { /* full (2^64-2 writes): it is readable anyway */
    }
}

static void drain_fd(int fd, atomic_bool *flag)
{
    uint64_t v;
    if (atomic_load(flag) && read(fd, &v, sizeof v) == (ssize_t)sizeof v) atomic_store(flag, false);
}

void ecxi_loop_kick(ecx_ctx *ctx) { signal_fd(ctx->kick, &ctx->kicked); }

static void unkick(ecx_ctx *ctx) { drain_fd(ctx->kick, &ctx->kicked); }

/* Note socket s's descriptor for the wait; true if it has input now. */
static bool watch_socket(ecx_ctx *ctx, void *s, size_t *n)
{
    int events = 0, fd = -1;
    size_t len = sizeof events;
    if (zmq_getsockopt(s, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN)) return true;
    len = sizeof fd;
    if (zmq_getsockopt(s, ZMQ_FD, &fd, &len) == 0 && fd >= 0 &&
        !ecxi_grow(&ctx->fds, &ctx->fds_cap, *n + 1, sizeof *ctx->fds))
        ctx->fds[(*n)++] = fd;
    return false;
}

/* Note a data context's descriptor; *sleepable false if it has none (then
 * the wait is short). True if it has work now. */
static bool watch_data(ecx_ctx *ctx, ecxi_data *d, size_t *n, bool *sleepable)
{
    if (!d) return false;
    int fd = ecxi_data_fd(d);
    if (fd < 0) {
        *sleepable = false;
        return false;
    }
    if (ecxi_data_arm(d) != 0) return true;
    if (!ecxi_grow(&ctx->fds, &ctx->fds_cap, *n + 1, sizeof *ctx->fds)) ctx->fds[(*n)++] = fd;
    return false;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Make epfd watch exactly fds[0..n) (and the kick). Sessions come and go,
 * so this diffs two sorted lists: O(n log n), no syscall when nothing
 * changed. A closed fd has left epoll by itself, so a failed DEL is fine.
 * With renew (sockets opened or closed since the last sync), fds in both
 * lists are registered again too: a new socket can reuse a closed one's
 * number, and the closed one's registration went with it. */
static void sync_epoll(ecx_ctx *ctx, size_t n, bool renew)
{
    qsort(ctx->fds, n, sizeof *ctx->fds, cmp_int);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) /* dedupe */
        if (m == 0 || ctx->fds[m - 1] != ctx->fds[i]) ctx->fds[m++] = ctx->fds[i];
    n = m;
    size_t i = 0, j = 0;
    while (i < n || j < ctx->n_watched) {
        if (j == ctx->n_watched || (i < n && ctx->fds[i] < ctx->watched[j])) {
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->fds[i]};
            if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->fds[i], &ev) && errno == EEXIST)
                epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, ctx->fds[i], &ev);
            i++;
        } else if (i == n || ctx->watched[j] < ctx->fds[i]) {
            epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ctx->watched[j], NULL);
            j++;
        } else {
            struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctx->fds[i]};
            if (renew && epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, ctx->fds[i], &ev) && errno == ENOENT)
                epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->fds[i], &ev);
            i++, j++;
        }
    }
    if (ecxi_grow(&ctx->watched, &ctx->watched_cap, n, sizeof *ctx->watched)) {
        ctx->n_watched = 0; /* forget: the next sync re-adds (EEXIST -> MOD) */
        return;
    }
    memcpy(ctx->watched, ctx->fds, n * sizeof *ctx->fds);
    ctx->n_watched = n;
}

static int64_t min_timeout(int64_t a, int64_t b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    return a < b ? a : b;
}

/* Get ready to wait up to limit ms (-1: no limit): 0 if there is work now,
 * else how long to wait on epfd (-1: until woken). *nothing is set when
 * there is nothing at all to wait for. Called with the lock held. */
static int64_t wait_ms(ecx_ctx *ctx, int64_t limit, bool *nothing)
{
    size_t n = 0;
    bool sleepable = true;
    *nothing = false;
    if (ctx->srv) {
        if (watch_socket(ctx, ecxi_ctrl_server_socket(ctx->srv), &n)) return 0;
        void *zap = ecxi_ctrl_server_zap_socket(ctx->srv); /* CURVE handshakes wait on it */
        if (zap && watch_socket(ctx, zap, &n)) return 0;
        if (watch_socket(ctx, ecxi_ctrl_server_monitor_socket(ctx->srv), &n)) return 0;
    }
    if (ctx->cons) {
        size_t want = ecxi_consumer_pollitems(ctx->cons, NULL, 0);
        if (ecxi_grow(&ctx->items, &ctx->items_cap, want, sizeof *ctx->items)) return 1;
        ecxi_consumer_pollitems(ctx->cons, ctx->items, want);
        for (size_t i = 0; i < want; i++)
            if (watch_socket(ctx, ctx->items[i].socket, &n)) return 0;
    }
    if (watch_data(ctx, ctx->pdata, &n, &sleepable) || watch_data(ctx, ctx->cdata, &n, &sleepable))
        return 0;
    uint64_t gen = ctx->cons ? ecxi_consumer_sessions_gen(ctx->cons) : 0;
    sync_epoll(ctx, n, gen != ctx->synced_gen);
    ctx->synced_gen = gen;
    int64_t wait = limit;
    if (ctx->prod) wait = min_timeout(wait, ecxi_producer_next_timeout(ctx->prod));
    if (ctx->srv) wait = min_timeout(wait, ecxi_ctrl_server_next_timeout(ctx->srv));
    if (ctx->cons) wait = min_timeout(wait, ecxi_consumer_next_timeout(ctx->cons));
    if (!sleepable) wait = min_timeout(wait, 1);
    *nothing = n == 0 && wait < 0;
    return wait;
}

/* How long one ecx_poll(ctx, 0) keeps stepping while work is ready, in the
 * no-thread mode: long enough to move a few slices of a READ per engine
 * step, short enough never to stall the step (issue 12: ≤ 1 ms). */
#define POLL_BUDGET_NS 500000

/* Wait on epfd for at most wait ms (-1: until woken) without the lock. */
static void wait_unlocked(ecx_ctx *ctx, int64_t wait)
{
    atomic_fetch_add(&ctx->waiters, 1);
    ecxi_ctx_unlock(ctx);
    struct epoll_event evs[8];
    epoll_wait(ctx->epfd, evs, 8, wait > INT32_MAX ? INT32_MAX : (int)wait);
    ecxi_ctx_lock(ctx);
    atomic_fetch_sub(&ctx->waiters, 1);
    unkick(ctx);
}

/* Step while work is ready, for at most budget_ns. Lock held. */
/* A data plane left work for another step at once (a READ's next slice).
 * The cheap test between two steps; wait_ms() is the full one before a
 * sleep. */
static bool data_busy(ecx_ctx *ctx)
{
    return (ctx->pdata && ecxi_data_arm(ctx->pdata) == 1) ||
           (ctx->cdata && ecxi_data_arm(ctx->cdata) == 1);
}

static int step_for(ecx_ctx *ctx, int64_t budget_ns)
{
    int64_t end = ecxi_now_ns() + budget_ns;
    int ev = step(ctx);
    while (data_busy(ctx) && ecxi_now_ns() < end) ev += step(ctx);
    return ev;
}

/* The engine's call when the progress thread does the work: report what
 * it did since the last call, waiting up to timeout_ms for something. */
static int poll_threaded(ecx_ctx *ctx, int timeout_ms)
{
    int ev = atomic_exchange(&ctx->done_events, 0);
    if (ev == 0 && timeout_ms != 0) {
        struct pollfd pfd = {ctx->done, POLLIN, 0};
        poll(&pfd, 1, timeout_ms);
    }
    drain_fd(ctx->done, &ctx->done_set);
    return ev + atomic_exchange(&ctx->done_events, 0);
}

int ecx_poll(ecx_ctx *ctx, int timeout_ms)
{
    if (!ctx) return ECX_EINVAL;
    if (ctx->threaded) return poll_threaded(ctx, timeout_ms);
    ecxi_ctx_lock(ctx);
    unkick(ctx);
    int ev = step_for(ctx, POLL_BUDGET_NS);
    if (ev || timeout_ms == 0) goto out;
    bool nothing;
    int64_t wait = wait_ms(ctx, timeout_ms < 0 ? -1 : timeout_ms, &nothing);
    /* With nothing to wait on (a consumer before its first fetch) and no
     * limit, return rather than block forever on nothing. */
    if (wait != 0 && !nothing) wait_unlocked(ctx, wait);
    ev = step_for(ctx, POLL_BUDGET_NS);
out:
    ecxi_ctx_unlock(ctx);
    return ev;
}

/* The progress thread: step, and between two steps let waiting callers in;
 * sleep on epfd when nothing is ready. Every step is bounded (the data
 * plane works in slices), so no call waits on the lock for long. */
static void *progress_main(void *arg)
{
    ecx_ctx *ctx = arg;
    ecxi_ctx_lock(ctx);
    for (;;) {
        /* Drain the kick before looking at stopping: stop_thread sets stopping, then
         * kicks; a kick drained after that store is seen below, one written after this
         * drain wakes the wait (a drain after the test lost stop_thread's kick, and the
         * thread slept for good: a hang seen under TSan in test_api). */
        unkick(ctx);
        if (atomic_load(&ctx->stopping)) break;
        int ev = step(ctx);
        if (ev > 0) {
            atomic_fetch_add(&ctx->done_events, ev);
            signal_fd(ctx->done, &ctx->done_set);
        }
        bool nothing, busy = data_busy(ctx);
        int64_t wait = busy ? 0 : wait_ms(ctx, -1, &nothing);
        if (wait != 0) {
            wait_unlocked(ctx, wait); /* -1 with nothing: until a kick */
            continue;
        }
        ecxi_ctx_unlock(ctx);
        /* A READ's next slice at once: first give the core to a thread
         * that waits for one (on a loaded host, the engine's, runnable
         * behind this one), so the thread holds a core for one slice at a
         * time (not after a step of requests: short, and a yield each would
         * slow a producer's control plane); then a caller that announced
         * itself gets mu within a few yields (bounded: the thread never
         * spins on its own). */
        if (busy) sched_yield();
        for (int i = 0; i < 64 && atomic_load_explicit(&ctx->callers, memory_order_relaxed); i++)
            sched_yield();
        ecxi_ctx_lock(ctx);
    }
    ecxi_ctx_unlock(ctx);
    return NULL;
}

int ecxi_loop_start_thread(ecx_ctx *ctx)
{
    ctx->done = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->done < 0) return ECX_ESYS;
    if (pthread_create(&ctx->thread, NULL, progress_main, ctx)) return ECX_ESYS;
    ctx->threaded = true;
    return 0;
}

void ecxi_loop_stop_thread(ecx_ctx *ctx)
{
    if (ctx->threaded) {
        atomic_store(&ctx->stopping, true);
        ecxi_loop_kick(ctx);
        pthread_join(ctx->thread, NULL);
        ctx->threaded = false;
    }
    if (ctx->done >= 0) close(ctx->done);
    ctx->done = -1;
}

int ecx_fd(ecx_ctx *ctx)
{
    if (!ctx) return ECX_EINVAL;
    return ctx->threaded ? ctx->done : ctx->epfd;
}

int ecx_next_timeout(ecx_ctx *ctx)
{
    if (!ctx) return ECX_EINVAL;
    if (ctx->threaded) return ECX_NO_TIMEOUT; /* the thread keeps the timers */
    ecxi_ctx_lock(ctx);
    bool nothing;
    int64_t w = wait_ms(ctx, -1, &nothing);
    ecxi_ctx_unlock(ctx);
    return w < 0 || w > ECX_NO_TIMEOUT ? ECX_NO_TIMEOUT : (int)w; /* -1: no timer */
}

void ecxi_loop_sent(ecx_ctx *ctx, uint64_t requests_before)
{
    if (ecxi_consumer_requests(ctx->cons) != requests_before && atomic_load(&ctx->waiters))
        ecxi_loop_kick(ctx);
}
