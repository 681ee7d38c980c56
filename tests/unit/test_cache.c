/* SPDX-License-Identifier: Apache-2.0 */
/* test_cache — the block cache: hand-worked cases for the allocation
 * policy, FIFO eviction and every misuse; a randomized run of 1,000,000
 * operations against a deliberately naive reference model written here
 * (same return codes, same blocks, same evictions in the same order, and
 * free + owned == total after every step); threads hammering one cache. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache.h"

/* ---- helpers --------------------------------------------------------- */

#define K(s) (s), strlen(s)

struct evlog {
    int n;
    char keys[64][64];
};

static void log_evict(void *arg, const char *key, size_t len, uint64_t n_blocks)
{
    struct evlog *l = arg;
    (void)n_blocks;
    if (l->n < 64) snprintf(l->keys[l->n++], 64, "%.*s", (int)len, key);
}

static ecxi_cache *mk(uint64_t n, struct evlog *log)
{
    ecxi_cache_opts o = {.num_blocks = n, .on_evict = log ? log_evict : NULL, .evict_arg = log};
    ecxi_cache *c = NULL;
    assert_int_equal(ecxi_cache_new(&o, &c), 0);
    assert_non_null(c);
    return c;
}

/* The entry's blocks as a string "0,1,2" for easy comparison. */
static const char *blocks_str(ecxi_cache *c, const char *key)
{
    static char buf[1024];
    int64_t idx[128];
    size_t n = 0;
    assert_int_equal(ecxi_cache_blocks(c, K(key), idx, 128, &n), 0);
    size_t off = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++)
        off +=
            (size_t)snprintf(buf + off, sizeof buf - off, i ? ",%lld" : "%lld", (long long)idx[i]);
    return buf;
}

static void ready(ecxi_cache *c, const char *key, uint64_t n)
{
    assert_int_equal(ecxi_cache_reserve(c, K(key), n), 0);
    assert_int_equal(ecxi_cache_mark_ready(c, K(key)), 0);
}

/* ---- hand-worked cases ----------------------------------------------- */

static void test_new_invalid(void **state)
{
    (void)state;
    ecxi_cache *c = (ecxi_cache *)1;
    ecxi_cache_opts o = {.num_blocks = 0};
    assert_int_equal(ecxi_cache_new(&o, &c), ECX_EINVAL);
    assert_null(c);
    o.num_blocks = (uint64_t)ECXI_CACHE_MAX_BLOCKS + 1;
    assert_int_equal(ecxi_cache_new(&o, &c), ECX_EINVAL);
    assert_int_equal(ecxi_cache_new(NULL, &c), ECX_EINVAL);
    assert_int_equal(ecxi_cache_new(&o, NULL), ECX_EINVAL);
    ecxi_cache_free(NULL);
}

static void test_lifecycle(void **state)
{
    (void)state;
    ecxi_cache *c = mk(10, NULL);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(c, K("a"), &info), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_pin_if_ready(c, K("a")), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_reserve(c, K("a"), 3), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("a"), &info), 0);
    assert_int_equal(info.state, ECXI_CACHE_NOT_READY);
    assert_int_equal(info.n_blocks, 3);
    assert_int_equal(info.size_bytes, 0);
    assert_int_equal(ecxi_cache_set_size(c, K("a"), 12345), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("a"), &info), 0);
    assert_int_equal(info.size_bytes, 12345);
    ecxi_cache_run one[2];
    size_t nr = 0;
    assert_int_equal(ecxi_cache_runs(c, K("a"), one, 2, &nr), 0);
    assert_int_equal(nr, 1);
    assert_int_equal(ecxi_cache_pin_if_ready(c, K("a")), ECX_ECACHE_NOT_READY);
    assert_int_equal(ecxi_cache_mark_ready(c, K("a")), 0);
    assert_int_equal(ecxi_cache_set_size(c, K("a"), 1), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_set_size(c, K("b"), 1), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_pin_if_ready(c, K("a")), 0);
    assert_int_equal(ecxi_cache_pin_if_ready(c, K("a")), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("a"), &info), 0);
    assert_int_equal(info.state, ECXI_CACHE_READY);
    assert_int_equal(info.pins, 2);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.free_blocks, 7);
    assert_int_equal(st.owned_blocks, 3);
    assert_int_equal(st.evictable_blocks, 0);
    assert_int_equal(st.pinned, 1);
    assert_int_equal(ecxi_cache_unpin(c, K("a")), 0);
    assert_int_equal(ecxi_cache_unpin(c, K("a")), 0);
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.evictable_blocks, 3);
    assert_int_equal(st.pinned, 0);
    assert_string_equal(blocks_str(c, "a"), "0,1,2");
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* Best fit with lowest start among equals; when nothing fits, the largest
 * runs whole, then best fit for the rest; blocks come out ascending. */
