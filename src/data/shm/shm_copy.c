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
#include <unistd.h>

#include "checksum.h"
#include "ecx.h"
#include "util.h"

/* The fused kernel reproduces XXH3-64's long-input loop with the library's
 * own constants and merge (all static under XXH_INLINE_ALL, so nothing
 * clashes with the linked libxxhash that checksum.c uses). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define SHM_HAVE_AVX2_KERNEL 1
#else
#define SHM_HAVE_AVX2_KERNEL 0
#endif

#define PREAD_CHUNK (512u << 10) /* hashed while still in L2 */
#define NT_MIN (16u << 20)        /* items this large bypass the cache on store, as memcpy does */

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

static bool cpu_ok(void)
{
#if SHM_HAVE_AVX2_KERNEL
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

bool ecxi_shm_copy_guarded(void)
{
    return cpu_ok() && guard_in_place();
}

/* ---- pread: a chunk at a time, hashed while in cache ------------------- */

static int pread_run(int fd, uint8_t *dst, uint64_t off, uint64_t len, ecxi_sum *s)
{
    while (len) {
        size_t want = len < PREAD_CHUNK ? (size_t)len : PREAD_CHUNK;
        ssize_t k = pread(fd, dst, want, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: read of the producer's region %s",
                                k < 0 ? strerror(errno) : "ended early (file truncated?)");
            return ECX_ESYS;
        }
        ecxi_sum_update(s, dst, (size_t)k);
        dst += k, off += (uint64_t)k, len -= (uint64_t)k;
    }
    return 0;
}

/* ---- guarded: copy and hash in one pass -------------------------------- */

#if SHM_HAVE_AVX2_KERNEL
/* XXH3-64 long-input state over a stream whose length is known up front:
 * stripes 0..K-1 (K = (total-1)/64) are accumulated as they pass, with a
 * scramble after every 16th; the last 64 bytes of the stream are
 * accumulated at the end with the "last stripe" secret, then merged. A
 * stripe that straddles two runs is assembled in buf. */
typedef struct fsum {
    uint64_t acc[8] __attribute__((aligned(32)));
    uint64_t total, done, k, K;
    uint8_t buf[64], last[64];
    size_t buffered;
    bool nt;
} fsum;

static void fsum_init(fsum *f, uint64_t total)
{
    static const uint64_t init[8] = {XXH_PRIME32_3, XXH_PRIME64_1, XXH_PRIME64_2, XXH_PRIME64_3,
                                     XXH_PRIME64_4, XXH_PRIME32_2, XXH_PRIME64_5, XXH_PRIME32_1};
    memcpy(f->acc, init, sizeof init);
    f->total = total;
    f->done = f->k = 0;
    f->K = (total - 1) / 64;
    f->buffered = 0;
    f->nt = total >= NT_MIN;
}

