/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events — encoder-cache events (see events.h; the wire format is
 * docs/EVENTS.md, which this file must match byte for byte).
 */
#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ctrl.h"
#include "ecx.h"
#include "events.h"
#include "table.h"
#include "util.h"

#define FORMAT_VERSION 1
#define PENDING_MAX (1u << 20)      /* encoded bytes waiting for the thread */
#define BATCH_BYTES (16u << 10)     /* a batch is cut after this many bytes of events */
#define RING_BATCHES 10000          /* batches kept for replay (vLLM's buffer_steps) */
#define RING_BYTES (16u << 20)      /* and at most this many bytes of them */
#define PUB_HWM 1000                /* batches queued per subscriber (each <= ~16 KiB) */
#define ROUTER_HWM 1000             /* replay messages queued per asker */
#define SNAPSHOT_EVENTS 256         /* events per snapshot message */
#define SNAPSHOT_REUSE_NS 100000000 /* a snapshot younger than this is sent again as is */
#define REQUESTS_PER_ROUND 16       /* replay requests served between two flushes */
#define STOP_LINGER_MS 200          /* time the last ("stop") batch gets to leave */
#define GATHER_NS 20000             /* a woken thread waits this long for more events */
#define REPEAT_NS 1000000000LL      /* idle this long: the newest batch is sent again */
#define JOIN_GAP_NS 10000000        /* empty batches for new subscribers: one per 10 ms at most */

/* Markers in the sequence frame of a replay reply (as signed 64-bit). */
#define SEQ_END UINT64_MAX              /* -1: end of this reply (vLLM's END_SEQ) */
#define SEQ_RESYNC (UINT64_MAX - 1)     /* -2: too old for the ring: ask for a snapshot */
#define SEQ_ERROR (UINT64_MAX - 2)      /* -3: malformed request; payload says why */
#define REQ_SNAPSHOT UINT64_MAX         /* request "since 2^64-1": a snapshot */

typedef struct held {
    ecxi_table_node node;
    uint64_t size_bytes, n_blocks;
    double ts; /* when it became ready */
    char key[];
} held;

typedef struct rec {
    uint64_t seq;
    char *buf; /* NULL: a hole (events lost before numbering) */
    size_t len;
} rec;

/* Events waiting for their batch: a chunk becomes one batch. */
typedef struct chunk {
    msgpack_sbuffer sb;
    uint32_t n;
} chunk;

typedef struct blob {
    char *buf;
    size_t len;
} blob;

struct ecxi_events {
    pthread_mutex_t mu; /* chunks, held, lost */
    chunk *chunks;      /* pending events */
    size_t n_chunks, chunks_cap, pending_bytes;
    bool lost;
    bool sleeping; /* the thread waits with nothing pending: the next event wakes it */
    ecxi_table held;
    int wake; /* eventfd: pending went non-empty, or stop */
    atomic_bool stopping;
    pthread_t thread;
    bool started;
    void *pub, *router;
    char topic[256];
    size_t topic_len;
    char host[256];
    int port;
    uint64_t block_bytes;
    /* The thread's own. */
    uint64_t seq; /* last number given (start: the start time in microseconds) */
    rec *ring;    /* RING_BATCHES slots, oldest at ring_head */
    size_t ring_head, ring_n, ring_bytes;
    uint64_t hole; /* the newest hole's number (0: none) */
    blob *snap; /* the last snapshot's messages, numbered snap_seq */
    size_t n_snap;
    uint64_t snap_seq;
    int64_t snap_ns;
    int64_t sent_ns;   /* when a batch was last sent */
    bool join_pending; /* a subscription came: an empty batch is due */
    int64_t join_ns;   /* when the last one went out */
    _Atomic uint64_t st[10]; /* ecxi_events_stats in order, but held */
};

enum { S_BATCHES, S_EVENTS, S_HWM, S_LOST, S_REPLAYS, S_RESYNCS, S_SNAPSHOTS, S_BAD, S_TRUNC };