static void test_allocation_policy(void **state)
{
    (void)state;
    ecxi_cache *c = mk(16, NULL);
    assert_int_equal(ecxi_cache_reserve(c, K("a"), 4), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("b"), 4), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("c"), 4), 0);
    assert_string_equal(blocks_str(c, "b"), "4,5,6,7");
    assert_int_equal(ecxi_cache_discard(c, K("b")), 0);
    /* free: [4..7] and [12..15], equal length: lowest start wins. */
    assert_int_equal(ecxi_cache_reserve(c, K("d"), 3), 0);
    assert_string_equal(blocks_str(c, "d"), "4,5,6");
    /* free: [7] and [12..15]; 5 fits nowhere: take 12..15, then 7. */
    assert_int_equal(ecxi_cache_reserve(c, K("e"), 5), 0);
    assert_string_equal(blocks_str(c, "e"), "7,12,13,14,15");
    ecxi_cache_run runs[4];
    size_t nr = 0;
    assert_int_equal(ecxi_cache_runs(c, K("e"), runs, 4, &nr), 0);
    assert_int_equal(nr, 2);
    assert_int_equal(runs[0].start, 7);
    assert_int_equal(runs[0].len, 1);
    assert_int_equal(runs[1].start, 12);
    assert_int_equal(runs[1].len, 4);
    assert_int_equal(ecxi_cache_runs(c, K("e"), runs, 1, &nr), ECX_ERANGE);
    assert_int_equal(nr, 2);
    int64_t idx[4];
    size_t nb = 0;
    assert_int_equal(ecxi_cache_blocks(c, K("e"), idx, 4, &nb), ECX_ERANGE);
    assert_int_equal(nb, 5);
    /* Best fit prefers the smaller run even at a higher address. */
    assert_int_equal(ecxi_cache_discard(c, K("a")), 0); /* free [0..3] */
    assert_int_equal(ecxi_cache_discard(c, K("d")), 0); /* free [0..6] merged */
    assert_int_equal(ecxi_cache_discard(c, K("c")), 0); /* frees 8..11 -> [0..6], [8..11] */
    assert_int_equal(ecxi_cache_reserve(c, K("f"), 4), 0);
    assert_string_equal(blocks_str(c, "f"), "8,9,10,11");
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.free_runs, 1);
    assert_int_equal(st.free_blocks, 7);
    ecxi_cache_free(c);
}

static void test_fifo_eviction(void **state)
{
    (void)state;
    struct evlog log = {0};
    ecxi_cache *c = mk(4, &log);
    ready(c, "a", 1);
    ready(c, "b", 1);
    ready(c, "c", 1);
    ready(c, "d", 1);
    /* a pinned then unpinned goes back to the tail: b, c, d, a. */
    assert_int_equal(ecxi_cache_pin(c, K("a")), 0);
    assert_int_equal(ecxi_cache_unpin(c, K("a")), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("e"), 2), 0);
    assert_int_equal(log.n, 2);
    assert_string_equal(log.keys[0], "b");
    assert_string_equal(log.keys[1], "c");
    assert_int_equal(ecxi_cache_lookup(c, K("b"), NULL), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_lookup(c, K("a"), NULL), 0);
    assert_string_equal(blocks_str(c, "e"), "1,2");
    /* A not-ready entry (e) and a pinned one (d) are never evicted. */
    assert_int_equal(ecxi_cache_pin(c, K("d")), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("f"), 2), ECX_ECACHE_FULL);
    assert_int_equal(log.n, 2); /* no side effect */
    assert_int_equal(ecxi_cache_lookup(c, K("a"), NULL), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("f"), 1), 0);
    assert_int_equal(log.n, 3);
    assert_string_equal(log.keys[2], "a");
    /* Eviction happens only when needed. */
    assert_int_equal(ecxi_cache_discard(c, K("f")), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("g"), 1), 0);
    assert_int_equal(log.n, 3);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* Every slot used by a one-block entry: the reserve must evict to get a
 * slot as well as a block. */
static void test_full_of_single_blocks(void **state)
{
    (void)state;
    struct evlog log = {0};
    ecxi_cache *c = mk(8, &log);
    char key[8];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "k%d", i);
        ready(c, key, 1);
    }
    assert_int_equal(ecxi_cache_reserve(c, K("new"), 1), 0);
    assert_int_equal(log.n, 1);
    assert_string_equal(log.keys[0], "k0");
    assert_string_equal(blocks_str(c, "new"), "0");
    assert_int_equal(ecxi_cache_reserve(c, K("big"), 8), ECX_ECACHE_FULL); /* new is not ready */
    assert_int_equal(ecxi_cache_reserve(c, K("big"), 7), 0);
    assert_int_equal(log.n, 8);
    assert_string_equal(blocks_str(c, "big"), "1,2,3,4,5,6,7");
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