__attribute__((target("avx2"))) static inline void stripe(__m256i acc[2], __m256i d0, __m256i d1,
                                                          const uint8_t *secret)
{
    __m256i k0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)secret));
    __m256i k1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(secret + 32)));
    __m256i p0 = _mm256_mul_epu32(k0, _mm256_shuffle_epi32(k0, _MM_SHUFFLE(0, 3, 0, 1)));
    __m256i p1 = _mm256_mul_epu32(k1, _mm256_shuffle_epi32(k1, _MM_SHUFFLE(0, 3, 0, 1)));
    acc[0] = _mm256_add_epi64(
        p0, _mm256_add_epi64(acc[0], _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
    acc[1] = _mm256_add_epi64(
        p1, _mm256_add_epi64(acc[1], _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
}

__attribute__((target("avx2"))) static inline void scramble(__m256i acc[2])
{
    const __m256i prime = _mm256_set1_epi32((int)XXH_PRIME32_1);
    const uint8_t *s = XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - 64;
    for (int i = 0; i < 2; i++) {
        __m256i a = acc[i];
        a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(s + 32 * i)));
        __m256i hi = _mm256_shuffle_epi32(a, _MM_SHUFFLE(0, 3, 0, 1));
        acc[i] = _mm256_add_epi64(_mm256_mul_epu32(a, prime),
                                  _mm256_slli_epi64(_mm256_mul_epu32(hi, prime), 32));
    }
}

/* The next len bytes of the stream, src -> dst. */
__attribute__((target("avx2"))) static void fsum_copy(fsum *f, uint8_t *dst, const uint8_t *src,
                                                      uint64_t len)
{
    const uint64_t last_from = f->total - 64;
    uint8_t *const dst0 = dst;
    const uint64_t done0 = f->done;
    __m256i acc[2] = {_mm256_load_si256((const __m256i *)f->acc),
                      _mm256_load_si256((const __m256i *)(f->acc + 4))};
    uint64_t left = len;
    while (left) {
        if (f->k == f->K) { /* past the last full stripe: copy only */
            memcpy(dst, src, left);
            break;
        }
        if (f->buffered || left < 64) { /* a stripe split between runs */
            size_t m = 64 - f->buffered < left ? 64 - f->buffered : (size_t)left;
            memcpy(dst, src, m);
            memcpy(f->buf + f->buffered, dst, m);
            f->buffered += m, dst += m, src += m, left -= m;
            if (f->buffered == 64) {
                stripe(acc, _mm256_loadu_si256((const __m256i *)f->buf),
                       _mm256_loadu_si256((const __m256i *)(f->buf + 32)),
                       XXH3_kSecret + (f->k % 16) * 8);
                f->buffered = 0;
                if (++f->k % 16 == 0) scramble(acc);
            }
            continue;
        }
        uint64_t s = left / 64;
        if (s > f->K - f->k) s = f->K - f->k;
        bool nt = f->nt && ((uintptr_t)dst & 31) == 0;
        for (uint64_t i = 0; i < s; i++) {
            __m256i d0 = _mm256_loadu_si256((const __m256i *)src);
            __m256i d1 = _mm256_loadu_si256((const __m256i *)(src + 32));
            if (nt) {
                _mm256_stream_si256((__m256i *)dst, d0);
                _mm256_stream_si256((__m256i *)(dst + 32), d1);
            } else {
                _mm256_storeu_si256((__m256i *)dst, d0);
                _mm256_storeu_si256((__m256i *)(dst + 32), d1);
            }
            stripe(acc, d0, d1, XXH3_kSecret + (f->k % 16) * 8);
            if (++f->k % 16 == 0) scramble(acc);
            src += 64, dst += 64;
        }
        left -= s * 64;
    }
    _mm256_store_si256((__m256i *)f->acc, acc[0]);
    _mm256_store_si256((__m256i *)(f->acc + 4), acc[1]);
    if (f->nt) _mm_sfence(); /* the streamed bytes are visible before we read any back */
    /* Keep the stream's last 64 bytes as written. */
    if (done0 + len > last_from) {
        uint64_t from = done0 > last_from ? done0 : last_from;
        memcpy(f->last + (from - last_from), dst0 + (from - done0), done0 + len - from);
    }
    f->done = done0 + len;
}

static uint64_t fsum_digest(fsum *f)
{
    XXH3_accumulate_512_scalar(f->acc, f->last,
                               XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - 64 -
                                   XXH_SECRET_LASTACC_START);
    return XXH3_mergeAccs(f->acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START,
                          f->total * XXH_PRIME64_1);
}

/* The guarded part: a fault on the source jumps back here (nothing in
 * between needs cleaning up: the job is failed). */
static int copy_guarded(const ecxi_shm_src *src, uint8_t *dst, const uint8_t *from, uint64_t len,
                        fsum *f)
{
    g_guard.lo = src->map;
    g_guard.hi = src->map + src->map_len;
    atomic_fetch_add(&g_armed, 1);
    if (sigsetjmp(g_guard.env, 0)) {
        atomic_fetch_sub(&g_armed, 1);
        return ECX_ESYS;
    }
    g_guard.armed = 1;
    fsum_copy(f, dst, from, len);
    g_guard.armed = 0;
    atomic_fetch_sub(&g_armed, 1);
    return 0;
}
#endif

/* ---- the job: one item, copied a slice at a time ----------------------- */

typedef struct jrun {
    uint64_t src, dst, len; /* byte offsets in the source file / destination */
} jrun;

struct ecxi_shm_job {
#if SHM_HAVE_AVX2_KERNEL
    fsum f; /* guarded: the running XXH3 state of the one-pass kernel */
#endif
    ecxi_sum s; /* pread: the streaming XXH3 state */
    uint64_t nbytes, done;
    size_t nruns, run_i;
    uint64_t run_off; /* into runs[run_i] */
    int mode;
    bool fast;
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

static void job_reset(ecxi_shm_job *j, bool fast)
{
    j->fast = fast;
    j->done = 0;
    j->run_i = 0;
    j->run_off = 0;
#if SHM_HAVE_AVX2_KERNEL
    if (fast) fsum_init(&j->f, j->nbytes);
#endif
    if (!fast) ecxi_sum_reset(&j->s);
}

static bool want_fast(const ecxi_shm_src *src, uint64_t nbytes, int mode)
{
    bool fast = (mode & ECX_SHM_COPY_PREAD) == 0 && src->map && nbytes > 240;
    if (fast && !ecxi_shm_copy_guarded()) {
        fast = false;
        ECX_LOG_RATELIMITED(ECX_LOG_INFO, "data shm: copying with pread (%s)",
                            cpu_ok() ? "another SIGBUS handler replaced ecx's guard"
                                     : "no AVX2 on this CPU");
    }
    return SHM_HAVE_AVX2_KERNEL && fast;
}

int ecxi_shm_job_new(const ecxi_shm_src *src, uint64_t block_bytes, const uint64_t *remote,
                    const uint64_t *local, size_t n, uint64_t nbytes, int mode,
                    ecxi_shm_job **out)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t m = 1;
        while (i + m < n && remote[i + m] == remote[i] + m && local[i + m] == local[i] + m)
            m++;
        k++;
        i += m;
    }
    size_t sz = sizeof(ecxi_shm_job) + k * sizeof(jrun);
    sz = (sz + 63) & ~(size_t)63;
    /* 64-byte aligned: the XXH3 states use aligned vector loads. */
    ecxi_shm_job *j = aligned_alloc(64, sz);
    if (!j) return ECX_ENOMEM;
    memset(j, 0, sizeof *j);
    uint64_t left = nbytes;
    k = 0;
    for (size_t i = 0; i < n && left;) {
        size_t m = 1;
        while (i + m < n && remote[i + m] == remote[i] + m && local[i + m] == local[i] + m)
            m++;
        uint64_t len = m * block_bytes < left ? m * block_bytes : left;
        j->runs[k++] = (jrun){remote[i] * block_bytes, local[i] * block_bytes, len};
        left -= len;
        i += m;
    }
    j->nruns = k;
    j->nbytes = nbytes;
    j->mode = mode;
    job_reset(j, want_fast(src, nbytes, mode));
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
        ECX_LOG_RATELIMITED(ECX_LOG_INFO, "data shm: SIGBUS guard replaced mid-copy; "
                                          "copying again with pread");
        job_reset(j, false);
    }
    while (max_bytes && j->run_i < j->nruns) {
        const jrun *r = &j->runs[j->run_i];
        uint64_t len = r->len - j->run_off;
        if (len > max_bytes) len = max_bytes;
        uint64_t so = r->src + j->run_off;
        uint8_t *dst = dst_base + r->dst + j->run_off;
        if (j->mode & ECX_SHM_COPY_POPULATE) {
            if (j->fast) ecxi_shm_populate(src->map + so, len, false);
            ecxi_shm_populate(dst, len, true);
        }
        int rc = 0;
#if SHM_HAVE_AVX2_KERNEL
        if (j->fast) {
            rc = copy_guarded(src, dst, src->map + so, len, &j->f);
            if (rc)
                ECX_LOG_RATELIMITED(ECX_LOG_WARN,
                                    "data shm: the producer's region faulted during a copy "
                                    "(file truncated?); read failed");
        } else
#endif
            rc = pread_run(src->fd, dst, so, len, &j->s);
        if (rc) return rc;
        j->run_off += len;
        j->done += len;
        *moved += len;
        max_bytes -= len;
        if (j->run_off == r->len) j->run_i++, j->run_off = 0;
    }
    if (j->done < j->nbytes) return 0;
#if SHM_HAVE_AVX2_KERNEL
    if (j->fast) {
        *sum = fsum_digest(&j->f);
        return 1;
    }
#endif
    *sum = ecxi_sum_digest(&j->s);
    return 1;
}

uint64_t ecxi_shm_job_left(const ecxi_shm_job *j)
{
    return j->nbytes - j->done;
}

void ecxi_shm_job_free(ecxi_shm_job *j)
{
    free(j);
}

int ecxi_shm_copy(const ecxi_shm_src *src, uint8_t *dst_base, uint64_t block_bytes,
                 const uint64_t *remote, const uint64_t *local, size_t n, uint64_t nbytes,
                 int mode, uint64_t *sum)
{
    ecxi_shm_job *j;
    int rc = ecxi_shm_job_new(src, block_bytes, remote, local, n, nbytes, mode, &j);
    if (rc) return rc;
    uint64_t moved;
    rc = ecxi_shm_job_step(j, src, dst_base, UINT64_MAX, &moved, sum);
    ecxi_shm_job_free(j);
    return rc < 0 ? rc : 0;
}