static void count(ecxi_events *ev, int i, uint64_t n) { atomic_fetch_add(&ev->st[i], n); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void be64(unsigned char out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (unsigned char)v;
}

/* ---------- encoding (docs/EVENTS.md "Events") ---------- */

static void pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_stored(msgpack_packer *pk, const char *key, size_t n, uint64_t size,
                        uint64_t blocks, double ts)
{
    msgpack_pack_array(pk, 5);
    pack_str(pk, "EncoderCacheStored", 18);
    pack_str(pk, key, n);
    msgpack_pack_uint64(pk, size);
    msgpack_pack_uint64(pk, blocks);
    msgpack_pack_double(pk, ts);
}

static void pack_cleared(ecxi_events *ev, msgpack_packer *pk, const char *reason, uint64_t items)
{
    msgpack_pack_array(pk, 7);
    pack_str(pk, "EncoderCacheCleared", 19);
    pack_str(pk, reason, strlen(reason));
    msgpack_pack_uint64(pk, FORMAT_VERSION);
    pack_str(pk, ev->host, strlen(ev->host));
    msgpack_pack_uint64(pk, (uint64_t)ev->port);
    msgpack_pack_uint64(pk, ev->block_bytes);
    msgpack_pack_uint64(pk, items);
}

/* [ts, [n events]] with the events' encoded bytes: a batch malloc'ed to its
 * exact size (the ring counts and keeps many). */
static int batch(const char *events, size_t len, uint32_t n, blob *out)
{
    char head[32];
    msgpack_sbuffer sb = {0, head, sizeof head}; /* never grown: the header fits */
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, now_s());
    msgpack_pack_array(&pk, n);
    out->len = sb.size + len;
    if (!(out->buf = malloc(out->len ? out->len : 1))) return ECX_ENOMEM;
    memcpy(out->buf, head, sb.size);
    if (len) memcpy(out->buf + sb.size, events, len);
    return 0;
}

/* ---------- the hooks (engine's threads) ---------- */

/* Where the next event (about n bytes) goes, mu held: the last chunk, or
 * a new one when that holds BATCH_BYTES; NULL when the pending bound is
 * reached (the event is lost, and its batch will be a hole). Wakes the
 * thread if it sleeps. */
static msgpack_sbuffer *slot(ecxi_events *ev, size_t n)
{
    if (ev->pending_bytes + n + 64 > PENDING_MAX) goto lost;
    if (!ev->n_chunks || ev->chunks[ev->n_chunks - 1].sb.size >= BATCH_BYTES) {
        if (ev->n_chunks == ev->chunks_cap) {
            size_t cap = ev->chunks_cap ? 2 * ev->chunks_cap : 4;
            chunk *c = realloc(ev->chunks, cap * sizeof *c);
            if (!c) goto lost;
            ev->chunks = c, ev->chunks_cap = cap;
        }
        chunk *c = &ev->chunks[ev->n_chunks++];
        msgpack_sbuffer_init(&c->sb);
        c->n = 0;
    }
    if (ev->sleeping) { /* one write per wait, not per event */
        ev->sleeping = false;
        uint64_t one = 1;
        if (write(ev->wake, &one, sizeof one) < 0) { /* saturated: readable anyway */
        }
    }
    ev->pending_bytes += n + 64;
    ev->chunks[ev->n_chunks - 1].n++;
    return &ev->chunks[ev->n_chunks - 1].sb;
lost:
    ev->lost = true;
    count(ev, S_LOST, 1);
    return NULL;
}

