/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cache — the mm_hash -> blocks bookkeeping: a block allocator (treap of
 * free runs + boundary tags), a key table (open addressing, keyed XXH3), an
 * entry pool and the eviction FIFO, all behind one mutex. cache.h states
 * the contract and the allocation policy; this comment describes the data.
 *
 * Per block b, one struct blk (16 bytes, an array allocated once):
 *   len    length of the run starting at b (free or owned), else 0;
 *   fend   if b is the last block of a free run, that run's start, else
 *          NIL — so "is the block before me the end of a free run" and "is
 *          the run after me free" are O(1) (boundary tags);
 *   left/right  treap children, for free-run starts;
 *   next   next run of the same entry, for owned-run starts.
 * A run is named by its start block, so no node is ever allocated.
 *
 * The treap orders free runs by (length, start); priorities are a seeded
 * hash of the start. Best fit is a lower_bound on (n, 0); the largest run
 * is the rightmost length, then a lower_bound on it for the lowest start.
 *
 * Entries are 64-byte records (one cache line) in a dense pool indexed by
 * uint32 id; the table stores (id, 32 hash bits) pairs with linear
 * probing, load <= 1/2 and backward-shift deletion (no tombstones), so a
 * lookup reads one 8-byte slot, then one entry line. Keys are stored in
 * the entry (raw up to 32 bytes, or packed when they are lowercase hex up
 * to 64 digits, as an mm_hash is) or, if longer, in power-of-two buffers
 * kept on per-size free lists, so even long keys cost no malloc once the
 * pools have reached their peak.
 */
#include "cache.h"

#include <pthread.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Inlined (all static): a key's hash is a few dozen instructions. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util.h"

#define NIL UINT32_MAX
#define KEY_INLINE 32  /* raw keys up to this long live in the entry */
#define KEY_HEX_MAX 64 /* lowercase-hex keys up to this long are packed there */
#define KEY_CLASS_MIN 128
#define KEY_CLASSES 2 /* buffers of 128 and 256 bytes: keys up to ECX_MM_HASH_MAX */
#define CACHE_SECRET_BYTES 192 /* random XXH3 secret (>= XXH3_SECRET_SIZE_MIN) */
/* An insert that probes further than this at load <= 1/2 is no accident:
 * the table draws a new secret (see key_hash). */
#define CACHE_PROBE_MAX 32
_Static_assert((KEY_CLASS_MIN << (KEY_CLASSES - 1)) >= ECX_MM_HASH_MAX,
               "the largest key class holds the longest key");

/* ST_FETCHING: not ready, reserved by this process's consumer for a fetch
 * (ecxi_cache_reserve_fetch); everything but the producer's grant treats
 * it as ST_NOT_READY. */
enum { SLOT_UNUSED = 0, ST_NOT_READY = 1, ST_READY = 2, ST_FETCHING = 3 };

enum { KEY_RAW = 0, KEY_HEX = 1, KEY_EXT = 2 };

/*
 * One cache line. The key is stored as it came (KEY_RAW, up to 32 bytes),
 * packed two hex digits to a byte (KEY_HEX: 33..64 lowercase hex digits of
 * even length, which is what an mm_hash is in practice), or in a pooled
 * buffer (KEY_EXT). Which form is a function of the key's bytes alone and
 * packing is reversible given the length, so comparing keys stays exact.
 * An entry is in the FIFO exactly when it is ready and unpinned.
 */
struct entry {
    uint64_t size_bytes; /* the caller's, set by ecxi_cache_set_size() */
    uint32_t pins;
    uint32_t n_blocks;
    uint32_t head;       /* start of the first (lowest) run */
    uint32_t prev, next; /* FIFO links */
    uint16_t key_len;
    uint8_t state;
    uint8_t key_kind;
    union {
        unsigned char in[KEY_INLINE]; /* KEY_RAW bytes or KEY_HEX nibbles */
        char *ext;                    /* KEY_EXT */
    } k;
};
_Static_assert(sizeof(struct entry) == 64, "entry is one cache line");

static bool not_ready(const struct entry *e)
{
    return e->state == ST_NOT_READY || e->state == ST_FETCHING;
}

/* Everything about block b in 16 bytes, so a treap step touches one
 * cache line. A run start is either free (treap links) or owned (chain
 * link), never both, hence the union. */
struct blk {
    uint32_t len;  /* length of the run starting here, else 0 */
    uint32_t fend; /* free-run end tag */
    union {
        struct {
            uint32_t left, right; /* treap children (free-run start) */
        };
        uint32_t next; /* the entry's next run (owned-run start) */
    };
};
_Static_assert(sizeof(struct blk) == 16, "block record is 16 bytes");

/* The slot keeps the folded hash: it filters compares and gives the home
 * slot (h & mask) without touching the entry, for deletion and growth. */
struct slot {
    uint32_t id; /* NIL: empty */
    uint32_t h;
};

/* An entry's announced shape; 0, 0: never set. */
struct shape {
    uint64_t rows, width;
};

struct ecxi_cache {
    pthread_mutex_t mu;
    uint32_t n;
    struct blk *b;
    uint32_t root;
    uint64_t prio_seed;
    uint64_t free_blocks, free_runs, evictable_blocks;
    uint64_t n_evictable; /* entries in the FIFO: ready, no pins */

    struct entry *ents; /* the pool, indexed by id */
    uint64_t *sums;     /* checksum per id, beside the pool to keep entries one line */
    struct shape *shapes; /* shape per id (ecxi_cache_set_shape), beside it likewise */
    uint32_t ents_cap, ents_used, free_ent;
    uint64_t n_entries, n_not_ready, n_ready, n_pinned;
    uint64_t not_ready_blocks; /* blocks of not-ready entries */

    struct slot *tab;
    uint32_t tab_mask;

    uint32_t fifo_head, fifo_tail;

    void *key_free[KEY_CLASSES];
    unsigned char secret[CACHE_SECRET_BYTES]; /* the keyed hash's (key_hash) */
    uint64_t since_rekey;                     /* reserves since it was drawn */
    ecxi_cache_evict_fn on_evict;
    void *evict_arg;
    ecxi_cache_alloc_fn on_alloc;
    void *alloc_arg;
    uint64_t reserves, reserve_full, evictions, dropped;
};

/* ---- big arrays -------------------------------------------------------- */