static void test_misuse(void **state)
{
    (void)state;
    ecxi_cache *c = mk(8, NULL);
    assert_int_equal(ecxi_cache_reserve(c, K("a"), 2), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("a"), 2), ECX_ECACHE_EXISTS);
    assert_int_equal(ecxi_cache_reserve(c, K("b"), 0), ECX_EINVAL);
    assert_int_equal(ecxi_cache_reserve(c, K("b"), 9), ECX_ECACHE_FULL);
    assert_int_equal(ecxi_cache_reserve(c, K("b"), UINT64_MAX), ECX_ECACHE_FULL);
    assert_int_equal(ecxi_cache_reserve(c, NULL, 3, 1), ECX_EINVAL);
    assert_int_equal(ecxi_cache_reserve(c, "x", 0, 1), ECX_EINVAL);
    static char huge[ECX_MM_HASH_MAX + 1];
    memset(huge, 'h', sizeof huge);
    assert_int_equal(ecxi_cache_reserve(c, huge, sizeof huge, 1), ECX_EINVAL);
    assert_int_equal(ecxi_cache_reserve(c, huge, ECX_MM_HASH_MAX, 1), 0);
    assert_int_equal(ecxi_cache_discard(c, huge, ECX_MM_HASH_MAX), 0);
    assert_int_equal(ecxi_cache_reserve(NULL, K("z"), 1), ECX_EINVAL);

    assert_int_equal(ecxi_cache_unpin(c, K("a")), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_unpin(c, K("nope")), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_mark_ready(c, K("nope")), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_discard(c, K("nope")), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_pin(c, K("nope")), ECX_ECACHE_MISSING);
    /* A pinned not-ready entry cannot be discarded. */
    assert_int_equal(ecxi_cache_pin(c, K("a")), 0);
    assert_int_equal(ecxi_cache_discard(c, K("a")), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_mark_ready(c, K("a")), 0);
    assert_int_equal(ecxi_cache_mark_ready(c, K("a")), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_discard(c, K("a")), ECX_ECACHE_STATE);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.evictable_blocks, 0); /* still pinned */
    assert_int_equal(ecxi_cache_unpin(c, K("a")), 0);
    assert_int_equal(ecxi_cache_unpin(c, K("a")), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_discard(c, K("a")), ECX_ECACHE_STATE);
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.evictable_blocks, 2);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.free_blocks, 6);
    assert_int_equal(ecxi_cache_blocks(c, K("a"), NULL, 1, NULL), ECX_EINVAL);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* Keys are bytes: NULs, long keys in every size class, prefixes. */
static void test_keys(void **state)
{
    (void)state;
    ecxi_cache *c = mk(64, NULL);
    assert_int_equal(ecxi_cache_reserve(c, "a\0b", 3, 1), 0);
    assert_int_equal(ecxi_cache_reserve(c, "a\0c", 3, 1), 0);
    assert_int_equal(ecxi_cache_reserve(c, "a", 1, 1), 0);
    assert_int_equal(ecxi_cache_lookup(c, "a\0b", 3, NULL), 0);
    assert_int_equal(ecxi_cache_lookup(c, "a\0", 2, NULL), ECX_ECACHE_MISSING);
    char key[ECX_MM_HASH_MAX];
    size_t lens[] = {63, 64, 65, 128, 129, 200, 254, ECX_MM_HASH_MAX};
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
            memset(key, 'a' + (int)i, lens[i]);
            assert_int_equal(ecxi_cache_reserve(c, key, lens[i], 2), 0);
        }
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
            memset(key, 'a' + (int)i, lens[i]);
            assert_int_equal(ecxi_cache_lookup(c, key, lens[i], NULL), 0);
            assert_int_equal(ecxi_cache_lookup(c, key, lens[i] - 1, NULL), ECX_ECACHE_MISSING);
        }
        assert_int_equal(ecxi_cache_check(c), 0);
        for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
            memset(key, 'a' + (int)i, lens[i]);
            assert_int_equal(ecxi_cache_discard(c, key, lens[i]), 0);
        }
    }
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* Many entries: the table and the entry pool grow, and stay consistent. */
static void test_growth(void **state)
{
    (void)state;
    enum { N = 50000 };
    ecxi_cache *c = mk(N, NULL);
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(ecxi_cache_reserve(c, K(key), 1), 0);
    }
    assert_int_equal(ecxi_cache_check(c), 0);
    for (int i = 0; i < N; i += 2) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(ecxi_cache_discard(c, K(key)), 0);
    }
    for (int i = 1; i < N; i += 2) {
        snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(ecxi_cache_lookup(c, K(key), NULL), 0);
    }
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.free_runs, N / 2);
    assert_int_equal(ecxi_cache_check(c), 0);
    /* 25,000 one-block holes: a 3-block reserve takes the 3 lowest. */
    assert_int_equal(ecxi_cache_reserve(c, K("spread"), 3), 0);
    assert_string_equal(blocks_str(c, "spread"), "0,2,4");
    ecxi_cache_free(c);
}

/* ---- randomized comparison with a reference model --------------------- */

#define RN 160    /* blocks */
#define RKEYS 400 /* key universe */

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct ref_entry {
    bool live, ready;
    uint32_t pins;
    uint64_t seq; /* when it last became evictable */
    int n;
    int blocks[RN];
};

