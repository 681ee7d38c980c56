/* SPDX-License-Identifier: Apache-2.0 */
/*
 * producer — grants, leases and completion notifications of the producer
 * session. See producer.h for the rules; this file is their mechanics.
 */
#include "producer.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "session_id.h"
#include "table.h"
#include "wire.h"

/* Grant tokens drawn from the system's CSPRNG in one call. */
#define TOKEN_BATCH 64

/* Longest ZeroMQ routing id (libzmq allows 255 bytes). */
#define IDENTITY_MAX 255

struct conn;

typedef struct grant {
    ecxi_table_node node;       /* keyed by key[0..key_len) */
    struct grant *prev, *next; /* lease queue, oldest first; next = free list */
    struct grant *cprev, *cnext; /* the owner's grants, oldest first */
    struct conn *owner; /* the connection that asked */
    int64_t expires_ms;
    uint64_t nbytes;
    uint64_t *blocks; /* item order; the buffer stays with the record when pooled */
    size_t n_blocks, blocks_cap;
    bool claimed; /* its bytes were handed to the data plane once */
    bool sending; /* claimed, and the path has not reported the send's end: it may
                     still read the blocks (data.h, ECXI_DATA_GRANT_CLAIM) */
    bool tokenless; /* answered in NIXL's form: no token to check (data.h) */
    uint32_t cache_ref; /* the pinned cache entry (ecxi_cache_unpin_ref) */
    bool pin_moved;     /* its pin went to its re-grant: releasing it unpins nothing */
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint32_t hash_off; /* mm_hash starts at key + hash_off */
    uint32_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1]; /* "{session_id}:{mm_hash}" */
} grant;

/* What one connection (routing id) holds; exists while it holds a grant. */
typedef struct conn {
    ecxi_table_node node;         /* keyed by identity[0..identity_len) */
    struct conn *bprev, *bnext;  /* by_count[count] list; bnext = free list */
    grant *oldest, *newest;      /* its grants, oldest first */
    uint32_t count;              /* grants */
    uint64_t blocks;             /* blocks its grants pin */
    uint8_t identity_len;
    uint8_t identity[IDENTITY_MAX];
} conn;

struct ecxi_producer {
    /* The last session id of ecx's length checked by
     * ecxi_session_id_is_ecx, and its answer (a consumer sends one id). */
    bool sid_memo, sid_memo_ecx;
    char sid_memo_id[ECXI_SESSION_ID_LEN];
    ecxi_cache *cache;
    ecxi_data *data;
    ecxi_ctrl_server *srv;
    ecxi_producer_opts o;
    char compat[ECX_COMPAT_HASH_HEX + 1];
    size_t compat_len;
    ecxi_producer_stats st;

    ecxi_table grants;
    grant *oldest, *newest; /* lease queue */
    grant *free_list;       /* pooled records */
    grant *draining;        /* let go while their send ran: pinned until it ends (next) */
    bool closing;           /* ecxi_producer_free: nothing is sent any more */
    uint64_t pin_total;     /* blocks pinned in the region that grants may take */

    ecxi_table conns;     /* routing id -> conn, for connections holding grants */
    conn *conn_free;     /* pooled conn records */
    conn **by_count;     /* [1..max_conn_grants]: conns holding that many grants */
    conn *last_conn;     /* the record conn_find found last (in conns), or NULL */
    uint32_t max_count;  /* highest non-empty by_count slot (0: none) */
    uint64_t pin_limit;  /* blocks one connection's pins may cover */

    ecxi_ctrl_msg msg;    /* reused for every request */
    msgpack_sbuffer out; /* reused for every ack */
    int64_t *idx;        /* reused block-index buffer */
    size_t idx_cap;
    uint8_t desc[ECXI_DATA_DESC_MAX]; /* reused mem_descriptor of an ack */
    /* Grant tokens are drawn from libsodium TOKEN_BATCH at a time (one
     * getrandom per batch, not per grant); each is wiped once handed out. */
    uint8_t tokens[TOKEN_BATCH * ECXI_DATA_TOKEN_LEN];
    size_t tokens_left;
};

/* ---------- grant table ---------- */

