/* SPDX-License-Identifier: Apache-2.0 */
/* shm_copy — guarded, verified copy out of a producer's region; see shm_copy.h. */
#include "shm_copy.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data_impl.h"
#include "ecx.h"
#include "util.h"

#include "fsum.h"

#define PREAD_CHUNK (512u << 10) /* hashed while still in L2 */

/* ---- the SIGBUS guard --------------------------------------------------- */

typedef struct guard {
    const uint8_t *lo, *hi; /* the source mapping being read */
    volatile sig_atomic_t armed;
    sigjmp_buf env;
} guard;

static _Thread_local guard g_guard;
static atomic_int g_armed; /* threads inside a guarded copy */
static struct sigaction g_prev;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_init_rc;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    if (atomic_load_explicit(&g_armed, memory_order_relaxed) > 0 && g_guard.armed) {
        const uint8_t *a = si->si_addr;
        if (a >= g_guard.lo && a < g_guard.hi) {
            g_guard.armed = 0;
            siglongjmp(g_guard.env, 1);
        }
    }
    /* Not a fault of ours: what would have happened without us. */
    if (g_prev.sa_flags & SA_SIGINFO) {
        g_prev.sa_sigaction(sig, si, uc);
    } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
        g_prev.sa_handler(sig);
    } else {
        /* Default action: a faulting access re-executes and dies of it; a
         * sent signal is raised again (SA_NODEFER: not blocked here). */
        signal(sig, SIG_DFL);
        if (si->si_code <= 0) raise(sig);
    }
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev) != 0) {
        ecxi_log(ECX_LOG_WARN, "data shm: cannot install the SIGBUS guard: %s; copies use pread",
                strerror(errno));
        g_init_rc = ECX_ESYS;
    }
}

int ecxi_shm_copy_init(void)
{
    pthread_once(&g_once, install);
    return g_init_rc;
}

static bool guard_in_place(void)
{
    struct sigaction cur;
    if (g_init_rc || sigaction(SIGBUS, NULL, &cur) != 0) return false;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus;
}

bool ecxi_shm_copy_guarded(void)
{
    return guard_in_place();
}

/* ---- pread: a chunk at a time, hashed while in cache ------------------- */

static int pread_run(int fd, uint8_t *dst, uint64_t off, uint64_t len, ecxi_fsum *f)
{
    while (len) {
        size_t want = len < PREAD_CHUNK ? (size_t)len : PREAD_CHUNK;
        ssize_t k = pread(fd, dst, want, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: read of the producer's region %s",
                                k < 0 ? strerror(errno) : "ended early (file truncated?)");
            return ECX_ESYS;
        }
        ecxi_fsum_update(f, dst, (uint64_t)k);
        dst += k, off += (uint64_t)k, len -= (uint64_t)k;
    }
    return 0;
}

/* ---- guarded: copy and hash in one pass -------------------------------- */

/* The guarded part: a fault on the source jumps back here (nothing in
 * between needs cleaning up: the job is failed). */
static int copy_guarded(const ecxi_shm_src *src, uint8_t *dst, const uint8_t *from, uint64_t len,
                        ecxi_fsum *f)
{
    g_guard.lo = src->map;
    g_guard.hi = src->map + src->map_len;
    atomic_fetch_add(&g_armed, 1);
    if (sigsetjmp(g_guard.env, 0)) {
        atomic_fetch_sub(&g_armed, 1);
        return ECX_ESYS;
    }
    g_guard.armed = 1;
    ecxi_fsum_copy(f, dst, from, len);
    g_guard.armed = 0;
    atomic_fetch_sub(&g_armed, 1);
    return 0;
}

/* ---- the job: one item, copied a slice at a time ----------------------- */

typedef struct jrun {
    uint64_t src, dst, len; /* byte offsets in the source file / destination */
    uint64_t at;            /* where the run starts in the item */
} jrun;

struct ecxi_shm_job {
    ecxi_fsum f; /* the running XXH3 state, either way */
    uint64_t nbytes, done;
    size_t nruns, run_i;
    uint64_t run_off; /* into runs[run_i] */
    int mode;
    bool fast;
    struct ahead *ahead; /* ECXI_SHM_COPY_AHEAD: the fault-ahead thread's, while it runs */
    jrun runs[];
};

/* MADV_POPULATE_* (Linux 5.14): 22 / 23 in <linux/mman.h>. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static atomic_bool g_no_populate; /* the kernel said EINVAL: stop asking */

