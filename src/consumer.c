/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer — sessions and per-transfer state machines; see consumer.h for
 * the states and the rules, this file for their mechanics.
 */
#include "consumer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "announce.h"
#include "session_id.h"
#include "table.h"
#include "wire.h"

const double ecxi_latency_bounds_ms[ECXI_LATENCY_BUCKETS - 1] = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 20000};

enum xstate { WAITING_ACK, READING, RETRY, QUARANTINED, TOMBSTONE };

/* What the engine is told about an item in the front (see struct
 * ecxi_consumer): pending, "encode locally" once (a tombstone), or
 * "encode locally" while its blocks are quarantined. */
enum fstate { F_PENDING, F_LOCAL, F_QUARANTINED };

typedef struct session session;

typedef struct xfer {
    ecxi_table_node node;      /* by mm_hash, in xfers */
    /* Under pmu: the item's place in the front and what it tells the engine. */
    ecxi_table_node fnode;
    bool in_front;
    int fstate, freason;      /* enum fstate; F_LOCAL: why */
    bool reported;            /* F_QUARANTINED: the engine was told already */
    atomic_bool claimed;      /* TOMBSTONE: the engine took the answer; delete it */
    struct xfer *prev, *next; /* every transfer; next = incoming or free list */
    session *s;               /* WAITING_ACK, READING, QUARANTINED; else NULL */
    int state;                /* enum xstate */
    int reason;               /* TOMBSTONE / QUARANTINED: why */
    bool holds_blocks;        /* a local cache entry is reserved for it */
    int64_t deadline_ms;      /* ack / read / quarantine / retry / tombstone */
    int64_t first_ask_ms;
    int64_t backoff_ms; /* RETRY */
    int64_t lease_end_ms; /* READING: the bytes must be in by then (see start_read) */
    uint64_t checksum;    /* READING: the producer's, from the ticket */
    bool unverified;      /* READING: none came (nixl): the READ's own becomes it */
    uint64_t size_bytes, n_blocks;
    ecxi_data_xfer *dx; /* READING, QUARANTINED */
    int port;
    char host[ECXI_HOST_MAX + 1];
    uint32_t hash_len;
    char hash[ECX_MM_HASH_MAX];
} xfer;

struct session {
    ecxi_table_node node; /* by "host|port" */
    session *next;
    ecxi_ctrl_peer *peer;
    ecxi_data_peer *dpeer; /* registered from the first OK ack */
    char sid[ECXI_SESSION_ID_LEN + 1]; /* UUID4 text */
    char key[ECXI_HOST_MAX + 8]; /* "host|port" */
    char host[ECXI_HOST_MAX + 1];
    int port;
    int64_t opened_ms;
    int64_t last_used_ms; /* opened, sent on, got an ack, or seen busy */
    uint64_t requests, acks; /* sent on it; messages read from it */
    bool busy;            /* scratch of mark_busy() */
};

struct ecxi_consumer {
    ecxi_cache *cache;
    ecxi_data *data;
    ecxi_consumer_opts o;
    char compat[ECX_COMPAT_HASH_HEX + 1];
    ecxi_consumer_stats st;
    uint64_t max_item_bytes; /* the most an announcement may say: the cache's block limit */
    ecxi_table xfers, sessions;
    /* The front: what the engine's fetch is answered from without the lock
     * that every other call here is made under (consumer.h). Under pmu, held
     * only for a lookup or a state change: the items the engine was told
     * about and has not yet been told the end of (pending, a tombstone not
     * yet taken, quarantined), new items waiting to be asked for (incoming,
     * first to last) and the free transfers. */
    pthread_mutex_t pmu;
    ecxi_table front;
    xfer *incoming, *incoming_tail, *free_xfers;
    _Atomic uint64_t fallbacks[ECX_REASON_COUNT]; /* counted by the engine's calls */
    xfer *head;
    session *sessions_list;
    size_t n_sessions;
    uint64_t sessions_gen; /* bumped when a session opens or closes */
    unsigned reads_started; /* by the acks of the current poll */
    int64_t ctrl_read_ns;   /* when the poll last read the sessions' sockets */
    msgpack_sbuffer out;
    int64_t *idx;                   /* scratch: ack indices */
    ecxi_cache_run *cruns;          /* scratch: our entry's runs */
    ecxi_block_run *remote, *local; /* scratch for read_post: the two sides' runs */
    size_t scratch_cap;
};

/* How often a poll reads the sessions' sockets while a READ's bytes move
 * (ecxi_consumer_poll). */
#define CTRL_READ_EVERY_NS 500000

/* ---------- small helpers ---------- */

static int64_t now_ms(const ecxi_consumer *c)
{
    return ecxi_now_ms(c->o.clock);
}

static int reason_of_status(int status)
{
    switch (status) {
    case ECX_STATUS_NACK_MISSING: return ECX_REASON_NACK_MISSING;
    case ECX_STATUS_NACK_INCOMPAT: return ECX_REASON_NACK_INCOMPAT;
    case ECX_STATUS_NACK_VERSION: return ECX_REASON_NACK_VERSION;
    default: return ECX_REASON_NACK_INTERNAL;
    }
}

static int grow_scratch(ecxi_consumer *c, size_t n)
{
    if (n <= c->scratch_cap) return 0;
    int64_t *i = realloc(c->idx, n * sizeof *i);
    if (i) c->idx = i;
    ecxi_cache_run *cr = realloc(c->cruns, n * sizeof *cr);
    if (cr) c->cruns = cr;
    ecxi_block_run *r = realloc(c->remote, n * sizeof *r);
    if (r) c->remote = r;
    ecxi_block_run *l = realloc(c->local, n * sizeof *l);
    if (l) c->local = l;
    if (!i || !cr || !r || !l) return ECX_ENOMEM;
    c->scratch_cap = n;
    return 0;
}

/* ---------- transfers ---------- */

/* The front (struct ecxi_consumer). An item enters it when the engine
 * first asks (ecxi_consumer_answer), and leaves when the engine has taken
 * its end (a tombstone's answer), when it is ready (the cache answers from
 * then on), or with its transfer. */
static void front_remove_locked(ecxi_consumer *c, xfer *x)
{
    if (!x->in_front) return;
    ecxi_table_remove(&c->front, &x->fnode);
    x->in_front = false;
}

static void front_leave(ecxi_consumer *c, xfer *x)
{
    pthread_mutex_lock(&c->pmu);
    front_remove_locked(c, x);
    pthread_mutex_unlock(&c->pmu);
}

static void front_set(ecxi_consumer *c, xfer *x, int fstate, int reason)
{
    pthread_mutex_lock(&c->pmu);
    x->fstate = fstate, x->freason = reason;
    pthread_mutex_unlock(&c->pmu);
}