/* A fresh random token (see ecxi_producer.tokens). */
static void new_token(ecxi_producer *p, uint8_t out[ECXI_DATA_TOKEN_LEN])
{
    if (p->tokens_left == 0) {
        randombytes_buf(p->tokens, sizeof p->tokens);
        p->tokens_left = TOKEN_BATCH;
    }
    uint8_t *t = p->tokens + --p->tokens_left * ECXI_DATA_TOKEN_LEN;
    memcpy(out, t, ECXI_DATA_TOKEN_LEN);
    sodium_memzero(t, ECXI_DATA_TOKEN_LEN);
}

static grant *grant_find(const ecxi_producer *p, const char *key, size_t len)
{
    ecxi_table_node *n = ecxi_table_find(&p->grants, key, len);
    return n ? ECXI_CONTAINER_OF(n, grant, node) : NULL;
}

/* The same for a key already hashed (h = ecxi_table_hash(&p->grants, ...)). */
static grant *grant_find_hashed(const ecxi_producer *p, uint64_t h, const char *key, size_t len)
{
    ecxi_table_node *n = ecxi_table_find_hashed(&p->grants, h, key, len);
    return n ? ECXI_CONTAINER_OF(n, grant, node) : NULL;
}

/* ---------- connections ---------- */

static void bucket_out(ecxi_producer *p, conn *c)
{
    if (!c->count) return;
    if (c->bprev)
        c->bprev->bnext = c->bnext;
    else
        p->by_count[c->count] = c->bnext;
    if (c->bnext) c->bnext->bprev = c->bprev;
}

static void bucket_in(ecxi_producer *p, conn *c)
{
    if (c->count) {
        c->bprev = NULL, c->bnext = p->by_count[c->count];
        if (c->bnext) c->bnext->bprev = c;
        p->by_count[c->count] = c;
        if (c->count > p->max_count) p->max_count = c->count;
    }
    while (p->max_count && !p->by_count[p->max_count])
        p->max_count--;
}

/* A connection's requests tend to come in runs, so the last record found
 * is tried first (an exact compare of the routing id, then the table). */
static conn *conn_find(ecxi_producer *p, const uint8_t *id, size_t len)
{
    conn *c = p->last_conn;
    if (c && c->identity_len == len && memcmp(c->identity, id, len) == 0) return c;
    ecxi_table_node *n = ecxi_table_find(&p->conns, (const char *)id, len);
    if (!n) return NULL;
    return p->last_conn = ECXI_CONTAINER_OF(n, conn, node);
}

/* The record of the connection that sent p->msg, created (from the pool) if
 * it holds nothing yet; NULL if memory runs out. */
static conn *conn_get(ecxi_producer *p)
{
    conn *c = conn_find(p, p->msg.identity, p->msg.identity_len);
    if (c) return c;
    if ((c = p->conn_free))
        p->conn_free = c->bnext;
    else if (!(c = calloc(1, sizeof *c)))
        return NULL;
    c->identity_len = (uint8_t)p->msg.identity_len;
    memcpy(c->identity, p->msg.identity, p->msg.identity_len);
    c->node.key = (const char *)c->identity;
    c->node.key_len = c->identity_len;
    c->oldest = c->newest = NULL;
    c->count = 0, c->blocks = 0;
    ecxi_table_insert(&p->conns, &c->node);
    return c;
}

/* Back to the pool once it holds nothing. */
static void conn_put(ecxi_producer *p, conn *c)
{
    if (c->count) return;
    if (p->last_conn == c) p->last_conn = NULL;
    ecxi_table_remove(&p->conns, &c->node);
    c->bnext = p->conn_free, p->conn_free = c;
}

/* Take g off its connection, the grant table and the lease queue; it is
 * no longer active (its pin is the caller's business). */
static void grant_detach(ecxi_producer *p, grant *g)
{
    conn *c = g->owner;
    if (g->cprev)
        g->cprev->cnext = g->cnext;
    else
        c->oldest = g->cnext;
    if (g->cnext)
        g->cnext->cprev = g->cprev;
    else
        c->newest = g->cprev;
    bucket_out(p, c);
    c->count--;
    c->blocks -= g->n_blocks;
    bucket_in(p, c);
    conn_put(p, c);
    ecxi_table_remove(&p->grants, &g->node);
    if (g->prev)
        g->prev->next = g->next;
    else
        p->oldest = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        p->newest = g->prev;
    p->st.active_grants--;
}

static void grant_unpin(ecxi_producer *p, grant *g)
{
    if (g->pin_moved) return;
    int rc = ecxi_cache_unpin_ref(p->cache, g->cache_ref);
    if (rc)
        ecxi_log(ECX_LOG_ERROR, "producer: unpin of a granted entry failed: %s", ecx_strerror(rc));
}