static struct {
    struct ref_entry e[RKEYS];
    int owner[RN]; /* key index or -1 */
    int free_blocks;
    uint64_t seq;
    int evicted[RN];
    int n_evicted;
} ref;

static char *rkeys[RKEYS];
static size_t rklen[RKEYS];

static bool ref_evictable(int k)
{
    return ref.e[k].live && ref.e[k].ready && ref.e[k].pins == 0;
}

static void ref_release(int k)
{
    for (int i = 0; i < ref.e[k].n; i++)
        ref.owner[ref.e[k].blocks[i]] = -1;
    ref.free_blocks += ref.e[k].n;
    ref.e[k].live = false;
}

/* The policy in cache.h, on a flat owner array, as plainly as possible. */
static void ref_alloc(int k, int n)
{
    int start[RN], len[RN], nr = 0;
    for (int b = 0; b < RN;) {
        if (ref.owner[b] != -1) {
            b++;
            continue;
        }
        int s = b;
        while (b < RN && ref.owner[b] == -1)
            b++;
        start[nr] = s, len[nr] = b - s, nr++;
    }
    int rem = n;
    while (rem > 0) {
        int best = -1;
        for (int i = 0; i < nr; i++)
            if (len[i] >= rem && (best < 0 || len[i] < len[best]))
                best = i; /* ties: lowest start */
        if (best >= 0) {
            for (int j = 0; j < rem; j++)
                ref.owner[start[best] + j] = k;
            rem = 0;
        } else {
            int big = -1;
            for (int i = 0; i < nr; i++)
                if (len[i] > 0 && (big < 0 || len[i] > len[big])) big = i;
            for (int j = 0; j < len[big]; j++)
                ref.owner[start[big] + j] = k;
            rem -= len[big];
            len[big] = 0;
        }
    }
    ref.e[k].n = 0;
    for (int b = 0; b < RN; b++)
        if (ref.owner[b] == k) ref.e[k].blocks[ref.e[k].n++] = b;
    ref.free_blocks -= n;
}

static int ref_reserve(int k, uint64_t n)
{
    if (n == 0) return ECX_EINVAL;
    if (ref.e[k].live) return ECX_ECACHE_EXISTS;
    uint64_t evictable = 0;
    for (int i = 0; i < RKEYS; i++)
        if (ref_evictable(i)) evictable += (uint64_t)ref.e[i].n;
    if (n > (uint64_t)ref.free_blocks + evictable) return ECX_ECACHE_FULL;
    while ((uint64_t)ref.free_blocks < n) {
        int oldest = -1;
        for (int i = 0; i < RKEYS; i++)
            if (ref_evictable(i) && (oldest < 0 || ref.e[i].seq < ref.e[oldest].seq)) oldest = i;
        ref.evicted[ref.n_evicted++] = oldest;
        ref_release(oldest);
    }
    ref.e[k] = (struct ref_entry){.live = true};
    ref_alloc(k, (int)n);
    return 0;
}

static int ref_mark_ready(int k)
{
    struct ref_entry *e = &ref.e[k];
    if (!e->live) return ECX_ECACHE_MISSING;
    if (e->ready) return ECX_ECACHE_STATE;
    e->ready = true;
    if (e->pins == 0) e->seq = ++ref.seq;
    return 0;
}

static int ref_pin(int k, bool only_ready)
{
    struct ref_entry *e = &ref.e[k];
    if (!e->live) return ECX_ECACHE_MISSING;
    if (only_ready && !e->ready) return ECX_ECACHE_NOT_READY;
    e->pins++;
    return 0;
}

static int ref_unpin(int k)
{
    struct ref_entry *e = &ref.e[k];
    if (!e->live) return ECX_ECACHE_MISSING;
    if (e->pins == 0) return ECX_ECACHE_STATE;
    if (--e->pins == 0 && e->ready) e->seq = ++ref.seq;
    return 0;
}

static int ref_discard(int k)
{
    struct ref_entry *e = &ref.e[k];
    if (!e->live) return ECX_ECACHE_MISSING;
    if (e->ready || e->pins) return ECX_ECACHE_STATE;
    ref_release(k);
    return 0;
}

struct seen {
    int keys[RN];
    int n;
};

static void seen_evict(void *arg, const char *key, size_t len, uint64_t n_blocks)
{
    struct seen *s = arg;
    int k = -1;
    for (int i = 0; i < RKEYS; i++)
        if (rklen[i] == len && memcmp(rkeys[i], key, len) == 0) k = i;
    assert_true(k >= 0);
    assert_int_equal(n_blocks, ref.e[k].n); /* ref has not evicted yet: still live */
    if (s->n < RN) s->keys[s->n++] = k;
}