/* The per-block array, the entry pool and the table are each allocated
 * whole. Those of 2 MiB or more get their own anonymous mapping with
 * MADV_HUGEPAGE: with 100,000 entries the cache spans ~15 MB, and a random
 * lookup would otherwise pay a TLB miss on top of each cache miss. */
#define HUGE_MIN ((size_t)2 << 20)

static void *big_alloc(size_t size)
{
    if (size < HUGE_MIN) return aligned_alloc(128, (size + 127) & ~(size_t)127);
    size = (size + HUGE_MIN - 1) & ~(HUGE_MIN - 1);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, size, MADV_HUGEPAGE); /* a hint; fine if refused */
    return p;
}

static void big_free(void *p, size_t size)
{
    if (!p) return;
    if (size < HUGE_MIN)
        free(p);
    else
        munmap(p, (size + HUGE_MIN - 1) & ~(HUGE_MIN - 1));
}

/* ---- treap of free runs ---------------------------------------------- */

static inline uint32_t prio(const ecxi_cache *c, uint32_t s)
{
    uint64_t z = s + c->prio_seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* (len_a, a) < (len_b, b) */
static inline bool key_less(uint32_t len_a, uint32_t a, uint32_t len_b, uint32_t b)
{
    return len_a < len_b || (len_a == len_b && a < b);
}

/* Split t into keys < (klen, ks) and keys >= (klen, ks). */
static void t_split(ecxi_cache *c, uint32_t t, uint32_t klen, uint32_t ks, uint32_t *l, uint32_t *r)
{
    if (t == NIL) {
        *l = *r = NIL;
        return;
    }
    if (key_less(c->b[t].len, t, klen, ks)) {
        t_split(c, c->b[t].right, klen, ks, &c->b[t].right, r);
        *l = t;
    } else {
        t_split(c, c->b[t].left, klen, ks, l, &c->b[t].left);
        *r = t;
    }
}

/* Join a and b, every key of a below every key of b. */
static uint32_t t_merge(ecxi_cache *c, uint32_t a, uint32_t b)
{
    if (a == NIL) return b;
    if (b == NIL) return a;
    if (prio(c, a) >= prio(c, b)) {
        c->b[a].right = t_merge(c, c->b[a].right, b);
        return a;
    }
    c->b[b].left = t_merge(c, a, c->b[b].left);
    return b;
}

static uint32_t t_insert(ecxi_cache *c, uint32_t t, uint32_t x)
{
    if (t == NIL) {
        c->b[x].left = c->b[x].right = NIL;
        return x;
    }
    if (prio(c, x) > prio(c, t)) {
        t_split(c, t, c->b[x].len, x, &c->b[x].left, &c->b[x].right);
        return x;
    }
    if (key_less(c->b[x].len, x, c->b[t].len, t))
        c->b[t].left = t_insert(c, c->b[t].left, x);
    else
        c->b[t].right = t_insert(c, c->b[t].right, x);
    return t;
}

/* Remove x (keyed by its current len) from t. */
static uint32_t t_erase(ecxi_cache *c, uint32_t t, uint32_t x)
{
    if (t == NIL) return NIL;
    if (t == x) return t_merge(c, c->b[x].left, c->b[x].right);
    if (key_less(c->b[x].len, x, c->b[t].len, t))
        c->b[t].left = t_erase(c, c->b[t].left, x);
    else
        c->b[t].right = t_erase(c, c->b[t].right, x);
    return t;
}

/* The smallest free run of length >= len, lowest start among equals. */
static uint32_t t_lower_bound(const ecxi_cache *c, uint32_t len)
{
    uint32_t t = c->root, best = NIL;
    while (t != NIL) {
        if (c->b[t].len >= len) {
            best = t;
            t = c->b[t].left;
        } else {
            t = c->b[t].right;
        }
    }
    return best;
}

/* The largest free run, lowest start among equals. */
static uint32_t t_largest(const ecxi_cache *c)
{
    uint32_t t = c->root;
    if (t == NIL) return NIL;
    while (c->b[t].right != NIL)
        t = c->b[t].right;
    return t_lower_bound(c, c->b[t].len);
}

/* ---- runs ------------------------------------------------------------ */

/* Take the first k blocks of the free run starting at s (k <= its length);
 * s becomes an owned run of length k. */
static void take_prefix(ecxi_cache *c, uint32_t s, uint32_t k)
{
    c->root = t_erase(c, c->root, s);
    uint32_t len = c->b[s].len;
    if (k == len) {
        c->b[s + len - 1].fend = NIL;
        c->free_runs--;
    } else {
        uint32_t t = s + k;
        c->b[t].len = len - k;
        c->b[s + len - 1].fend = t;
        c->root = t_insert(c, c->root, t);
    }
    c->b[s].len = k;
    c->b[s].next = NIL;
    c->free_blocks -= k;
}

/* Return the owned run [a, a + l) to the free space, merging neighbours. */
static void free_run(ecxi_cache *c, uint32_t a, uint32_t l)
{
    c->free_blocks += l;
    c->b[a].len = 0;
    c->b[a].next = NIL;
    if (a > 0 && c->b[a - 1].fend != NIL) {
        uint32_t p = c->b[a - 1].fend;
        c->root = t_erase(c, c->root, p);
        c->b[a - 1].fend = NIL;
        l += c->b[p].len;
        a = p;
        c->free_runs--;
    }
    uint32_t q = a + l; /* a + l <= n, no overflow: n < UINT32_MAX */
    if (q < c->n && c->b[q].len != 0 && c->b[q + c->b[q].len - 1].fend == q) {
        uint32_t ql = c->b[q].len;
        c->root = t_erase(c, c->root, q);
        c->b[q].len = 0;
        c->b[q + ql - 1].fend = NIL;
        l += ql;
        c->free_runs--;
    }
    c->b[a].len = l;
    c->b[a + l - 1].fend = a;
    c->root = t_insert(c, c->root, a);
    c->free_runs++;
}

/* Sort a chain of owned runs (linked by next) by start. */
static uint32_t sort_runs(ecxi_cache *c, uint32_t list, uint32_t count)
{
    if (count <= 1) return list;
    uint32_t half = count / 2, mid = list;
    for (uint32_t i = 1; i < half; i++)
        mid = c->b[mid].next;
    uint32_t second = c->b[mid].next;
    c->b[mid].next = NIL;
    uint32_t a = sort_runs(c, list, half), b = sort_runs(c, second, count - half);
    uint32_t head = NIL, *tail = &head;
    while (a != NIL && b != NIL) {
        uint32_t *pick = a < b ? &a : &b;
        *tail = *pick;
        tail = &c->b[*pick].next;
        *pick = c->b[*pick].next;
    }
    *tail = a != NIL ? a : b;
    return head;
}

/* Allocate n <= free_blocks blocks by the policy in cache.h. */
static void alloc_blocks(ecxi_cache *c, uint32_t n, uint32_t *head)
{
    uint32_t rem = n, list = NIL, k = 0;
    while (rem > 0) {
        uint32_t s = t_lower_bound(c, rem), take;
        if (s != NIL) {
            take = rem;
        } else {
            s = t_largest(c);
            take = c->b[s].len;
        }
        take_prefix(c, s, take);
        c->b[s].next = list;
        list = s;
        k++;
        rem -= take;
    }
    *head = sort_runs(c, list, k);
}

/* ---- keys and the table ---------------------------------------------- */

/* HEX_PAIRS + 2 * b: byte b as two lowercase hex digits. */
#define HEX_ROW(h)                                                                                 \
    h "0" h "1" h "2" h "3" h "4" h "5" h "6" h "7" h "8" h "9" h "a" h "b" h "c" h "d" h "e" h "f"
static const char HEX_PAIRS[] = HEX_ROW("0") HEX_ROW("1") HEX_ROW("2") HEX_ROW("3") HEX_ROW("4")
    HEX_ROW("5") HEX_ROW("6") HEX_ROW("7") HEX_ROW("8") HEX_ROW("9") HEX_ROW("a") HEX_ROW("b")
        HEX_ROW("c") HEX_ROW("d") HEX_ROW("e") HEX_ROW("f");
_Static_assert(sizeof HEX_PAIRS == 513, "256 pairs");
/* 1 + the value of a lowercase hex digit, 0 for any other byte: tested
 * without branches (random hex defeats branch prediction). */
static const uint8_t HEXV[256] = {
    ['0'] = 1, ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

/* Which form a key is stored in (see struct entry). */
static int key_kind_of(const char *key, size_t len)
{
    if (len <= KEY_INLINE) return KEY_RAW;
    if (len > KEY_HEX_MAX || len % 2) return KEY_EXT;
    unsigned all = 1;
    for (size_t i = 0; i < len; i++)
        all &= HEXV[(unsigned char)key[i]] != 0;
    return all ? KEY_HEX : KEY_EXT;
}

static inline unsigned hexval(char ch)
{
    return HEXV[(unsigned char)ch] - 1u;
}

static void key_store(struct entry *e, const char *key, size_t len, int kind, char *ext)
{
    e->key_len = (uint16_t)len;
    e->key_kind = (uint8_t)kind;
    if (kind == KEY_RAW) {
        memcpy(e->k.in, key, len);
    } else if (kind == KEY_HEX) {
        for (size_t i = 0; i < len / 2; i++)
            e->k.in[i] = (unsigned char)(hexval(key[2 * i]) << 4 | hexval(key[2 * i + 1]));
    } else {
        memcpy(ext, key, len);
        e->k.ext = ext;
    }
}

static bool key_equal(const struct entry *e, const char *key, size_t len)
{
    if (e->key_len != len) return false;
    if (e->key_kind == KEY_RAW) return memcmp(e->k.in, key, len) == 0;
    if (e->key_kind == KEY_EXT) return memcmp(e->k.ext, key, len) == 0;
    /* Eight digits per step (then two), without branches on the data. */
    uint64_t diff = 0;
    size_t i = 0, n = len / 2;
    for (; i + 4 <= n; i += 4) {
        char want[8]; /* endian-neutral: compared as the bytes they are */
        uint64_t got, w;
        memcpy(want, HEX_PAIRS + 2 * e->k.in[i], 2);
        memcpy(want + 2, HEX_PAIRS + 2 * e->k.in[i + 1], 2);
        memcpy(want + 4, HEX_PAIRS + 2 * e->k.in[i + 2], 2);
        memcpy(want + 6, HEX_PAIRS + 2 * e->k.in[i + 3], 2);
        memcpy(&w, want, 8);
        memcpy(&got, key + 2 * i, 8);
        diff |= got ^ w;
    }
    for (; i < n; i++) {
        uint16_t got, want;
        memcpy(&got, key + 2 * i, 2);
        memcpy(&want, HEX_PAIRS + 2 * e->k.in[i], 2);
        diff |= (uint64_t)(got ^ want);
    }
    return diff == 0;
}

/* The key's bytes; buf (KEY_HEX_MAX) is used to unpack a packed key. */
static const char *key_view(const struct entry *e, char buf[KEY_HEX_MAX])
{
    if (e->key_kind == KEY_RAW) return (const char *)e->k.in;
    if (e->key_kind == KEY_EXT) return e->k.ext;
    for (size_t i = 0; i < e->key_len / 2u; i++)
        memcpy(buf + 2 * i, HEX_PAIRS + 2 * e->k.in[i], 2);
    return buf;
}

static inline bool evictable(const struct entry *e)
{
    return e->state == ST_READY && e->pins == 0;
}

/*
 * Keys can come from the network (a consumer caches what its engine asks
 * for; a producer looks up what consumers ask for), so the hash is keyed:
 * XXH3-64 under a random secret drawn per cache, as table.h explains (a
 * tenth of SipHash's cost for a 64-digit mm_hash). A peer cannot predict
 * where a key lands; and should an insert ever probe past CACHE_PROBE_MAX
 * slots, the cache draws a new secret and rehashes (tab_rekey).
 */
static uint32_t key_hash(const ecxi_cache *c, const char *key, size_t len)
{
    uint64_t v = XXH3_64bits_withSecret(key, len, c->secret, sizeof c->secret);
    return (uint32_t)(v ^ (v >> 32));
}

static int key_class(size_t len)
{
    int k = 0;
    while ((size_t)KEY_CLASS_MIN << k < len)
        k++;
    return k;
}

static char *key_buf_get(ecxi_cache *c, size_t len)
{
    int k = key_class(len);
    void *b = c->key_free[k];
    if (b) {
        memcpy(&c->key_free[k], b, sizeof(void *));
        return b;
    }
    return malloc((size_t)KEY_CLASS_MIN << k);
}

static void key_buf_put(ecxi_cache *c, char *b, size_t len)
{
    int k = key_class(len);
    memcpy(b, &c->key_free[k], sizeof(void *));
    c->key_free[k] = b;
}

/* ---- the table and the entry pool ------------------------------------ */

/*
 * The pool is dense: freed ids are reused last-in first-out and the pool
 * grows by doubling only when none is free, so it stays within twice the
 * peak entry count and as much of it as possible stays in the CPU caches.
 */

static uint32_t tab_find(const ecxi_cache *c, uint32_t h, const char *key, size_t len)
{
    for (uint32_t i = h & c->tab_mask;; i = (i + 1) & c->tab_mask) {
        const struct slot *s = &c->tab[i];
        if (s->id == NIL) return NIL;
        if (s->h == h) {
            const struct entry *e = &c->ents[s->id];
            if (key_equal(e, key, len)) return s->id;
        }
    }
}

/* The first empty slot on h's probe path. */
static uint32_t tab_hole(const struct slot *tab, uint32_t mask, uint32_t h)
{
    uint32_t i = h & mask;
    while (tab[i].id != NIL)
        i = (i + 1) & mask;
    return i;
}

/* Insert a new key: take an id (ents_reserve_one() made sure there is
 * one) and place its slot; *probe gets how far that slot is from home. */
static uint32_t tab_insert(ecxi_cache *c, uint32_t h, uint32_t *probe)
{
    uint32_t id;
    if (c->free_ent != NIL) {
        id = c->free_ent;
        c->free_ent = c->ents[id].next;
    } else {
        id = c->ents_used++;
    }
    uint32_t p = tab_hole(c->tab, c->tab_mask, h);
    c->tab[p].id = id;
    c->tab[p].h = h;
    *probe = (p - h) & c->tab_mask;
    return id;
}

/* Remove id, whose key hashes to h (the entry keeps no copy of its hash:
 * that keeps it within one cache line). */
static void tab_delete(ecxi_cache *c, uint32_t id, uint32_t h)
{
    uint32_t mask = c->tab_mask, i = h & mask;
    while (c->tab[i].id != id)
        i = (i + 1) & mask;
    /* Backward-shift: pull later members of the cluster into the hole when
     * their home slot does not lie cyclically in (hole, j]. */
    for (uint32_t j = (i + 1) & mask; c->tab[j].id != NIL; j = (j + 1) & mask) {
        uint32_t home = c->tab[j].h & mask;
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            c->tab[i] = c->tab[j];
            i = j;
        }
    }
    c->tab[i].id = NIL;
    c->ents[id].next = c->free_ent;
    c->free_ent = id;
}

/* Size (or resize) the table for want_entries at load <= 1/2. Nothing
 * changes on failure. */
static int tab_grow(ecxi_cache *c, uint64_t want_entries)
{
    uint64_t old = c->tab ? (uint64_t)c->tab_mask + 1 : 0, size = old ? old : 16;
    if (want_entries * 2 <= old) return 0;
    while (want_entries * 2 > size)
        size *= 2;
    if (size > ((uint64_t)1 << 32)) return ECX_ENOMEM;
    struct slot *t = big_alloc(size * sizeof *t);
    if (!t) return ECX_ENOMEM;
    for (uint64_t i = 0; i < size; i++)
        t[i].id = NIL;
    uint32_t mask = (uint32_t)(size - 1);
    for (uint64_t i = 0; i < old; i++)
        if (c->tab[i].id != NIL) t[tab_hole(t, mask, c->tab[i].h)] = c->tab[i];
    big_free(c->tab, old * sizeof *t);
    c->tab = t;
    c->tab_mask = mask;
    return 0;
}

/* Draw a new secret and rehash every entry in place (same size). */
static void tab_rekey(ecxi_cache *c)
{
    randombytes_buf(c->secret, sizeof c->secret);
    c->since_rekey = 0;
    for (uint64_t i = 0; i <= c->tab_mask; i++)
        c->tab[i].id = NIL;
    char buf[KEY_HEX_MAX];
    for (uint32_t id = 0; id < c->ents_used; id++) {
        const struct entry *e = &c->ents[id];
        if (e->state == SLOT_UNUSED) continue;
        uint32_t h = key_hash(c, key_view(e, buf), e->key_len);
        uint32_t p = tab_hole(c->tab, c->tab_mask, h);
        c->tab[p] = (struct slot){id, h};
    }
}

/* Make sure one more id exists (may move c->ents). */
static int ents_reserve_one(ecxi_cache *c)
{
    if (c->free_ent != NIL || c->ents_used < c->ents_cap) return 0;
    /* With an id per block, the eviction this reserve must do (no block is
     * free when n entries own all n blocks) frees an id. */
    if (c->ents_cap >= c->n) return 0;
    uint64_t cap = c->ents_cap ? (uint64_t)c->ents_cap * 2 : 64;
    if (cap > c->n) cap = c->n; /* every entry owns >= 1 block */
    struct entry *e = big_alloc(cap * sizeof *e);
    uint64_t *sums = big_alloc(cap * sizeof *sums);
    struct shape *shapes = big_alloc(cap * sizeof *shapes);
    if (!e || !sums || !shapes) {
        if (e) big_free(e, cap * sizeof *e);
        if (sums) big_free(sums, cap * sizeof *sums);
        if (shapes) big_free(shapes, cap * sizeof *shapes);
        return ECX_ENOMEM;
    }
    if (c->ents_used) {
        memcpy(e, c->ents, c->ents_used * sizeof *e);
        memcpy(sums, c->sums, c->ents_used * sizeof *sums);
        memcpy(shapes, c->shapes, c->ents_used * sizeof *shapes);
    }
    big_free(c->ents, (size_t)c->ents_cap * sizeof *e);
    big_free(c->sums, (size_t)c->ents_cap * sizeof *sums);
    big_free(c->shapes, (size_t)c->ents_cap * sizeof *shapes);
    c->ents = e;
    c->sums = sums;
    c->shapes = shapes;
    c->ents_cap = (uint32_t)cap;
    return 0;
}

/* ---- FIFO of evictable entries --------------------------------------- */

static void fifo_push(ecxi_cache *c, uint32_t id)
{
    struct entry *e = &c->ents[id];
    e->prev = c->fifo_tail;
    e->next = NIL;
    if (c->fifo_tail != NIL)
        c->ents[c->fifo_tail].next = id;
    else
        c->fifo_head = id;
    c->fifo_tail = id;
    c->evictable_blocks += e->n_blocks;
    c->n_evictable++;
}

static void fifo_remove(ecxi_cache *c, uint32_t id)
{
    struct entry *e = &c->ents[id];
    if (e->prev != NIL)
        c->ents[e->prev].next = e->next;
    else
        c->fifo_head = e->next;
    if (e->next != NIL)
        c->ents[e->next].prev = e->prev;
    else
        c->fifo_tail = e->prev;
    e->prev = e->next = NIL;
    c->evictable_blocks -= e->n_blocks;
    c->n_evictable--;
}

/* ---- entries --------------------------------------------------------- */

/* Free the entry's blocks, drop it from the table, recycle its id. */
static void entry_remove(ecxi_cache *c, uint32_t id, uint32_t h)
{
    struct entry *e = &c->ents[id];
    if (evictable(e)) fifo_remove(c, id);
    for (uint32_t s = e->head; s != NIL;) {
        uint32_t next = c->b[s].next;
        free_run(c, s, c->b[s].len);
        s = next;
    }
    if (e->key_kind == KEY_EXT) key_buf_put(c, e->k.ext, e->key_len);
    if (e->state == ST_READY) {
        c->n_ready--;
    } else {
        c->n_not_ready--;
        c->not_ready_blocks -= e->n_blocks;
    }
    if (e->pins) c->n_pinned--;
    c->n_entries--;
    e->key_kind = KEY_RAW;
    e->state = SLOT_UNUSED;
    e->head = NIL;
    tab_delete(c, id, h);
}

static void evict_one(ecxi_cache *c)
{
    uint32_t id = c->fifo_head;
    struct entry *e = &c->ents[id];
    /* Start the loads removal will need (its first run's block, its FIFO
     * successor, then its table slot) so that they overlap with hashing
     * instead of following one another. */
    __builtin_prefetch(&c->b[e->head], 1);
    if (e->next != NIL) __builtin_prefetch(&c->ents[e->next], 1);
    char buf[KEY_HEX_MAX];
    const char *key = key_view(e, buf);
    uint32_t h = key_hash(c, key, e->key_len);
    __builtin_prefetch(&c->tab[h & c->tab_mask], 1);
    if (c->on_evict) c->on_evict(c->evict_arg, key, e->key_len, e->n_blocks);
    entry_remove(c, id, h);
    c->evictions++;
}

static bool key_ok(const char *key, size_t len)
{
    return key && len >= 1 && len <= ECX_MM_HASH_MAX;
}

/* ---- public API ------------------------------------------------------ */

int ecxi_cache_new(const ecxi_cache_opts *opts, ecxi_cache **out)
{
    if (!out) return ECX_EINVAL;
    *out = NULL;
    if (!opts || opts->num_blocks == 0 || opts->num_blocks > ECXI_CACHE_MAX_BLOCKS)
        return ECX_EINVAL;
    if (sodium_init() < 0) return ECX_ECRYPTO;
    ecxi_cache *c = calloc(1, sizeof *c);
    if (!c) return ECX_ENOMEM;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return ECX_ESYS;
    }
    uint32_t n = (uint32_t)opts->num_blocks;
    c->n = n;
    c->b = big_alloc((size_t)n * sizeof *c->b);
    uint64_t want = opts->expected_entries ? opts->expected_entries : 64;
    if (want > n) want = n;
    if (!c->b || tab_grow(c, want) != 0) {
        ecxi_cache_free(c);
        return ECX_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++)
        c->b[i] = (struct blk){.len = 0, .fend = NIL, .left = NIL, .right = NIL};
    randombytes_buf(c->secret, sizeof c->secret);
    randombytes_buf(&c->prio_seed, sizeof c->prio_seed);
    c->fifo_head = c->fifo_tail = c->free_ent = NIL;
    c->on_evict = opts->on_evict;
    c->evict_arg = opts->evict_arg;
    c->on_alloc = opts->on_alloc;
    c->alloc_arg = opts->alloc_arg;
    /* One free run: all the blocks. */
    c->root = NIL;
    c->b[0].len = n;
    c->b[n - 1].fend = 0;
    c->root = t_insert(c, c->root, 0);
    c->free_runs = 1;
    c->free_blocks = n;
    *out = c;
    return 0;
}