/* Drop a grant and the pin it holds. A grant whose send may still be
 * reading its blocks (sending) keeps the pin: the path cuts the send, and
 * the record waits on p->draining, out of every table and off its lease,
 * until the path reports the send's end (drain_end). Only then may a save
 * reuse the blocks, so a slow reader never gets another item's bytes. */
static void grant_release(ecxi_producer *p, grant *g)
{
    grant_detach(p, g);
    if (g->sending && !p->closing &&
        ecxi_data_cut(p->data, g->key, g->key_len, g->token) > 0) {
        p->st.cut_sends++;
        p->st.draining_grants++;
        g->next = p->draining, p->draining = g;
        return;
    }
    grant_unpin(p, g);
    g->next = p->free_list, p->free_list = g;
}

/* A completion for a grant already let go: if it names a draining grant
 * (key and token), its send has ended and its pin goes now. */
static bool drain_end(ecxi_producer *p, const char *key, size_t len,
                      const uint8_t token[ECXI_DATA_TOKEN_LEN])
{
    for (grant **pp = &p->draining; *pp; pp = &(*pp)->next) {
        grant *g = *pp;
        if (g->key_len != len || memcmp(g->key, key, len) ||
            sodium_memcmp(g->token, token, ECXI_DATA_TOKEN_LEN) != 0)
            continue;
        *pp = g->next;
        p->st.draining_grants--;
        grant_unpin(p, g);
        g->next = p->free_list, p->free_list = g;
        return true;
    }
    return false;
}

/* A grant record for blocks p->idx[0..n) of the cache entry pinned as ref,
 * keyed "sid:hash" whose hash in the grant table is kh, from the pool;
 * NULL if memory runs out. */