static void count_fallback(ecxi_consumer *c, int why)
{
    atomic_fetch_add_explicit(&c->fallbacks[why], 1, memory_order_relaxed);
}

/* The front's answer about x (pmu held). */
static int front_answer_locked(ecxi_consumer *c, xfer *x, int *reason)
{
    switch (x->fstate) {
    case F_LOCAL: /* told once; the transfer is deleted on the next poll */
        *reason = x->freason;
        count_fallback(c, x->freason);
        front_remove_locked(c, x);
        atomic_store_explicit(&x->claimed, true, memory_order_release);
        return ECX_FETCH_LOCAL;
    case F_QUARANTINED: /* counted once; its blocks are still held */
        *reason = ECX_REASON_QUARANTINED;
        if (!x->reported) count_fallback(c, *reason);
        x->reported = true;
        return ECX_FETCH_LOCAL;
    default: return ECX_FETCH_PENDING;
    }
}

/* The front's answer about mm_hash, or -1 if it is not there. */
static int front_answer(ecxi_consumer *c, const char *h, size_t hl, int *reason)
{
    pthread_mutex_lock(&c->pmu);
    ecxi_table_node *n = ecxi_table_find(&c->front, h, hl);
    int st = n ? front_answer_locked(c, ECXI_CONTAINER_OF(n, xfer, fnode), reason) : -1;
    pthread_mutex_unlock(&c->pmu);
    return st;
}

static void free_push(ecxi_consumer *c, xfer *x)
{
    pthread_mutex_lock(&c->pmu);
    x->next = c->free_xfers, c->free_xfers = x;
    pthread_mutex_unlock(&c->pmu);
}

static xfer *xfer_find(const ecxi_consumer *c, const char *hash, size_t len)
{
    ecxi_table_node *n = ecxi_table_find(&c->xfers, hash, len);
    return n ? ECXI_CONTAINER_OF(n, xfer, node) : NULL;
}

/* A new transfer (from incoming) joins the ones this file drives. */
static void xfer_link(ecxi_consumer *c, xfer *x)
{
    x->node.key = x->hash;
    x->node.key_len = x->hash_len;
    ecxi_table_insert(&c->xfers, &x->node);
    x->prev = NULL;
    x->next = c->head;
    if (c->head) c->head->prev = x;
    c->head = x;
    c->st.in_flight++;
}

static void xfer_delete(ecxi_consumer *c, xfer *x)
{
    ecxi_table_remove(&c->xfers, &x->node);
    if (x->prev)
        x->prev->next = x->next;
    else
        c->head = x->next;
    if (x->next) x->next->prev = x->prev;
    c->st.in_flight--;
    pthread_mutex_lock(&c->pmu);
    front_remove_locked(c, x);
    x->next = c->free_xfers, c->free_xfers = x;
    pthread_mutex_unlock(&c->pmu);
}

/* Give the local blocks back (the entry is not ready). */
static void free_blocks(ecxi_consumer *c, xfer *x)
{
    if (!x->holds_blocks) return;
    int rc = ecxi_cache_discard(c->cache, x->hash, x->hash_len);
    if (rc) ecxi_log(ECX_LOG_ERROR, "consumer: discard failed: %s", ecx_strerror(rc));
    x->holds_blocks = false;
}

static void tombstone(ecxi_consumer *c, xfer *x, int reason, int64_t now)
{
    int level = reason == ECX_REASON_NACK_MISSING ? ECX_LOG_INFO : ECX_LOG_WARN;
    ECXI_LOG_RATELIMITED(level, "consumer: %.*s from %s:%d falls back: %s", (int)x->hash_len,
                        x->hash, x->host, x->port, ecx_reason_name(reason));
    if (x->dx) {
        ecxi_data_read_release(x->dx);
        x->dx = NULL;
    }
    free_blocks(c, x);
    front_set(c, x, F_LOCAL, reason);
    x->state = TOMBSTONE;
    x->reason = reason;
    x->s = NULL;
    x->deadline_ms = now + c->o.tombstone_ttl_ms;
}

/* A READ that overran its deadline, or whose producer was lost: its blocks
 * stay held until the READ has ended (docs/PROTOCOL.md §5). */
static void quarantine(ecxi_consumer *c, xfer *x, int64_t now)
{
    front_set(c, x, F_QUARANTINED, ECX_REASON_QUARANTINED);
    x->state = QUARANTINED;
    x->reason = ECX_REASON_QUARANTINED;
    x->deadline_ms = now + c->o.quarantine_ms;
    c->st.quarantines++;
}

/* NOT_READY, a lost producer before its ack, or (version 2, as vLLM >=
 * 0.34 does) an ack timeout: free the blocks and ask again after a
 * backoff, within the item's overall wait; past it, tombstone with
 * reason. */
static void retry_later(ecxi_consumer *c, xfer *x, int64_t now, int reason)
{
    free_blocks(c, x);
    x->s = NULL;
    if (now - x->first_ask_ms >= c->o.item_wait_ms) {
        tombstone(c, x, reason, now);
        return;
    }
    x->backoff_ms = x->backoff_ms ? x->backoff_ms * 2 : ECXI_CONSUMER_BACKOFF_MIN_MS;
    if (x->backoff_ms > ECXI_CONSUMER_BACKOFF_MAX_MS) x->backoff_ms = ECXI_CONSUMER_BACKOFF_MAX_MS;
    x->state = RETRY;
    x->deadline_ms = now + x->backoff_ms;
    c->st.retries++;
}

/* ---------- sessions ---------- */

static void session_close(ecxi_consumer *c, session *s, int64_t now)
{
    for (xfer *x = c->head; x; x = x->next) {
        if (x->s != s) continue;
        if (x->state == WAITING_ACK) {
            retry_later(c, x, now, ECX_REASON_NOT_READY_TIMEOUT);
        } else if (x->state == READING) {
            quarantine(c, x, now);
        }
        x->s = NULL;
    }
    /* Dropping the data peer fails its running READs: nothing writes into
     * the quarantined blocks after this, so they settle on the next poll. */
    ecxi_data_peer_drop(s->dpeer);
    ecxi_ctrl_peer_free(s->peer);
    ecxi_table_remove(&c->sessions, &s->node);
    for (session **pp = &c->sessions_list; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    c->n_sessions--;
    c->sessions_gen++;
    free(s);
}

/* A session is busy while a transfer on it waits for an ack, reads, or is
 * quarantined (a quarantined READ keeps the data peer registered). Marks
 * each session's busy flag, and refreshes last_used of busy ones. */
static void mark_busy(ecxi_consumer *c, int64_t now)
{
    for (session *s = c->sessions_list; s; s = s->next)
        s->busy = false;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s && (x->state == WAITING_ACK || x->state == READING || x->state == QUARANTINED))
            x->s->busy = true;
    for (session *s = c->sessions_list; s; s = s->next)
        if (s->busy) s->last_used_ms = now;
}

