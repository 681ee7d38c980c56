/* SPDX-License-Identifier: Apache-2.0 */
/* fsum — XXH3-64 computed as a known-length stream passes; see fsum.h. */
#include "fsum.h"

#include <stdatomic.h>
#include <string.h>

/* The kernels reproduce XXH3-64's long-input loop with the library's own
 * constants and merge (all static under XXH_INLINE_ALL, so nothing clashes
 * with the linked libxxhash that checksum.c uses). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define FSUM_X86 1
#else
#define FSUM_X86 0
#endif

#define STRIPES 16 /* per block: (default secret 192 - 64) / 8 */
#define SCRAMBLE_SECRET (XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - 64)

enum { ST_HASH = 0, ST_STORE = 1, ST_STREAM = 2, ST_STREAM_PF = 3 };

/* How far ahead of its loads a streaming AVX2 copy prefetches, on CPUs
 * where that was measured faster: on an AMD EPYC (2 vCPUs, AVX2), 256 MB
 * copied at 6.5-7.7 GB/s without and 8.5-9.3 GB/s with a prefetch 4 KiB
 * ahead, as fast as glibc's memcpy (8.6-9.6 GB/s); on an Intel machine
 * (AVX-512) the same prefetch made either kernel ~12% slower
 * (BENCHMARKS.md, "Data-plane speed"), so elsewhere there is none. */
#define PREFETCH_AHEAD 4096

/* n full stripes from src (stored to dst per `store`), the first of them
 * stripe k of the stream; acc is the accumulators (unaligned). */
typedef void kernel_fn(uint64_t *acc, uint8_t *dst, const uint8_t *src, uint64_t n, uint64_t k,
                       int store);

/* ---- portable C --------------------------------------------------------- */

static void kernel_c(uint64_t *acc, uint8_t *dst, const uint8_t *src, uint64_t n, uint64_t k,
                     int store)
{
    uint64_t a[8];
    memcpy(a, acc, sizeof a);
    for (; n; n--, k++, src += 64) {
        const uint8_t *d = src;
        if (store != ST_HASH) { /* hash what was written, not the source again */
            memcpy(dst, src, 64);
            d = dst;
            dst += 64;
        }
        XXH3_accumulate_512_scalar(a, d, XXH3_kSecret + (k % STRIPES) * 8);
        if (k % STRIPES == STRIPES - 1) XXH3_scrambleAcc_scalar(a, SCRAMBLE_SECRET);
    }
    memcpy(acc, a, sizeof a);
}

#if FSUM_X86
/* ---- AVX2: a stripe is two 32-byte halves ------------------------------- */

__attribute__((target("avx2"))) static inline __m256i acc256(__m256i acc, __m256i d,
                                                             const uint8_t *key)
{
    __m256i dk = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)key));
    __m256i p = _mm256_mul_epu32(dk, _mm256_shuffle_epi32(dk, _MM_SHUFFLE(0, 3, 0, 1)));
    return _mm256_add_epi64(p, _mm256_add_epi64(acc, _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2))));
}

__attribute__((target("avx2"))) static inline __m256i scramble256(__m256i a, const uint8_t *key)
{
    const __m256i prime = _mm256_set1_epi32((int)XXH_PRIME32_1);
    a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
    a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)key));
    __m256i hi = _mm256_shuffle_epi32(a, _MM_SHUFFLE(0, 3, 0, 1));
    return _mm256_add_epi64(_mm256_mul_epu32(a, prime),
                            _mm256_slli_epi64(_mm256_mul_epu32(hi, prime), 32));
}

__attribute__((target("avx2"), always_inline)) static inline void
stripe256(__m256i *a0, __m256i *a1, uint8_t *dst, const uint8_t *src, unsigned j, int store)
{
    __m256i d0 = _mm256_loadu_si256((const __m256i *)src);
    __m256i d1 = _mm256_loadu_si256((const __m256i *)(src + 32));
    if (store == ST_STREAM || store == ST_STREAM_PF) {
        _mm256_stream_si256((__m256i *)dst, d0);
        _mm256_stream_si256((__m256i *)(dst + 32), d1);
    } else if (store == ST_STORE) {
        _mm256_storeu_si256((__m256i *)dst, d0);
        _mm256_storeu_si256((__m256i *)(dst + 32), d1);
    }
    *a0 = acc256(*a0, d0, XXH3_kSecret + j * 8);
    *a1 = acc256(*a1, d1, XXH3_kSecret + j * 8 + 32);
}