void ecxi_events_stored(ecxi_events *ev, const char *key, size_t key_len, uint64_t size_bytes,
                        uint64_t n_blocks)
{
    if (!ev) return;
    pthread_mutex_lock(&ev->mu);
    ecxi_table_node *node = ecxi_table_find(&ev->held, key, key_len);
    held *h = node ? ECXI_CONTAINER_OF(node, held, node) : malloc(sizeof *h + key_len);
    if (h && !node) {
        memcpy(h->key, key, key_len);
        h->node.key = h->key, h->node.key_len = key_len;
        ecxi_table_insert(&ev->held, &h->node);
    }
    double ts = now_s();
    if (h) h->size_bytes = size_bytes, h->n_blocks = n_blocks, h->ts = ts;
    /* Without memory for the record the event still goes out; only a later
     * snapshot would miss the item. */
    msgpack_sbuffer *sb = slot(ev, key_len);
    if (sb) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
        pack_stored(&pk, key, key_len, size_bytes, n_blocks, ts);
    }
    pthread_mutex_unlock(&ev->mu);
}

void ecxi_events_removed(ecxi_events *ev, const char *key, size_t key_len, const char *reason)
{
    if (!ev) return;
    pthread_mutex_lock(&ev->mu);
    ecxi_table_node *node = ecxi_table_find(&ev->held, key, key_len);
    if (node) {
        ecxi_table_remove(&ev->held, node);
        free(ECXI_CONTAINER_OF(node, held, node));
        msgpack_sbuffer *sb = slot(ev, key_len);
        if (sb) {
            msgpack_packer pk;
            msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
            msgpack_pack_array(&pk, 4);
            pack_str(&pk, "EncoderCacheRemoved", 19);
            pack_str(&pk, key, key_len);
            pack_str(&pk, reason, strlen(reason));
            msgpack_pack_double(&pk, now_s());
        }
    }
    pthread_mutex_unlock(&ev->mu);
}

/* ---------- the ring ---------- */

static rec *ring_at(ecxi_events *ev, size_t i) { return &ev->ring[(ev->ring_head + i) % RING_BATCHES]; }

static void ring_drop_oldest(ecxi_events *ev)
{
    rec *r = ring_at(ev, 0);
    ev->ring_bytes -= r->len;
    free(r->buf);
    ev->ring_head = (ev->ring_head + 1) % RING_BATCHES;
    ev->ring_n--;
}

/* Keep batch seq (buf NULL: a hole); the ring takes buf. */
static void ring_push(ecxi_events *ev, uint64_t seq, char *buf, size_t len)
{
    while (ev->ring_n && (ev->ring_n == RING_BATCHES || ev->ring_bytes + len > RING_BYTES))
        ring_drop_oldest(ev);
    if (len > RING_BYTES) { /* never kept: a hole */
        free(buf);
        buf = NULL, len = 0;
    }
    if (!buf) ev->hole = seq;
    *ring_at(ev, ev->ring_n) = (rec){seq, buf, len};
    ev->ring_n++;
    ev->ring_bytes += len;
}

/* ---------- the thread ---------- */