static void compare_entry(ecxi_cache *c, int k)
{
    ecxi_cache_info info;
    int rc = ecxi_cache_lookup(c, rkeys[k], rklen[k], &info);
    if (!ref.e[k].live) {
        assert_int_equal(rc, ECX_ECACHE_MISSING);
        return;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(info.state, ref.e[k].ready ? ECXI_CACHE_READY : ECXI_CACHE_NOT_READY);
    assert_int_equal(info.pins, ref.e[k].pins);
    assert_int_equal(info.n_blocks, ref.e[k].n);
    int64_t idx[RN];
    size_t n = 0;
    assert_int_equal(ecxi_cache_blocks(c, rkeys[k], rklen[k], idx, RN, &n), 0);
    assert_int_equal(n, ref.e[k].n);
    int runs = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(idx[i], ref.e[k].blocks[i]);
        if (i == 0 || idx[i] != idx[i - 1] + 1) runs++;
    }
    ecxi_cache_run rr[RN];
    size_t nr = 0;
    assert_int_equal(ecxi_cache_runs(c, rkeys[k], rklen[k], rr, RN, &nr), 0);
    assert_int_equal(nr, runs);
    for (size_t i = 0, b = 0; i < nr; b += rr[i].len, i++)
        assert_int_equal(rr[i].start, idx[b]);
}

static void test_random_vs_reference(void **state)
{
    (void)state;
    rng_state = 0x5eed1234abcdull;
    /* Keys: mostly 64 hex characters like a real mm_hash, some short, some
     * long enough for every pooled size class, none over ECX_MM_HASH_MAX. */
    for (int i = 0; i < RKEYS; i++) {
        size_t len = i % 7 == 0    ? 1 + rnd() % 8
                     : i % 11 == 0 ? 65 + rnd() % (ECX_MM_HASH_MAX - 8 - 64) /* + prefix */
                                   : 64;
        rkeys[i] = malloc(len + 16);
        assert_non_null(rkeys[i]);
        int p = snprintf(rkeys[i], 16, "%x:", i);
        for (size_t j = (size_t)p; j < len + (size_t)p; j++)
            rkeys[i][j] = "0123456789abcdef"[rnd() % 16];
        rklen[i] = len + (size_t)p;
    }
    memset(&ref, 0, sizeof ref);
    for (int b = 0; b < RN; b++)
        ref.owner[b] = -1;
    ref.free_blocks = RN;

    struct seen seen = {0};
    ecxi_cache_opts o = {.num_blocks = RN, .on_evict = seen_evict, .evict_arg = &seen};
    ecxi_cache *c = NULL;
    assert_int_equal(ecxi_cache_new(&o, &c), 0);

    int live[RKEYS], n_live = 0;
    long counts[8] = {0}, ok[8] = {0}, evictions = 0;
    const long OPS = 1000000;
    for (long step = 0; step < OPS; step++) {
        /* Mostly act on live keys, so that every state is well exercised. */
        n_live = 0;
        if (rnd() % 5) {
            for (int i = 0; i < RKEYS; i++)
                if (ref.e[i].live) live[n_live++] = i;
        }
        int k = n_live ? live[rnd() % (uint64_t)n_live] : (int)(rnd() % RKEYS);
        int op = (int)(rnd() % 100);
        int got, want;
        seen.n = 0;
        ref.n_evicted = 0;
        if (op < 30) {
            op = 0;
            uint64_t r = rnd() % 100, n;
            if (r < 1)
                n = 0;
            else if (r < 2)
                n = RN + 1 + rnd() % 4;
            else if (r < 10)
                n = 1 + rnd() % RN;
            else
                n = 1 + rnd() % (RN / 8);
            if (rnd() % 2) k = (int)(rnd() % RKEYS); /* mostly new keys */
            got = ecxi_cache_reserve(c, rkeys[k], rklen[k], n);
            want = ref_reserve(k, n);
        } else if (op < 50) {
            op = 1;
            got = ecxi_cache_mark_ready(c, rkeys[k], rklen[k]);
            want = ref_mark_ready(k);
        } else if (op < 56) {
            op = 2;
            got = ecxi_cache_pin(c, rkeys[k], rklen[k]);
            want = ref_pin(k, false);
        } else if (op < 66) {
            op = 3;
            got = ecxi_cache_pin_if_ready(c, rkeys[k], rklen[k]);
            want = ref_pin(k, true);
        } else if (op < 86) {
            op = 4;
            got = ecxi_cache_unpin(c, rkeys[k], rklen[k]);
            want = ref_unpin(k);
        } else if (op < 95) {
            op = 5;
            got = ecxi_cache_discard(c, rkeys[k], rklen[k]);
            want = ref_discard(k);
        } else {
            op = 6;
            got = ecxi_cache_lookup(c, rkeys[k], rklen[k], NULL);
            want = ref.e[k].live ? 0 : ECX_ECACHE_MISSING;
        }
        if (got != want) fail_msg("step %ld op %d key %d: got %d want %d", step, op, k, got, want);
        counts[op]++;
        ok[op] += got == 0;
        /* Same evictions, same order. */
        assert_int_equal(seen.n, ref.n_evicted);
        for (int i = 0; i < seen.n; i++)
            assert_int_equal(seen.keys[i], ref.evicted[i]);
        evictions += seen.n;
        /* Same entry afterwards (blocks included), same totals. */
        compare_entry(c, k);
        ecxi_cache_stats st;
        ecxi_cache_get_stats(c, &st);
        assert_int_equal(st.free_blocks, ref.free_blocks);
        uint64_t owned = 0, entries = 0;
        for (int i = 0; i < RKEYS; i++)
            if (ref.e[i].live) owned += (uint64_t)ref.e[i].n, entries++;
        assert_int_equal(st.free_blocks + owned, RN);
        assert_int_equal(st.owned_blocks, owned);
        assert_int_equal(st.entries, entries);
        if (step % 4096 == 0) ecxi_cache_rekey(c); /* a new secret keeps every entry */
        if (step % 256 == 0) {
            assert_int_equal(ecxi_cache_check(c), 0);
            for (int i = 0; i < RKEYS; i++)
                compare_entry(c, i);
        }
    }
    assert_int_equal(ecxi_cache_check(c), 0);
    /* The run must have exercised every path, not just the error ones. */
    for (int op = 0; op < 7; op++) {
        print_message("op %d: %ld calls, %ld succeeded\n", op, counts[op], ok[op]);
        assert_true(ok[op] > counts[op] / 50);
    }
    assert_true(evictions > 10000);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.evictions, evictions);
    print_message("random: %ld ops, %ld evictions, %llu reserves ok, %llu full\n", OPS, evictions,
                  (unsigned long long)st.reserves, (unsigned long long)st.reserve_full);
    ecxi_cache_free(c);
    for (int i = 0; i < RKEYS; i++)
        free(rkeys[i]);
}