__attribute__((target("avx2"), always_inline)) static inline void
run256(uint64_t *acc, uint8_t *dst, const uint8_t *src, uint64_t n, uint64_t k, int store)
{
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    /* One stripe an iteration: unrolling a block measured slower here (its
     * 32 secret halves do not fit AVX2's 16 registers). */
    while (n) {
        if (store == ST_STREAM_PF) _mm_prefetch((const char *)src + PREFETCH_AHEAD, _MM_HINT_T0);
        stripe256(&a0, &a1, dst, src, (unsigned)(k % STRIPES), store);
        if (k % STRIPES == STRIPES - 1) {
            a0 = scramble256(a0, SCRAMBLE_SECRET);
            a1 = scramble256(a1, SCRAMBLE_SECRET + 32);
        }
        src += 64, dst += 64, n--, k++;
    }
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

__attribute__((target("avx2"))) static void kernel_avx2(uint64_t *acc, uint8_t *dst,
                                                        const uint8_t *src, uint64_t n,
                                                        uint64_t k, int store)
{
    if (store == ST_STREAM_PF) run256(acc, dst, src, n, k, ST_STREAM_PF);
    else if (store == ST_STREAM) run256(acc, dst, src, n, k, ST_STREAM);
    else if (store == ST_STORE) run256(acc, dst, src, n, k, ST_STORE);
    else run256(acc, dst, src, n, k, ST_HASH);
}

/* ---- AVX-512: a stripe is one register ---------------------------------- */

#define F512 "avx512f"

__attribute__((target(F512))) static inline __m512i acc512(__m512i acc, __m512i d, __m512i key)
{
    __m512i dk = _mm512_xor_si512(d, key);
    __m512i p = _mm512_mul_epu32(dk, _mm512_shuffle_epi32(dk, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1)));
    return _mm512_add_epi64(
        p, _mm512_add_epi64(acc, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2))));
}

__attribute__((target(F512))) static inline __m512i scramble512(__m512i a)
{
    const __m512i prime = _mm512_set1_epi32((int)XXH_PRIME32_1);
    a = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
    a = _mm512_xor_si512(a, _mm512_loadu_si512(SCRAMBLE_SECRET));
    __m512i hi = _mm512_shuffle_epi32(a, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
    return _mm512_add_epi64(_mm512_mul_epu32(a, prime),
                            _mm512_slli_epi64(_mm512_mul_epu32(hi, prime), 32));
}

__attribute__((target(F512), always_inline)) static inline __m512i
stripe512(__m512i a, uint8_t *dst, const uint8_t *src, __m512i key, int store)
{
    __m512i d = _mm512_loadu_si512(src);
    if (store == ST_STREAM) _mm512_stream_si512((void *)dst, d);
    else if (store == ST_STORE) _mm512_storeu_si512(dst, d);
    return acc512(a, d, key);
}

__attribute__((target(F512), always_inline)) static inline void
run512(uint64_t *acc, uint8_t *dst, const uint8_t *src, uint64_t n, uint64_t k, int store)
{
    __m512i a = _mm512_loadu_si512(acc);
    if (n >= STRIPES) {
        /* The 16 secrets of a block, in registers for the whole run. */
        __m512i key[STRIPES];
#pragma GCC unroll 16
        for (unsigned j = 0; j < STRIPES; j++)
            key[j] = _mm512_loadu_si512(XXH3_kSecret + j * 8);
        for (; n && k % STRIPES; src += 64, dst += 64, n--, k++) {
            a = stripe512(a, dst, src, _mm512_loadu_si512(XXH3_kSecret + (k % STRIPES) * 8),
                          store);
            if (k % STRIPES == STRIPES - 1) a = scramble512(a);
        }
        for (; n >= STRIPES; src += 64 * STRIPES, dst += 64 * STRIPES, n -= STRIPES) {
#pragma GCC unroll 16
            for (unsigned j = 0; j < STRIPES; j++)
                a = stripe512(a, dst + 64 * j, src + 64 * j, key[j], store);
            a = scramble512(a);
        }
    }
    for (; n; src += 64, dst += 64, n--, k++) {
        a = stripe512(a, dst, src, _mm512_loadu_si512(XXH3_kSecret + (k % STRIPES) * 8), store);
        if (k % STRIPES == STRIPES - 1) a = scramble512(a);
    }
    _mm512_storeu_si512(acc, a);
}

/* A streaming copy past the cache, the way glibc's large memcpy reads:
 * two 4 KiB streams at once (a pair: bytes [0, 4096) and [4096, 8192) of
 * the next 8 KiB), 128 bytes of each per step, each prefetched 2-5 lines
 * ahead. XXH3 must take the stripes in order, so each pair's lines also go
 * to a scratch copy in L1 (from the registers that were stored: the hash
 * is of what was written), and the previous pair's scratch is hashed, in
 * order, 4 stripes per step, while this pair's lines are in flight. On
 * an Intel Xeon (AVX-512, BENCHMARKS.md): 256 MB in 1.03-1.05x memcpy's
 * time, against 1.14-1.17x one stream, one stripe after another.
 * k % STRIPES == 0; n stripes, a whole number of pairs. */
#define PAIR_STRIPES 128 /* 8 KiB */
#define PAIR_STEPS 32    /* of 128 bytes per 4 KiB stream */

__attribute__((target(F512), always_inline)) static inline void
pair_step(uint8_t *scr, uint8_t *dst, const uint8_t *src, unsigned o)
{
    for (unsigned p = 0; p < 2; p++) {
        const uint8_t *s = src + p * 4096 + o;
        _mm_prefetch((const char *)s + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)s + 192, _MM_HINT_T0);
        _mm_prefetch((const char *)s + 256, _MM_HINT_T0);
        _mm_prefetch((const char *)s + 320, _MM_HINT_T0);
    }
    for (unsigned p = 0; p < 2; p++) {
        unsigned at = p * 4096 + o;
        __m512i d0 = _mm512_loadu_si512(src + at), d1 = _mm512_loadu_si512(src + at + 64);
        _mm512_stream_si512((void *)(dst + at), d0);
        _mm512_stream_si512((void *)(dst + at + 64), d1);
        _mm512_store_si512((void *)(scr + at), d0);
        _mm512_store_si512((void *)(scr + at + 64), d1);
    }
}