void ecxi_shm_populate(const void *p, uint64_t len, bool write)
{
    if (!len || atomic_load_explicit(&g_no_populate, memory_order_relaxed)) return;
    static atomic_long g_page; /* several contexts' threads may get here first */
    long page = atomic_load_explicit(&g_page, memory_order_relaxed);
    if (!page) {
        page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
        atomic_store_explicit(&g_page, page, memory_order_relaxed);
    }
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    uintptr_t e = (uintptr_t)p + len;
    /* EFAULT (a truncated source) and the like are the copy's to find. */
    if (madvise((void *)a, e - a, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0 &&
        errno == EINVAL)
        atomic_store(&g_no_populate, true);
}

/* ---- fault-ahead (ECXI_SHM_COPY_AHEAD) ------------------------------------
 * A detached thread per job faults the source in, the job's runs from the
 * last, each from its end, AHEAD_PIECE at a time, down to where the copy
 * has got, or until the job says stop (at its end or when it is freed:
 * neither waits for the thread). Its state is shared with the job and
 * freed by whichever lets go last. It only ever faults pages of the source
 * mapping in: a truncated file is an error it ignores (MADV_POPULATE_READ
 * says EFAULT, no signal). Whoever unmaps a source first calls
 * ecxi_shm_ahead_drain(), which waits for the threads still working on
 * that mapping (each sees its stop within one piece). */
#define AHEAD_PIECE (1u << 20)

typedef struct ahead {
    const uint8_t *map;
    const jrun *runs; /* a copy, owned */
    size_t nruns;
    atomic_uint_least64_t copied; /* bytes of the item the copy has done */
    atomic_bool stop;
    atomic_int refs; /* the job and the thread */
    struct ahead *next; /* in g_ahead, while the thread runs */
} ahead;

static pthread_mutex_t g_ahead_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_ahead_cv = PTHREAD_COND_INITIALIZER;
static ahead *g_ahead; /* threads running */
static pthread_once_t g_ahead_once = PTHREAD_ONCE_INIT;

/* A forked child has none of the parent's threads (their entries would
 * never leave the list) and may have copied the lock held. */
static void ahead_atfork_child(void)
{
    pthread_mutex_init(&g_ahead_mu, NULL);
    pthread_cond_init(&g_ahead_cv, NULL);
    g_ahead = NULL;
}

static void ahead_install(void)
{
    pthread_atfork(NULL, NULL, ahead_atfork_child);
}

static void ahead_put(ahead *a)
{
    if (atomic_fetch_sub(&a->refs, 1) == 1) {
        free((void *)a->runs);
        free(a);
    }
}

static void *ahead_main(void *arg)
{
    ahead *a = arg;
    for (size_t i = a->nruns; i-- > 0;) {
        const jrun *r = &a->runs[i];
        for (uint64_t hi = r->len; hi > 0;) {
            uint64_t lo = hi > AHEAD_PIECE ? hi - AHEAD_PIECE : 0;
            if (atomic_load_explicit(&a->stop, memory_order_relaxed) ||
                r->at + hi <= atomic_load_explicit(&a->copied, memory_order_relaxed))
                goto out;
            ecxi_shm_populate(a->map + r->src + lo, hi - lo, false);
            hi = lo;
        }
    }
out:
    pthread_mutex_lock(&g_ahead_mu);
    for (ahead **pp = &g_ahead; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    pthread_cond_broadcast(&g_ahead_cv);
    pthread_mutex_unlock(&g_ahead_mu);
    ahead_put(a);
    return NULL;
}

static void ahead_start(ecxi_shm_job *j, const ecxi_shm_src *src)
{
    pthread_once(&g_ahead_once, ahead_install);
    ahead *a = calloc(1, sizeof *a);
    jrun *runs = malloc(j->nruns * sizeof *runs);
    if (!a || !runs) {
        free(a), free(runs);
        return; /* the copy goes on without */
    }
    memcpy(runs, j->runs, j->nruns * sizeof *runs);
    a->map = src->map;
    a->runs = runs;
    a->nruns = j->nruns;
    atomic_init(&a->copied, 0);
    atomic_init(&a->stop, false);
    atomic_init(&a->refs, 2);
    pthread_attr_t at;
    pthread_t th;
    bool attr = pthread_attr_init(&at) == 0, ok = attr;
    if (ok) ok = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) == 0;
    pthread_mutex_lock(&g_ahead_mu);
    a->next = g_ahead;
    g_ahead = a;
    ok = ok && pthread_create(&th, &at, ahead_main, a) == 0;
    if (!ok) g_ahead = a->next;
    pthread_mutex_unlock(&g_ahead_mu);
    if (attr) pthread_attr_destroy(&at);
    if (!ok) {
        free(runs), free(a);
        return;
    }
    j->ahead = a;
}

static void ahead_end(ecxi_shm_job *j)
{
    if (!j->ahead) return;
    atomic_store(&j->ahead->stop, true);
    ahead_put(j->ahead);
    j->ahead = NULL;
}

void ecxi_shm_ahead_drain(const void *map)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10; /* each thread sees its stop within one piece; bounded all the same */
    pthread_mutex_lock(&g_ahead_mu);
    for (;;) {
        ahead *a = g_ahead;
        while (a && a->map != map)
            a = a->next;
        if (!a) break;
        atomic_store(&a->stop, true);
        if (pthread_cond_timedwait(&g_ahead_cv, &g_ahead_mu, &until) == ETIMEDOUT) {
            ecxi_log(ECX_LOG_WARN, "data shm: a fault-ahead thread did not stop in 10 s");
            break;
        }
    }
    pthread_mutex_unlock(&g_ahead_mu);
}

