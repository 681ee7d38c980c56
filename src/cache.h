/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cache — which mm_hash owns which blocks of a region, and in what state
 * (docs/PROTOCOL.md §2, §4.1). It owns the bookkeeping only, never the bytes: the
 * region holds those, and whoever reserves an entry writes into its blocks.
 * Producer and consumer both keep one, over their own region; in ec_both
 * mode one cache is shared by both roles. Every call takes an internal
 * mutex, so that the cache is safe on its own (test_cache drives it from
 * four threads). Inside the library it is the one lock between the engine's
 * per-step calls (ecx_load, ecx_release, a fetch's answer), which never take
 * the context's lock, and the progress thread's work under that lock
 * (loop.c): each call holds it for a lookup or an update, never for bytes.
 *
 * An entry is keyed by its mm_hash (any bytes, 1..ECX_MM_HASH_MAX long)
 * and is *not ready* (reserved, being written; never evicted), *ready*, and
 * carries a pin count. A ready entry with no pins is evictable; evictable
 * entries leave oldest-first, in the order they became evictable (an unpin
 * to zero puts the entry back at the tail), and only when a reservation
 * needs room. A reservation that cannot be met even after evicting every
 * evictable entry fails with no side effect.
 *
 * Allocation: an entry's blocks come in ascending order and in as few
 * contiguous runs as the free space allows. The policy, exactly (the test's
 * reference model implements the same words): while blocks remain to be
 * found, if some free run holds all of them, take the start of the
 * smallest such run (lowest start among equals) and stop; otherwise take
 * the whole of the largest free run (lowest start among equals). The
 * pieces are then sorted by start. Taking the k largest runs is the
 * fewest runs possible, and best fit for the last piece keeps big runs for
 * big encodings.
 *
 * Cost: free runs sit in a treap keyed by (length, start) plus boundary
 * tags per block, so finding, splitting and merging a run are O(log
 * blocks); keys sit in an open-addressing table (XXH3 under a random
 * secret, since mm_hash strings come from the network, with a new secret
 * should an insert ever probe far; cache.c key_hash); the FIFO is an
 * intrusive list. Every operation is O(1) or O(log n) per run it touches,
 * and a run is created once and freed once, so reserve is O(log n)
 * amortised per run. Memory is 16 bytes per block, allocated once, plus
 * at most 208 bytes per entry (64-byte entries, 8-byte checksums and 16-byte shapes in a pool
 * at most twice the peak count, 8-byte table slots at load <= 1/2) and long-key buffers, all
 * grown by doubling to their peak and reused after: no allocation per
 * operation in steady state (a growth costs O(entries), once per
 * doubling). Misuse (duplicate reserve, unpin of an unpinned entry,
 * discard of a ready one...) returns an error code and changes nothing.
 */
#ifndef ECXI_CACHE_H
#define ECXI_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

typedef struct ecxi_cache ecxi_cache;

/* Largest number of blocks a cache can manage (block indices are uint32;
 * equal to ECXI_REGION_MAX_BLOCKS). */
#define ECXI_CACHE_MAX_BLOCKS 0xfffffffeu

enum ecxi_cache_state { ECXI_CACHE_NOT_READY = 0, ECXI_CACHE_READY = 1 };

/* A contiguous run of blocks: start, start + 1, ..., start + len - 1. */
typedef struct ecxi_cache_run {
    uint32_t start;
    uint32_t len;
} ecxi_cache_run;

/* Called, with the cache locked, for each entry evicted by a reserve. It
 * must not call back into the cache. key is valid only during the call. */
typedef void (*ecxi_cache_evict_fn)(void *arg, const char *key, size_t key_len, uint64_t n_blocks);

/* Called, with the cache locked, for each run of blocks a reserve has just
 * taken, before the reserve returns (the region backs them: region.h
 * ecxi_region_back). It must not call back into the cache. Non-zero fails
 * the reserve with that code: the entry is gone again (what was evicted
 * for it stays evicted). */
typedef int (*ecxi_cache_alloc_fn)(void *arg, uint64_t start, uint64_t n_blocks);

typedef struct ecxi_cache_opts {
    uint64_t num_blocks;         /* 1..ECXI_CACHE_MAX_BLOCKS */
    size_t expected_entries;     /* sizing hint for the table; 0: a default */
    ecxi_cache_evict_fn on_evict; /* optional */
    void *evict_arg;
    ecxi_cache_alloc_fn on_alloc; /* optional */
    void *alloc_arg;
} ecxi_cache_opts;

typedef struct ecxi_cache_info {
    int state; /* enum ecxi_cache_state */
    uint32_t pins;
    uint64_t n_blocks;
    uint64_t size_bytes; /* as set by ecxi_cache_set_size(); 0 if never set */
    uint64_t checksum;   /* as set by ecxi_cache_set_checksum(); 0 if never set */
    uint64_t shape_rows, shape_width; /* as set by ecxi_cache_set_shape(); 0, 0 if never set */
    /* The whole cache's blocks in ready, pinned entries when this was read
     * (what ecxi_cache_get_stats gives as owned - evictable - not_ready):
     * a producer checks its pin share without a second lock. */
    uint64_t pinned_blocks;
} ecxi_cache_info;

typedef struct ecxi_cache_stats {
    uint64_t num_blocks;       /* total */
    uint64_t free_blocks;      /* in no entry */
    uint64_t owned_blocks;     /* in some entry; free + owned == total */
    uint64_t evictable_blocks; /* in ready, unpinned entries */
    uint64_t not_ready_blocks; /* in not-ready entries (pinned or not) */
    uint64_t free_runs;        /* fragments of free space */
    uint64_t entries, not_ready, ready, pinned; /* pinned: entries with pins, any state */
    uint64_t evictable;                         /* ready entries without pins */
    uint64_t reserves, reserve_full, evictions; /* counters since creation */
    uint64_t dropped; /* ready entries removed by ecxi_cache_evict */
} ecxi_cache_stats;

int ecxi_cache_new(const ecxi_cache_opts *opts, ecxi_cache **out);
void ecxi_cache_free(ecxi_cache *c);

/* Reserve n_blocks (>= 1) for a new, not-ready entry, evicting as
 * described above. ECX_EINVAL (bad key, n_blocks 0), ECX_ECACHE_EXISTS,
 * ECX_ECACHE_FULL (n_blocks > free + evictable; nothing changed),
 * ECX_ENOMEM (growing the table failed; nothing changed), or on_alloc's
 * code. */
int ecxi_cache_reserve(ecxi_cache *c, const char *key, size_t key_len, uint64_t n_blocks);
/* The same for an entry this process's consumer fetches: not ready as any
 * other, except that the producer's grant (ecxi_cache_pin_ready_blocks)
 * sees it as absent, so a `both` context never waits on its own fetch. */
int ecxi_cache_reserve_fetch(ecxi_cache *c, const char *key, size_t key_len, uint64_t n_blocks);

/* not ready -> ready (evictable when it has no pins). ECX_ECACHE_MISSING,
 * ECX_ECACHE_STATE if already ready. */
int ecxi_cache_mark_ready(ecxi_cache *c, const char *key, size_t key_len);

/* Add a pin to an entry in any state (a pinned entry is never evicted, and
 * a not-ready one cannot be discarded while pinned). ECX_ECACHE_MISSING,
 * ECX_ERANGE if the count would overflow. */
int ecxi_cache_pin(ecxi_cache *c, const char *key, size_t key_len);

/* The producer's check: absent -> ECX_ECACHE_MISSING, not ready ->
 * ECX_ECACHE_NOT_READY, ready -> pinned, 0. */
int ecxi_cache_pin_if_ready(ecxi_cache *c, const char *key, size_t key_len);

/* The producer's grant in one lookup: pin_if_ready, and on success fill
 * *info and out[0..n_blocks) as ecxi_cache_lookup() and ecxi_cache_blocks()
 * would, and set *ref, which names the pinned entry for
 * ecxi_cache_unpin_ref(). Errors as pin_if_ready, and ECX_ERANGE if cap <
 * the entry's block count (*n_blocks says how many; nothing pinned). A ref
 * stays the entry's while the pin is held (a pinned entry is neither
 * evicted nor discarded). An entry of ecxi_cache_reserve_fetch() not yet
 * ready is ECX_ECACHE_MISSING here. */
int ecxi_cache_pin_ready_blocks(ecxi_cache *c, const char *key, size_t key_len,
                               ecxi_cache_info *info, int64_t *out, size_t cap, size_t *n_blocks,
                               uint32_t *ref);
/* Drop the pin taken by ecxi_cache_pin_ready_blocks(), as
 * ecxi_cache_unpin() does with the key, without hashing it.
 * ECX_ECACHE_STATE if ref names no pinned entry. */
int ecxi_cache_unpin_ref(ecxi_cache *c, uint32_t ref);
/* What ecxi_cache_pin_ready_blocks() reads (info, blocks), for the entry
 * that a pin the caller holds (`held`, from that call) keeps, without
 * taking another pin: that entry cannot have gone or changed its key
 * meanwhile, so the key is neither hashed nor compared. A producer hands
 * an old grant's pin on to its re-grant with it (pin and unpin of the same
 * entry change nothing in the cache). ECX_ECACHE_STATE if held names no
 * pinned ready entry (the caller then looks up by key); ECX_ERANGE (with
 * *n_blocks) if cap is too small. */
int ecxi_cache_held_ready_blocks(ecxi_cache *c, uint32_t held, ecxi_cache_info *info,
                                 int64_t *out, size_t cap, size_t *n_blocks);

/* Drop a pin; at zero a ready entry becomes evictable (at the FIFO tail).
 * ECX_ECACHE_MISSING, ECX_ECACHE_STATE if it has no pins. */
int ecxi_cache_unpin(ecxi_cache *c, const char *key, size_t key_len);

/* Drop a not-ready, unpinned entry and free its blocks (a failed save or
 * fetch). ECX_ECACHE_MISSING, ECX_ECACHE_STATE if ready or pinned. */
int ecxi_cache_discard(ecxi_cache *c, const char *key, size_t key_len);

/* Remove a ready, unpinned entry now and free its blocks, as an eviction
 * would (the eviction hook is told), for the engine that no longer needs
 * it. ECX_ECACHE_MISSING; ECX_ECACHE_NOT_READY; ECX_ECACHE_STATE if pinned
 * (loaded, or granted to a consumer). */
int ecxi_cache_evict(ecxi_cache *c, const char *key, size_t key_len);

/* Record the entry's size in bytes (the encoding it will hold; the cache
 * does not interpret it), while it is not ready: the writer sets it after
 * reserve and it is fixed from mark_ready on. ECX_ECACHE_MISSING,
 * ECX_ECACHE_STATE once ready. */
int ecxi_cache_set_size(ecxi_cache *c, const char *key, size_t key_len, uint64_t size_bytes);

/* Record the checksum of the entry's bytes (checksum.h), while it is not
 * ready, as ecxi_cache_set_size(): the writer sets it when the bytes are in,
 * before mark_ready. ECX_ECACHE_MISSING, ECX_ECACHE_STATE once ready. */
int ecxi_cache_set_checksum(ecxi_cache *c, const char *key, size_t key_len, uint64_t checksum);

/* Record the item's shape [rows, width] (what a version-2 announcement says; the cache
 * does not interpret it), in any state: it describes the bytes for the
 * announcement only and does not change them. A new reserve of the key starts
 * with 0, 0 (never set). ECX_EINVAL (rows or width 0), ECX_ECACHE_MISSING. */
int ecxi_cache_set_shape(ecxi_cache *c, const char *key, size_t key_len, uint64_t rows,
                         uint64_t width);

/* 0 and *info (may be NULL) if present, else ECX_ECACHE_MISSING. */
int ecxi_cache_lookup(ecxi_cache *c, const char *key, size_t key_len, ecxi_cache_info *info);

/* Copy an entry's runs (ascending) into runs[0..cap). *n_runs receives the
 * entry's run count; ECX_ERANGE if cap is smaller (the first cap are
 * copied). O(runs). The
 * answer is stable only while the caller keeps the entry from eviction
 * (it is not ready, or pinned). */
int ecxi_cache_runs(ecxi_cache *c, const char *key, size_t key_len, ecxi_cache_run *runs, size_t cap,
                   size_t *n_runs);

/* The same as block indices: out[0..n_blocks) in ascending order.
 * ECX_ERANGE if cap < the entry's block count (*n_blocks says how many). */
int ecxi_cache_blocks(ecxi_cache *c, const char *key, size_t key_len, int64_t *out, size_t cap,
                     size_t *n_blocks);

void ecxi_cache_get_stats(ecxi_cache *c, ecxi_cache_stats *st);

/* Draw a new key-hash secret and rehash the table: what an insert that
 * probes too far does by itself (cache.c key_hash). For tests. */
void ecxi_cache_rekey(ecxi_cache *c);

/* Walk every structure and check every invariant (free + owned == total,
 * boundary tags, treap order and heap property, table, FIFO). O(blocks +
 * entries); for tests. 0, or ECX_ERANGE on the first inconsistency (and a
 * log line saying which). */
int ecxi_cache_check(ecxi_cache *c);

#endif
