/* SPDX-License-Identifier: Apache-2.0 */
/* bench_cache — cache operations per second with a small and a large
 * number of live entries, to show the cost does not grow with the cache.
 *
 * Each cycle is what a busy producer does: reserve a new 64-hex-char key of
 * 1..4 blocks (the cache is full, so this evicts the oldest entry),
 * mark it ready, pin_if_ready + unpin a recent key (a grant), look up a
 * recent key and a missing one (announce). Every call counts as one op.
 * Each phase stops after --ops ops or --seconds seconds, whichever first.
 * The two sizes run alternately for --rounds rounds and the best round of
 * each is reported, so that a noisy neighbour on a shared machine skews
 * the figures less (the worst-case total time is about
 * 2 x rounds x seconds plus filling the caches).
 *
 *   bench_cache [--small N] [--large N] [--ops N] [--seconds S] [--rounds R]
 *
 * Last line: entries_small=... ops_small=... entries_large=... ops_large=...
 * ratio=ops_small/ops_large. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Key i: 64 lowercase hex characters, like a real mm_hash. */
static void make_key(uint64_t i, char key[64])
{
    static const char hex[] = "0123456789abcdef";
    for (int w = 0; w < 4; w++) {
        uint64_t v = mix(i * 4 + (uint64_t)w);
        for (int j = 0; j < 16; j++, v >>= 4)
            key[w * 16 + j] = hex[v & 15];
    }
}

struct result {
    double ops_per_s;
    uint64_t live, ops, evictions;
    double seconds;
};

static int run(uint64_t entries, uint64_t max_ops, double max_s, struct result *res)
{
    uint64_t blocks = entries * 5 / 2; /* sizes 1..4: 2.5 blocks on average */
    ecxi_cache_opts o = {.num_blocks = blocks, .expected_entries = entries};
    ecxi_cache *c;
    int rc = ecxi_cache_new(&o, &c);
    if (rc) return rc;
    char key[64], other[64];
    uint64_t next = 0, rng = 42;
    ecxi_cache_stats st;
    /* Fill until the cache is full and evicting. */
    do {
        make_key(next, key);
        rng = mix(rng);
        if ((rc = ecxi_cache_reserve(c, key, 64, 1 + rng % 4)) ||
            (rc = ecxi_cache_mark_ready(c, key, 64)))
            goto out;
        next++;
        ecxi_cache_get_stats(c, &st);
    } while (st.evictions == 0);

    uint64_t ops = 0, hits = 0;
    double t0 = now_s(), t = t0;
    while (ops < max_ops) {
        for (int i = 0; i < 256; i++) {
            make_key(next, key);
            rng = mix(rng);
            if ((rc = ecxi_cache_reserve(c, key, 64, 1 + rng % 4)) ||
                (rc = ecxi_cache_mark_ready(c, key, 64)))
                goto out;
            next++;
            make_key(next - 1 - (rng >> 8) % (entries / 2), other);
            if (ecxi_cache_pin_if_ready(c, other, 64) == 0) {
                hits++;
                ecxi_cache_unpin(c, other, 64);
                ops++;
            }
            make_key(next - 1 - (rng >> 32) % (entries / 2), other);
            hits += ecxi_cache_lookup(c, other, 64, NULL) == 0;
            make_key(next + 1000000, other); /* never reserved yet */
            ecxi_cache_lookup(c, other, 64, NULL);
            ops += 5;
        }
        t = now_s();
        if (t - t0 >= max_s) break;
    }
    ecxi_cache_get_stats(c, &st);
    res->ops = ops;
    res->seconds = t - t0;
    res->ops_per_s = (double)ops / (t - t0);
    res->live = st.entries;
    res->evictions = st.evictions;
    if (hits == 0) rc = ECX_ERANGE; /* the workload is not what it claims */
out:
    ecxi_cache_free(c);
    return rc;
}

int main(int argc, char **argv)
{
    uint64_t small = 1000, large = 100000, max_ops = 2000000, rounds = 3;
    double max_s = 0.5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--small"))
            small = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--large"))
            large = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--ops"))
            max_ops = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--seconds"))
            max_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_cache [--small N] [--large N] [--ops N] [--seconds S] "
                            "[--rounds R]\n");
            return 2;
        }
    }
    if (small < 4 || large < 4 || max_s <= 0 || rounds < 1 || rounds > 20) {
        fprintf(stderr, "bench_cache: sizes must be >= 4, seconds > 0, rounds 1..20\n");
        return 2;
    }
    struct result rs = {0}, rl = {0}, r;
    for (uint64_t i = 0; i < rounds; i++) {
        int rc = run(small, max_ops, max_s, &r);
        if (!rc && r.ops_per_s > rs.ops_per_s) rs = r;
        if (!rc) rc = run(large, max_ops, max_s, &r);
        if (!rc && r.ops_per_s > rl.ops_per_s) rl = r;
        if (rc) {
            fprintf(stderr, "bench_cache: %s\n", ecx_strerror(rc));
            return 1;
        }
    }
    printf("cache, %llu live entries:   %.0f ops/s (%llu ops in %.2f s, %llu evictions)\n",
           (unsigned long long)rs.live, rs.ops_per_s, (unsigned long long)rs.ops, rs.seconds,
           (unsigned long long)rs.evictions);
    printf("cache, %llu live entries: %.0f ops/s (%llu ops in %.2f s, %llu evictions)\n",
           (unsigned long long)rl.live, rl.ops_per_s, (unsigned long long)rl.ops, rl.seconds,
           (unsigned long long)rl.evictions);
    printf("entries_small=%llu ops_small=%.0f entries_large=%llu ops_large=%.0f ratio=%.2f\n",
           (unsigned long long)small, rs.ops_per_s, (unsigned long long)large, rl.ops_per_s,
           rs.ops_per_s / rl.ops_per_s);
    return 0;
}