/* The producer's one-lookup grant: pin + info + blocks, unpin by ref. */
/* An entry the consumer fetches is not ready to everyone, and absent to the
 * producer's grant: a `both` context never waits on its own fetch. */
static void test_reserve_fetch(void **state)
{
    (void)state;
    ecxi_cache *c = mk(16, NULL);
    ecxi_cache_info info;
    int64_t idx[8];
    size_t n = 0;
    uint32_t ref;
    assert_int_equal(ecxi_cache_reserve_fetch(c, K("f"), 2), 0);
    assert_int_equal(ecxi_cache_reserve_fetch(c, K("f"), 2), ECX_ECACHE_EXISTS);
    assert_int_equal(ecxi_cache_reserve(c, K("f"), 2), ECX_ECACHE_EXISTS);
    assert_int_equal(ecxi_cache_lookup(c, K("f"), &info), 0);
    assert_int_equal(info.state, ECXI_CACHE_NOT_READY);
    assert_int_equal(ecxi_cache_pin_if_ready(c, K("f")), ECX_ECACHE_NOT_READY);
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("f"), &info, idx, 8, &n, &ref),
                     ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_set_size(c, K("f"), 100), 0);
    assert_int_equal(ecxi_cache_set_checksum(c, K("f"), 5), 0);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.not_ready, 1);
    assert_int_equal(st.not_ready_blocks, 2);
    /* Ready: a cached item like any other, granted to peers. */
    assert_int_equal(ecxi_cache_mark_ready(c, K("f")), 0);
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("f"), &info, idx, 8, &n, &ref), 0);
    assert_int_equal(info.checksum, 5);
    assert_int_equal(ecxi_cache_unpin_ref(c, ref), 0);
    /* A failed fetch is discarded as a failed save is. */
    assert_int_equal(ecxi_cache_reserve_fetch(c, K("g"), 3), 0);
    assert_int_equal(ecxi_cache_discard(c, K("g")), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("g"), &info), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* on_alloc sees each run a reserve takes, in order, before the reserve
 * returns; when it refuses, the reserve fails with its code and leaves no
 * entry and no block taken. */
struct allocs {
    int n, fail_at; /* fail the fail_at-th call (1-based); 0: never */
    uint64_t start[8], len[8];
};

static int on_alloc(void *arg, uint64_t start, uint64_t n_blocks)
{
    struct allocs *a = arg;
    if (a->n < 8) a->start[a->n] = start, a->len[a->n] = n_blocks;
    return ++a->n == a->fail_at ? ECX_EREGION_NOSPC : 0;
}