/* Close every session that has not been busy for session_idle_ms: a dead
 * producer that never completed a handshake is never reported lost, and
 * its socket would otherwise reconnect forever. */
static int close_idle(ecxi_consumer *c, int64_t now)
{
    int closed = 0;
    mark_busy(c, now);
    for (session *s = c->sessions_list, *next; s; s = next) {
        next = s->next;
        if (s->busy || now - s->last_used_ms < c->o.session_idle_ms) continue;
        ecxi_log(ECX_LOG_DEBUG, "consumer: session to %s:%d idle; closed", s->host, s->port);
        c->st.sessions_idle_closed++;
        session_close(c, s, now);
        closed++;
    }
    return closed;
}

/* At the cap: close the idle session unused the longest; failing that, the
 * unreached one opened the longest ago (consumer.h), whose waiting items
 * fall back now. Returns false if neither exists. Transfers change state
 * but none is deleted (the caller may be walking the transfer list). */
static bool evict_one(ecxi_consumer *c, int64_t now)
{
    mark_busy(c, now);
    session *victim = NULL, *unreached = NULL;
    for (session *s = c->sessions_list; s; s = s->next) {
        if (!s->busy && (!victim || s->last_used_ms < victim->last_used_ms)) victim = s;
        if (s->busy && now - s->opened_ms >= ECXI_CONSUMER_UNREACHED_MS &&
            (!unreached || s->opened_ms < unreached->opened_ms) &&
            !ecxi_ctrl_peer_handshaken(s->peer))
            unreached = s;
    }
    if (victim) {
        ecxi_log(ECX_LOG_DEBUG, "consumer: session cap (%d) reached; closed idle session to %s:%d",
                 c->o.max_sessions, victim->host, victim->port);
        c->st.sessions_evicted++;
        session_close(c, victim, now);
        return true;
    }
    if (!unreached) return false;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                        "consumer: session cap (%d) reached; closed the session to %s:%d, "
                        "no handshake in %lld ms (its items fall back: ACK_TIMEOUT)",
                        c->o.max_sessions, unreached->host, unreached->port,
                        (long long)(now - unreached->opened_ms));
    c->st.sessions_unreached++;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s == unreached && x->state == WAITING_ACK) tombstone(c, x, ECX_REASON_ACK_TIMEOUT, now);
    session_close(c, unreached, now);
    return true;
}

/* Close a session whose producer connection was lost (docs/PROTOCOL.md §5: waiting
 * transfers become retryable, reading ones are quarantined). A later
 * contact opens a fresh socket and session id. */
static bool retire_if_lost(ecxi_consumer *c, session *s, int64_t now)
{
    if (!ecxi_ctrl_peer_lost(s->peer)) return false;
    ecxi_log(ECX_LOG_WARN, "consumer: lost producer %s:%d; session closed", s->host, s->port);
    c->st.peers_lost++;
    session_close(c, s, now);
    return true;
}

/* Close a session whose producer's address refused the connection: its
 * waiting transfers fall back at once (REFUSED), not after the ack timeout. A
 * producer that accepts and stays silent still gets the timeouts. */
static bool retire_if_refused(ecxi_consumer *c, session *s, int64_t now)
{
    if (!ecxi_ctrl_peer_refused(s->peer)) return false;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s == s && x->state == WAITING_ACK) tombstone(c, x, ECX_REASON_REFUSED, now);
    ecxi_log(ECX_LOG_WARN, "consumer: %s:%d refused the connection (nothing listening); "
             "session closed", s->host, s->port);
    session_close(c, s, now);
    return true;
}

/* Close a session whose producer hung up before a handshake completed
 * (CURVE keys or modes differ, it refused us at its connection cap, or not
 * a ZeroMQ peer): its waiting transfers fall back at once (HANDSHAKE), not
 * at the ack timeout (every try of it, on version 2: the per-item wait). A
 * later fetch dials again, so fixed keys heal. */
static bool retire_if_hung_up(ecxi_consumer *c, session *s, int64_t now)
{
    if (!ecxi_ctrl_peer_hung_up(s->peer)) return false;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s == s && x->state == WAITING_ACK) tombstone(c, x, ECX_REASON_HANDSHAKE, now);
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: %s:%d hung up in the ZeroMQ handshake (CURVE "
                        "keys or modes differ, it is at its connection cap, or not a ZeroMQ "
                        "peer; `ecx ping` tells which); session closed", s->host, s->port);
    session_close(c, s, now);
    return true;
}

/* Close a session whose producer's address is not a ZeroMQ peer (its TCP
 * connection sent no ZeroMQ greeting within ECXI_CTRL_GREETING_MS: an HTTP
 * server, a metrics port): its waiting transfers fall back at once
 * (NOT_ZMQ) rather than at the ack timeout (every try of it, on version
 * 2). */
static bool retire_if_silent(ecxi_consumer *c, session *s, int64_t now)
{
    if (!ecxi_ctrl_peer_silent(s->peer)) return false;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s == s && x->state == WAITING_ACK) tombstone(c, x, ECX_REASON_NOT_ZMQ, now);
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: %s:%d is not a ZeroMQ peer (no ZeroMQ greeting "
                        "%d ms after connecting: a web server, a metrics port?); session closed",
                        s->host, s->port, ECXI_CTRL_GREETING_MS);
    session_close(c, s, now);
    return true;
}

/* The session to host:port, opened if needed; NULL if it cannot be, with
 * *at_cap set when the session cap is why. */
static session *session_get(ecxi_consumer *c, const char *host, int port, int64_t now,
                            bool *at_cap)
{
    *at_cap = false;
    char key[ECXI_HOST_MAX + 8];
    int kl = snprintf(key, sizeof key, "%s|%d", host, port);
    ecxi_table_node *n = ecxi_table_find(&c->sessions, key, (size_t)kl);
    /* Never send over a connection already known to be lost. */
    if (n && !retire_if_lost(c, ECXI_CONTAINER_OF(n, session, node), now)) {
        session *s = ECXI_CONTAINER_OF(n, session, node);
        s->last_used_ms = now;
        return s;
    }
    if (c->n_sessions >= (size_t)c->o.max_sessions && !evict_one(c, now)) {
        *at_cap = true;
        return NULL;
    }
    session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    int rc = ecxi_ctrl_peer_new(c->o.zctx, host, port, &c->o.ctrl, &s->peer);
    if (rc) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: cannot open a session to %s:%d: %s", host,
                            port, ecx_strerror(rc));
        free(s);
        return NULL;
    }
    ecxi_session_id_new(s->sid); /* marked: an ecx producer answers in its checked form */
    memcpy(s->key, key, (size_t)kl + 1);
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    s->opened_ms = s->last_used_ms = now;
    s->node.key = s->key;
    s->node.key_len = (size_t)kl;
    ecxi_table_insert(&c->sessions, &s->node);
    s->next = c->sessions_list, c->sessions_list = s;
    c->n_sessions++;
    c->sessions_gen++;
    ecxi_log(ECX_LOG_DEBUG, "consumer: session %s to %s:%d", s->sid, host, port);
    return s;
}

