/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_tcp — the data path across hosts that ecx controls end to end: its
 * own small protocol on plain TCP, no third-party wire format. The
 * producer owns a listener and its connections, and sends a live grant's
 * bytes straight from the region (sendmsg over the grant's block runs) to
 * the request that names its key and token, and nothing else; the
 * consumer owns one connection per producer, receives straight into its
 * blocks and hashes each chunk while it is in cache. Both sides move an
 * item in bounded slices (data.h) from progress / poll_notifs, no thread;
 * ecxi_data_fd() is a level-triggered epoll descriptor over the sockets.
 * This file owns the messages, the connection budget's use
 * (conn_budget.h), every timeout and bound (TCP_* below), and the cut of
 * a reply whose grant is let go (tcp_cut: the pin outlives the send). The
 * protocol, what each side can do to the other and what is left open
 * (the bytes cross the network unencrypted): docs/PROTOCOL.md §6.7.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fsum.h"
#include "conn_budget.h"
#include "data_impl.h"
#include "util.h"

#define TCP_PROTO 1
#define TCP_GET 'G'
#define TCP_DECLINE 'C'
#define TCP_OK 0
#define TCP_REFUSED 1
#define TCP_REQ_HEAD 28 /* version, type, id, token, key_len */
#define TCP_REQ_MAX (TCP_REQ_HEAD + ECXI_DATA_NOTIF_MAX)
#define TCP_REP_HEAD 9  /* id, status */
#define TCP_REP_OK 17   /* id, status, nbytes */

/* The data plane's own protocol bounds and timeouts: internal to this path
 * (no ecx_config knob, so no ECX_DEFAULT_* in ecx.h), and kept here, beside
 * the protocol they bound. Producer bounds. */
#define TCP_MAX_CONNS 256
#define TCP_MAX_PER_PREFIX 128 /* per /24 (IPv4) or /64 (IPv6) */
#define TCP_MAX_PER_HOST 32
#define TCP_BACKLOG 128
#define TCP_IN_MAX 4096           /* request bytes read ahead per connection */
#define TCP_DECLINES_PER_STEP 256 /* 'C' requests handled per connection per call */
#define TCP_LINGER_MS 200 /* a dropped peer's unsent declines: at most this to leave */
#define TCP_HELLO_MS 10000        /* connected, no whole request yet; idle, none served */
#define TCP_REQ_MS 5000           /* a started request, first byte to last */
#define TCP_IDLE_MS 60000         /* between requests */
#define TCP_EVICT_KEEP_MS 1000    /* a reply this young is never evicted */
#define TCP_SEND_STALL_MS 30000   /* a reply that makes no progress */
#define TCP_IOV 64                /* runs per sendmsg */
/* Consumer. */
#define TCP_CONS_IDLE_MS 20000 /* close an idle connection before the producer does */
#define TCP_RECV_CHUNK ECXI_DATA_CHUNK /* per recv: hashed while in cache */
#define TCP_SCRATCH 65536
#define TCP_EVENTS 64
#define TCP_SWEEP_MS 50

/* ---- shared ------------------------------------------------------------ */

typedef struct run {
    uint64_t off, len; /* bytes in the region */
} run;

typedef struct tcp_counters {
    uint64_t accepted, conns_refused, evicted, served, refused, bad_requests, timeouts,
        stalls, send_failures, bytes, cuts, declined;
} tcp_counters;

typedef struct tcp_conn tcp_conn;
typedef struct tcp_peer tcp_peer;

/* A completion waiting for poll_notifs. */
typedef struct tnotif {
    struct tnotif *next;
    int status;
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    size_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1];
} tnotif;

/* The producer's side of one connection. */
struct tcp_conn {
    tcp_conn *next;
    int fd;
    bool dead; /* closed during this progress; freed at its end */
    struct sockaddr_storage from;
    uint8_t key[16]; /* its address, for the connection budget */
    uint32_t events; /* epoll interest now */
    uint8_t in[TCP_IN_MAX];
    size_t in_len;
    uint64_t requests, served; /* answered; of them, served a grant */
    int64_t last_in_ms, last_out_ms;
    int64_t accepted_ms, req_ms, reply_ms; /* accept; a started request's, a reply's start */
    bool in_req;                           /* in[] holds the start of a request */
    /* The reply being sent: header, then the runs; the grant's completion. */
    uint8_t hdr[TCP_REP_OK];
    size_t hdr_len, hdr_off;
    run *runs;
    size_t nruns, run_i;
    uint64_t run_off;
    tnotif *pending;
};

typedef struct tcp_xfer {
    ecxi_data_xfer head;
    struct tcp_xfer *next; /* the peer's queue, oldest first */
    tcp_peer *peer;        /* NULL once off the queue */
    int state;
    bool released;
    uint64_t id, nbytes, checksum;
    int64_t deadline_ms;
    run *runs; /* local destination runs */
    size_t nruns;
} tcp_xfer;

/* The consumer's side of one producer. */
struct tcp_peer {
    ecxi_data_peer head;
    tcp_peer *next;
    int fd; /* -1: not connected (the next READ connects) */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    uint32_t events;
    int64_t last_ms;
    uint8_t *out; /* requests not yet sent */
    size_t out_len, out_cap;
    tcp_xfer *q, **q_tail;
    /* The reply being received (for q, the oldest). */
    uint8_t rh[TCP_REP_OK];
    size_t rh_len;
    bool in_body;
    uint64_t got;
    size_t run_i;
    uint64_t run_off;
    ecxi_fsum sum; /* the body's XXH3-64, hashed right after each recv */
};