__attribute__((target(F512))) static void run512_pairs(uint64_t *acc, uint8_t *dst,
                                                       const uint8_t *src, uint64_t n)
{
    _Alignas(64) uint8_t scr[2][PAIR_STRIPES * 64];
    __m512i key[STRIPES];
    for (unsigned j = 0; j < STRIPES; j++)
        key[j] = _mm512_loadu_si512(XXH3_kSecret + j * 8);
    __m512i a = _mm512_loadu_si512(acc);
    uint64_t pairs = n / PAIR_STRIPES;
    for (uint64_t q = 0; q <= pairs; q++) { /* the last turn only hashes */
        uint8_t *fill = scr[q & 1], *to = dst + q * PAIR_STRIPES * 64;
        const uint8_t *from = src + q * PAIR_STRIPES * 64, *hash = scr[(q + 1) & 1];
        /* 4 steps hash one block: its 16 secrets stay in registers. */
        for (unsigned b = 0; b < PAIR_STEPS / 4; b++) {
#pragma GCC unroll 4
            for (unsigned u = 0; u < 4; u++) {
                unsigned st = b * 4 + u;
                if (q < pairs) pair_step(fill, to, from, st * 128);
                if (q > 0) {
#pragma GCC unroll 4
                    for (unsigned i = 0; i < 4; i++)
                        a = acc512(a, _mm512_load_si512(hash + st * 256 + i * 64), key[u * 4 + i]);
                }
            }
            if (q > 0) a = scramble512(a);
        }
    }
    _mm512_storeu_si512(acc, a);
}

__attribute__((target(F512))) static void kernel_avx512(uint64_t *acc, uint8_t *dst,
                                                        const uint8_t *src, uint64_t n,
                                                        uint64_t k, int store)
{
    uint64_t head = (STRIPES - k % STRIPES) % STRIPES;
    if (store == ST_STREAM && n >= head + PAIR_STRIPES) {
        run512(acc, dst, src, head, k, ST_STREAM);
        uint64_t mid = (n - head) / PAIR_STRIPES * PAIR_STRIPES;
        run512_pairs(acc, dst + head * 64, src + head * 64, mid);
        uint64_t done = head + mid;
        run512(acc, dst + done * 64, src + done * 64, n - done, k + done, ST_STREAM);
    } else if (store == ST_STREAM) run512(acc, dst, src, n, k, ST_STREAM);
    else if (store == ST_STORE) run512(acc, dst, src, n, k, ST_STORE);
    else run512(acc, dst, src, n, k, ST_HASH);
}
#endif

/* ---- dispatch ----------------------------------------------------------- */

static kernel_fn *const kernels[3] = {
    kernel_c,
#if FSUM_X86
    kernel_avx2,
    kernel_avx512,
#endif
};

int ecxi_fsum_best_isa(void)
{
#if FSUM_X86
    if (__builtin_cpu_supports("avx512f")) return ECXI_FSUM_AVX512;
    if (__builtin_cpu_supports("avx2")) return ECXI_FSUM_AVX2;
#endif
    return ECXI_FSUM_C;
}

static atomic_int g_isa = -1; /* -1: not chosen yet */

int ecxi_fsum_set_isa(int isa)
{
    if (isa < ECXI_FSUM_C || isa > ecxi_fsum_best_isa()) return -1;
    atomic_store(&g_isa, isa);
    return 0;
}

static int isa_now(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) atomic_store(&g_isa, isa = ecxi_fsum_best_isa());
    return isa;
}