static int send3(void *s, const void *a, size_t an, const void *b, size_t bn, const void *c,
                 size_t cn, int more)
{
    if (zmq_send(s, a, an, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return -1;
    if (zmq_send(s, b, bn, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return -1;
    return zmq_send(s, c, cn, more | ZMQ_DONTWAIT) < 0 ? -1 : 0;
}

/* Send one batch to every subscriber without blocking. With XPUB_NODROP the
 * send is refused whole if a subscriber is at its high-water mark: that is
 * counted, and the batch is sent again lossy, to those with room. */
static void publish(ecxi_events *ev, uint64_t seq, const char *buf, size_t len)
{
    unsigned char s[8];
    be64(s, seq);
    ev->sent_ns = ecxi_now_ns();
    if (send3(ev->pub, ev->topic, ev->topic_len, s, 8, buf, len, 0) == 0) return;
    if (zmq_errno() != EAGAIN) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "events: publish failed: %s", zmq_strerror(zmq_errno()));
        return;
    }
    count(ev, S_HWM, 1);
    int off = 0, on = 1;
    zmq_setsockopt(ev->pub, ZMQ_XPUB_NODROP, &off, sizeof off);
    send3(ev->pub, ev->topic, ev->topic_len, s, 8, buf, len, 0);
    zmq_setsockopt(ev->pub, ZMQ_XPUB_NODROP, &on, sizeof on);
}

/* What the hooks left, taken under mu (nothing is pending then). */
typedef struct taken {
    chunk *chunks;
    size_t n;
    bool lost;
} taken;

static taken take(ecxi_events *ev)
{
    taken t = {ev->chunks, ev->n_chunks, ev->lost};
    ev->chunks = NULL, ev->n_chunks = ev->chunks_cap = ev->pending_bytes = 0;
    ev->lost = false, ev->sleeping = false;
    return t;
}

/* Number what was taken, one batch per chunk (lost events first leave a
 * hole, a number with no batch, which makes subscribers take a snapshot),
 * keep the batches and send them. */
static void number(ecxi_events *ev, taken t)
{
    if (t.lost) ring_push(ev, ++ev->seq, NULL, 0);
    for (size_t i = 0; i < t.n; i++) {
        blob b;
        if (batch(t.chunks[i].sb.data, t.chunks[i].sb.size, t.chunks[i].n, &b) == 0) {
            ring_push(ev, ++ev->seq, b.buf, b.len);
            publish(ev, ev->seq, b.buf, b.len);
            count(ev, S_BATCHES, 1), count(ev, S_EVENTS, t.chunks[i].n);
        } else {
            ring_push(ev, ++ev->seq, NULL, 0); /* out of memory: a hole too */
        }
        msgpack_sbuffer_destroy(&t.chunks[i].sb);
    }
    free(t.chunks);
}

/* Drop what was taken (ecxi_events_free, if the thread never ran). */
static void number_free(taken t)
{
    for (size_t i = 0; i < t.n; i++) msgpack_sbuffer_destroy(&t.chunks[i].sb);
    free(t.chunks);
}

static void flush(ecxi_events *ev)
{
    pthread_mutex_lock(&ev->mu);
    taken t = take(ev);
    pthread_mutex_unlock(&ev->mu);
    number(ev, t);
}

static void reply_marker(ecxi_events *ev, const zmq_msg_t *id, uint64_t marker, const char *text)
{
    unsigned char s[8];
    be64(s, marker);
    send3(ev->router, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size(id), "", 0, s, 8, ZMQ_SNDMORE);
    zmq_send(ev->router, text, strlen(text), ZMQ_DONTWAIT);
}

/* One reply message; false if the asker's queue is full (the reply is cut:
 * it asks again after its timeout) or it is gone. */
static bool reply(ecxi_events *ev, const zmq_msg_t *id, uint64_t seq, const char *buf, size_t len)
{
    unsigned char s[8];
    be64(s, seq);
    if (send3(ev->router, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size(id), "", 0, s, 8,
              ZMQ_SNDMORE) < 0 ||
        zmq_send(ev->router, buf, len, ZMQ_DONTWAIT) < 0) {
        count(ev, S_TRUNC, 1);
        return false;
    }
    return true;
}

static void snap_free(ecxi_events *ev)
{
    for (size_t i = 0; i < ev->n_snap; i++) free(ev->snap[i].buf);
    free(ev->snap);
    ev->snap = NULL, ev->n_snap = 0;
}

/* The current contents as messages of SNAPSHOT_EVENTS events, the first
 * starting with a cleared event ("snapshot") that says how many stored
 * events follow. Flushes first, under the hooks' mutex, so the contents are
 * exactly the state after batch ev->seq. */
static int snapshot_build(ecxi_events *ev)
{
    pthread_mutex_lock(&ev->mu);
    taken t = take(ev); /* numbered below: the held set is the state after it */
    size_t items = ev->held.count, n_msgs = items / SNAPSHOT_EVENTS + 1, m = 0;
    blob *msgs = calloc(n_msgs, sizeof *msgs);
    int rc = msgs ? 0 : ECX_ENOMEM;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    uint32_t in_msg = 1;
    pack_cleared(ev, &pk, "snapshot", items);
    for (size_t b = 0; !rc && b < ev->held.n_buckets; b++)
        for (ecxi_table_node *nd = ev->held.buckets[b]; !rc && nd; nd = nd->next) {
            if (in_msg == SNAPSHOT_EVENTS) {
                rc = batch(sb.data, sb.size, in_msg, &msgs[m++]);
                msgpack_sbuffer_clear(&sb);
                in_msg = 0;
            }
            const held *h = ECXI_CONTAINER_OF(nd, held, node);
            pack_stored(&pk, h->key, h->node.key_len, h->size_bytes, h->n_blocks, h->ts);
            in_msg++;
        }
    pthread_mutex_unlock(&ev->mu);
    number(ev, t);
    uint64_t seq = ev->seq;
    if (!rc) rc = batch(sb.data, sb.size, in_msg, &msgs[m++]);
    msgpack_sbuffer_destroy(&sb);
    snap_free(ev);
    ev->snap = msgs, ev->n_snap = m;
    ev->snap_seq = seq, ev->snap_ns = ecxi_now_ns();
    if (rc) snap_free(ev);
    return rc;
}

static void serve_snapshot(ecxi_events *ev, const zmq_msg_t *id)
{
    count(ev, S_SNAPSHOTS, 1);
    /* Rebuilt only when stale: a flood of requests costs one build per
     * SNAPSHOT_REUSE_NS, and the hooks wait on mu for at most that build. */
    if (!ev->snap || (ev->snap_seq != ev->seq && ecxi_now_ns() - ev->snap_ns > SNAPSHOT_REUSE_NS))
        if (snapshot_build(ev)) {
            reply_marker(ev, id, SEQ_ERROR, "out of memory");
            return;
        }
    for (size_t i = 0; i < ev->n_snap; i++)
        if (!reply(ev, id, ev->snap_seq, ev->snap[i].buf, ev->snap[i].len)) return;
    reply_marker(ev, id, SEQ_END, "");
}

static void serve_since(ecxi_events *ev, const zmq_msg_t *id, uint64_t since)
{
    count(ev, S_REPLAYS, 1);
    /* The ring holds consecutive numbers, oldest first: since..seq must all
     * be in it, none a hole. */
    uint64_t oldest = ev->ring_n ? ring_at(ev, 0)->seq : ev->seq + 1;
    if (since <= ev->seq && (since < oldest || ev->hole >= since)) {
        count(ev, S_RESYNCS, 1);
        reply_marker(ev, id, SEQ_RESYNC, "");
        reply_marker(ev, id, SEQ_END, "");
        return;
    }
    for (size_t i = since > oldest ? (size_t)(since - oldest) : 0; i < ev->ring_n; i++) {
        const rec *r = ring_at(ev, i);
        if (!reply(ev, id, r->seq, r->buf, r->len)) return;
    }
    reply_marker(ev, id, SEQ_END, "");
}

/* Serve up to REQUESTS_PER_ROUND requests; true if more may wait. A request
 * is [identity, "", 8-byte big-endian N]: N = 2^64-1 asks for a snapshot,
 * anything else for every batch numbered N or more. */
static bool serve_replay(ecxi_events *ev)
{
    for (int served = 0; served < REQUESTS_PER_ROUND; served++) {
        zmq_msg_t part[3];
        int n = 0, more = 0;
        size_t ml = sizeof more;
        for (int i = 0; i < 3; i++) zmq_msg_init(&part[i]);
        if (zmq_msg_recv(&part[0], ev->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part[0]);
            for (int i = 1; i < 3; i++) zmq_msg_close(&part[i]);
            return false;
        }
        n = 1;
        bool extra = false;
        for (;;) {
            zmq_getsockopt(ev->router, ZMQ_RCVMORE, &more, &ml);
            if (!more) break;
            if (n < 3) {
                if (zmq_msg_recv(&part[n], ev->router, ZMQ_DONTWAIT) < 0) break;
                n++;
            } else { /* more frames than a request has: read and drop them */
                zmq_msg_t junk;
                zmq_msg_init(&junk);
                int rc = zmq_msg_recv(&junk, ev->router, ZMQ_DONTWAIT);
                zmq_msg_close(&junk);
                if (rc < 0) break;
                extra = true;
            }
        }
        if (n != 3 || extra || zmq_msg_size(&part[1]) != 0 || zmq_msg_size(&part[2]) != 8) {
            count(ev, S_BAD, 1);
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "events: malformed replay request (%d frames)", n);
            reply_marker(ev, &part[0], SEQ_ERROR,
                         "request is [\"\", 8-byte big-endian sequence number]");
        } else {
            const unsigned char *p = zmq_msg_data(&part[2]);
            uint64_t since = 0;
            for (int i = 0; i < 8; i++) since = since << 8 | p[i];
            flush(ev); /* answer with everything numbered so far */
            if (since == REQ_SNAPSHOT) serve_snapshot(ev, &part[0]);
            else serve_since(ev, &part[0], since);
        }
        for (int i = 0; i < 3; i++) zmq_msg_close(&part[i]);
    }
    return true;
}

/* Subscriptions arrive on the XPUB as messages (every one: XPUB_VERBOSE).
 * A subscriber that (re)connects may have missed batches published before
 * its subscription reached us, and cannot tell until the next batch: so a
 * subscription is answered with an empty batch, whose number shows the gap
 * (at most one per JOIN_GAP_NS: a flood of subscriptions cannot flush the
 * ring). Returns how long until the next one is due (ms; -1: none). */
static int drain_subscriptions(ecxi_events *ev)
{
    char buf[300];
    int n;
    for (int i = 0; i < 256 && (n = zmq_recv(ev->pub, buf, sizeof buf, ZMQ_DONTWAIT)) >= 0; i++)
        if (n >= 1 && buf[0] == 1) ev->join_pending = true;
    if (!ev->join_pending) return -1;
    int64_t left = ev->join_ns + JOIN_GAP_NS - ecxi_now_ns();
    if (left > 0) return (int)(left / 1000000) + 1;
    blob b;
    if (batch(NULL, 0, 0, &b) == 0) {
        ring_push(ev, ++ev->seq, b.buf, b.len);
        publish(ev, ev->seq, b.buf, b.len);
        count(ev, S_BATCHES, 1);
    }
    ev->join_pending = false;
    ev->join_ns = ecxi_now_ns();
    return -1;
}

/* PUB/SUB loses a batch silently, and a subscriber learns of it only from
 * the next number: when none comes, the newest batch is sent again (same
 * number, same bytes; who has it skips it) every REPEAT_NS while idle.
 * Returns the ms until the next repeat (-1: nothing to repeat). */
static int repeat_newest(ecxi_events *ev)
{
    if (!ev->ring_n || !ring_at(ev, ev->ring_n - 1)->buf) return -1;
    int64_t left = ev->sent_ns + REPEAT_NS - ecxi_now_ns();
    if (left <= 0) {
        const rec *r = ring_at(ev, ev->ring_n - 1);
        publish(ev, r->seq, r->buf, r->len);
        left = REPEAT_NS;
    }
    return (int)(left / 1000000) + 1;
}

static void *events_main(void *arg)
{
    ecxi_events *ev = arg;
    bool busy = true;
    int wait_ms = -1;
    while (!atomic_load(&ev->stopping)) {
        zmq_pollitem_t it[3] = {{ev->router, 0, ZMQ_POLLIN, 0},
                                {ev->pub, 0, ZMQ_POLLIN, 0},
                                {NULL, ev->wake, ZMQ_POLLIN, 0}};
        pthread_mutex_lock(&ev->mu);
        ev->sleeping = !busy && !ev->n_chunks && !ev->lost;
        long wait = ev->sleeping ? wait_ms : 0;
        pthread_mutex_unlock(&ev->mu);
        zmq_poll(it, 3, wait);
        uint64_t v;
        if (read(ev->wake, &v, sizeof v) == sizeof v) {
            /* Woken by an event: let the ones right behind it join its batch
             * (fewer, larger batches; the hooks rarely meet this thread on mu). */
            struct timespec gather = {0, GATHER_NS};
            nanosleep(&gather, NULL);
        }
        flush(ev);
        busy = serve_replay(ev);
        wait_ms = drain_subscriptions(ev);
        int repeat_ms = repeat_newest(ev);
        if (wait_ms < 0 || (repeat_ms >= 0 && repeat_ms < wait_ms)) wait_ms = repeat_ms;
    }
    /* The last batch: everything pending, then "stop". */
    pthread_mutex_lock(&ev->mu);
    msgpack_sbuffer *sb = slot(ev, 0);
    if (sb) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
        pack_cleared(ev, &pk, "stop", 0);
    }
    pthread_mutex_unlock(&ev->mu);
    flush(ev);
    return NULL;
}