static grant *grant_add(ecxi_producer *p, conn *c, ecx_span sid, ecx_span hash, uint64_t kh,
                        size_t n, uint64_t nbytes, uint32_t ref, int64_t now)
{
    grant *g = p->free_list;
    if (g) {
        p->free_list = g->next;
    } else if (!(g = calloc(1, sizeof *g))) {
        return NULL;
    }
    if (n > g->blocks_cap) {
        uint64_t *b = realloc(g->blocks, n * sizeof *b);
        if (!b) {
            g->next = p->free_list, p->free_list = g;
            return NULL;
        }
        g->blocks = b, g->blocks_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        g->blocks[i] = (uint64_t)p->idx[i];
    g->n_blocks = n;
    g->nbytes = nbytes;
    g->cache_ref = ref;
    g->pin_moved = false;
    g->claimed = false;
    g->sending = false;
    new_token(p, g->token);
    memcpy(g->key, sid.p, sid.n);
    g->key[sid.n] = ':';
    memcpy(g->key + sid.n + 1, hash.p, hash.n);
    g->hash_off = (uint32_t)(sid.n + 1);
    g->key_len = (uint32_t)(sid.n + 1 + hash.n);
    g->key[g->key_len] = 0;
    g->expires_ms = now + p->o.lease_ms;
    g->node.key = g->key;
    g->node.key_len = g->key_len;
    ecxi_table_insert_hashed(&p->grants, &g->node, kh);
    g->prev = p->newest, g->next = NULL;
    if (p->newest)
        p->newest->next = g;
    else
        p->oldest = g;
    p->newest = g;
    g->owner = c;
    g->cprev = c->newest, g->cnext = NULL;
    if (c->newest)
        c->newest->cnext = g;
    else
        c->oldest = g;
    c->newest = g;
    bucket_out(p, c);
    c->count++;
    c->blocks += n;
    bucket_in(p, c);
    p->st.active_grants++;
    return g;
}

/* ---------- lifecycle ---------- */

static int grant_check(void *arg, const char *key, size_t key_len,
                       const uint8_t token[ECXI_DATA_TOKEN_LEN], int flags, ecxi_data_grant *out);

int ecxi_producer_new(ecxi_cache *cache, ecxi_data *data, ecxi_ctrl_server *srv,
                     const ecxi_producer_opts *opts, ecxi_producer **out)
{
    if (!cache || !data || !srv || !opts || !opts->compat_hash || !out) return ECX_EINVAL;
    size_t cl = strlen(opts->compat_hash);
    if (cl > ECX_COMPAT_HASH_HEX) return ECX_EINVAL;
    ecxi_producer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    p->cache = cache, p->data = data, p->srv = srv, p->o = *opts;
    if (p->o.lease_ms <= 0) p->o.lease_ms = ECX_DEFAULT_LEASE_MS;
    if (p->o.connector_version == 0) p->o.connector_version = ECX_CONNECTOR_VERSION;
    if (p->o.max_grants == 0) p->o.max_grants = ECX_DEFAULT_MAX_GRANTS;
    if (p->o.max_conn_grants == 0) p->o.max_conn_grants = ECX_DEFAULT_MAX_CONN_GRANTS;
    if (p->o.max_conn_grants > p->o.max_grants) p->o.max_conn_grants = p->o.max_grants;
    if (p->o.max_conn_pin_pct == 0) p->o.max_conn_pin_pct = ECX_DEFAULT_MAX_CONN_PIN_PCT;
    if (p->o.max_conn_pin_pct > 100) p->o.max_conn_pin_pct = 100;
    ecxi_cache_stats cst;
    ecxi_cache_get_stats(cache, &cst);
    p->pin_limit = cst.num_blocks * p->o.max_conn_pin_pct / 100;
    if (p->pin_limit == 0) p->pin_limit = 1;
    if (p->o.max_pin_pct == 0) p->o.max_pin_pct = ECX_DEFAULT_MAX_PIN_PCT;
    if (p->o.max_pin_pct > 100) p->o.max_pin_pct = 100;
    p->pin_total = cst.num_blocks * p->o.max_pin_pct / 100;
    memcpy(p->compat, opts->compat_hash, cl + 1);
    p->compat_len = cl;
    p->o.compat_hash = p->compat;
    p->idx_cap = 1024;
    p->idx = malloc(p->idx_cap * sizeof *p->idx);
    p->by_count = calloc((size_t)p->o.max_conn_grants + 1, sizeof *p->by_count);
    int rc = p->idx && p->by_count ? ecxi_table_init(&p->grants) : ECX_ENOMEM;
    if (!rc && (rc = ecxi_table_init(&p->conns))) ecxi_table_fini(&p->grants);
    if (rc) {
        free(p->by_count), free(p->idx), free(p);
        return rc;
    }
    ecxi_ctrl_msg_init(&p->msg);
    msgpack_sbuffer_init(&p->out);
    ecxi_data_set_grant_fn(data, grant_check, p);
    *out = p;
    return 0;
}

void ecxi_producer_free(ecxi_producer *p)
{
    if (!p) return;
    ecxi_data_set_grant_fn(p->data, NULL, NULL);
    p->closing = true; /* the data plane is polled no more: nothing reads the blocks */
    while (p->oldest)
        grant_release(p, p->oldest);
    while (p->draining) {
        grant *g = p->draining;
        p->draining = g->next;
        grant_unpin(p, g);
        g->next = p->free_list, p->free_list = g;
    }
    for (grant *g = p->free_list, *n; g; g = n) {
        n = g->next;
        free(g->blocks);
        free(g);
    }
    ecxi_ctrl_msg_fini(&p->msg);
    msgpack_sbuffer_destroy(&p->out);
    for (conn *c = p->conn_free, *n; c; c = n) {
        n = c->bnext;
        free(c);
    }
    ecxi_table_fini(&p->grants);
    ecxi_table_fini(&p->conns);
    free(p->by_count);
    free(p->idx);
    sodium_memzero(p->tokens, sizeof p->tokens);
    free(p);
}

int64_t ecxi_producer_next_timeout(const ecxi_producer *p)
{
    if (!p->oldest) return -1;
    int64_t due = p->oldest->expires_ms - ecxi_now_ms(p->o.clock);
    return due < 0 ? 0 : due;
}

ecxi_producer_stats ecxi_producer_get_stats(const ecxi_producer *p)
{
    return p->st;
}

/* ---------- requests ---------- */

static void reply_to(ecxi_producer *p, const ecx_ack *a, bool strs_decoded)
{
    int rc = ecxi_wire_encode_ack_of(a, strs_decoded, &p->out);
    if (!rc) rc = ecxi_ctrl_server_reply(p->srv, &p->msg, p->out.data, p->out.size);
    if (rc) {
        p->st.reply_failed++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: ack not sent: %s", ecx_strerror(rc));
    }
}

static void nack(ecxi_producer *p, ecx_span hash, int status, const char *why)
{
    p->st.nacks[status]++;
    /* Expected outcomes are info, the rest warnings (docs/PROTOCOL.md §3). */
    int level = status == ECX_STATUS_NACK_MISSING || status == ECX_STATUS_NACK_NOT_READY
                    ? ECX_LOG_INFO
                    : ECX_LOG_WARN;
    ECXI_LOG_RATELIMITED(level, "producer: %s for %.*s: %s", ecx_status_name(status),
                        (int)(hash.n > 80 ? 80 : hash.n), hash.p, why);
    ecx_ack a;
    ecx_ack_init(&a);
    a.mm_hash = hash;
    a.status = status;
    reply_to(p, &a, false);
}

/* ecxi_session_id_is_ecx, with the answer for the last id of ecx's length
 * kept: a consumer sends one id. */
static bool session_is_ecx(ecxi_producer *p, ecx_span sid)
{
    if (sid.n != ECXI_SESSION_ID_LEN) return ecxi_session_id_is_ecx(sid.p, sid.n);
    if (!p->sid_memo || memcmp(sid.p, p->sid_memo_id, ECXI_SESSION_ID_LEN) != 0) {
        memcpy(p->sid_memo_id, sid.p, ECXI_SESSION_ID_LEN);
        p->sid_memo_ecx = ecxi_session_id_is_ecx(sid.p, sid.n);
        p->sid_memo = true;
    }
    return p->sid_memo_ecx;
}

/* Pin the entry if it is ready and copy its block indices into p->idx,
 * growing it if needed (ecxi_cache_pin_ready_blocks). */
static int pin_blocks(ecxi_producer *p, ecx_span hash, ecxi_cache_info *info, size_t *n,
                      uint32_t *ref)
{
    int rc = ecxi_cache_pin_ready_blocks(p->cache, hash.p, hash.n, info, p->idx, p->idx_cap, n, ref);
    if (rc != ECX_ERANGE) return rc;
    int64_t *bigger = realloc(p->idx, *n * sizeof *bigger);
    if (!bigger) return ECX_ENOMEM;
    p->idx = bigger, p->idx_cap = *n;
    return ecxi_cache_pin_ready_blocks(p->cache, hash.p, hash.n, info, p->idx, p->idx_cap, n, ref);
}

static void serve(ecxi_producer *p, const ecx_req *r, int64_t now)
{
    if (r->connector_version != p->o.connector_version) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_VERSION, "connector version differs");
        return;
    }
    if (r->compatibility_hash.n != p->compat_len ||
        memcmp(r->compatibility_hash.p, p->compat, p->compat_len)) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_INCOMPAT, "compatibility hash differs");
        return;
    }
    if (r->session_id.n == 0) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "request has no session_id");
        return;
    }
    if (r->mm_hash.n == 0 || r->mm_hash.n > ECX_MM_HASH_MAX) {
        /* No entry has such a key (the cache holds 1..ECX_MM_HASH_MAX). */
        nack(p, r->mm_hash, ECX_STATUS_NACK_MISSING, "mm_hash empty or too long");
        return;
    }
    if (r->session_id.n + 1 + r->mm_hash.n > ECXI_DATA_NOTIF_MAX) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "session_id:mm_hash too long");
        return;
    }

    /* The grant's key, hashed once: for the lookup and for the insert. */
    char key[ECXI_DATA_NOTIF_MAX];
    size_t key_len = r->session_id.n + 1 + r->mm_hash.n;
    memcpy(key, r->session_id.p, r->session_id.n);
    key[r->session_id.n] = ':';
    memcpy(key + r->session_id.n + 1, r->mm_hash.p, r->mm_hash.n);
    uint64_t kh = ecxi_table_hash(&p->grants, key, key_len);
    grant *old = grant_find_hashed(p, kh, key, key_len);
    conn *c = conn_find(p, p->msg.identity, p->msg.identity_len);
    if (old && old->owner != c) {
        /* Only the connection that holds a grant may replace it. */
        p->st.foreign_requests++;
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "grant held by another connection");
        return;
    }
    /* A re-grant's entry is the one the old grant pins (the same mm_hash):
     * the old grant's pin passes to the new one (an unpin and a pin of one
     * entry change nothing in the cache), and the entry is read by that
     * pin's reference, so the key is neither hashed nor compared. The pin
     * counts read are those the release and a new pin would leave. Not for
     * a grant whose send drains (its pin stays until that send ends). */
    size_t n = 0;
    ecxi_cache_info info;
    uint32_t ref = 0;
    bool repinned = old && !old->sending &&
                    ecxi_cache_held_ready_blocks(p->cache, old->cache_ref, &info, p->idx,
                                                 p->idx_cap, &n) == 0;
    if (repinned) ref = old->cache_ref, old->pin_moved = true;
    if (old) { /* the consumer asked again: its old pin goes first */
        grant_release(p, old);
        p->st.regrants++;
        if (c->count == 0) c = NULL; /* pooled with its last grant */
    }
    /* Per-connection cap, then the shared table (see producer.h). */
    uint32_t held = c ? c->count : 0;
    if (held >= p->o.max_conn_grants) {
        if (repinned) ecxi_cache_unpin_ref(p->cache, ref);
        p->st.refused_conn_grants++;
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "connection holds too many grants");
        return;
    }
    bool evict = false;
    if (p->st.active_grants >= p->o.max_grants) {
        size_t conns = p->conns.count + (c ? 0 : 1);
        uint64_t fair = p->o.max_grants / conns;
        if (held >= (fair ? fair : 1)) {
            if (repinned) ecxi_cache_unpin_ref(p->cache, ref);
            p->st.refused_conn_grants++;
            nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "too many active grants");
            return;
        }
        evict = true; /* below its share: the heaviest connection makes room */
    }

    /* One cache lookup pins the entry and reads its size, checksum and
     * blocks; the grant then unpins it by reference. */
    grant *g = NULL;
    int rc = repinned ? 0 : pin_blocks(p, r->mm_hash, &info, &n, &ref);
    if (rc == ECX_ECACHE_MISSING || rc == ECX_EINVAL) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_MISSING, "not held");
        return;
    }
    if (rc == ECX_ECACHE_NOT_READY) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_NOT_READY, "save not landed yet");
        return;
    }
    if (rc) {
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, ecx_strerror(rc));
        return;
    }
    /* A connection's pins stay within its share of the region, except that
     * one holding none may always take one item (else a big item could
     * never be served). */
    if (c && c->blocks && c->blocks + info.n_blocks > p->pin_limit) {
        ecxi_cache_unpin_ref(p->cache, ref);
        p->st.refused_conn_pins++;
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, "connection pins too many blocks");
        return;
    }
    /* Pins in all stay within max_pin_pct of the region, so saves find
     * room (producer.h). Only a first pin of an entry takes room away. */
    if (info.pins == 1) {
        uint64_t pinned = info.pinned_blocks; /* read with the pin, under its lock */
        if (pinned > p->pin_total && pinned > info.n_blocks) {
            ecxi_cache_unpin_ref(p->cache, ref);
            p->st.refused_pins++;
            nack(p, r->mm_hash, ECX_STATUS_NACK_NOT_READY,
                 "pins would pass the region's share (max_pin_pct); retry later");
            return;
        }
    }
    if (evict && p->max_count) {
        conn *heavy = p->by_count[p->max_count];
        p->st.evicted_grants++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                            "producer: grant table full; released the oldest grant of a "
                            "connection holding %u",
                            heavy->count);
        grant_release(p, heavy->oldest);
    }
    if (!c) c = conn_get(p);
    if (c) g = grant_add(p, c, r->session_id, r->mm_hash, kh, n, info.size_bytes, ref, now);
    if (c && !g) conn_put(p, c); /* a record created for nothing goes back */
    /* What the ack carries: a nixl producer answers an ecx consumer in
     * ecx's own form, anyone else tokenless (data.h, ecxi_data_grant_ack). */
    ecxi_data_ack da;
    rc = ECX_ENOMEM;
    if (g) {
        ecxi_data_ticket t = {.checksum = info.checksum,
                             .nbytes = info.size_bytes,
                             .lease_ms = (uint32_t)p->o.lease_ms};
        memcpy(t.token, g->token, sizeof t.token);
        rc = ecxi_data_grant_ack(p->data, session_is_ecx(p, r->session_id), &t, p->desc,
                                 sizeof p->desc, &da);
    }
    if (rc) {
        if (g)
            grant_release(p, g);
        else
            ecxi_cache_unpin_ref(p->cache, ref);
        nack(p, r->mm_hash, ECX_STATUS_NACK_INTERNAL, ecx_strerror(rc));
        return;
    }
    g->tokenless = da.tokenless;
    p->st.nixl_grants += da.tokenless;
    ecx_ack a;
    ecx_ack_init(&a);
    a.mm_hash = r->mm_hash;
    a.status = ECX_STATUS_OK;
    a.session_id = r->session_id;
    a.n_indices = n;
    a.indices = p->idx;
    a.agent_metadata = (ecx_span){(const char *)da.meta, da.meta_len};
    a.mem_descriptor = (ecx_span){(const char *)da.desc, da.desc_len};
    uint64_t failed_before = p->st.reply_failed;
    reply_to(p, &a, true); /* its strs are r's: ecx_wire_decode_req_v checked their UTF-8 */
    if (p->st.reply_failed != failed_before) {
        grant_release(p, g); /* nobody will read it */
        return;
    }
    p->st.grants++;
}