/* Every session is busy at the cap: free the blocks and ask again shortly
 * (RETRY), within the cap wait (consumer.h); past it, fall back. */
static void wait_for_session(ecxi_consumer *c, xfer *x, int64_t now)
{
    int64_t limit = c->o.ack_timeout_ms < ECXI_CONSUMER_CAP_WAIT_MS ? c->o.ack_timeout_ms
                                                                   : ECXI_CONSUMER_CAP_WAIT_MS;
    if (now - x->first_ask_ms >= limit) {
        c->st.session_cap_refusals++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                            "consumer: %zu sessions open, all busy (cap %d); no session to "
                            "%s:%d within %lld ms",
                            c->n_sessions, c->o.max_sessions, x->host, x->port, (long long)limit);
        tombstone(c, x, ECX_REASON_SEND_FAILED, now);
        return;
    }
    free_blocks(c, x);
    c->st.session_cap_waits++;
    x->state = RETRY;
    x->deadline_ms = now + ECXI_CONSUMER_CAP_RETRY_MS;
}

/* Reserve local blocks and send the XferReq. On failure the transfer is a
 * tombstone. */
static void ask(ecxi_consumer *c, xfer *x, int64_t now)
{
    int rc = ecxi_cache_reserve_fetch(c->cache, x->hash, x->hash_len, x->n_blocks);
    if (!rc && (rc = ecxi_cache_set_size(c->cache, x->hash, x->hash_len, x->size_bytes)))
        ecxi_cache_discard(c->cache, x->hash, x->hash_len);
    if (rc) {
        tombstone(c, x, ECX_REASON_NO_ROOM, now);
        return;
    }
    x->holds_blocks = true;
    bool at_cap;
    session *s = session_get(c, x->host, x->port, now, &at_cap);
    if (!s && at_cap) {
        wait_for_session(c, x, now);
        return;
    }
    if (!s) {
        tombstone(c, x, ECX_REASON_SEND_FAILED, now);
        return;
    }
    ecx_req r;
    ecx_req_init(&r);
    r.mm_hash = (ecx_span){x->hash, x->hash_len};
    r.compatibility_hash = (ecx_span){c->compat, strlen(c->compat)};
    r.session_id = (ecx_span){s->sid, ECXI_SESSION_ID_LEN};
    r.connector_version = c->o.connector_version;
    if ((rc = ecxi_wire_encode_req(&r, c->o.connector_version, &c->out)) ||
        (rc = ecxi_ctrl_peer_send(s->peer, c->out.data, c->out.size))) {
        tombstone(c, x, ECX_REASON_SEND_FAILED, now);
        return;
    }
    c->st.requests++;
    s->requests++;
    x->s = s;
    x->state = WAITING_ACK;
    x->deadline_ms = now + c->o.ack_timeout_ms;
}

/* ---------- acks ---------- */

/* The producer granted x and we will not read it: say so on the data
 * plane (ecxi_data_decline), so that it releases the grant now rather than
 * at the lease's end, then tombstone x with why. */
static void decline(ecxi_consumer *c, session *s, xfer *x, const ecxi_data_desc *dd, int why,
                    int64_t now)
{
    char key[ECXI_DATA_NOTIF_MAX];
    int kl = snprintf(key, sizeof key, "%s:%.*s", s->sid, (int)x->hash_len, x->hash);
    int rc = ecxi_data_decline(s->dpeer, dd, key, (size_t)kl);
    if (rc && rc != ECX_EDATA_NOPATH)
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "consumer: could not tell %s:%d that %.*s will not be "
                            "read (%s); its lease releases it",
                            s->host, s->port, (int)x->hash_len, x->hash, ecx_strerror(rc));
    tombstone(c, x, why, now);
}

/* Validate an OK ack and post the READ; on any failure, tombstone (and,
 * once the producer's data plane is registered, decline the grant). */