/* Whether a streaming copy on `isa` prefetches (PREFETCH_AHEAD): the AVX2
 * kernel on an AMD CPU. */
static bool stream_prefetch(int isa)
{
#if FSUM_X86
    static atomic_int amd = -1;
    int a = atomic_load_explicit(&amd, memory_order_relaxed);
    if (a < 0) atomic_store(&amd, a = __builtin_cpu_is("amd"));
    return a && isa == ECXI_FSUM_AVX2;
#else
    (void)isa;
    return false;
#endif
}

/* ---- the stream --------------------------------------------------------- */

void ecxi_fsum_init(ecxi_fsum *f, uint64_t total)
{
    static const uint64_t init[8] = {XXH_PRIME32_3, XXH_PRIME64_1, XXH_PRIME64_2, XXH_PRIME64_3,
                                     XXH_PRIME64_4, XXH_PRIME32_2, XXH_PRIME64_5, XXH_PRIME32_1};
    memcpy(f->acc, init, sizeof init);
    f->total = total;
    f->done = f->k = 0;
    f->K = total > XXH3_MIDSIZE_MAX ? (total - 1) / 64 : 0;
    f->buffered = 0;
    f->nt = total >= ECXI_FSUM_NT_MIN;
}

/* The next len bytes: from src, stored to dst unless dst is NULL. */
static void feed(ecxi_fsum *f, uint8_t *dst, const uint8_t *src, uint64_t len)
{
    if (f->total <= XXH3_MIDSIZE_MAX) { /* short: gathered, hashed at the end */
        if (dst) memcpy(dst, src, len);
        memcpy(f->buf + f->done, dst ? dst : src, len);
        f->done += len;
        return;
    }
    const uint64_t last_from = f->total - 64;
    const uint64_t done0 = f->done;
    const uint8_t *const data0 = dst ? dst : src; /* the bytes as they now are */
    bool streamed = false;
    uint64_t left = len;
    while (left) {
        if (f->k == f->K) { /* past the last full stripe: the rest only passes */
            if (dst) memcpy(dst, src, left);
            break;
        }
        if (f->buffered || left < 64) { /* a stripe split between calls */
            size_t m = 64 - f->buffered < left ? 64 - f->buffered : (size_t)left;
            if (dst) memcpy(dst, src, m);
            memcpy(f->buf + f->buffered, dst ? dst : src, m);
            f->buffered += m, src += m, left -= m;
            if (dst) dst += m;
            if (f->buffered == 64) {
                kernel_c(f->acc, NULL, f->buf, 1, f->k, ST_HASH);
                f->buffered = 0;
                f->k++;
            }
            continue;
        }
        uint64_t s = left / 64;
        if (s > f->K - f->k) s = f->K - f->k;
        int store = ST_HASH, isa = isa_now();
        if (dst) {
            store = ST_STORE;
#if FSUM_X86
            if (f->nt && ((uintptr_t)dst & 63) == 0)
                store = stream_prefetch(isa) ? ST_STREAM_PF : ST_STREAM, streamed = true;
#endif
        }
        /* (hashing only: no store, and dst is never NULL inside a kernel) */
        kernels[isa](f->acc, dst ? dst : (uint8_t *)src, src, s, f->k, store);
        f->k += s, src += s * 64, left -= s * 64;
        if (dst) dst += s * 64;
    }
#if FSUM_X86
    if (streamed) _mm_sfence(); /* the streamed bytes are visible before anyone reads them */
#endif
    /* Keep the stream's last 64 bytes as they now are. */
    if (done0 + len > last_from) {
        uint64_t from = done0 > last_from ? done0 : last_from;
        memcpy(f->last + (from - last_from), data0 + (from - done0), done0 + len - from);
    }
    f->done = done0 + len;
}

void ecxi_fsum_copy(ecxi_fsum *f, void *dst, const void *src, uint64_t len)
{
    feed(f, dst, src, len);
}

void ecxi_fsum_update(ecxi_fsum *f, const void *p, uint64_t len)
{
    feed(f, NULL, p, len);
}

uint64_t ecxi_fsum_digest(const ecxi_fsum *f)
{
    if (f->total <= XXH3_MIDSIZE_MAX) return XXH3_64bits(f->buf, (size_t)f->total);
    uint64_t acc[8];
    memcpy(acc, f->acc, sizeof acc);
    XXH3_accumulate_512_scalar(acc, f->last,
                               XXH3_kSecret + XXH_SECRET_DEFAULT_SIZE - 64 -
                                   XXH_SECRET_LASTACC_START);
    return XXH3_mergeAccs(acc, XXH3_kSecret + XXH_SECRET_MERGEACCS_START,
                          f->total * XXH_PRIME64_1);
}