typedef struct tcp_data {
    ecxi_data base;
    int epfd;
    int lfd; /* producer: listener */
    tcp_counters c;
    int64_t next_sweep_ms;
    /* producer */
    tcp_conn *conns, *dead;
    unsigned nconns;
    tnotif *done, **done_tail;
    /* consumer */
    tcp_peer *peers;
    uint8_t scratch[TCP_SCRATCH];
} tcp_data;

static const struct ecxi_data_ops tcp_ops;
static char listener_tag; /* epoll data of the listener */


/* Set fd's epoll interest to ev (cached in *cur); ptr is its data. */
static void set_events(tcp_data *t, int fd, uint32_t *cur, uint32_t ev, void *ptr)
{
    if (*cur == ev) return;
    struct epoll_event e = {.events = ev, .data.ptr = ptr};
    if (epoll_ctl(t->epfd, *cur ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &e) != 0)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data tcp: epoll_ctl: %s", strerror(errno));
    *cur = ev;
}

/* The byte runs of the block runs blocks[0..n) of bs bytes, nbytes in
 * all; malloc'd into *out. */
static int byte_runs(const ecxi_block_run *blocks, size_t n, uint64_t bs, uint64_t nbytes,
                     run **out, size_t *nruns)
{
    run *r = malloc(n * sizeof *r);
    if (!r) return ECX_ENOMEM;
    size_t k = 0;
    for (uint64_t left = nbytes; k < n && left; k++) {
        uint64_t len = blocks[k].count * bs < left ? blocks[k].count * bs : left;
        r[k] = (run){blocks[k].first * bs, len};
        left -= len;
    }
    *out = r;
    *nruns = k;
    return 0;
}

/* The same for a grant's block indices blocks[0..n). */
static int grant_runs(const uint64_t *blocks, size_t n, uint64_t bs, uint64_t nbytes, run **out,
                      size_t *nruns)
{
    ecxi_block_run *b = malloc(n * sizeof *b);
    if (!b) return ECX_ENOMEM;
    int rc = byte_runs(b, ecxi_block_runs_of(blocks, n, b), bs, nbytes, out, nruns);
    free(b);
    return rc;
}

/* ---- producer: connections ------------------------------------------- */

/* A completion of (key, token), status 0; NULL without memory. */
static tnotif *notif_new(const uint8_t *token, const char *key, size_t key_len)
{
    tnotif *n = malloc(sizeof *n);
    if (!n) return NULL;
    memcpy(n->token, token, ECXI_DATA_TOKEN_LEN);
    memcpy(n->key, key, key_len);
    n->key[key_len] = 0;
    n->key_len = key_len;
    n->status = 0;
    return n;
}

static void queue_notif(tcp_data *t, tnotif *n)
{
    n->next = NULL;
    *t->done_tail = n;
    t->done_tail = &n->next;
}

/* Close c (its reply, if unfinished, is a failed send); freed at the end of
 * this progress, so events already fetched for it are skipped. */
static void conn_close(tcp_data *t, tcp_conn *c)
{
    if (c->dead) return;
    close(c->fd);
    c->dead = true;
    if (c->pending) {
        c->pending->status = ECX_EDATA_PEER;
        queue_notif(t, c->pending);
        c->pending = NULL;
        t->c.send_failures++;
    }
    free(c->runs);
    c->runs = NULL;
    for (tcp_conn **pp = &t->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    t->nconns--;
    c->next = t->dead;
    t->dead = c;
}

static void reap_dead(tcp_data *t)
{
    while (t->dead) {
        tcp_conn *c = t->dead;
        t->dead = c->next;
        free(c);
    }
}

/* How evictable c is (conn_budget.h): 0 idle (the longest idle, and those
 * only refused, first), 1 a request started (the oldest first), 2 a reply
 * running for TCP_EVICT_KEEP_MS (the slowest first); a younger reply never. */
static void conn_slot(const tcp_conn *c, int64_t now, ecxi_conn_slot *s)
{
    if (c->hdr_len) {
        int64_t ms = now - c->reply_ms;
        uint64_t sent = c->hdr_off;
        for (size_t i = 0; i < c->run_i && i < c->nruns; i++)
            sent += c->runs[i].len;
        sent += c->run_off;
        s->tier = ms < TCP_EVICT_KEEP_MS ? ECXI_CONN_KEEP : 2;
        s->since = ms > 0 ? (int64_t)(sent / (uint64_t)ms) : 0; /* bytes per ms */
    } else if (c->in_len) {
        s->tier = 1;
        s->since = c->req_ms;
    } else {
        s->tier = 0;
        s->since = c->served ? c->last_in_ms : c->last_in_ms - TCP_IDLE_MS;
    }
}

/* Make room for a newcomer from key, if its share allows (conn_budget.h):
 * true to accept it (a connection evicted for it if need be). */
static bool admit(tcp_data *t, const uint8_t key[16], int64_t now)
{
    ecxi_conn_slot slots[TCP_MAX_CONNS];
    tcp_conn *by_id[TCP_MAX_CONNS];
    size_t n = 0;
    for (tcp_conn *c = t->conns; c && n < TCP_MAX_CONNS; c = c->next) {
        memcpy(slots[n].key, c->key, 16);
        conn_slot(c, now, &slots[n]);
        slots[n].id = n;
        by_id[n++] = c;
    }
    static const ecxi_conn_caps caps = {TCP_MAX_CONNS, TCP_MAX_PER_PREFIX, TCP_MAX_PER_HOST};
    size_t victim = 0;
    int rc = ecxi_conn_admit(slots, n, key, &caps, &victim);
    if (rc == ECXI_CONN_ADMIT) return true;
    if (rc != ECXI_CONN_EVICT || victim >= n) return false;
    tcp_conn *v = by_id[victim];
    t->c.evicted++;
    ECXI_LOG_RATELIMITED(ECX_LOG_INFO,
                        "data tcp: connection evicted for a newcomer (%s; %" PRIu64 " so far)",
                        v->hdr_len ? "the slowest reply" : v->in_len ? "unfinished request"
                                                                     : "idle",
                        t->c.evicted);
    conn_close(t, v);
    return true;
}

static int accept_conns(tcp_data *t, int64_t now)
{
    int n = 0;
    for (int i = 0; i < TCP_EVENTS; i++) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        int fd = accept4(t->lfd, (struct sockaddr *)&from, &fl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED &&
                errno != EINTR)
                ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data tcp: accept: %s", strerror(errno));
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            continue;
        }
        uint8_t key[16];
        ecxi_conn_key((struct sockaddr *)&from, key);
        tcp_conn *c = NULL;
        if (!admit(t, key, now) || !(c = calloc(1, sizeof *c))) {
            close(fd);
            t->c.conns_refused++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data tcp: connection refused (%u held; its address or prefix "
                                "holds its share; %" PRIu64 " refused so far)",
                                t->nconns, t->c.conns_refused);
            continue;
        }
        memcpy(c->key, key, sizeof key);
        c->accepted_ms = now;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        c->from = from;
        c->last_in_ms = c->last_out_ms = now;
        c->next = t->conns;
        t->conns = c;
        t->nconns++;
        t->c.accepted++;
        set_events(t, fd, &c->events, EPOLLIN, c);
        n++;
    }
    return n;
}