static void start_read(ecxi_consumer *c, session *s, xfer *x, const ecx_ack *a, int64_t now)
{
    const uint8_t *meta = (const uint8_t *)a->agent_metadata.p;
    size_t ml = a->agent_metadata.n;
    /* An ack that does not fit what we asked for: not read, but its grant
     * is declined once the data plane is registered (below). */
    int unfit = 0;
    if (a->n_indices != x->n_blocks) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: ack for %.*s has %zu blocks, reserved %llu",
                            (int)x->hash_len, x->hash, a->n_indices,
                            (unsigned long long)x->n_blocks);
        unfit = ECX_REASON_BAD_ACK;
    }
    if (s->dpeer && !ecxi_data_peer_same(s->dpeer, meta, ml)) {
        ecxi_log(ECX_LOG_WARN, "consumer: producer %s:%d restarted (new metadata); re-registering",
                s->host, s->port);
        /* READs still running on the old registration fail and settle. */
        ecxi_data_peer_drop(s->dpeer);
        s->dpeer = NULL;
        c->st.peer_restarts++;
    }
    /* A registration serves only the control-plane peer that first sent
     * it: metadata leading to a data plane another session registered is
     * that producer's, relayed, and reading it under this session's items
     * would copy another producer's region (on shm, any block of it). */
    if (!s->dpeer) {
        for (session *o = c->sessions_list; o; o = o->next) {
            if (o == s || !ecxi_data_peer_overlaps(o->dpeer, meta, ml)) continue;
            c->st.relayed_registrations++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "consumer: %s:%d sent the data-plane registration of %s:%d "
                                "(relayed?); its item falls back; %llu so far",
                                s->host, s->port, o->host, o->port,
                                (unsigned long long)c->st.relayed_registrations);
            tombstone(c, x, unfit ? unfit : ECX_REASON_BAD_ACK, now);
            return;
        }
    }
    /* The data plane parses the descriptor, once (the READ takes the
     * parsed form; its lease and checksum are kept below), and registers
     * the producer if this session has not. */
    const ecxi_data_ack da = {meta, ml, (const uint8_t *)a->mem_descriptor.p,
                              a->mem_descriptor.n, false};
    ecxi_data_desc dd;
    int rc = ecxi_data_ack_register(c->data, &da, x->size_bytes, &dd, &s->dpeer);
    if (rc) {
        /* A descriptor or metadata we cannot use is a bad ack; a producer
         * we cannot reach with good ones (it died after acking, say) is a
         * failed READ. */
        bool bad = rc == ECX_EDATA_META || rc == ECX_EDATA_DESC || rc == ECX_EDATA_VERSION ||
                   rc == ECX_EDATA_MISMATCH || rc == ECX_EINVAL;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: %s %s:%d: %s",
                            bad ? "unusable ack from" : "cannot reach the data path of",
                            s->host, s->port, ecx_strerror(rc));
        s->dpeer = NULL;
        tombstone(c, x, unfit ? unfit : bad ? ECX_REASON_BAD_ACK : ECX_REASON_READ_FAILED, now);
        return;
    }
    if (dd.ticket.nbytes != x->size_bytes) {
        /* The producer's item has another size than the one announced (or
         * given): the announcement or the caller's size is wrong. That is
         * the reason, also when the block count differs with it. */
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: %.*s from %s:%d is %llu bytes, not the "
                            "%llu announced", (int)x->hash_len, x->hash, s->host, s->port,
                            (unsigned long long)dd.ticket.nbytes,
                            (unsigned long long)x->size_bytes);
        unfit = ECX_REASON_SIZE_MISMATCH;
    }
    if (unfit) {
        decline(c, s, x, &dd, unfit, now);
        return;
    }
    size_t n = (size_t)x->n_blocks, nlocal = 0;
    if (grow_scratch(c, n)) {
        decline(c, s, x, &dd, ECX_REASON_READ_FAILED, now);
        return;
    }
    if (ecx_wire_ack_indices(a, c->idx, n) != n) {
        decline(c, s, x, &dd, ECX_REASON_BAD_ACK, now);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (c->idx[i] < 0) {
            decline(c, s, x, &dd, ECX_REASON_BAD_ACK, now);
            return;
        }
    /* The wire's indices become runs here, once; the data front checks them. */
    size_t nremote = ecxi_block_runs_of((const uint64_t *)c->idx, n, c->remote);
    uint64_t got = 0;
    if (!ecxi_cache_runs(c->cache, x->hash, x->hash_len, c->cruns, n, &nlocal))
        for (size_t i = 0; i < nlocal; i++) {
            c->local[i] = (ecxi_block_run){c->cruns[i].start, c->cruns[i].len};
            got += c->cruns[i].len;
        }
    if (got != n) {
        decline(c, s, x, &dd, ECX_REASON_READ_FAILED, now);
        return;
    }
    char key[ECXI_DATA_NOTIF_MAX];
    int kl = snprintf(key, sizeof key, "%s:%.*s", s->sid, (int)x->hash_len, x->hash);
    rc = ecxi_data_read_post(s->dpeer, &dd, c->remote, nremote, c->local, nlocal, x->size_bytes,
                             key, (size_t)kl, &x->dx);
    if (rc) {
        x->dx = NULL;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: READ of %.*s not posted: %s", (int)x->hash_len,
                            x->hash, ecx_strerror(rc));
        bool bad = rc == ECX_EDATA_INDEX || rc == ECX_EDATA_COUNT || rc == ECX_EDATA_DESC ||
                   rc == ECX_EDATA_VERSION || rc == ECX_EDATA_MISMATCH;
        decline(c, s, x, &dd, bad ? ECX_REASON_BAD_ACK : ECX_REASON_READ_FAILED, now);
        return;
    }
    /* The producer may reuse the blocks once its lease runs out, which it
     * counts from before we saw the ack: the bytes must be in, and
     * verified, by our receipt + lease - a margin, or they are not used. */
    const ecxi_data_ticket *t = &dd.ticket;
    int64_t margin = t->lease_ms / 10 < ECXI_CONSUMER_LEASE_MARGIN_MAX_MS
                         ? t->lease_ms / 10
                         : ECXI_CONSUMER_LEASE_MARGIN_MAX_MS;
    x->lease_end_ms = now + (int64_t)t->lease_ms - margin;
    x->checksum = t->checksum;
    x->unverified = dd.unverified;
    x->state = READING;
    x->deadline_ms = now + c->o.read_timeout_ms;
    if (x->deadline_ms > x->lease_end_ms) x->deadline_ms = x->lease_end_ms;
    c->reads_started++;
}

static void on_ack(ecxi_consumer *c, session *s, const void *payload, size_t len, int64_t now)
{
    ecx_ack a;
    int rc = ecx_wire_decode_ack(payload, len, &a);
    if (rc) {
        c->st.malformed_acks++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: dropped undecodable ack from %s:%d: %s",
                            s->host, s->port, ecx_strerror(rc));
        return;
    }
    xfer *x = a.mm_hash.n <= ECX_MM_HASH_MAX ? xfer_find(c, a.mm_hash.p, a.mm_hash.n) : NULL;
    /* A NACK may leave session_id out (the reference's do); an OK ack must
     * echo ours. */
    bool sid_ok = a.session_id.n == 0 ? a.status != ECX_STATUS_OK
                                      : a.session_id.n == ECXI_SESSION_ID_LEN &&
                                            !memcmp(a.session_id.p, s->sid, ECXI_SESSION_ID_LEN);
    if (!x || x->s != s || x->state != WAITING_ACK || !sid_ok) {
        c->st.stale_acks++;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "consumer: ignored an ack for no waiting transfer");
        return;
    }
    if (a.status == ECX_STATUS_OK)
        start_read(c, s, x, &a, now);
    else if (a.status == ECX_STATUS_NACK_NOT_READY)
        retry_later(c, x, now, ECX_REASON_NOT_READY_TIMEOUT);
    else
        tombstone(c, x, reason_of_status(a.status), now);
}

/* A producer sent more acks than it was asked for (ECXI_CONSUMER_ACK_SLACK
 * beyond): it floods, or is broken. Its waiting items fall back (BAD_ACK),
 * its session is closed without reading the rest, and the next contact
 * opens a fresh one. */
static void drop_flooder(ecxi_consumer *c, session *s, int64_t now)
{
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                        "consumer: producer %s:%d sent %llu acks and %llu badly framed replies "
                        "for %llu requests; session closed, its items fall back",
                        s->host, s->port, (unsigned long long)s->acks,
                        (unsigned long long)ecxi_ctrl_peer_stats(s->peer).bad_framing,
                        (unsigned long long)s->requests);
    c->st.ack_floods++;
    for (xfer *x = c->head; x; x = x->next)
        if (x->s == s && x->state == WAITING_ACK) tombstone(c, x, ECX_REASON_BAD_ACK, now);
    session_close(c, s, now);
}