static void job_reset(ecxi_shm_job *j, bool fast)
{
    j->fast = fast;
    j->done = 0;
    j->run_i = 0;
    j->run_off = 0;
    ecxi_fsum_init(&j->f, j->nbytes);
}

static bool want_fast(const ecxi_shm_src *src, int mode)
{
    bool fast = (mode & ECXI_SHM_COPY_PREAD) == 0 && src->map;
    if (fast && !ecxi_shm_copy_guarded()) {
        fast = false;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO,
                            "data shm: copying with pread (another SIGBUS handler replaced "
                            "ecx's guard)");
    }
    return fast;
}

int ecxi_shm_job_new(const ecxi_shm_src *src, uint64_t block_bytes, const ecxi_block_run *remote,
                    size_t nremote, const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                    int mode, ecxi_shm_job **out)
{
    uint64_t r, l, m;
    size_t k = 0;
    ecxi_block_zip z = ecxi_block_zip_start(remote, nremote, local, nlocal);
    while (ecxi_block_zip_next(&z, &r, &l, &m))
        k++;
    size_t sz = sizeof(ecxi_shm_job) + k * sizeof(jrun);
    sz = (sz + 63) & ~(size_t)63;
    ecxi_shm_job *j = aligned_alloc(64, sz);
    if (!j) return ECX_ENOMEM;
    memset(j, 0, sizeof *j);
    uint64_t left = nbytes;
    k = 0;
    z = ecxi_block_zip_start(remote, nremote, local, nlocal);
    while (left && ecxi_block_zip_next(&z, &r, &l, &m)) {
        uint64_t len = m * block_bytes < left ? m * block_bytes : left;
        j->runs[k++] = (jrun){r * block_bytes, l * block_bytes, len, nbytes - left};
        left -= len;
    }
    j->nruns = k;
    j->nbytes = nbytes;
    j->mode = mode;
    job_reset(j, want_fast(src, mode));
    *out = j;
    return 0;
}

int ecxi_shm_job_step(ecxi_shm_job *j, const ecxi_shm_src *src, uint8_t *dst_base,
                     uint64_t max_bytes, uint64_t *moved, uint64_t *sum)
{
    *moved = 0;
    if (j->fast && !ecxi_shm_copy_guarded()) {
        /* The guard went away under us (someone replaced the handler):
         * the bytes so far are ours to overwrite; start again with pread. */
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "data shm: SIGBUS guard replaced mid-copy; "
                                          "copying again with pread");
        job_reset(j, false);
    }
    /* The first step of a guarded copy starts the fault-ahead thread. */
    if ((j->mode & ECXI_SHM_COPY_AHEAD) && j->fast && !j->ahead && j->done == 0 && j->nbytes)
        ahead_start(j, src);
    while (max_bytes && j->run_i < j->nruns) {
        const jrun *r = &j->runs[j->run_i];
        uint64_t len = r->len - j->run_off;
        if (len > max_bytes) len = max_bytes;
        uint64_t so = r->src + j->run_off;
        uint8_t *dst = dst_base + r->dst + j->run_off;
        if (j->mode & ECXI_SHM_COPY_POPULATE) {
            if (j->fast) ecxi_shm_populate(src->map + so, len, false);
            ecxi_shm_populate(dst, len, true);
        }
        int rc;
        if (j->fast) {
            rc = copy_guarded(src, dst, src->map + so, len, &j->f);
            if (rc)
                ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                    "data shm: the producer's region faulted during a copy "
                                    "(file truncated?); read failed");
        } else
            rc = pread_run(src->fd, dst, so, len, &j->f);
        if (rc) return rc;
        j->run_off += len;
        j->done += len;
        if (j->ahead) atomic_store_explicit(&j->ahead->copied, j->done, memory_order_relaxed);
        *moved += len;
        max_bytes -= len;
        if (j->run_off == r->len) j->run_i++, j->run_off = 0;
    }
    if (j->done < j->nbytes) return 0;
    ahead_end(j);
    *sum = ecxi_fsum_digest(&j->f);
    return 1;
}

uint64_t ecxi_shm_job_left(const ecxi_shm_job *j)
{
    return j->nbytes - j->done;
}

void ecxi_shm_job_free(ecxi_shm_job *j)
{
    if (!j) return;
    ahead_end(j);
    free(j);
}

int ecxi_shm_copy(const ecxi_shm_src *src, uint8_t *dst_base, uint64_t block_bytes,
                 const ecxi_block_run *remote, size_t nremote, const ecxi_block_run *local,
                 size_t nlocal, uint64_t nbytes, int mode, uint64_t *sum)
{
    ecxi_shm_job *j;
    int rc = ecxi_shm_job_new(src, block_bytes, remote, nremote, local, nlocal, nbytes, mode, &j);
    if (rc) return rc;
    uint64_t moved;
    rc = ecxi_shm_job_step(j, src, dst_base, UINT64_MAX, &moved, sum);
    ecxi_shm_job_free(j);
    return rc < 0 ? rc : 0;
}