/* Hand c's reply to the kernel, at most ECXI_DATA_CHUNK bytes per sendmsg,
 * while the socket takes it and the slice lasts: 0 when all of it is sent,
 * 1 when the socket is full, 2 when the slice is spent, negative on error. */
static int conn_flush(tcp_data *t, tcp_conn *c, int64_t now, ecxi_slice *sl)
{
    uint8_t *base = ecxi_region_base(t->base.region);
    for (;;) {
        struct iovec iov[TCP_IOV + 1];
        int k = 0;
        size_t room = ECXI_DATA_CHUNK;
        if (c->hdr_off < c->hdr_len)
            iov[k++] = (struct iovec){c->hdr + c->hdr_off, c->hdr_len - c->hdr_off};
        for (size_t i = c->run_i; i < c->nruns && k < TCP_IOV + 1 && room; i++) {
            uint64_t skip = i == c->run_i ? c->run_off : 0;
            uint64_t len = c->runs[i].len - skip;
            if (len > room) len = room;
            iov[k++] = (struct iovec){base + c->runs[i].off + skip, (size_t)len};
            room -= (size_t)len;
        }
        if (k == 0) return 0;
        if (ecxi_slice_spent(sl)) return 2;
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t s = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (s < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 1;
            if (errno == EINTR) continue;
            return ECX_ESYS;
        }
        c->last_out_ms = now;
        size_t left = (size_t)s;
        size_t h = c->hdr_len - c->hdr_off < left ? c->hdr_len - c->hdr_off : left;
        c->hdr_off += h;
        left -= h;
        t->c.bytes += left;
        sl->bytes += left;
        while (left && c->run_i < c->nruns) {
            uint64_t room = c->runs[c->run_i].len - c->run_off;
            uint64_t take = left < room ? left : room;
            c->run_off += take;
            left -= take;
            if (c->run_off == c->runs[c->run_i].len) c->run_i++, c->run_off = 0;
        }
    }
}

/* Answer one parsed request: a refusal header, or the grant's header and
 * runs (sent by conn_flush). */
static void conn_answer(tcp_data *t, tcp_conn *c, uint64_t id, const uint8_t *token,
                        const char *key, size_t key_len)
{
    ecxi_data_grant g;
    int rc = ecxi_data_grant_check(&t->base, key, key_len, token, ECXI_DATA_GRANT_CLAIM, &g);
    ecxi_put_le64(c->hdr, id);
    c->hdr_off = 0;
    c->hdr_len = TCP_REP_HEAD;
    c->hdr[8] = TCP_REFUSED;
    if (rc) {
        t->c.refused++;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO,
                            "data tcp: request refused (no live grant with that key and "
                            "token; %" PRIu64 " refused so far)",
                            t->c.refused);
        return;
    }
    /* The grant is claimed: whatever happens now, the session hears of it. */
    tnotif *n = notif_new(token, key, key_len);
    uint64_t bs = ecxi_region_block_bytes(t->base.region);
    uint64_t nb = ecxi_region_num_blocks(t->base.region);
    bool sane = g.n > 0 && g.nbytes > (g.n - 1) * bs && g.nbytes <= g.n * bs;
    for (size_t i = 0; sane && i < g.n; i++)
        sane = g.blocks[i] < nb;
    if (!n || !sane || grant_runs(g.blocks, g.n, bs, g.nbytes, &c->runs, &c->nruns) != 0) {
        if (!sane) ecxi_log(ECX_LOG_ERROR, "data tcp: the session granted blocks out of range");
        if (n) {
            n->status = sane ? ECX_ENOMEM : ECX_EDATA_INDEX;
            queue_notif(t, n);
        }
        return;
    }
    c->hdr[8] = TCP_OK;
    ecxi_put_le64(c->hdr + 9, g.nbytes);
    c->hdr_len = TCP_REP_OK;
    c->run_i = 0;
    c->run_off = 0;
    c->pending = n;
    t->c.served++;
}