/* ---------- timers and READs ---------- */

static void record_done(ecxi_consumer *c, xfer *x, int64_t now)
{
    double ms = (double)(now - x->first_ask_ms);
    int b = 0;
    while (b < ECXI_LATENCY_BUCKETS - 1 && ms > ecxi_latency_bounds_ms[b])
        b++;
    c->st.latency_count[b]++;
    c->st.latency_sum_ms += ms;
    c->st.ready++;
    c->st.bytes += x->size_bytes;
}

/* Settle a quarantined transfer: its READ has ended (or was cancelled with
 * its peer), so the blocks can go back. */
static void settle(ecxi_consumer *c, xfer *x, int64_t now)
{
    ecxi_data_read_release(x->dx);
    x->dx = NULL;
    free_blocks(c, x);
    c->st.settled++;
    pthread_mutex_lock(&c->pmu);
    bool told = x->reported;
    if (!told) x->fstate = F_LOCAL, x->freason = x->reason; /* the engine has yet to hear of it */
    pthread_mutex_unlock(&c->pmu);
    if (told) {
        xfer_delete(c, x);
    } else {
        x->state = TOMBSTONE;
        x->deadline_ms = now + c->o.tombstone_ttl_ms;
    }
}

static int advance(ecxi_consumer *c, xfer *x, int64_t now)
{
    int st;
    switch (x->state) {
    case WAITING_ACK:
        if (now < x->deadline_ms) return 0;
        if (c->o.connector_version == 2)
            retry_later(c, x, now, ECX_REASON_ACK_TIMEOUT);
        else
            tombstone(c, x, ECX_REASON_ACK_TIMEOUT, now);
        return 1;
    case READING:
        st = ecxi_data_read_poll(x->dx);
        if (st == ECXI_XFER_DONE && now > x->lease_end_ms) {
            tombstone(c, x, ECX_REASON_LEASE_EXPIRED, now);
            return 1;
        }
        if (st == ECXI_XFER_DONE) {
            int rc = x->unverified && !ecxi_data_read_checksum(x->dx, &x->checksum)
                         ? ECX_EDATA_PEER
                         : 0;
            ecxi_data_read_release(x->dx);
            x->dx = NULL;
            if (!rc) rc = ecxi_cache_set_checksum(c->cache, x->hash, x->hash_len, x->checksum);
            if (!rc) rc = ecxi_cache_mark_ready(c->cache, x->hash, x->hash_len);
            if (rc) {
                tombstone(c, x, ECX_REASON_READ_FAILED, now);
                return 1;
            }
            x->holds_blocks = false; /* the ready entry now belongs to the cache */
            record_done(c, x, now);
            xfer_delete(c, x);
            return 1;
        }
        if (st == ECXI_XFER_FAILED || st == ECXI_XFER_CORRUPT) {
            tombstone(c, x, st == ECXI_XFER_CORRUPT ? ECX_REASON_CORRUPT : ECX_REASON_READ_FAILED,
                      now);
            return 1;
        }
        if (now < x->deadline_ms) return 0;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: READ of %.*s overran; quarantined",
                            (int)x->hash_len, x->hash);
        quarantine(c, x, now);
        return 1;
    case QUARANTINED:
        if (ecxi_data_read_poll(x->dx) != ECXI_XFER_RUNNING) {
            settle(c, x, now);
            return 1;
        }
        if (now < x->deadline_ms) return 0;
        /* Out of patience: drop the registration so the READ is cancelled
         * and can no longer write, then free. */
        if (x->s) {
            ecxi_data_peer_drop(x->s->dpeer);
            x->s->dpeer = NULL;
        }
        settle(c, x, now);
        return 1;
    case RETRY:
        if (now < x->deadline_ms) return 0;
        ask(c, x, now);
        return 1;
    case TOMBSTONE:
        if (atomic_load_explicit(&x->claimed, memory_order_acquire)) {
            xfer_delete(c, x); /* the engine has its answer */
            return 0;
        }
        if (now < x->deadline_ms) return 0;
        xfer_delete(c, x);
        return 1;
    }
    return 0;
}

/* Each session's news: its connection's (lost, refused, hung up in the
 * handshake, not ZeroMQ: the session closes) and its acks. Returns events. */
static int read_sessions(ecxi_consumer *c, int64_t now)
{
    int events = 0;
    for (session *s = c->sessions_list, *next; s; s = next) {
        next = s->next;
        /* The monitor first: an ack read after a disconnect may come from a
         * new producer that ZeroMQ reconnected to behind our back. */
        if (retire_if_lost(c, s, now) || retire_if_refused(c, s, now) ||
            retire_if_hung_up(c, s, now) || retire_if_silent(c, s, now)) {
            events++;
            continue;
        }
        const void *pl;
        size_t len;
        for (int i = 0; i < ECXI_CONSUMER_ACKS_PER_POLL; i++) {
            int got = ecxi_ctrl_peer_recv(s->peer, &pl, &len);
            s->acks += got == 1;
            /* Badly framed replies count too: ctrl drops them unseen. */
            if (s->acks + ecxi_ctrl_peer_stats(s->peer).bad_framing >
                s->requests + ECXI_CONSUMER_ACK_SLACK) {
                drop_flooder(c, s, now);
                break;
            }
            if (got != 1) break;
            events++;
            s->last_used_ms = now;
            on_ack(c, s, pl, len, now);
        }
    }
    return events;
}

int ecxi_consumer_poll(ecxi_consumer *c)
{
    ecxi_consumer_admit(c);
    int events = 0;
    int64_t now = now_ms(c);
    c->reads_started = 0;
    /* One bounded slice of data-plane work per poll (data.h): a large
     * READ moves on over many polls, each short. */
    int64_t t0 = ecxi_now_ns();
    int n = ecxi_data_progress(c->data, ECXI_DATA_SLICE_NS, NULL);
    if (n > 0) events += n;
    /* Timers first: an ack that waited in the socket past its transfer's
     * deadline (say, while this process was stopped) finds the transfer
     * timed out and is dropped as stale, never acted on. */
    for (xfer *x = c->head, *next; x; x = next) {
        next = x->next;
        events += advance(c, x, now);
    }
    /* While a READ's bytes move, its slices follow one another with no wait
     * between them, and the sessions' sockets are read every
     * CTRL_READ_EVERY_NS rather than every slice: each read that finds
     * nothing is two system calls inside libzmq (a poll of its mailbox,
     * getpid), ten per session per poll, ~15 us next to a slice's 150. */
    if (!ecxi_data_moving(c->data) || t0 - c->ctrl_read_ns >= CTRL_READ_EVERY_NS) {
        c->ctrl_read_ns = t0;
        events += read_sessions(c, now);
    }
    /* READs the acks just started get what is left of this poll's slice
     * (a small item is then done, and reported in this call rather than
     * the engine's next step). */
    if (c->reads_started) {
        int64_t left = ECXI_DATA_SLICE_NS - (ecxi_now_ns() - t0);
        n = ecxi_data_progress(c->data, left > 0 ? left : 0, NULL);
        if (n > 0) events += n;
    }
    for (xfer *x = c->reads_started ? c->head : NULL, *next; x; x = next) {
        next = x->next;
        if (x->state == READING) events += advance(c, x, now);
    }
    events += close_idle(c, now);
    return events;
}