void ecxi_cache_free(ecxi_cache *c)
{
    if (!c) return;
    for (uint64_t i = 0; i < c->ents_used; i++)
        if (c->ents[i].state != SLOT_UNUSED && c->ents[i].key_kind == KEY_EXT)
            free(c->ents[i].k.ext);
    for (int k = 0; k < KEY_CLASSES; k++) {
        void *b = c->key_free[k];
        while (b) {
            void *next;
            memcpy(&next, b, sizeof next);
            free(b);
            b = next;
        }
    }
    big_free(c->ents, (size_t)c->ents_cap * sizeof *c->ents);
    big_free(c->sums, (size_t)c->ents_cap * sizeof *c->sums);
    big_free(c->shapes, (size_t)c->ents_cap * sizeof *c->shapes);
    big_free(c->tab, ((size_t)c->tab_mask + 1) * sizeof *c->tab);
    big_free(c->b, (size_t)c->n * sizeof *c->b);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int reserve_as(ecxi_cache *c, const char *key, size_t key_len, uint64_t n_blocks,
                      uint8_t state)
{
    if (!c || !key_ok(key, key_len) || n_blocks == 0) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    char *ext = NULL;
    uint32_t h = key_hash(c, key, key_len);
    if (tab_find(c, h, key, key_len) != NIL) {
        rc = ECX_ECACHE_EXISTS;
        goto out;
    }
    if (n_blocks > c->free_blocks + c->evictable_blocks) {
        c->reserve_full++;
        rc = ECX_ECACHE_FULL;
        goto out;
    }
    /* Everything that can fail comes before the first change. */
    if ((rc = ents_reserve_one(c)) || (rc = tab_grow(c, c->n_entries + 1))) goto out;
    int kind = key_kind_of(key, key_len);
    if (kind == KEY_EXT && !(ext = key_buf_get(c, key_len))) {
        rc = ECX_ENOMEM;
        goto out;
    }
    while (c->free_blocks < n_blocks)
        evict_one(c);

    uint32_t probe, id = tab_insert(c, h, &probe);
    struct entry *e = &c->ents[id];
    e->size_bytes = 0;
    c->sums[id] = 0;
    c->shapes[id] = (struct shape){0, 0};
    key_store(e, key, key_len, kind, ext);
    e->pins = 0;
    e->n_blocks = (uint32_t)n_blocks;
    e->prev = e->next = NIL;
    e->state = state;
    alloc_blocks(c, (uint32_t)n_blocks, &e->head);
    c->n_entries++;
    c->n_not_ready++;
    c->not_ready_blocks += n_blocks;
    for (uint32_t s = e->head; c->on_alloc && s != NIL; s = c->b[s].next)
        if ((rc = c->on_alloc(c->alloc_arg, s, c->b[s].len))) {
            entry_remove(c, id, h);
            goto out;
        }
    c->reserves++;
    /* At most one rehash per n_entries reserves: O(1) amortised. */
    if (++c->since_rekey >= c->n_entries && probe > CACHE_PROBE_MAX) tab_rekey(c);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_reserve(ecxi_cache *c, const char *key, size_t key_len, uint64_t n_blocks)
{
    return reserve_as(c, key, key_len, n_blocks, ST_NOT_READY);
}

int ecxi_cache_reserve_fetch(ecxi_cache *c, const char *key, size_t key_len, uint64_t n_blocks)
{
    return reserve_as(c, key, key_len, n_blocks, ST_FETCHING);
}

/* Look the key up with the lock held; NULL if absent. */
static struct entry *find_locked(ecxi_cache *c, const char *key, size_t key_len, uint32_t *id_out,
                                 uint32_t *h_out)
{
    uint32_t h = key_hash(c, key, key_len), id = tab_find(c, h, key, key_len);
    if (id == NIL) return NULL;
    if (id_out) *id_out = id;
    if (h_out) *h_out = h;
    return &c->ents[id];
}

int ecxi_cache_mark_ready(ecxi_cache *c, const char *key, size_t key_len)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    uint32_t id;
    struct entry *e = find_locked(c, key, key_len, &id, NULL);
    if (!e) {
        rc = ECX_ECACHE_MISSING;
    } else if (!not_ready(e)) {
        rc = ECX_ECACHE_STATE;
    } else {
        e->state = ST_READY;
        c->n_not_ready--;
        c->not_ready_blocks -= e->n_blocks;
        c->n_ready++;
        if (e->pins == 0) fifo_push(c, id);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int pin_locked(ecxi_cache *c, uint32_t id)
{
    struct entry *e = &c->ents[id];
    if (e->pins == UINT32_MAX) return ECX_ERANGE;
    if (e->pins++ == 0) {
        c->n_pinned++;
        if (e->state == ST_READY) fifo_remove(c, id);
    }
    return 0;
}

int ecxi_cache_pin(ecxi_cache *c, const char *key, size_t key_len)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    uint32_t id;
    int rc = find_locked(c, key, key_len, &id, NULL) ? pin_locked(c, id) : ECX_ECACHE_MISSING;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_pin_if_ready(ecxi_cache *c, const char *key, size_t key_len)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    uint32_t id;
    struct entry *e = find_locked(c, key, key_len, &id, NULL);
    int rc = !e                     ? ECX_ECACHE_MISSING
             : e->state != ST_READY ? ECX_ECACHE_NOT_READY
                                    : pin_locked(c, id);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void info_of(const ecxi_cache *c, const struct entry *e, ecxi_cache_info *info)
{
    info->state = e->state == ST_READY ? ECXI_CACHE_READY : ECXI_CACHE_NOT_READY;
    info->pins = e->pins;
    info->n_blocks = e->n_blocks;
    info->size_bytes = e->size_bytes;
    info->checksum = c->sums[e - c->ents];
    info->shape_rows = c->shapes[e - c->ents].rows;
    info->shape_width = c->shapes[e - c->ents].width;
    info->pinned_blocks = c->n - c->free_blocks - c->evictable_blocks - c->not_ready_blocks;
}

/* out[0..e->n_blocks): the entry's block indices, ascending. */
static void blocks_of(const ecxi_cache *c, const struct entry *e, int64_t *out)
{
    size_t i = 0;
    for (uint32_t s = e->head; s != NIL; s = c->b[s].next)
        for (uint32_t b = 0; b < c->b[s].len; b++)
            out[i++] = (int64_t)s + b;
}

int ecxi_cache_pin_ready_blocks(ecxi_cache *c, const char *key, size_t key_len,
                               ecxi_cache_info *info, int64_t *out, size_t cap, size_t *n_blocks,
                               uint32_t *ref)
{
    if (!c || !key_ok(key, key_len) || !info || (cap && !out) || !n_blocks || !ref)
        return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    uint32_t id;
    struct entry *e = find_locked(c, key, key_len, &id, NULL);
    int rc = !e || e->state == ST_FETCHING ? ECX_ECACHE_MISSING
             : e->state != ST_READY        ? ECX_ECACHE_NOT_READY
                                           : 0;
    if (!rc) {
        *n_blocks = e->n_blocks;
        if (cap < e->n_blocks) rc = ECX_ERANGE;
    }
    if (!rc && !(rc = pin_locked(c, id))) {
        info_of(c, e, info);
        blocks_of(c, e, out);
        *ref = id;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_held_ready_blocks(ecxi_cache *c, uint32_t held, ecxi_cache_info *info,
                                 int64_t *out, size_t cap, size_t *n_blocks)
{
    if (!c || !info || (cap && !out) || !n_blocks) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct entry *e = held < c->ents_used ? &c->ents[held] : NULL;
    int rc = !e || e->state != ST_READY || e->pins == 0 ? ECX_ECACHE_STATE : 0;
    if (!rc) {
        *n_blocks = e->n_blocks;
        if (cap < e->n_blocks) rc = ECX_ERANGE;
    }
    if (!rc) {
        info_of(c, e, info);
        blocks_of(c, e, out);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int unpin_locked(ecxi_cache *c, uint32_t id)
{
    struct entry *e = &c->ents[id];
    if (e->pins == 0) return ECX_ECACHE_STATE;
    if (--e->pins == 0) {
        c->n_pinned--;
        if (e->state == ST_READY) fifo_push(c, id);
    }
    return 0;
}

int ecxi_cache_unpin_ref(ecxi_cache *c, uint32_t ref)
{
    if (!c) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = ref < c->ents_used && c->ents[ref].state != SLOT_UNUSED ? unpin_locked(c, ref)
                                                                     : ECX_ECACHE_STATE;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_unpin(ecxi_cache *c, const char *key, size_t key_len)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    uint32_t id;
    int rc = find_locked(c, key, key_len, &id, NULL) ? unpin_locked(c, id) : ECX_ECACHE_MISSING;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Remove an unpinned entry: a not-ready one (ready false: a save or fetch
 * given up) or a ready one (ready true: the engine's eviction, which the
 * eviction hook hears of). */
static int remove_unpinned(ecxi_cache *c, const char *key, size_t key_len, bool ready)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    uint32_t id, h;
    struct entry *e = find_locked(c, key, key_len, &id, &h);
    if (!e)
        rc = ECX_ECACHE_MISSING;
    else if (not_ready(e) == ready)
        rc = ready ? ECX_ECACHE_NOT_READY : ECX_ECACHE_STATE;
    else if (e->pins)
        rc = ECX_ECACHE_STATE;
    else {
        if (ready && c->on_evict) c->on_evict(c->evict_arg, key, key_len, e->n_blocks);
        c->dropped += ready;
        entry_remove(c, id, h);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_discard(ecxi_cache *c, const char *key, size_t key_len)
{
    return remove_unpinned(c, key, key_len, false);
}

int ecxi_cache_evict(ecxi_cache *c, const char *key, size_t key_len)
{
    return remove_unpinned(c, key, key_len, true);
}

int ecxi_cache_set_size(ecxi_cache *c, const char *key, size_t key_len, uint64_t size_bytes)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    int rc = !e ? ECX_ECACHE_MISSING : !not_ready(e) ? ECX_ECACHE_STATE : 0;
    if (!rc) e->size_bytes = size_bytes;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_set_checksum(ecxi_cache *c, const char *key, size_t key_len, uint64_t checksum)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    int rc = !e ? ECX_ECACHE_MISSING : !not_ready(e) ? ECX_ECACHE_STATE : 0;
    if (!rc) c->sums[e - c->ents] = checksum;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_set_shape(ecxi_cache *c, const char *key, size_t key_len, uint64_t rows,
                         uint64_t width)
{
    if (!c || !key_ok(key, key_len) || rows == 0 || width == 0) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    if (e) c->shapes[e - c->ents] = (struct shape){rows, width};
    pthread_mutex_unlock(&c->mu);
    return e ? 0 : ECX_ECACHE_MISSING;
}

int ecxi_cache_lookup(ecxi_cache *c, const char *key, size_t key_len, ecxi_cache_info *info)
{
    if (!c || !key_ok(key, key_len)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    if (e && info) info_of(c, e, info);
    pthread_mutex_unlock(&c->mu);
    return e ? 0 : ECX_ECACHE_MISSING;
}

int ecxi_cache_runs(ecxi_cache *c, const char *key, size_t key_len, ecxi_cache_run *runs, size_t cap,
                   size_t *n_runs)
{
    if (!c || !key_ok(key, key_len) || (cap && !runs)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    if (!e) {
        rc = ECX_ECACHE_MISSING;
    } else {
        size_t i = 0;
        for (uint32_t s = e->head; s != NIL; s = c->b[s].next, i++)
            if (i < cap) runs[i] = (ecxi_cache_run){s, c->b[s].len};
        if (n_runs) *n_runs = i;
        if (i > cap) rc = ECX_ERANGE; /* runs[0..cap) hold the first ones */
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ecxi_cache_blocks(ecxi_cache *c, const char *key, size_t key_len, int64_t *out, size_t cap,
                     size_t *n_blocks)
{
    if (!c || !key_ok(key, key_len) || (cap && !out)) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    struct entry *e = find_locked(c, key, key_len, NULL, NULL);
    if (!e) {
        rc = ECX_ECACHE_MISSING;
    } else {
        if (n_blocks) *n_blocks = e->n_blocks;
        if (cap < e->n_blocks)
            rc = ECX_ERANGE;
        else
            blocks_of(c, e, out);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void ecxi_cache_rekey(ecxi_cache *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    tab_rekey(c);
    pthread_mutex_unlock(&c->mu);
}

void ecxi_cache_get_stats(ecxi_cache *c, ecxi_cache_stats *st)
{
    if (!c || !st) return;
    pthread_mutex_lock(&c->mu);
    *st = (ecxi_cache_stats){
        .num_blocks = c->n,
        .free_blocks = c->free_blocks,
        .evictable_blocks = c->evictable_blocks,
        .not_ready_blocks = c->not_ready_blocks,
        .free_runs = c->free_runs,
        .entries = c->n_entries,
        .not_ready = c->n_not_ready,
        .ready = c->n_ready,
        .pinned = c->n_pinned,
        .evictable = c->n_evictable,
        .reserves = c->reserves,
        .reserve_full = c->reserve_full,
        .evictions = c->evictions,
        .dropped = c->dropped,
    };
    /* owned is counted from the entries in ecxi_cache_check(); here it is
     * what the allocator says is not free. */
    st->owned_blocks = c->n - c->free_blocks;
    pthread_mutex_unlock(&c->mu);
}

/* ---- self-check ------------------------------------------------------ */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            ecxi_log(ECX_LOG_ERROR, "cache check: " __VA_ARGS__);                                  \
            rc = ECX_ERANGE;                                                                       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* In-order walk of the treap: count nodes, check order, heap, and that each
 * node is a free-run start. Returns -1 on a violation. */
static int64_t check_treap(const ecxi_cache *c, uint32_t t, uint32_t *prev, bool *have_prev,
                           int depth)
{
    if (t == NIL) return 0;
    if (depth > 4096 || t >= c->n) return -1;
    uint32_t kids[2] = {c->b[t].left, c->b[t].right};
    for (int i = 0; i < 2; i++)
        if (kids[i] != NIL && (kids[i] >= c->n || prio(c, kids[i]) > prio(c, t))) return -1;
    int64_t l = check_treap(c, c->b[t].left, prev, have_prev, depth + 1);
    if (l < 0) return -1;
    uint32_t len = c->b[t].len;
    if (len == 0 || (uint64_t)t + len > c->n || c->b[t + len - 1].fend != t) return -1;
    if (*have_prev && !key_less(c->b[*prev].len, *prev, len, t)) return -1;
    *prev = t;
    *have_prev = true;
    int64_t r = check_treap(c, c->b[t].right, prev, have_prev, depth + 1);
    if (r < 0) return -1;
    return l + r + 1;
}

int ecxi_cache_check(ecxi_cache *c)
{
    if (!c) return ECX_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    uint8_t *claimed = calloc(c->n, 1); /* 1: owned-run start, 2: claimed by an entry */
    if (!claimed) {
        pthread_mutex_unlock(&c->mu);
        return ECX_ENOMEM;
    }
    /* 1. The runs tile [0, n): walk them in address order. */
    uint64_t free_blocks = 0, free_runs = 0, owned_blocks = 0, owned_runs = 0;
    bool prev_free = false;
    for (uint32_t b = 0; b < c->n;) {
        uint32_t len = c->b[b].len;
        CHECK(len > 0 && (uint64_t)b + len <= c->n, "block %u starts no run", b);
        for (uint32_t i = 1; i < len; i++)
            CHECK(c->b[b + i].len == 0, "block %u inside a run has a length", b + i);
        for (uint32_t i = 0; i + 1 < len; i++)
            CHECK(c->b[b + i].fend == NIL, "block %u inside a run has an end tag", b + i);
        bool is_free = c->b[b + len - 1].fend == b;
        CHECK(is_free || c->b[b + len - 1].fend == NIL, "run %u has a stray end tag", b);
        if (is_free) {
            CHECK(!prev_free, "free runs not merged at %u", b);
            free_blocks += len, free_runs++;
        } else {
            claimed[b] = 1;
            owned_blocks += len, owned_runs++;
        }
        prev_free = is_free;
        b += len;
    }
    CHECK(free_blocks == c->free_blocks, "free blocks %llu, counter %llu",
          (unsigned long long)free_blocks, (unsigned long long)c->free_blocks);
    CHECK(free_runs == c->free_runs, "free runs %llu, counter %llu", (unsigned long long)free_runs,
          (unsigned long long)c->free_runs);
    CHECK(free_blocks + owned_blocks == c->n, "free + owned != total");

    /* 2. The treap holds exactly the free runs, in order. */
    uint32_t prev = NIL;
    bool have_prev = false;
    int64_t nodes = check_treap(c, c->root, &prev, &have_prev, 0);
    CHECK(nodes >= 0 && (uint64_t)nodes == free_runs, "treap broken (%lld nodes, %llu runs)",
          (long long)nodes, (unsigned long long)free_runs);

    /* 3. Entries: runs ascending, each an owned run claimed once; counts. */
    uint64_t nr_blocks = 0, ents = 0, nr = 0, rd = 0, pinned = 0, evictable_sum = 0, fifo_len = 0, e_blocks = 0,
             e_runs = 0;
    uint64_t cap = c->ents_used, unused = 0;
    for (uint32_t id = 0; id < cap; id++) {
        const struct entry *e = &c->ents[id];
        if (e->state == SLOT_UNUSED) {
            unused++;
            continue;
        }
        ents++;
        if (e->state == ST_READY)
            rd++;
        else
            nr++, nr_blocks += e->n_blocks;
        if (e->pins) pinned++;
        bool should_fifo = e->state == ST_READY && e->pins == 0;
        if (should_fifo) evictable_sum += e->n_blocks, fifo_len++;
        uint64_t blocks = 0, runs = 0;
        uint64_t last_end = 0;
        for (uint32_t s = e->head; s != NIL; s = c->b[s].next) {
            CHECK(s < c->n && claimed[s] == 1, "entry %u run %u not an unclaimed owned run", id, s);
            CHECK(runs == 0 || s > last_end, "entry %u runs not ascending / adjacent", id);
            claimed[s] = 2;
            blocks += c->b[s].len, runs++;
            last_end = (uint64_t)s + c->b[s].len;
        }
        CHECK(blocks == e->n_blocks && blocks > 0, "entry %u block/run counts wrong", id);
        e_blocks += blocks, e_runs += runs;
        char buf[KEY_HEX_MAX];
        const char *key = key_view(e, buf);
        CHECK(e->key_kind == key_kind_of(key, e->key_len), "entry %u key form wrong", id);
        CHECK(tab_find(c, key_hash(c, key, e->key_len), key, e->key_len) == id,
              "entry %u not in table", id);
    }
    CHECK(e_blocks == owned_blocks && e_runs == owned_runs, "owned runs not all claimed");
    CHECK(ents == c->n_entries && nr == c->n_not_ready && rd == c->n_ready && pinned == c->n_pinned,
          "entry counters wrong");
    CHECK(evictable_sum == c->evictable_blocks, "evictable blocks counter wrong");
    CHECK(nr_blocks == c->not_ready_blocks, "not-ready blocks counter wrong");

    /* 4. The table holds exactly the live entries. */
    uint64_t slots = 0;
    for (uint64_t i = 0; i <= c->tab_mask; i++) {
        uint32_t id = c->tab[i].id;
        if (id == NIL) continue;
        slots++;
        CHECK(id < cap && c->ents[id].state != SLOT_UNUSED, "table slot dangles");
        char buf[KEY_HEX_MAX];
        const struct entry *e = &c->ents[id];
        CHECK(c->tab[i].h == key_hash(c, key_view(e, buf), e->key_len), "table hash wrong");
    }
    CHECK(slots == ents && slots * 2 <= (uint64_t)c->tab_mask + 1, "table count/load wrong");
    uint64_t listed = 0;
    for (uint32_t id = c->free_ent; id != NIL && listed <= unused; id = c->ents[id].next, listed++)
        CHECK(id < cap && c->ents[id].state == SLOT_UNUSED, "free id list holds a live entry");
    CHECK(listed == unused, "free id list has %llu of %llu unused ids", (unsigned long long)listed,
          (unsigned long long)unused);

    /* 5. The FIFO, both directions. */
    uint64_t walked = 0;
    uint32_t back = NIL;
    for (uint32_t id = c->fifo_head; id != NIL; id = c->ents[id].next) {
        CHECK(id < cap && evictable(&c->ents[id]) && c->ents[id].prev == back, "FIFO links broken");
        back = id;
        CHECK(++walked <= fifo_len, "FIFO longer than the evictable set");
    }
    CHECK(walked == fifo_len && back == c->fifo_tail, "FIFO length/tail wrong");
    CHECK(c->n_evictable == fifo_len, "evictable count wrong");
done:
    free(claimed);
    pthread_mutex_unlock(&c->mu);
    return rc;
}