static void test_on_alloc(void **state)
{
    (void)state;
    struct allocs a = {0};
    ecxi_cache_opts o = {.num_blocks = 10, .on_alloc = on_alloc, .alloc_arg = &a};
    ecxi_cache *c = NULL;
    assert_int_equal(ecxi_cache_new(&o, &c), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("a"), 3), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("b"), 2), 0);
    assert_int_equal(ecxi_cache_discard(c, K("a")), 0); /* free: 0-2 and 5-9 */
    assert_int_equal(a.n, 2);
    assert_int_equal(a.start[0], 0);
    assert_int_equal(a.len[0], 3);
    assert_int_equal(a.start[1], 3);
    assert_int_equal(a.len[1], 2);
    /* 7 blocks: the whole 5-9 run, then 0-1; the second run is refused. */
    a = (struct allocs){.fail_at = 2};
    assert_int_equal(ecxi_cache_reserve_fetch(c, K("c"), 7), ECX_EREGION_NOSPC);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.start[0], 0);
    assert_int_equal(a.len[0], 2);
    assert_int_equal(a.start[1], 5);
    assert_int_equal(a.len[1], 5);
    assert_int_equal(ecxi_cache_lookup(c, K("c"), NULL), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.free_blocks, 8);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.not_ready_blocks, 2);
    assert_int_equal(st.reserves, 2); /* the refused one does not count */
    a = (struct allocs){0};
    assert_int_equal(ecxi_cache_reserve(c, K("c"), 7), 0); /* room again */
    assert_int_equal(a.n, 2);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* An entry's shape: recorded in any state, 0, 0 on every new reserve (a
 * reused id included), kept when the pool grows, given by lookup and grant. */
static void test_shape(void **state)
{
    (void)state;
    ecxi_cache *c = mk(256, NULL);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_set_shape(c, K("s"), 880, 16384), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_reserve(c, K("s"), 2), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("s"), &info), 0);
    assert_true(info.shape_rows == 0 && info.shape_width == 0);
    assert_int_equal(ecxi_cache_set_shape(c, K("s"), 0, 16384), ECX_EINVAL);
    assert_int_equal(ecxi_cache_set_shape(c, K("s"), 880, 0), ECX_EINVAL);
    assert_int_equal(ecxi_cache_set_shape(c, K("s"), 880, 16384), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("s"), &info), 0);
    assert_true(info.shape_rows == 880 && info.shape_width == 16384);
    /* Ready: still settable (the announcement only), and granted with it. */
    assert_int_equal(ecxi_cache_mark_ready(c, K("s")), 0);
    assert_int_equal(ecxi_cache_set_shape(c, K("s"), 440, 32768), 0);
    int64_t idx[4];
    size_t n = 0;
    uint32_t ref;
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("s"), &info, idx, 4, &n, &ref), 0);
    assert_true(info.shape_rows == 440 && info.shape_width == 32768);
    assert_int_equal(ecxi_cache_unpin_ref(c, ref), 0);
    /* A discarded entry's id comes back without its shape. */
    assert_int_equal(ecxi_cache_reserve(c, K("d"), 1), 0);
    assert_int_equal(ecxi_cache_set_shape(c, K("d"), 7, 9), 0);
    assert_int_equal(ecxi_cache_discard(c, K("d")), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("e"), 1), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("e"), &info), 0);
    assert_true(info.shape_rows == 0 && info.shape_width == 0);
    /* The pool grows past its first 64 ids: every shape moves with it. */
    char key[16];
    for (int i = 0; i < 150; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(ecxi_cache_reserve(c, K(key), 1), 0);
        assert_int_equal(ecxi_cache_set_shape(c, K(key), (uint64_t)i + 1, (uint64_t)i + 2), 0);
    }
    for (int i = 0; i < 150; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(ecxi_cache_lookup(c, K(key), &info), 0);
        assert_true(info.shape_rows == (uint64_t)i + 1 && info.shape_width == (uint64_t)i + 2);
    }
    assert_int_equal(ecxi_cache_lookup(c, K("s"), &info), 0);
    assert_true(info.shape_rows == 440 && info.shape_width == 32768);
    /* Evicted, then saved again under the same key: no shape. */
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(ecxi_cache_reserve(c, K("big"), st.free_blocks + 1), 0); /* evicts "s" */
    assert_int_equal(ecxi_cache_lookup(c, K("s"), &info), ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_discard(c, K("big")), 0);
    assert_int_equal(ecxi_cache_reserve(c, K("s"), 2), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("s"), &info), 0);
    assert_true(info.shape_rows == 0 && info.shape_width == 0);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