/* Parse the request at the front of c->in: its length, 0 if incomplete,
 * negative if malformed (the caller closes). */
static long parse_request(tcp_conn *c, uint8_t *type, uint64_t *id, const uint8_t **token,
                          const char **key, size_t *key_len)
{
    const uint8_t *b = c->in;
    if (c->in_len >= 2 && (b[0] != TCP_PROTO || (b[1] != TCP_GET && b[1] != TCP_DECLINE)))
        return -1;
    if (c->in_len < TCP_REQ_HEAD) return 0;
    size_t kl = (size_t)b[26] | (size_t)b[27] << 8;
    if (kl == 0 || kl > ECXI_DATA_NOTIF_MAX) return -1;
    if (c->in_len < TCP_REQ_HEAD + kl) return 0;
    *type = b[1];
    *id = ecxi_get_le64(b + 2);
    *token = b + 10;
    *key = (const char *)b + TCP_REQ_HEAD;
    *key_len = kl;
    return (long)(TCP_REQ_HEAD + kl);
}

/* Move c on as far as it goes: finish the reply, then answer requests in
 * order, reading more only when no whole request is buffered. */
static int conn_step(tcp_data *t, tcp_conn *c, int64_t now, ecxi_slice *sl)
{
    int n = 0, declines = 0;
    while (!c->dead) {
        int rc = conn_flush(t, c, now, sl);
        if (rc < 0) {
            ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "data tcp: send failed: %s", strerror(errno));
            conn_close(t, c);
            break;
        }
        if (rc == 1 || rc == 2) { /* full, or out of time: the next slice goes on */
            set_events(t, c->fd, &c->events, EPOLLOUT, c);
            break;
        }
        if (c->pending) { /* the item is wholly with the kernel */
            queue_notif(t, c->pending);
            c->pending = NULL;
            n++;
        }
        free(c->runs);
        c->runs = NULL;
        c->nruns = c->run_i = 0;
        c->hdr_len = c->hdr_off = 0;

        uint8_t type = 0;
        uint64_t id;
        const uint8_t *token;
        const char *key;
        size_t key_len;
        long used = parse_request(c, &type, &id, &token, &key, &key_len);
        if (used < 0) {
            t->c.bad_requests++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data tcp: malformed request; connection closed (%" PRIu64
                                " so far)",
                                t->c.bad_requests);
            conn_close(t, c);
            break;
        }
        if (used > 0 && type == TCP_DECLINE) {
            tnotif *dn = notif_new(token, key, key_len); /* lost if not: the lease releases it */
            if (dn) queue_notif(t, dn);
            t->c.declined++;
            declines++;
            c->in_req = false;
            memmove(c->in, c->in + used, c->in_len - (size_t)used);
            c->in_len -= (size_t)used;
            n++;
            continue;
        }
        if (used > 0) {
            conn_answer(t, c, id, token, key, key_len);
            c->requests++;
            c->served += c->hdr_len == TCP_REP_OK;
            c->reply_ms = now;
            c->in_req = false;
            memmove(c->in, c->in + used, c->in_len - (size_t)used);
            c->in_len -= (size_t)used;
            n++;
            continue;
        }
        /* Declines get no reply, so nothing holds back a peer that streams
         * them: read on in the next progress call (the socket stays
         * readable; no whole request is left in c->in here). */
        if (declines >= TCP_DECLINES_PER_STEP) {
            set_events(t, c->fd, &c->events, EPOLLIN, c);
            break;
        }
        if (c->in_len && !c->in_req) { /* a request has started: TCP_REQ_MS from now */
            c->in_req = true;
            c->req_ms = now;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, MSG_DONTWAIT);
        if (r > 0) {
            c->in_len += (size_t)r;
            c->last_in_ms = now;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_events(t, c->fd, &c->events, EPOLLIN, c);
            break;
        }
        if (r < 0 && errno == EINTR) continue;
        conn_close(t, c); /* the peer closed, or an error */
    }
    return n;
}

/* Close connections past their time (bounds at the top of the file). */
static void sweep_conns(tcp_data *t, int64_t now)
{
    for (tcp_conn *c = t->conns, *next; c; c = next) {
        next = c->next;
        const char *why = NULL;
        if (c->hdr_len)
            why = now - c->last_out_ms > TCP_SEND_STALL_MS ? "its reply stalled" : NULL;
        else if (!c->requests && now - c->accepted_ms > TCP_HELLO_MS)
            why = "no whole request";
        else if (c->in_req)
            why = now - c->req_ms > TCP_REQ_MS ? "a request not finished in time" : NULL;
        else if (!c->served && c->requests)
            why = now - c->last_in_ms > TCP_HELLO_MS ? "idle, nothing served" : NULL;
        else if (c->requests)
            why = now - c->last_in_ms > TCP_IDLE_MS ? "idle" : NULL;
        if (!why) continue;
        if (c->hdr_len)
            t->c.stalls++;
        else
            t->c.timeouts++;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "data tcp: connection closed: %s", why);
        conn_close(t, c);
    }
}