/* ---------- setup ---------- */

static int set_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static int bind_socket(const ecxi_events_opts *o, int type, const char *host, int port,
                       void **out)
{
    char ep[300];
    int n = snprintf(ep, sizeof ep, strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", host,
                     port);
    if (n <= 0 || (size_t)n >= sizeof ep) return ECX_EINVAL;
    void *s = zmq_socket(o->zctx, type);
    if (!s) return ECX_ESYS;
    *out = s;
    /* Requests and subscriptions are tiny, CURVE's handshake commands are
     * not (INITIATE is some 250 bytes); a larger frame closes the connection. */
    int64_t max_in = 1024;
    if (set_int(s, ZMQ_LINGER, 0) || set_int(s, ZMQ_IPV6, 1) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_in, sizeof max_in) ||
        set_int(s, ZMQ_SNDHWM, type == ZMQ_ROUTER ? ROUTER_HWM : PUB_HWM) ||
        set_int(s, ZMQ_RCVHWM, 64))
        return ECX_ESYS;
    if (type == ZMQ_ROUTER && set_int(s, ZMQ_ROUTER_MANDATORY, 1)) return ECX_ESYS;
    if (type == ZMQ_XPUB && (set_int(s, ZMQ_XPUB_NODROP, 1) || set_int(s, ZMQ_XPUB_VERBOSE, 1)))
        return ECX_ESYS;
    if (o->curve_secret_key) {
        if (ecxi_ctrl_key_parse(o->curve_secret_key, NULL)) return ECX_EINVAL;
        if (set_int(s, ZMQ_CURVE_SERVER, 1) ||
            zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, o->curve_secret_key, ECXI_CTRL_KEY_Z85))
            return ECX_ESYS;
    }
    if (zmq_bind(s, ep)) {
        ecxi_log(ECX_LOG_ERROR, "events: cannot bind %s: %s", ep, zmq_strerror(zmq_errno()));
        return ECX_ESYS;
    }
    return 0;
}