/* ---------- engine-facing ---------- */

/* An "encode locally" answer, counted. */
static int local(ecxi_consumer *c, int why, int *reason)
{
    *reason = why;
    count_fallback(c, why);
    return ECX_FETCH_LOCAL;
}

/* A transfer for the incoming list: from the free list, else malloc. */
static xfer *xfer_alloc(ecxi_consumer *c)
{
    pthread_mutex_lock(&c->pmu);
    xfer *x = c->free_xfers;
    if (x) c->free_xfers = x->next;
    pthread_mutex_unlock(&c->pmu);
    if (!x && !(x = malloc(sizeof *x))) return NULL;
    memset(x, 0, offsetof(xfer, hash));
    atomic_init(&x->claimed, false);
    return x;
}

int ecxi_consumer_answer(ecxi_consumer *c, const char *mm_hash, size_t hash_len, const char *json,
                         const ecx_announcement *from, uint64_t expected_size, int *reason,
                         bool *queued)
{
    if (!c || !reason || (json && from)) return ECX_EINVAL;
    *reason = ECX_REASON_NONE;
    bool may_queue = queued != NULL;
    if (queued) *queued = false;
    if (!mm_hash || hash_len == 0 || hash_len > ECX_MM_HASH_MAX)
        return local(c, ECX_REASON_INVALID, reason);
    /* An item in flight, tombstoned or held locally is answered without
     * looking at its announcement (the engine asks every step; only a new
     * item's announcement is parsed). */
    int st = front_answer(c, mm_hash, hash_len, reason);
    if (st >= 0) return st;
    ecxi_cache_info info;
    if (ecxi_cache_lookup(c->cache, mm_hash, hash_len, &info) == 0)
        return info.state == ECXI_CACHE_READY ? ECX_FETCH_READY : ECX_FETCH_PENDING;
    if (!may_queue) return ECX_FETCH_PENDING;
    ecxi_announce_peer ap;
    ecxi_announce_rows rows = {c->o.block_bytes, c->o.elem_size};
    int why = ecxi_announce_parse(json, from, expected_size, c->max_item_bytes,
                                  c->o.connector_version == 2 ? &rows : NULL, &ap);
    /* (A version-2 size that is not its shape's whole blocks is also
     * SIZE_MISMATCH; announce.c has said so, with the numbers.) */
    if (why == ECX_REASON_SIZE_MISMATCH && expected_size && expected_size != ap.size_bytes)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "consumer: %.*s announced as %llu bytes, expected %llu",
                            (int)hash_len, mm_hash, (unsigned long long)ap.size_bytes,
                            (unsigned long long)expected_size);
    if (why) return local(c, why, reason);
    xfer *x = xfer_alloc(c);
    if (!x) return local(c, ECX_REASON_NO_ROOM, reason);
    memcpy(x->hash, mm_hash, hash_len);
    x->hash_len = (uint32_t)hash_len;
    memcpy(x->host, ap.host, sizeof x->host);
    x->port = ap.port;
    x->size_bytes = ap.size_bytes;
    x->n_blocks = (ap.size_bytes + c->o.block_bytes - 1) / c->o.block_bytes;
    x->first_ask_ms = now_ms(c);
    x->fnode.key = x->hash;
    x->fnode.key_len = hash_len;
    pthread_mutex_lock(&c->pmu);
    /* Another thread may have asked for it meanwhile: one transfer. */
    ecxi_table_node *n = ecxi_table_find(&c->front, mm_hash, hash_len);
    if (n) {
        st = front_answer_locked(c, ECXI_CONTAINER_OF(n, xfer, fnode), reason);
        x->next = c->free_xfers, c->free_xfers = x;
    } else {
        ecxi_table_insert(&c->front, &x->fnode);
        x->in_front = true;
        x->fstate = F_PENDING;
        x->next = NULL;
        if (c->incoming_tail)
            c->incoming_tail->next = x;
        else
            c->incoming = x;
        c->incoming_tail = x;
        *queued = true;
        st = ECX_FETCH_PENDING;
    }
    pthread_mutex_unlock(&c->pmu);
    return st;
}

void ecxi_consumer_admit(ecxi_consumer *c)
{
    pthread_mutex_lock(&c->pmu);
    xfer *x = c->incoming;
    c->incoming = c->incoming_tail = NULL;
    pthread_mutex_unlock(&c->pmu);
    for (xfer *next; x; x = next) {
        next = x->next;
        /* The engine took the tombstone of an earlier transfer of it (that is
         * why the front had no answer): that one goes now. */
        xfer *old = xfer_find(c, x->hash, x->hash_len);
        if (old) xfer_delete(c, old);
        /* Held meanwhile (another thread's fetch of it finished, or a save
         * in a `both` context): the cache answers the engine from now on. */
        if (ecxi_cache_lookup(c->cache, x->hash, x->hash_len, NULL) == 0) {
            front_leave(c, x);
            free_push(c, x);
            continue;
        }
        xfer_link(c, x);
        ask(c, x, now_ms(c));
    }
}

int ecxi_consumer_fetch(ecxi_consumer *c, const char *mm_hash, size_t hash_len, const char *json,
                        const ecx_announcement *from, uint64_t expected_size, int *reason)
{
    bool queued = false;
    int st = ecxi_consumer_answer(c, mm_hash, hash_len, json, from, expected_size, reason, &queued);
    if (!queued) return st;
    ecxi_consumer_admit(c);
    /* A request that failed at once (no room, no session) is answered now. */
    return ecxi_consumer_answer(c, mm_hash, hash_len, json, from, expected_size, reason, NULL);
}

size_t ecxi_consumer_pollitems(ecxi_consumer *c, zmq_pollitem_t *items, size_t cap)
{
    size_t n = 0;
    for (session *s = c->sessions_list; s; s = s->next) {
        if (n < cap) items[n] = (zmq_pollitem_t){ecxi_ctrl_peer_socket(s->peer), 0, ZMQ_POLLIN, 0};
        n++;
        if (n < cap)
            items[n] = (zmq_pollitem_t){ecxi_ctrl_peer_monitor_socket(s->peer), 0, ZMQ_POLLIN, 0};
        n++;
    }
    return n;
}