/* The data plane asks before anything leaves (data.h): a live grant with
 * this key and token, claimed at most once. */
static int grant_check(void *arg, const char *key, size_t key_len,
                       const uint8_t token[ECXI_DATA_TOKEN_LEN], int flags, ecxi_data_grant *out)
{
    ecxi_producer *p = arg;
    grant *g = grant_find(p, key, key_len);
    if (!g || g->tokenless || sodium_memcmp(g->token, token, ECXI_DATA_TOKEN_LEN) != 0 ||
        ((flags & ECXI_DATA_GRANT_CLAIM) && g->claimed)) {
        p->st.refused_reads++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: refused a data-plane request for %s",
                            g ? (g->claimed ? "a grant already served" : "a grant (wrong token)")
                              : "no grant");
        return ECX_EDATA_GRANT;
    }
    if (flags & ECXI_DATA_GRANT_CLAIM) g->claimed = g->sending = true;
    out->blocks = g->blocks;
    out->n = g->n_blocks;
    out->nbytes = g->nbytes;
    return 0;
}

static void on_notif(void *arg, const char *key, size_t len,
                     const uint8_t token[ECXI_DATA_TOKEN_LEN], int status)
{
    ecxi_producer *p = arg;
    grant *g = len <= ECXI_DATA_NOTIF_MAX ? grant_find(p, key, len) : NULL;
    /* The end of a send cut when its grant was let go (the key may name a
     * new grant by now, with another token). */
    if (token && p->draining && (!g || sodium_memcmp(g->token, token, ECXI_DATA_TOKEN_LEN)) &&
        drain_end(p, key, len, token))
        return;
    if (!g) {
        p->st.unknown_notifs++;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "producer: notification for no grant (%zu bytes)", len);
        return;
    }
    /* Only the grant's holder knows its token: release nothing. A grant
     * answered in NIXL's form (one-sided) has none to check; one answered
     * in ecx's form needs it, whichever path the notification came by. */
    if (token ? sodium_memcmp(g->token, token, ECXI_DATA_TOKEN_LEN) != 0 : !g->tokenless) {
        p->st.forged_notifs++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: notification with a wrong token ignored");
        return;
    }
    if (status) {
        p->st.send_failed++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: sending %s failed: %s", key + g->hash_off,
                            ecx_strerror(status));
    } else {
        p->st.completions++;
        p->st.bytes_served += g->nbytes;
    }
    grant_release(p, g);
}

int ecxi_producer_poll(ecxi_producer *p)
{
    int events = 0;
    int64_t now = ecxi_now_ms(p->o.clock);
    for (int i = 0; i < ECXI_PRODUCER_REQUESTS_PER_POLL && ecxi_ctrl_server_recv(p->srv, &p->msg) == 1; i++, events++) {
        p->st.requests++;
        ecx_req r;
        int rc = ecx_wire_decode_req_v(p->msg.payload, p->msg.payload_len,
                                       p->o.connector_version, &r);
        if (rc) {
            p->st.malformed++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: dropped undecodable request: %s",
                                ecx_strerror(rc));
            continue;
        }
        serve(p, &r, now);
    }
    int n = ecxi_data_poll_notifs(p->data, on_notif, p);
    if (n > 0) events += n;
    while (p->oldest && p->oldest->expires_ms <= now) {
        grant *g = p->oldest;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "producer: lease expired for %.*s; %s",
                            (int)(g->key_len - g->hash_off > 120 ? 120 : g->key_len - g->hash_off),
                            g->key + g->hash_off,
                            g->sending ? "its send is cut, then unpinned" : "unpinned");
        p->st.expired_leases++;
        grant_release(p, g);
        events++;
    }
    return events;
}