int ecxi_events_new(const ecxi_events_opts *o, ecxi_events **out)
{
    char host[256];
    int port, rc;
    const char *topic = o->topic ? o->topic : "";
    if (ecxi_ctrl_parse_addr(o->endpoint, host, &port) || port < 1 || port > 65534) {
        ecxi_log(ECX_LOG_ERROR, "events endpoint '%s' is not HOST:PORT with PORT 1..65534 "
                 "(the replay socket takes PORT + 1)", o->endpoint);
        return ECX_EINVAL;
    }
    if (strlen(topic) >= sizeof ((ecxi_events *)0)->topic) {
        ecxi_log(ECX_LOG_ERROR, "events topic is over 255 bytes");
        return ECX_EINVAL;
    }
    ecxi_events *ev = calloc(1, sizeof *ev);
    if (!ev) return ECX_ENOMEM;
    pthread_mutex_init(&ev->mu, NULL);
    ev->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ev->topic_len = strlen(topic);
    memcpy(ev->topic, topic, ev->topic_len);
    snprintf(ev->host, sizeof ev->host, "%s", o->peer_host ? o->peer_host : "");
    ev->port = o->peer_port;
    ev->block_bytes = o->block_bytes;
    /* Numbers start at the start time in microseconds, so a restarted
     * producer's numbers jump ahead of its last life's: subscribers see a
     * gap older than any ring, and take a snapshot. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev->seq = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    ev->ring = calloc(RING_BATCHES, sizeof *ev->ring);
    rc = ev->wake < 0 ? ECX_ESYS : !ev->ring ? ECX_ENOMEM : ecxi_table_init(&ev->held);
    if (!rc) rc = bind_socket(o, ZMQ_XPUB, host, port, &ev->pub);
    if (!rc) rc = bind_socket(o, ZMQ_ROUTER, host, port + 1, &ev->router);
    if (!rc) {
        msgpack_sbuffer *sb = slot(ev, 0);
        if (sb) {
            msgpack_packer pk;
            msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
            pack_cleared(ev, &pk, "start", 0);
        }
        if (pthread_create(&ev->thread, NULL, events_main, ev)) rc = ECX_ESYS;
        else ev->started = true;
    }
    if (rc) {
        ecxi_events_free(ev);
        return rc;
    }
    ecxi_log(ECX_LOG_INFO, "events: publishing on %s (replay on port %d)", o->endpoint, port + 1);
    *out = ev;
    return 0;
}

void ecxi_events_free(ecxi_events *ev)
{
    if (!ev) return;
    if (ev->started) {
        atomic_store(&ev->stopping, true);
        uint64_t one = 1;
        if (write(ev->wake, &one, sizeof one) < 0) { /* saturated: readable anyway */
        }
        pthread_join(ev->thread, NULL);
    }
    if (ev->pub) {
        set_int(ev->pub, ZMQ_LINGER, STOP_LINGER_MS); /* give "stop" a moment to leave */
        zmq_close(ev->pub);
    }
    if (ev->router) zmq_close(ev->router);
    if (ev->wake >= 0) close(ev->wake);
    while (ev->ring && ev->ring_n) ring_drop_oldest(ev);
    free(ev->ring);
    snap_free(ev);
    if (ev->held.buckets) {
        for (size_t b = 0; b < ev->held.n_buckets; b++)
            for (ecxi_table_node *n = ev->held.buckets[b], *next; n; n = next) {
                next = n->next;
                free(ECXI_CONTAINER_OF(n, held, node));
            }
        ecxi_table_fini(&ev->held);
    }
    number_free(take(ev));
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

ecxi_events_stats ecxi_events_get_stats(ecxi_events *ev)
{
    ecxi_events_stats s = {0};
    if (!ev) return s;
    s.batches = atomic_load(&ev->st[S_BATCHES]);
    s.events = atomic_load(&ev->st[S_EVENTS]);
    s.hwm_drops = atomic_load(&ev->st[S_HWM]);
    s.lost = atomic_load(&ev->st[S_LOST]);
    s.replays = atomic_load(&ev->st[S_REPLAYS]);
    s.resyncs = atomic_load(&ev->st[S_RESYNCS]);
    s.snapshots = atomic_load(&ev->st[S_SNAPSHOTS]);
    s.bad_requests = atomic_load(&ev->st[S_BAD]);
    s.reply_truncated = atomic_load(&ev->st[S_TRUNC]);
    pthread_mutex_lock(&ev->mu);
    s.held = ev->held.count;
    pthread_mutex_unlock(&ev->mu);
    return s;
}