int64_t ecxi_consumer_next_timeout(ecxi_consumer *c)
{
    int64_t now = now_ms(c), best = -1;
    pthread_mutex_lock(&c->pmu);
    bool incoming = c->incoming != NULL;
    pthread_mutex_unlock(&c->pmu);
    if (incoming) return 0;
    for (xfer *x = c->head; x; x = x->next) {
        /* READs are polled, not timed: wake soon while any runs. */
        int64_t due = x->state == READING || x->state == QUARANTINED ? 1 : x->deadline_ms - now;
        if (due < 0) due = 0;
        if (best < 0 || due < best) best = due;
    }
    /* Idle closes are timers too (a busy session is refreshed by the poll
     * this wakes, so it costs at most one spurious wake per idle period). */
    for (const session *s = c->sessions_list; s; s = s->next) {
        int64_t due = s->last_used_ms + c->o.session_idle_ms - now;
        if (due < 0) due = 0;
        if (best < 0 || due < best) best = due;
        /* The inflow guard looks only when called (ctrl.h). */
        due = ecxi_ctrl_peer_next_timeout(s->peer);
        if (due >= 0 && (best < 0 || due < best)) best = due;
    }
    return best;
}

ecxi_consumer_stats ecxi_consumer_get_stats(const ecxi_consumer *c)
{
    ecxi_consumer_stats st = c->st;
    for (int i = 0; i < ECX_REASON_COUNT; i++)
        st.fallbacks[i] = atomic_load_explicit(&c->fallbacks[i], memory_order_relaxed);
    st.sessions_open = c->n_sessions;
    for (const xfer *x = c->head; x; x = x->next) {
        switch (x->state) {
        case WAITING_ACK: st.waiting_ack++; break;
        case READING: st.reading++; break;
        case RETRY: st.retrying++; break;
        case QUARANTINED: st.quarantined++; break;
        case TOMBSTONE:
            /* One the engine took is gone but for its memory (the next
             * poll frees it). */
            if (atomic_load_explicit(&x->claimed, memory_order_acquire))
                st.in_flight--;
            else
                st.tombstones++;
            break;
        }
    }
    return st;
}

/* ---------- lifecycle ---------- */

int ecxi_consumer_new(ecxi_cache *cache, ecxi_data *data, const ecxi_consumer_opts *opts,
                     ecxi_consumer **out)
{
    if (!cache || !data || !opts || !opts->zctx || !opts->compat_hash || !out ||
        opts->block_bytes == 0 || strlen(opts->compat_hash) > ECX_COMPAT_HASH_HEX)
        return ECX_EINVAL;
    ecxi_consumer *c = calloc(1, sizeof *c);
    if (!c) return ECX_ENOMEM;
    c->cache = cache, c->data = data, c->o = *opts;
    snprintf(c->compat, sizeof c->compat, "%s", opts->compat_hash);
    c->o.compat_hash = c->compat;
    if (c->o.ack_timeout_ms <= 0) c->o.ack_timeout_ms = ECX_DEFAULT_ACK_TIMEOUT_MS;
    if (c->o.read_timeout_ms <= 0) c->o.read_timeout_ms = ECX_DEFAULT_READ_TIMEOUT_MS;
    if (c->o.quarantine_ms <= 0) c->o.quarantine_ms = ECX_DEFAULT_QUARANTINE_MS;
    if (c->o.item_wait_ms <= 0) c->o.item_wait_ms = ECX_DEFAULT_ITEM_WAIT_MS;
    if (c->o.tombstone_ttl_ms <= 0) c->o.tombstone_ttl_ms = ECX_DEFAULT_TOMBSTONE_TTL_MS;
    if (c->o.session_idle_ms <= 0) c->o.session_idle_ms = ECX_DEFAULT_SESSION_IDLE_MS;
    if (c->o.max_sessions <= 0) c->o.max_sessions = ECX_DEFAULT_MAX_SESSIONS;
    if (c->o.connector_version == 0) c->o.connector_version = ECX_CONNECTOR_VERSION;
    /* An item needs fewer than ECXI_CACHE_MAX_BLOCKS blocks. */
    c->max_item_bytes = c->o.block_bytes > UINT64_MAX / ECXI_CACHE_MAX_BLOCKS
                            ? UINT64_MAX
                            : (uint64_t)ECXI_CACHE_MAX_BLOCKS * c->o.block_bytes - 1;
    int rc = ecxi_table_init(&c->xfers);
    if (!rc && (rc = ecxi_table_init(&c->sessions))) ecxi_table_fini(&c->xfers);
    if (!rc && (rc = ecxi_table_init(&c->front))) {
        ecxi_table_fini(&c->xfers);
        ecxi_table_fini(&c->sessions);
    }
    if (!rc && (rc = grow_scratch(c, 256))) {
        ecxi_table_fini(&c->xfers);
        ecxi_table_fini(&c->sessions);
        ecxi_table_fini(&c->front);
    }
    if (rc) {
        free(c->idx), free(c->cruns), free(c->remote), free(c->local), free(c);
        return rc;
    }
    pthread_mutex_init(&c->pmu, NULL);
    msgpack_sbuffer_init(&c->out);
    *out = c;
    return 0;
}

void ecxi_consumer_free(ecxi_consumer *c)
{
    if (!c) return;
    int64_t now = now_ms(c);
    while (c->sessions_list)
        session_close(c, c->sessions_list, now);
    /* Every READ is now failed or cancelled with its peer: free it all. */
    while (c->head) {
        xfer *x = c->head;
        if (x->dx) ecxi_data_read_release(x->dx);
        x->dx = NULL;
        free_blocks(c, x);
        xfer_delete(c, x);
    }
    for (xfer *x = c->incoming, *n; x; x = n) /* asked for, never admitted: no blocks */
        n = x->next, free(x);
    for (xfer *x = c->free_xfers, *n; x; x = n)
        n = x->next, free(x);
    ecxi_table_fini(&c->xfers);
    ecxi_table_fini(&c->sessions);
    ecxi_table_fini(&c->front);
    pthread_mutex_destroy(&c->pmu);
    msgpack_sbuffer_destroy(&c->out);
    free(c->idx), free(c->cruns), free(c->remote), free(c->local);
    free(c);
}

uint64_t ecxi_consumer_requests(const ecxi_consumer *c) { return c->st.requests; }

uint64_t ecxi_consumer_sessions_gen(const ecxi_consumer *c) { return c->sessions_gen; }