static void test_pin_ready_blocks(void **state)
{
    (void)state;
    ecxi_cache *c = mk(64, NULL);
    ecxi_cache_info info;
    int64_t idx[8];
    size_t n = 0;
    uint32_t ref = 99;
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("none"), &info, idx, 8, &n, &ref),
                     ECX_ECACHE_MISSING);
    assert_int_equal(ecxi_cache_reserve(c, K("aa"), 3), 0);
    assert_int_equal(ecxi_cache_set_size(c, K("aa"), 12345), 0);
    assert_int_equal(ecxi_cache_set_checksum(c, K("aa"), 777), 0);
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("aa"), &info, idx, 8, &n, &ref),
                     ECX_ECACHE_NOT_READY);
    assert_int_equal(ecxi_cache_mark_ready(c, K("aa")), 0);
    /* Too small a buffer: the count, and nothing pinned. */
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("aa"), &info, idx, 2, &n, &ref), ECX_ERANGE);
    assert_int_equal(n, 3);
    assert_int_equal(ecxi_cache_lookup(c, K("aa"), &info), 0);
    assert_int_equal(info.pins, 0);
    assert_int_equal(ecxi_cache_pin_ready_blocks(c, K("aa"), &info, idx, 8, &n, &ref), 0);
    assert_int_equal(n, 3);
    assert_int_equal(info.state, ECXI_CACHE_READY);
    assert_int_equal(info.pins, 1);
    assert_int_equal(info.n_blocks, 3);
    assert_int_equal(info.size_bytes, 12345);
    assert_int_equal(info.checksum, 777);
    int64_t want[8];
    size_t wn = 0;
    assert_int_equal(ecxi_cache_blocks(c, K("aa"), want, 8, &wn), 0);
    assert_int_equal(wn, 3);
    assert_memory_equal(idx, want, 3 * sizeof *idx);
    /* Read through the held pin's reference: the same entry, its blocks
     * and info, no pin taken; pinned_blocks as the stats say. */
    int64_t idx2[8];
    assert_int_equal(ecxi_cache_held_ready_blocks(c, ref, &info, idx2, 2, &n), ECX_ERANGE);
    assert_int_equal(n, 3);
    assert_int_equal(ecxi_cache_held_ready_blocks(c, ref, &info, idx2, 8, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(info.pins, 1);
    assert_int_equal(info.size_bytes, 12345);
    assert_int_equal(info.checksum, 777);
    assert_memory_equal(idx2, want, 3 * sizeof *idx2);
    ecxi_cache_stats pst;
    ecxi_cache_get_stats(c, &pst);
    assert_int_equal(info.pinned_blocks,
                     pst.owned_blocks - pst.evictable_blocks - pst.not_ready_blocks);
    assert_int_equal(info.pinned_blocks, 3);
    assert_int_equal(ecxi_cache_check(c), 0);
    /* Pinned: not evicted by a reserve that needs every other block. */
    assert_int_equal(ecxi_cache_reserve(c, K("bb"), 62), ECX_ECACHE_FULL);
    assert_int_equal(ecxi_cache_reserve(c, K("bb"), 61), 0);
    assert_int_equal(ecxi_cache_unpin_ref(c, ref), 0);
    assert_int_equal(ecxi_cache_lookup(c, K("aa"), &info), 0);
    assert_int_equal(info.pins, 0);
    /* No pin left, or no such entry: refused, nothing changes. */
    assert_int_equal(ecxi_cache_unpin_ref(c, ref), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_unpin_ref(c, 1000000), ECX_ECACHE_STATE);
    /* By reference only while a pin holds the entry. */
    assert_int_equal(ecxi_cache_held_ready_blocks(c, ref, &info, idx, 8, &n), ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_held_ready_blocks(c, 1000000, &info, idx, 8, &n),
                     ECX_ECACHE_STATE);
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_free(c);
}

/* ---- threads --------------------------------------------------------- */

struct worker {
    ecxi_cache *c;
    int id;
    long ops, failures;
};

/* Each thread runs the save / serve / unpin / fail cycle on its own keys,
 * and pins keys of the others (which may be evicted under it). */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint64_t s = 0x1234u + (uint64_t)w->id;
    char key[64], other[64];
    for (long i = 0; i < w->ops; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int r = (int)(s >> 33);
        snprintf(key, sizeof key, "t%d-%ld", w->id, i);
        int rc = ecxi_cache_reserve(w->c, K(key), 1 + (uint64_t)(r % 5));
        if (rc == ECX_ECACHE_FULL) continue;
        if (rc) w->failures++;
        if (r % 7 == 0) {
            if (ecxi_cache_discard(w->c, K(key))) w->failures++;
            continue;
        }
        if (ecxi_cache_mark_ready(w->c, K(key))) w->failures++;
        snprintf(other, sizeof other, "t%d-%ld", (w->id + 1) % 4, i > 3 ? i - 3 : 0);
        if (ecxi_cache_pin_if_ready(w->c, K(other)) == 0 && ecxi_cache_unpin(w->c, K(other)))
            w->failures++;
        if (ecxi_cache_pin(w->c, K(key)) == 0 && ecxi_cache_unpin(w->c, K(key))) w->failures++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    ecxi_cache *c = mk(512, NULL);
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){.c = c, .id = i, .ops = 40000};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_int_equal(ecxi_cache_check(c), 0);
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    assert_int_equal(st.free_blocks + st.owned_blocks, 512);
    assert_int_equal(st.pinned, 0);
    assert_true(st.evictions > 1000);
    ecxi_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_invalid),
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_reserve_fetch),
        cmocka_unit_test(test_on_alloc),
        cmocka_unit_test(test_allocation_policy),
        cmocka_unit_test(test_fifo_eviction),
        cmocka_unit_test(test_full_of_single_blocks),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_random_vs_reference),
        cmocka_unit_test(test_pin_ready_blocks),
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