/* The session lets go of a claimed grant (data.h, ecxi_data_cut): if a
 * connection is still sending it, close that connection. Its fd is closed
 * here, so no sendmsg reads the grant's blocks after this (what the kernel
 * already holds is a copy), and its failed completion is queued for
 * poll_notifs, after which the session unpins. */
static int tcp_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    tcp_data *t = (tcp_data *)d;
    for (tcp_conn *c = t->conns; c; c = c->next) {
        tnotif *n = c->pending;
        if (c->dead || !n || n->key_len != key_len ||
            sodium_memcmp(n->token, token, ECXI_DATA_TOKEN_LEN) != 0 || memcmp(n->key, key, key_len))
            continue;
        t->c.cuts++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                            "data tcp: cut a send whose grant was let go (lease expired, "
                            "replaced or completed; %" PRIu64 " so far)",
                            t->c.cuts);
        conn_close(t, c);
        return 1;
    }
    return 0;
}

static int producer_progress(tcp_data *t, ecxi_slice *sl)
{
    struct epoll_event ev[TCP_EVENTS];
    int64_t now = ecxi_now_ms(NULL);
    int k = epoll_wait(t->epfd, ev, TCP_EVENTS, 0), n = 0;
    for (int i = 0; i < k; i++) {
        if (ev[i].data.ptr == &listener_tag) {
            n += accept_conns(t, now);
            continue;
        }
        tcp_conn *c = ev[i].data.ptr;
        if (!c->dead) n += conn_step(t, c, now, sl);
    }
    if (now >= t->next_sweep_ms) {
        sweep_conns(t, now);
        t->next_sweep_ms = now + TCP_SWEEP_MS;
    }
    reap_dead(t);
    return n;
}

static int listen_on(tcp_data *t, const ecxi_data_opts *opts, ecxi_data_meta *m)
{
    struct sockaddr_storage bind_ss, pub;
    bool any;
    int rc = ecxi_data_bind_addr(opts ? opts->bind_host : NULL, &bind_ss, &pub, &any);
    if (rc) return rc;
    socklen_t sl = bind_ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
    t->lfd = socket(bind_ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->lfd < 0) return ECX_ESYS;
    int one = 1;
    setsockopt(t->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(t->lfd, (struct sockaddr *)&bind_ss, sl) != 0 || listen(t->lfd, TCP_BACKLOG) != 0) {
        ecxi_log(ECX_LOG_WARN, "data tcp: cannot listen: %s", strerror(errno));
        return ECX_ESYS;
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    if (getsockname(t->lfd, (struct sockaddr *)&got, &gl) != 0) return ECX_ESYS;
    m->has_tcp = true;
    if (pub.ss_family == AF_INET6) {
        m->tcp_family = 6;
        memcpy(m->tcp_addr, &((struct sockaddr_in6 *)&pub)->sin6_addr, 16);
    } else {
        m->tcp_family = 4;
        memcpy(m->tcp_addr, &((struct sockaddr_in *)&pub)->sin_addr, 4);
    }
    m->tcp_port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                  : ((struct sockaddr_in *)&got)->sin_port);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &listener_tag};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->lfd, &e) != 0) return ECX_ESYS;
    if (any)
        ecxi_log(ECX_LOG_INFO, "data tcp: listening on every interface (no advertised host)");
    return 0;
}

/* ---- consumer ---------------------------------------------------------- */

static void xfer_free(tcp_xfer *x)
{
    free(x->runs);
    free(x);
}

/* x leaves its peer's queue (the caller unlinks it) with this state. */
static void xfer_end(tcp_xfer *x, int state)
{
    x->peer = NULL;
    if (x->released)
        xfer_free(x);
    else
        x->state = state;
}

/* Close p's connection and fail every READ on it. */
static void peer_fail(tcp_data *t, tcp_peer *p, const char *why)
{
    if (why) ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data tcp: producer connection closed: %s", why);
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->events = 0;
    p->out_len = 0;
    p->rh_len = 0;
    p->in_body = false;
    while (p->q) {
        tcp_xfer *x = p->q;
        p->q = x->next;
        xfer_end(x, ECXI_XFER_FAILED);
    }
    p->q_tail = &p->q;
    (void)t;
}

static void peer_events(tcp_data *t, tcp_peer *p)
{
    if (p->fd >= 0)
        set_events(t, p->fd, &p->events, EPOLLIN | (p->out_len ? EPOLLOUT : 0u), p);
}

static int peer_connect(tcp_data *t, tcp_peer *p)
{
    p->fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p->fd < 0) return ECX_ESYS;
    int one = 1;
    setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(p->fd, (struct sockaddr *)&p->addr, p->addr_len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(p->fd);
        p->fd = -1;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data tcp: connect: %s", strerror(e));
        return e == ENETUNREACH || e == EHOSTUNREACH || e == ECONNREFUSED ? ECX_EDATA_NOPATH
                                                                           : ECX_EDATA_PEER;
    }
    p->events = 0;
    p->last_ms = ecxi_now_ms(NULL);
    peer_events(t, p);
    return 0;
}

/* Send what requests the socket takes; false if the connection failed. */
static bool peer_flush(tcp_peer *p)
{
    while (p->out_len) {
        ssize_t s = send(p->fd, p->out, p->out_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (s < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                          errno == ENOTCONN; /* connect still in progress */
        memmove(p->out, p->out + s, p->out_len - (size_t)s);
        p->out_len -= (size_t)s;
    }
    return true;
}

/* A reply header is complete in p->rh: check it against the oldest READ.
 * 1 if a body follows, 0 if the READ ended (refused), negative if the
 * reply is not one we asked for. */
static int reply_head(tcp_peer *p)
{
    tcp_xfer *x = p->q;
    if (ecxi_get_le64(p->rh) != x->id) return -1;
    if (p->rh[8] == TCP_REFUSED) {
        p->q = x->next;
        if (!p->q) p->q_tail = &p->q;
        xfer_end(x, ECXI_XFER_FAILED);
        p->rh_len = 0;
        return 0;
    }
    if (p->rh[8] != TCP_OK) return -1;
    if (p->rh_len < TCP_REP_OK) return 2; /* nbytes still to come */
    if (ecxi_get_le64(p->rh + 9) != x->nbytes) return -1;
    p->in_body = true;
    p->got = 0;
    p->run_i = 0;
    p->run_off = 0;
    ecxi_fsum_init(&p->sum, x->nbytes);
    return 1;
}

/* Receive into the oldest READ's blocks (or the scratch buffer if it was
 * released), at most its nbytes; 0 to go on, 1 when the socket is empty,
 * negative on a closed connection or error. */
static int recv_body(tcp_data *t, tcp_peer *p, ecxi_slice *sl)
{
    tcp_xfer *x = p->q;
    uint8_t *dst;
    uint64_t room;
    if (x->released) {
        dst = t->scratch;
        room = x->nbytes - p->got < TCP_SCRATCH ? x->nbytes - p->got : TCP_SCRATCH;
    } else {
        dst = (uint8_t *)ecxi_region_base(t->base.region) + x->runs[p->run_i].off + p->run_off;
        room = x->runs[p->run_i].len - p->run_off;
        if (room > TCP_RECV_CHUNK) room = TCP_RECV_CHUNK;
    }
    ssize_t r = recv(p->fd, dst, room, MSG_DONTWAIT);
    if (r == 0) return -1;
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
    p->got += (uint64_t)r;
    sl->bytes += (uint64_t)r;
    if (!x->released) {
        ecxi_region_busy(t->base.region);
        ecxi_fsum_update(&p->sum, dst, (uint64_t)r);
        p->run_off += (uint64_t)r;
        if (p->run_off == x->runs[p->run_i].len) p->run_i++, p->run_off = 0;
    }
    if (p->got == x->nbytes) {
        p->q = x->next;
        if (!p->q) p->q_tail = &p->q;
        p->in_body = false;
        p->rh_len = 0;
        xfer_end(x, x->released                               ? ECXI_XFER_FAILED
                    : ecxi_fsum_digest(&p->sum) == x->checksum ? ECXI_XFER_DONE
                                                               : ECXI_XFER_CORRUPT);
    }
    return 0;
}

/* Read what p's socket holds; returns READs ended. */
static int peer_recv(tcp_data *t, tcp_peer *p, int64_t now, ecxi_slice *sl)
{
    int n = 0;
    while (p->fd >= 0) {
        if (!p->q) { /* nothing asked: a byte is a protocol error, 0 a close */
            uint8_t b;
            ssize_t r = recv(p->fd, &b, 1, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
            peer_fail(t, p, r > 0 ? "a reply nobody asked for" : NULL);
            break;
        }
        int rc;
        if (p->in_body) {
            tcp_xfer *x = p->q;
            if (ecxi_slice_spent(sl)) break; /* the socket stays readable */
            rc = recv_body(t, p, sl);
            if (rc == 0 && p->q != x) n++;
        } else {
            size_t want = p->rh_len < TCP_REP_HEAD ? TCP_REP_HEAD : TCP_REP_OK;
            ssize_t r = recv(p->fd, p->rh + p->rh_len, want - p->rh_len, MSG_DONTWAIT);
            if (r == 0)
                rc = -1;
            else if (r < 0)
                rc = errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
            else {
                p->rh_len += (size_t)r;
                rc = 0;
                if (p->rh_len >= TCP_REP_HEAD) {
                    int h = reply_head(p);
                    if (h < 0) {
                        peer_fail(t, p, "a reply that does not match the request");
                        break;
                    }
                    n += h == 0;
                }
            }
        }
        if (rc == 1) break;
        if (rc < 0) {
            peer_fail(t, p, "connection lost");
            break;
        }
        p->last_ms = now;
    }
    return n;
}

static void sweep_peers(tcp_data *t, int64_t now)
{
    for (tcp_peer *p = t->peers; p; p = p->next) {
        if (p->fd < 0) continue;
        if (!p->q) {
            if (now - p->last_ms > TCP_CONS_IDLE_MS) peer_fail(t, p, NULL);
            continue;
        }
        for (tcp_xfer *x = p->q; x; x = x->next)
            if (now > x->deadline_ms) {
                t->c.timeouts++;
                peer_fail(t, p, "a READ outlived its lease");
                break;
            }
    }
}

static int consumer_progress(tcp_data *t, ecxi_slice *sl)
{
    struct epoll_event ev[TCP_EVENTS];
    int64_t now = ecxi_now_ms(NULL);
    int k = epoll_wait(t->epfd, ev, TCP_EVENTS, 0), n = 0;
    for (int i = 0; i < k; i++) {
        tcp_peer *p = ev[i].data.ptr;
        if (p->fd < 0) continue;
        if ((ev[i].events & EPOLLOUT) && !peer_flush(p)) {
            peer_fail(t, p, strerror(errno));
            continue;
        }
        n += peer_recv(t, p, now, sl);
        peer_events(t, p);
    }
    if (now >= t->next_sweep_ms) {
        sweep_peers(t, now);
        t->next_sweep_ms = now + TCP_SWEEP_MS;
    }
    return n;
}

static int tcp_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                        ecxi_data_peer **out)
{
    (void)desc;
    tcp_data *t = (tcp_data *)d;
    if (!m->has_tcp) return ECX_EDATA_NOPATH;
    tcp_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    if (m->tcp_family == 4) {
        struct sockaddr_in *in = (struct sockaddr_in *)&p->addr;
        in->sin_family = AF_INET;
        in->sin_port = htons(m->tcp_port);
        memcpy(&in->sin_addr, m->tcp_addr, 4);
        p->addr_len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&p->addr;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(m->tcp_port);
        memcpy(&in6->sin6_addr, m->tcp_addr, 16);
        p->addr_len = sizeof *in6;
    }
    p->q_tail = &p->q;
    int rc = peer_connect(t, p);
    if (rc) {
        free(p);
        return rc;
    }
    p->head.owner = d;
    p->head.backend = "tcp";
    p->next = t->peers;
    t->peers = p;
    *out = &p->head;
    return 0;
}

/* Requests still unsent when their peer is dropped are declines (a READ's
 * request has its xfer, failed with the peer), and a consumer drops its
 * peers as it ends, often right after a decline to a producer it has just
 * connected to: give them up to TCP_LINGER_MS to leave, or the producer
 * keeps the grant for its lease. */
static void peer_linger(tcp_peer *p)
{
    int64_t end = ecxi_now_ms(NULL) + TCP_LINGER_MS;
    for (int64_t left; p->fd >= 0 && p->out_len && (left = end - ecxi_now_ms(NULL)) > 0;) {
        struct pollfd pf = {.fd = p->fd, .events = POLLOUT};
        if (poll(&pf, 1, (int)left) < 0 && errno != EINTR) return;
        if ((pf.revents & (POLLERR | POLLHUP)) || !peer_flush(p)) return;
    }
}

static void tcp_peer_drop(ecxi_data_peer *hp)
{
    tcp_peer *p = (tcp_peer *)hp;
    tcp_data *t = (tcp_data *)hp->owner;
    if (!p->q) peer_linger(p);
    peer_fail(t, p, NULL);
    for (tcp_peer **pp = &t->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p->out);
    free(p);
}

/* Connect if need be and make room for a request of key_len at the end of
 * p->out; 0, or an error (nothing queued). */
static int request_room(tcp_data *t, tcp_peer *p, size_t key_len)
{
    int rc;
    if (p->fd < 0 && (rc = peer_connect(t, p))) return rc;
    size_t need = p->out_len + TCP_REQ_HEAD + key_len;
    if (need > p->out_cap) {
        size_t cap = need * 2;
        uint8_t *o = realloc(p->out, cap);
        if (!o) return ECX_ENOMEM;
        p->out = o, p->out_cap = cap;
    }
    return 0;
}

/* Append a request (room made by request_room) to p->out. */
static void request_put(tcp_peer *p, uint8_t type, uint64_t id, const uint8_t *token,
                        const char *key, size_t key_len)
{
    uint8_t *b = p->out + p->out_len;
    b[0] = TCP_PROTO;
    b[1] = type;
    ecxi_put_le64(b + 2, id);
    memcpy(b + 10, token, ECXI_DATA_TOKEN_LEN);
    b[26] = (uint8_t)key_len;
    b[27] = (uint8_t)(key_len >> 8);
    memcpy(b + TCP_REQ_HEAD, key, key_len);
    p->out_len += TCP_REQ_HEAD + key_len;
}

static int tcp_decline(ecxi_data_peer *hp, const ecxi_data_ticket *tk, const char *key,
                       size_t key_len)
{
    tcp_peer *p = (tcp_peer *)hp;
    tcp_data *t = (tcp_data *)hp->owner;
    int rc = request_room(t, p, key_len);
    if (rc) return rc;
    request_put(p, TCP_DECLINE, 0, tk->token, key, key_len);
    if (!peer_flush(p)) {
        peer_fail(t, p, strerror(errno));
        return ECX_EDATA_PEER;
    }
    peer_events(t, p);
    return 0;
}

static int tcp_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *tk,
                         const ecxi_block_run *remote, size_t nremote,
                         const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                         const char *key, size_t key_len, ecxi_data_xfer **out)
{
    (void)remote, (void)nremote; /* the producer's grant decides what it sends */
    tcp_peer *p = (tcp_peer *)hp;
    tcp_data *t = (tcp_data *)hp->owner;
    int rc = request_room(t, p, key_len);
    if (rc) return rc;
    tcp_xfer *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    if ((rc = byte_runs(local, nlocal, ecxi_region_block_bytes(t->base.region), nbytes, &x->runs,
                        &x->nruns))) {
        free(x);
        return rc;
    }
    x->head.owner = hp->owner;
    x->peer = p;
    x->state = ECXI_XFER_RUNNING;
    x->nbytes = nbytes;
    x->checksum = tk->checksum;
    x->deadline_ms = ecxi_now_ms(NULL) + tk->lease_ms;
    randombytes_buf(&x->id, sizeof x->id);
    request_put(p, TCP_GET, x->id, tk->token, key, key_len);
    *p->q_tail = x;
    p->q_tail = &x->next;
    if (!p->q->next) p->last_ms = ecxi_now_ms(NULL); /* the first outstanding READ */
    if (!peer_flush(p))
        peer_fail(t, p, strerror(errno)); /* x is FAILED: the caller polls it */
    else
        peer_events(t, p);
    *out = &x->head;
    return 0;
}

static int tcp_read_poll(ecxi_data_xfer *hx)
{
    return ((tcp_xfer *)hx)->state;
}

/* A READ still queued on its connection stays there, released: its bytes
 * are drained when they come (or the connection fails). */
static void tcp_read_release(ecxi_data_xfer *hx)
{
    tcp_xfer *x = (tcp_xfer *)hx;
    if (x->peer)
        x->released = true;
    else
        xfer_free(x);
}

/* ---- both -------------------------------------------------------------- */

static int tcp_progress(ecxi_data *d, ecxi_slice *sl)
{
    tcp_data *t = (tcp_data *)d;
    return t->lfd >= 0 ? producer_progress(t, sl) : consumer_progress(t, sl);
}

static int tcp_fd(ecxi_data *d)
{
    return ((tcp_data *)d)->epfd;
}

static int tcp_arm(ecxi_data *d)
{
    /* Level-triggered: a socket with work keeps the descriptor readable;
     * only completions already collected need a call without waiting. */
    return ((tcp_data *)d)->done ? 1 : 0;
}

static int tcp_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    tcp_data *t = (tcp_data *)d;
    int rc = tcp_progress(d, sl);
    if (rc < 0) return rc;
    int count = 0;
    while (t->done) {
        tnotif *n = t->done;
        if (!(t->done = n->next)) t->done_tail = &t->done;
        cb(arg, n->key, n->key_len, n->token, n->status);
        free(n);
        count++;
    }
    return count;
}

static void tcp_free(ecxi_data *d)
{
    tcp_data *t = (tcp_data *)d;
    while (t->conns)
        conn_close(t, t->conns);
    reap_dead(t);
    while (t->done) {
        tnotif *n = t->done;
        t->done = n->next;
        free(n);
    }
    while (t->peers)
        tcp_peer_drop(&t->peers->head);
    if (t->lfd >= 0) close(t->lfd);
    if (t->epfd >= 0) close(t->epfd);
    if (t->c.accepted || t->c.conns_refused || t->c.bad_requests)
        ecxi_log(ECX_LOG_INFO,
                "data tcp: %" PRIu64 " connections (%" PRIu64 " refused), %" PRIu64
                " served, %" PRIu64 " declined, %" PRIu64 " refused, %" PRIu64
                " malformed, %" PRIu64 " timed out, %" PRIu64 " stalled, %" PRIu64
                " failed sends, %" PRIu64 " bytes",
                t->c.accepted, t->c.conns_refused, t->c.served, t->c.declined, t->c.refused,
                t->c.bad_requests, t->c.timeouts, t->c.stalls, t->c.send_failures, t->c.bytes);
    free(t);
}

static tcp_data *tcp_alloc(ecxi_region *r)
{
    tcp_data *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->base.ops = &tcp_ops;
    t->base.region = r;
    t->lfd = -1;
    t->done_tail = &t->done;
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (t->epfd < 0) {
        free(t);
        return NULL;
    }
    return t;
}

int ecxi_data_tcp_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data_meta *m,
                              ecxi_data **out)
{
    tcp_data *t = tcp_alloc(r);
    if (!t) return ECX_ENOMEM;
    int rc = listen_on(t, opts, m);
    if (rc) {
        m->has_tcp = false;
        tcp_free(&t->base);
        return rc;
    }
    *out = &t->base;
    return 0;
}

int ecxi_data_tcp_new_consumer(ecxi_region *r, ecxi_data **out)
{
    tcp_data *t = tcp_alloc(r);
    if (!t) return ECX_ENOMEM;
    *out = &t->base;
    return 0;
}

static void tcp_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const tcp_data *t = (const tcp_data *)d;
    ecxi_data_counts *c = &st->path[ECX_DATA_TCP];
    c->conns_refused += t->c.conns_refused;
    c->conns_evicted += t->c.evicted;
    c->conns_dropped += t->c.timeouts + t->c.stalls + t->c.cuts;
    c->requests_dropped += t->c.bad_requests;
}

static const struct ecxi_data_ops tcp_ops = {
    .name = "tcp",
    .stats = tcp_stats,
    .free = tcp_free,
    .progress = tcp_progress,
    .fd = tcp_fd,
    .arm = tcp_arm,
    .poll_notifs = tcp_poll_notifs,
    .cut = tcp_cut,
    .peer_add = tcp_peer_add,
    .peer_drop = tcp_peer_drop,
    .read_post = tcp_read_post,
    .read_poll = tcp_read_poll,
    .read_release = tcp_read_release,
    .decline = tcp_decline,
};
