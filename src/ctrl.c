/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrl — ZeroMQ ROUTER / DEALER sockets with the framing, size caps,
 * heartbeats and disconnect monitor of the control plane, and the opt-in
 * CURVE security with its poll-driven ZAP handler. See ctrl.h.
 */
#include "ctrl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "conn_budget.h"
#include "ecx.h"
#include "util.h"

/* Watches a socket's TCP connections; see "the inflow guard" below. */
typedef struct guard {
    /* Everything below but the monitor: a DEALER's guard is also checked
     * by the watchdog thread. */
    pthread_mutex_t mu;
    void *monitor;      /* PAIR reading the socket's monitor events */
    struct conn *conns; /* indexed by fd */
    int nconns, open_conns;
    uint64_t seq; /* counts accepts and whole messages: orders connections by activity */
    int port;   /* ours: the server's local port, or the peer's remote one */
    bool local; /* port is the local one */
    int64_t max_pending, max_pending_total, next_check_ms;
    uint64_t drops, drops_told, drop_bytes; /* connections dropped; counted in stats so far;
                                               the last one's undelivered bytes */
    struct guard *wd_next; /* in the watchdog's list */
    bool watched;
    /* The last connection's fd, by its messages' metadata (see
     * guard_srcfd); touched only by the thread receiving on the socket. */
    bool meta_cached;
    const void *meta;
    int meta_fd;
    zmq_msg_t meta_hold; /* a part holding a reference on meta */
    /* The last message came from a connection the guard does not track
     * (yet): guard_settle counted nothing for it. */
    bool untracked;
} guard;

struct ecxi_ctrl_server {
    void *sock;
    guard g;
    int max_conns;
    void *zap;            /* REP on inproc://zeromq.zap.01; NULL without an allow-list */
    uint8_t (*allow)[32]; /* allowed client public keys, binary */
    size_t n_allow;
    int port;
    unsigned events_countdown; /* receives until events are taken again (0: this one) */
    ecxi_ctrl_stats stats;
};

static bool has_more(void *sock);
static void drain(void *sock, zmq_msg_t *scratch);

struct ecxi_ctrl_peer {
    void *sock;
    guard g;
    zmq_msg_t parts[2];
    bool parts_open, lost;
    bool handshaken; /* a ZMTP handshake has succeeded */
    bool heard;      /* the monitor said something about the last dial */
    bool connected;  /* the last dial's TCP connect succeeded */
    bool refused;    /* a dial's TCP connect failed (refused), and none succeeded since */
    bool hung_up;    /* the peer closed a connection before any handshake completed */
    bool curve;      /* CURVE on (a handshake can fail on keys) */
    int64_t dialed_ms, redial_ms; /* the last dial; the next one (0: none due) */
    int64_t greeting_by_ms;       /* TCP up, no handshake yet: its deadline (0: none) */
    int backoff_ms;
    char ep[300];
    /* Copies of what was sent before a completed handshake: a re-dial drops
     * the old attempt's queue, so they are sent again on the new one. */
    struct unsent {
        void *b;
        size_t n;
    } unsent[ECXI_CTRL_UNSENT_MAX];
    int n_unsent;
    ecxi_ctrl_stats stats;
};

static void unsent_clear(ecxi_ctrl_peer *p)
{
    for (int i = 0; i < p->n_unsent; i++)
        free(p->unsent[i].b);
    p->n_unsent = 0;
}

int ecxi_ctrl_parse_addr(const char *addr, char host[256], int *port)
{
    if (!addr) return ECX_EINVAL;
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr) return ECX_EINVAL;
    const char *h = addr, *hend = colon;
    if (addr[0] == '[') { /* [v6]:port */
        if (hend[-1] != ']') return ECX_EINVAL;
        h++, hend--;
    } else if (memchr(addr, ':', (size_t)(colon - addr))) {
        return ECX_EINVAL; /* bare v6 needs brackets when a port follows */
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl > 255) return ECX_EINVAL;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end || errno || p < 0 || p > 65535) return ECX_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

/* "tcp://HOST:PORT" with IPv6 literals in brackets. */
static int endpoint(char *out, size_t cap, const char *host, int port)
{
    bool v6 = strchr(host, ':') != NULL;
    int n = snprintf(out, cap, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    return n > 0 && (size_t)n < cap ? 0 : ECX_EINVAL;
}

static int set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

int ecxi_ctrl_key_parse(const char *z85, uint8_t out[32])
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";
    if (!z85 || strnlen(z85, ECXI_CTRL_KEY_Z85 + 1) != ECXI_CTRL_KEY_Z85 ||
        strspn(z85, alphabet) != ECXI_CTRL_KEY_Z85)
        return ECX_EINVAL;
    uint8_t tmp[32];
    int rc = zmq_z85_decode(tmp, z85) ? 0 : ECX_EINVAL;
    if (!rc && out) memcpy(out, tmp, sizeof tmp);
    sodium_memzero(tmp, sizeof tmp);
    return rc;
}

/* Make sock a CURVE server with secret key sk (Z85). */
static int curve_server(void *sock, const char *sk)
{
    if (ecxi_ctrl_key_parse(sk, NULL)) return ECX_EINVAL;
    if (set_int(sock, ZMQ_CURVE_SERVER, 1) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sk, ECXI_CTRL_KEY_Z85))
        return ECX_ESYS;
    return 0;
}

/* Make sock a CURVE client of server key pk, with secret key sk (Z85) or,
 * if sk is NULL, a fresh keypair. */
static int curve_client(void *sock, const char *pk, const char *sk)
{
    char pub[ECXI_CTRL_KEY_Z85 + 1], sec[ECXI_CTRL_KEY_Z85 + 1];
    int rc = 0;
    if (ecxi_ctrl_key_parse(pk, NULL) || (sk && ecxi_ctrl_key_parse(sk, NULL))) return ECX_EINVAL;
    if (sk) {
        memcpy(sec, sk, sizeof sec);
        if (zmq_curve_public(pub, sec)) rc = ECX_ESYS;
    } else if (zmq_curve_keypair(pub, sec)) {
        rc = ECX_ESYS;
    }
    if (!rc && (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, pk, ECXI_CTRL_KEY_Z85) ||
                zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, ECXI_CTRL_KEY_Z85) ||
                zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, ECXI_CTRL_KEY_Z85)))
        rc = ECX_ESYS;
    sodium_memzero(sec, sizeof sec);
    return rc;
}

/* *max_frame: in, the default frame cap; out, the one set. */
static int apply_common(void *sock, const ecxi_ctrl_opts *o, int64_t *max_frame)
{
    if (o && o->max_frame_bytes > 0) *max_frame = o->max_frame_bytes;
    if (set_int(sock, ZMQ_LINGER, 0) || set_int(sock, ZMQ_IPV6, 1) ||
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, max_frame, sizeof *max_frame))
        return ECX_ESYS;
    return 0;
}

/* ---------- the inflow guard ---------- */

/* libzmq (4.3.4) keeps the frames of a multipart message in the
 * connection's pipe until its last frame arrives, and neither the receive
 * HWM (it counts whole messages) nor ZMQ_MAXMSGSIZE (one frame) bounds
 * them; the application cannot see a frame before the message is whole. So
 * the guard watches each TCP connection from outside: the socket monitor
 * tells it the fd of every connection, the kernel (TCP_INFO) how many bytes
 * arrived on it, and each whole message read (ZMQ_SRCFD) marks how many of
 * those were delivered. A connection with more than max_pending bytes
 * undelivered, or the heaviest one when all of them together hold more than
 * max_pending_total, is shut down; libzmq then frees its pipe.
 *
 * The mark is the kernel's count read at a whole message, but not at every
 * one (a getsockopt per message was the producer's largest system-call
 * cost): at a connection's first message, and then once the messages read
 * since the last reading add up to SETTLE_SHARE of max_pending (their
 * sizes plus SETTLE_OVERHEAD each, more than ZMTP's or CURVE's framing of a
 * message). In between the mark stays where it was, so the undelivered
 * count is over by at most that share of messages already read, never
 * under: a flood is dropped as soon as before, and a connection is never
 * dropped for what it sent whole unless what it holds unfinished is within
 * that share of the bound. */
#define SETTLE_SHARE 8     /* the kernel's count is read every max_pending / 8 bytes */
#define SETTLE_OVERHEAD 128

struct conn {
    bool open;
    bool spoke;       /* a whole message was read from it */
    uint64_t settled; /* bytes received at the last reading at a whole message */
    uint64_t unsettled; /* bytes of whole messages read since (SETTLE_OVERHEAD each more) */
    uint64_t seq;     /* g->seq at its accept or its last whole message */
    uint8_t key[16];  /* server: the peer's address (conn_budget.h) */
};

static int guard_init(guard *g, void *zctx, void *sock, int events, int port, bool local,
                      int64_t max_frame, const ecxi_ctrl_opts *o)
{
    static unsigned long seq;
    char mon[64];
    pthread_mutex_init(&g->mu, NULL);
    /* The monitor endpoint must be unique in the context. */
    snprintf(mon, sizeof mon, "inproc://ecx-mon-%p-%lu", (void *)g,
             __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
    g->port = port;
    g->local = local;
    g->max_pending = o && o->max_pending_bytes > 0 ? o->max_pending_bytes : 2 * max_frame;
    g->max_pending_total = o && o->max_pending_total > 0 ? o->max_pending_total
                                                         : ECXI_CTRL_MAX_PENDING_TOTAL;
    if (zmq_socket_monitor(sock, mon, events)) return ECX_ESYS;
    g->monitor = zmq_socket(zctx, ZMQ_PAIR);
    if (!g->monitor || set_int(g->monitor, ZMQ_LINGER, 0) || zmq_connect(g->monitor, mon))
        return ECX_ESYS;
    return 0;
}

static void watchdog_remove(guard *g);

static void guard_fini(guard *g, void *sock)
{
    if (g->meta_cached) zmq_msg_close(&g->meta_hold);
    g->meta_cached = false;
    if (g->watched) watchdog_remove(g);
    if (sock && g->monitor) zmq_socket_monitor(sock, NULL, 0);
    if (g->monitor) zmq_close(g->monitor);
    free(g->conns);
    pthread_mutex_destroy(&g->mu);
}

/* Read one monitor event: true and its event and value, or false. */
static bool guard_event(guard *g, uint16_t *event, uint32_t *value)
{
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    bool got = false;
    if (zmq_msg_recv(&ev, g->monitor, ZMQ_DONTWAIT) >= 0) {
        /* Frame 1: uint16 event + uint32 value; frame 2: the endpoint. */
        if ((got = zmq_msg_size(&ev) >= 6)) {
            memcpy(event, zmq_msg_data(&ev), sizeof *event);
            memcpy(value, (char *)zmq_msg_data(&ev) + 2, sizeof *value);
        }
        drain(g->monitor, &ev);
    }
    zmq_msg_close(&ev);
    return got;
}

/* Record a connection on fd opened (true) or closed; g->mu held. */
static int guard_track_locked(guard *g, int fd, bool open)
{
    if (fd < 0) return ECX_EINVAL;
    if (fd >= g->nconns) {
        if (!open) return 0;
        int n = fd + 64;
        struct conn *c = realloc(g->conns, (size_t)n * sizeof *c);
        if (!c) return ECX_ENOMEM;
        memset(c + g->nconns, 0, (size_t)(n - g->nconns) * sizeof *c);
        g->conns = c, g->nconns = n;
    }
    if (g->conns[fd].open != open) g->open_conns += open ? 1 : -1;
    g->conns[fd] = (struct conn){.open = open, .seq = ++g->seq};
    return 0;
}

/* Bytes the kernel received on the TCP socket fd. */
static bool tcp_received(int fd, uint64_t *bytes)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len)) return false;
    *bytes = ti.tcpi_bytes_received;
    return true;
}

/* True if fd is still our connection: a TCP socket whose local (server) or
 * remote (peer) port is ours. Guards against an fd that libzmq closed and
 * the process reused before the monitor told us. */
static bool guard_owns(const guard *g, int fd)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if ((g->local ? getsockname(fd, (struct sockaddr *)&a, &len)
                  : getpeername(fd, (struct sockaddr *)&a, &len)) ||
        (a.ss_family != AF_INET && a.ss_family != AF_INET6))
        return false;
    return g->port == ntohs(a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port
                                                   : ((struct sockaddr_in6 *)&a)->sin6_port);
}

/* A whole message (of which part is a frame) was read from a connection. */
/* The fd a message part came from (ZMQ_SRCFD). libzmq 4.3 answers
 * ZMQ_SRCFD by looking up the "__fd" metadata property and running atoi on
 * it; reading the property ourselves skips a strtol per request, and any
 * libzmq without it gets the documented call. */
static int msg_srcfd(zmq_msg_t *part)
{
    const char *s = zmq_msg_gets(part, "__fd");
    if (!s) return zmq_msg_get(part, ZMQ_SRCFD);
    int fd = 0;
    for (int i = 0; s[i]; i++) {
        if (s[i] < '0' || s[i] > '9' || i > 8) return zmq_msg_get(part, ZMQ_SRCFD);
        fd = fd * 10 + (s[i] - '0');
    }
    return fd;
}

static int guard_track(guard *g, int fd, bool open)
{
    pthread_mutex_lock(&g->mu);
    int rc = guard_track_locked(g, fd, open);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* libzmq 4.2 and 4.3 keep a message's metadata pointer in the first
 * bytes of zmq_msg_t, whatever the message's form (msg.hpp); elsewhere the
 * cache below is off. */
static bool meta_layout_known(void)
{
    static int known = -1;
    if (known < 0) {
        int major, minor, patch;
        zmq_version(&major, &minor, &patch);
        known = major == 4 && (minor == 2 || minor == 3);
    }
    return known;
}

static const void *msg_meta(const zmq_msg_t *m)
{
    const void *p;
    memcpy(&p, m, sizeof p);
    return p;
}

/* The fd a whole message came from; part is its last part, parts[0..n)
 * all of it. libzmq gives every message of a connection the same metadata
 * object (its engine's, holding "__fd", immutable), so the answer of the
 * last lookup holds for every part carrying the same metadata pointer:
 * the `"__fd"` lookup (a std::map find, ~340 instructions) runs once per
 * run of messages from one connection. To keep the pointer from naming a
 * new connection's metadata, allocated where a freed one was, the cache
 * holds a reference on it (a copy of a small part of that message: no
 * payload is kept). Equal to msg_srcfd(part) on every message. */
static int guard_srcfd(guard *g, zmq_msg_t *parts, int n)
{
    zmq_msg_t *part = &parts[n - 1];
    if (!meta_layout_known()) return msg_srcfd(part);
    const void *meta = msg_meta(part);
    if (meta && g->meta_cached && meta == g->meta) return g->meta_fd;
    int fd = msg_srcfd(part);
    if (!meta || fd < 0) return fd;
    for (int i = 0; i < n; i++) { /* a part with that metadata and no payload to hold */
        if (msg_meta(&parts[i]) != meta || zmq_msg_size(&parts[i]) > 16) continue;
        if (g->meta_cached) zmq_msg_close(&g->meta_hold);
        zmq_msg_init(&g->meta_hold);
        g->meta_cached = zmq_msg_copy(&g->meta_hold, &parts[i]) == 0 &&
                         msg_meta(&g->meta_hold) == meta;
        if (!g->meta_cached) zmq_msg_close(&g->meta_hold);
        g->meta = meta, g->meta_fd = fd;
        break;
    }
    return fd;
}

/* A whole message of `bytes` (UINT64_MAX: unknown, read the kernel's count
 * now), parts[0..nparts), was read from a connection. */
static void guard_settle(guard *g, zmq_msg_t *parts, int nparts, uint64_t bytes)
{
    int fd = guard_srcfd(g, parts, nparts);
    uint64_t rx;
    pthread_mutex_lock(&g->mu);
    g->untracked = fd >= 0 && (fd >= g->nconns || !g->conns[fd].open);
    if (!g->untracked && fd >= 0) {
        struct conn *c = &g->conns[fd];
        c->unsettled = bytes > UINT64_MAX - SETTLE_OVERHEAD - c->unsettled
                           ? UINT64_MAX
                           : c->unsettled + bytes + SETTLE_OVERHEAD;
        if ((!c->spoke || c->unsettled > (uint64_t)g->max_pending / SETTLE_SHARE) &&
            tcp_received(fd, &rx)) {
            c->settled = rx;
            c->unsettled = 0;
            c->spoke = true;
        }
        c->seq = ++g->seq;
    }
    pthread_mutex_unlock(&g->mu);
}

/* g->mu held. Counted and logged by the next guard_check (the watchdog
 * thread does not log). */
static void guard_drop(guard *g, int fd, uint64_t pending)
{
    guard_track_locked(g, fd, false);
    if (!guard_owns(g, fd)) return;
    shutdown(fd, SHUT_RDWR); /* libzmq sees the end of the stream and closes it */
    g->drops++;
    g->drop_bytes = pending;
}

/* Drop the connections over the bounds; g->mu held. */
static void guard_scan(guard *g)
{
    uint64_t total = 0, heaviest = 0;
    int heaviest_fd = -1;
    for (int fd = 0; fd < g->nconns; fd++) {
        uint64_t rx, pending;
        if (!g->conns[fd].open || !tcp_received(fd, &rx)) continue;
        pending = rx > g->conns[fd].settled ? rx - g->conns[fd].settled : 0;
        if (pending > (uint64_t)g->max_pending) {
            guard_drop(g, fd, pending);
            continue;
        }
        total += pending;
        if (pending > heaviest) heaviest = pending, heaviest_fd = fd;
    }
    if (total > (uint64_t)g->max_pending_total) guard_drop(g, heaviest_fd, heaviest);
}

/* Every ECXI_CTRL_GUARD_IVL_MS, drop the connections over the bounds; count
 * and log the drops (the watchdog's too). */
static void guard_check(guard *g, ecxi_ctrl_stats *st)
{
    int64_t now = ecxi_now_ms(NULL);
    pthread_mutex_lock(&g->mu);
    if (now >= g->next_check_ms) {
        g->next_check_ms = now + ECXI_CTRL_GUARD_IVL_MS;
        guard_scan(g);
    }
    uint64_t new_drops = g->drops - g->drops_told, bytes = g->drop_bytes;
    g->drops_told = g->drops;
    pthread_mutex_unlock(&g->mu);
    if (!new_drops) return;
    st->pending_drops += new_drops;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                        "ctrl: dropped a connection holding %llu bytes of unfinished messages",
                        (unsigned long long)bytes);
}

/* Milliseconds until the guard must look again (it only looks when it is
 * called, and a half-sent message wakes nobody): while it watches an open
 * connection, its next check; else -1. */
static int64_t guard_due(const guard *cg)
{
    guard *g = (guard *)cg; /* only to take its lock */
    int64_t d = -1;
    pthread_mutex_lock(&g->mu);
    if (g->open_conns > 0) {
        d = g->next_check_ms - ecxi_now_ms(NULL);
        if (d < 0) d = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return d;
}

/* ---------- the watchdog ---------- */

/* libzmq reads a DEALER's connections on its own thread whether or not the
 * application calls in (it has no receive HWM, see "peer" below), so a
 * consumer busy elsewhere for a while would hold whatever a producer sent
 * meanwhile. One thread per process checks the DEALERs' guards every
 * ECXI_CTRL_GUARD_IVL_MS too; it only shuts connections down (no logging,
 * no ZeroMQ calls): the receive calls count and log them, and the
 * monitor's disconnect makes the producer lost. It runs while any DEALER
 * exists. */
static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    guard *head;
    pthread_t thread;
    bool running, stop, joining;
} wd = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

static void watchdog_once(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&wd.cv, &a);
    pthread_condattr_destroy(&a);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&wd.mu);
    while (!wd.stop) {
        for (guard *g = wd.head; g; g = g->wd_next) {
            pthread_mutex_lock(&g->mu);
            guard_scan(g);
            pthread_mutex_unlock(&g->mu);
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += ECXI_CTRL_GUARD_IVL_MS * 1000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&wd.cv, &wd.mu, &t);
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

/* Watch g (a DEALER's guard); start the thread if it is not running. */
static void watchdog_add(guard *g)
{
    pthread_once(&wd.once, watchdog_once);
    pthread_mutex_lock(&wd.mu);
    while (wd.joining) /* the last thread is still ending */
        pthread_cond_wait(&wd.cv, &wd.mu);
    g->wd_next = wd.head, wd.head = g;
    g->watched = true;
    if (!wd.running) {
        wd.stop = false;
        wd.running = !pthread_create(&wd.thread, NULL, watchdog_main, NULL);
        if (!wd.running)
            ecxi_log(ECX_LOG_WARN, "ctrl: no watchdog thread; the inflow guard checks only "
                                  "in the receive calls");
    }
    pthread_mutex_unlock(&wd.mu);
}

/* Stop watching g; end the thread when nothing is left to watch. */
static void watchdog_remove(guard *g)
{
    pthread_mutex_lock(&wd.mu);
    for (guard **pp = &wd.head; *pp; pp = &(*pp)->wd_next)
        if (*pp == g) {
            *pp = g->wd_next;
            break;
        }
    g->watched = false;
    bool join = !wd.head && wd.running;
    pthread_t t = wd.thread;
    if (join) {
        wd.stop = wd.joining = true;
        pthread_cond_broadcast(&wd.cv);
    }
    pthread_mutex_unlock(&wd.mu);
    if (!join) return;
    pthread_join(t, NULL);
    pthread_mutex_lock(&wd.mu);
    wd.running = wd.joining = false;
    pthread_cond_broadcast(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
}

/* ---------- server ---------- */

/* The soft fd limit less ECXI_CTRL_FD_RESERVE for everything else and
 * ECXI_CTRL_DATA_FD_RESERVE for the data plane, but at least a quarter of
 * what is left after the first (and 16). */
static int default_max_conns(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT_MAX)
        return INT_MAX;
    int n = (int)rl.rlim_cur - ECXI_CTRL_FD_RESERVE - ECXI_CTRL_DATA_FD_RESERVE;
    int quarter = ((int)rl.rlim_cur - ECXI_CTRL_FD_RESERVE) / 4;
    if (n < quarter) n = quarter;
    return n > 16 ? n : 16;
}

int ecxi_ctrl_server_new(void *zctx, const char *host, int port, const ecxi_ctrl_opts *opts,
                        ecxi_ctrl_server **out)
{
    if (!zctx || !host || port < 0 || port > 65535 || !out) return ECX_EINVAL;
    /* Resolve the bind address ourselves: libzmq binds only to numeric
     * addresses or interface names. */
    char numeric[NI_MAXHOST], ep[300];
    if (!strcmp(host, "*")) {
        snprintf(numeric, sizeof numeric, "*");
    } else {
        struct addrinfo hints = {.ai_family = AF_UNSPEC,
                                 .ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_PASSIVE},
                        *ai;
        int g = getaddrinfo(host, NULL, &hints, &ai);
        if (g) {
            ecxi_log(ECX_LOG_ERROR, "ctrl: cannot resolve listen host '%s': %s", host,
                    gai_strerror(g));
            return ECX_EINVAL;
        }
        g = getnameinfo(ai->ai_addr, ai->ai_addrlen, numeric, sizeof numeric, NULL, 0,
                        NI_NUMERICHOST);
        freeaddrinfo(ai);
        if (g) return ECX_EINVAL;
    }
    if (endpoint(ep, sizeof ep, numeric, port)) return ECX_EINVAL;

    const char *sk = opts ? opts->curve_secret_key : NULL;
    size_t n_allow = opts && opts->curve_allow ? opts->n_curve_allow : 0;
    if (n_allow && !sk) return ECX_EINVAL; /* an allow-list needs CURVE */
    ecxi_ctrl_server *s = calloc(1, sizeof *s);
    if (!s) return ECX_ENOMEM;
    int rc = ECX_ESYS;
    if (n_allow) {
        if (!(s->allow = calloc(n_allow, sizeof *s->allow))) {
            rc = ECX_ENOMEM;
            goto fail;
        }
        for (s->n_allow = 0; s->n_allow < n_allow; s->n_allow++)
            if (ecxi_ctrl_key_parse(opts->curve_allow[s->n_allow], s->allow[s->n_allow])) {
                rc = ECX_EINVAL;
                goto fail;
            }
        /* The handler must be bound before the ROUTER takes connections. */
        s->zap = zmq_socket(zctx, ZMQ_REP);
        if (!s->zap || set_int(s->zap, ZMQ_LINGER, 0) ||
            zmq_bind(s->zap, "inproc://zeromq.zap.01")) {
            ecxi_log(ECX_LOG_ERROR, "ctrl: cannot bind the ZAP handler: %s",
                    zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    s->sock = zmq_socket(zctx, ZMQ_ROUTER);
    int64_t frame = ECXI_CTRL_MAX_REQUEST;
    if (!s->sock || apply_common(s->sock, opts, &frame) ||
        set_int(s->sock, ZMQ_ROUTER_MANDATORY, 1) ||
        set_int(s->sock, ZMQ_HANDSHAKE_IVL, ECXI_CTRL_HANDSHAKE_MS) ||
        guard_init(&s->g, zctx, s->sock,
                   ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED, 0, true,
                   frame, opts))
        goto fail;
    s->max_conns = opts && opts->max_connections > 0 ? opts->max_connections : default_max_conns();
    if (sk && (rc = curve_server(s->sock, sk))) {
        if (rc == ECX_EINVAL) ecxi_log(ECX_LOG_ERROR, "ctrl: the CURVE secret key is not Z85");
        goto fail;
    }
    rc = ECX_ESYS;
    if (zmq_bind(s->sock, ep)) {
        ecxi_log(ECX_LOG_ERROR, "ctrl: cannot listen on %s: %s", ep, zmq_strerror(zmq_errno()));
        goto fail;
    }
    char last[300];
    size_t n = sizeof last;
    const char *colon;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, last, &n) || !(colon = strrchr(last, ':')))
        goto fail;
    s->port = s->g.port = atoi(colon + 1);
    *out = s;
    return 0;
fail:
    ecxi_ctrl_server_free(s);
    return rc;
}

void ecxi_ctrl_server_free(ecxi_ctrl_server *s)
{
    if (!s) return;
    guard_fini(&s->g, s->sock);
    if (s->sock) zmq_close(s->sock);
    if (s->zap) zmq_close(s->zap);
    free(s->allow);
    free(s);
}

void *ecxi_ctrl_server_zap_socket(const ecxi_ctrl_server *s)
{
    return s->zap;
}

static bool allowed(const ecxi_ctrl_server *s, const zmq_msg_t *key)
{
    if (zmq_msg_size(key) != 32) return false;
    for (size_t i = 0; i < s->n_allow; i++)
        if (!sodium_memcmp(s->allow[i], zmq_msg_data((zmq_msg_t *)key), 32)) return true;
    return false;
}

/* ZAP (RFC 27): request [version, request_id, domain, address, identity,
 * mechanism, credentials...]; reply [version, request_id, status_code,
 * status_text, user_id, metadata]. Only libzmq speaks on this inproc
 * socket, but a request of another shape still gets a 500, so the REP
 * socket never sticks half-way through a request. */
int ecxi_ctrl_server_serve_zap(ecxi_ctrl_server *s)
{
    if (!s->zap) return 0;
    int served = 0;
    enum { NPARTS = 8 };
    zmq_msg_t part[NPARTS];
    for (int i = 0; i < NPARTS; i++)
        zmq_msg_init(&part[i]);
    for (;;) {
        int n = 0;
        if (zmq_msg_recv(&part[0], s->zap, ZMQ_DONTWAIT) < 0) break;
        for (n = 1; has_more(s->zap); n++) {
            zmq_msg_t *m = &part[n < NPARTS ? n : NPARTS - 1];
            if (zmq_msg_recv(m, s->zap, ZMQ_DONTWAIT) < 0) break;
        }
        bool shaped = n == 7 && zmq_msg_size(&part[0]) == 3 &&
                      !memcmp(zmq_msg_data(&part[0]), "1.0", 3) && zmq_msg_size(&part[5]) == 5 &&
                      !memcmp(zmq_msg_data(&part[5]), "CURVE", 5);
        const char *code = "500", *text = "Bad ZAP request";
        if (shaped && allowed(s, &part[6])) {
            code = "200", text = "OK";
        } else if (shaped) {
            code = "400", text = "Client key not allowed";
            s->stats.auth_failures++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "ctrl: refused a CURVE client not in the allow-list");
        }
        const void *rid = n > 1 ? zmq_msg_data(&part[1]) : "";
        size_t rid_len = n > 1 ? zmq_msg_size(&part[1]) : 0;
        if (zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(s->zap, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(s->zap, code, 3, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(s->zap, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
            zmq_send(s->zap, "", 0, ZMQ_DONTWAIT) < 0) {
            ecxi_log(ECX_LOG_WARN, "ctrl: ZAP reply not sent: %s", zmq_strerror(zmq_errno()));
            break;
        }
        served++;
    }
    for (int i = 0; i < NPARTS; i++)
        zmq_msg_close(&part[i]);
    return served;
}

int ecxi_ctrl_server_port(const ecxi_ctrl_server *s)
{
    return s->port;
}
void *ecxi_ctrl_server_socket(const ecxi_ctrl_server *s)
{
    return s->sock;
}
ecxi_ctrl_stats ecxi_ctrl_server_stats(const ecxi_ctrl_server *s)
{
    return s->stats;
}

/* Receive the rest of a multipart message and throw it away. */
static void drain(void *sock, zmq_msg_t *scratch)
{
    int more;
    size_t sz = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        if (zmq_msg_recv(scratch, sock, ZMQ_DONTWAIT) < 0) break;
    }
}

static bool has_more(void *sock)
{
    int more = 0;
    size_t sz = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

/* Receive one whole message of exactly `want` parts into parts[] and tell
 * the guard a message from its connection was read. Returns 1 on a message
 * of that shape, 0 if none is waiting, -1 if one of another shape was
 * received and dropped. */
static int recv_parts(void *sock, guard *g, zmq_msg_t *parts, int want, size_t *sizes)
{
    uint64_t bytes = 0;
    for (int i = 0;; i++) {
        /* Only the first part can be absent: ZMQ delivers a message's parts
         * together. */
        int sz = zmq_msg_recv(&parts[i], sock, ZMQ_DONTWAIT); /* = zmq_msg_size */
        if (sz < 0) return i == 0 ? 0 : -1;
        if (sizes) sizes[i] = (size_t)sz;
        bytes += (size_t)sz;
        bool more = zmq_msg_more(&parts[i]); /* = ZMQ_RCVMORE, without a getsockopt */
        if (more && i < want - 1) continue;
        if (more) { /* parts not counted: read the kernel's count */
            drain(sock, &parts[i]);
            bytes = UINT64_MAX;
        }
        guard_settle(g, parts, i + 1, bytes);
        return more || i < want - 1 ? -1 : 1;
    }
}

/* A connection accepted on fd: admit it within the connection budget
 * (conn_budget.h), closing the heaviest holder's idlest connection for it
 * if need be, or refuse it (accepted, then shut down: libzmq closes it). */
static void server_admit(ecxi_ctrl_server *s, int fd)
{
    guard *g = &s->g;
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    uint8_t key[16] = {0};
    if (getpeername(fd, (struct sockaddr *)&a, &len) == 0)
        ecxi_conn_key((struct sockaddr *)&a, key);
    ecxi_conn_caps caps = {(size_t)s->max_conns, ECXI_CTRL_MAX_PER_PREFIX, ECXI_CTRL_MAX_PER_ADDR};
    int rc = ECXI_CONN_ADMIT;
    size_t victim = 0;
    pthread_mutex_lock(&g->mu);
    size_t ca = 0, cp = 0, n = 0;
    for (int i = 0; i < g->nconns; i++) { /* the policy's caps, counted first: all cheap */
        if (!g->conns[i].open) continue;
        ca += !memcmp(g->conns[i].key, key, 16);
        cp += ecxi_conn_same_prefix(g->conns[i].key, key) != 0;
    }
    if ((size_t)g->open_conns >= caps.total || cp >= caps.per_prefix || ca >= caps.per_addr) {
        ecxi_conn_slot *sl = malloc((size_t)g->open_conns * sizeof *sl);
        for (int i = 0; sl && i < g->nconns && n < (size_t)g->open_conns; i++) {
            if (!g->conns[i].open) continue;
            memcpy(sl[n].key, g->conns[i].key, 16);
            /* Never a message first, then the longest without one. */
            sl[n].tier = g->conns[i].spoke;
            sl[n].since = (int64_t)g->conns[i].seq;
            sl[n++].id = (size_t)i;
        }
        rc = sl ? ecxi_conn_admit(sl, n, key, &caps, &victim) : ECXI_CONN_REFUSE_SHARE;
        free(sl);
    }
    if (rc == ECXI_CONN_EVICT) {
        guard_track_locked(g, (int)victim, false);
        if (guard_owns(g, (int)victim)) shutdown((int)victim, SHUT_RDWR);
    }
    if (rc == ECXI_CONN_ADMIT || rc == ECXI_CONN_EVICT) {
        if (guard_track_locked(g, fd, true) == 0)
            memcpy(g->conns[fd].key, key, 16);
        else /* untracked, it would be neither bounded nor served */
            rc = ECXI_CONN_REFUSE_SHARE;
    }
    pthread_mutex_unlock(&g->mu);
    if (rc == ECXI_CONN_EVICT) {
        s->stats.evicted_conns++;
        ECXI_LOG_RATELIMITED(ECX_LOG_INFO,
                            "ctrl: closed an idle connection of the heaviest peer for a "
                            "newcomer (%llu so far)",
                            (unsigned long long)s->stats.evicted_conns);
    } else if (rc != ECXI_CONN_ADMIT) {
        shutdown(fd, SHUT_RDWR);
        s->stats.refused_conns++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                            "ctrl: refused a connection: its address or prefix holds its share "
                            "(%d open, cap %d)",
                            g->open_conns, s->max_conns);
    }
}

/* Take the monitor's news of connections; admit or refuse new ones. */
static void server_events(ecxi_ctrl_server *s)
{
    uint16_t ev = 0;
    uint32_t v = 0;
    while (guard_event(&s->g, &ev, &v)) {
        if (ev == ZMQ_EVENT_ACCEPTED) {
            server_admit(s, (int)v);
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            guard_track(&s->g, (int)v, false);
        } else if (ev == ZMQ_EVENT_ACCEPT_FAILED) {
            s->stats.accept_failed++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "ctrl: cannot accept a connection: %s",
                                strerror((int)v));
        }
    }
    guard_check(&s->g, &s->stats);
}

/* Answer ZAP requests and take the monitor's news (and the guard's check). */
static void server_housekeeping(ecxi_ctrl_server *s)
{
    ecxi_ctrl_server_serve_zap(s);
    server_events(s);
    s->events_countdown = ECXI_CTRL_EVENTS_EVERY;
}

int ecxi_ctrl_server_recv(ecxi_ctrl_server *s, ecxi_ctrl_msg *m)
{
    /* CURVE handshakes and the monitor's news are taken whenever the
     * socket runs dry and every ECXI_CTRL_EVENTS_EVERY requests in between:
     * a steady stream does not pay a monitor read per request, and a flood
     * delays them by that many requests at most. */
    bool fresh = s->events_countdown == 0;
    if (fresh) server_housekeeping(s);
    s->events_countdown--;
    for (;;) {
        size_t sz[3];
        int rc = recv_parts(s->sock, &s->g, m->parts, 3, sz);
        if (rc == 0) {
            if (!fresh) server_housekeeping(s);
            return 0;
        }
        if (rc == 1 && s->g.untracked) {
            /* A message from a connection the guard does not track: a new
             * one's first, read before the monitor's news of its accept
             * (libzmq queues that news before the connection can deliver
             * anything, so it is there now), or one from a connection
             * closed since. Take the news, then count the message, or a
             * new connection would stay "never spoke", the first evicted
             * at the cap. Still untracked, its connection was refused at
             * the cap or is closed: the message is not served. */
            server_housekeeping(s);
            guard_settle(&s->g, m->parts, 3, sz[0] + sz[1] + sz[2]);
            if (s->g.untracked) {
                ecxi_log(ECX_LOG_DEBUG, "ctrl: dropped a request from a refused or closed "
                                        "connection");
                continue;
            }
        }
        if (rc == 1 && sz[1] == 0) {
            m->identity = zmq_msg_data(&m->parts[0]);
            m->identity_len = sz[0];
            m->payload = zmq_msg_data(&m->parts[2]);
            m->payload_len = sz[2];
            return 1;
        }
        s->stats.bad_framing++;
        ecxi_log(ECX_LOG_DEBUG, "ctrl: dropped a request with bad framing");
    }
}

void ecxi_ctrl_msg_init(ecxi_ctrl_msg *m)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < 3; i++)
        zmq_msg_init(&m->parts[i]);
}

void ecxi_ctrl_msg_fini(ecxi_ctrl_msg *m)
{
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&m->parts[i]);
}

int ecxi_ctrl_server_send(ecxi_ctrl_server *s, const void *identity, size_t identity_len,
                         const void *payload, size_t len)
{
    if (zmq_send(s->sock, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->sock, payload, len, ZMQ_DONTWAIT) < 0) {
        s->stats.send_failed++;
        ecxi_log(ECX_LOG_DEBUG, "ctrl: reply not sent: %s", zmq_strerror(zmq_errno()));
        return ECX_ESYS;
    }
    return 0;
}

int ecxi_ctrl_server_reply(ecxi_ctrl_server *s, ecxi_ctrl_msg *m, const void *payload, size_t len)
{
    int rc = 0;
    if (zmq_msg_send(&m->parts[0], s->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_msg_send(&m->parts[1], s->sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->sock, payload, len, ZMQ_DONTWAIT) < 0) {
        s->stats.send_failed++;
        ecxi_log(ECX_LOG_DEBUG, "ctrl: reply not sent: %s", zmq_strerror(zmq_errno()));
        rc = ECX_ESYS;
    }
    m->identity = NULL, m->identity_len = 0;
    return rc;
}

/* ---------- peer ---------- */

/* A DEALER never stops reading (ZMQ_RCVHWM 0). With a receive HWM, a
 * connection whose pipe is full stops reading, and libzmq 4.3.4 aborts the
 * process if such a stopped connection then ends: a heartbeat timer writes
 * a PING to a connection whose hangup it saw while stopped (`Assertion
 * failed: !_io_error`, stream_engine_base.cpp:331), or the connection that
 * libzmq reconnects in its place is told to restart reading it never
 * stopped (`_input_stopped`, :417, zeromq/libzmq#3937). A producer that
 * floods acks at a consumer slower than them, and then hangs up or just
 * waits for the heartbeat timeout, could abort it either way
 * (tests/shell/test_ack_flood.sh). Without the HWM, reading never stops, so
 * neither can happen, and heartbeats keep working while the application is
 * slow. What bounds what a producer can make a consumer hold instead: the
 * inflow guard (bytes not yet read as whole messages; checked by the
 * watchdog too, so also while the application is not calling in) and the
 * consumer's own bound on acks (consumer.h).
 *
 * Nor does a DEALER reconnect on its own (ZMQ_RECONNECT_IVL -1): a
 * connection the guard dropped must not come back behind an application
 * that is not calling in (the watchdog, above, watches only connections
 * the application has been told of). After a completed handshake there is
 * nothing to reconnect anyway: the producer is lost (sticky) and the
 * consumer opens a fresh socket. Before one (the connect failed, or the
 * handshake did), ctrl dials again itself from the receive calls, backing
 * off from ECXI_CTRL_REDIAL_MIN_MS to ECXI_CTRL_REDIAL_MAX_MS; a dial the
 * monitor says nothing about for ECXI_CTRL_REDIAL_MAX_MS (a name that did
 * not resolve) is retried too. A re-dial drops the old attempt's queue,
 * so what was sent before the first handshake (copies, up to
 * ECXI_CTRL_UNSENT_MAX) is sent again on the new attempt, as libzmq's own
 * reconnect would have kept it. */

/* Drop the endpoint's earlier attempt, if any, and connect anew. */
static int peer_dial(ecxi_ctrl_peer *p)
{
    zmq_disconnect(p->sock, p->ep); /* ENOENT when there is none, or libzmq ended it */
    p->dialed_ms = ecxi_now_ms(NULL);
    p->heard = false;
    p->connected = false;
    p->greeting_by_ms = 0;
    p->redial_ms = 0;
    if (!zmq_connect(p->sock, p->ep)) {
        for (int i = 0; i < p->n_unsent; i++) /* queued for the new attempt */
            if (zmq_send(p->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
                zmq_send(p->sock, p->unsent[i].b, p->unsent[i].n, ZMQ_DONTWAIT) < 0)
                p->stats.send_failed++;
        return 0;
    }
    ecxi_log(ECX_LOG_WARN, "ctrl: cannot connect to %s: %s", p->ep, zmq_strerror(zmq_errno()));
    return ECX_EINVAL;
}

/* The attempt failed before a handshake: dial again after the backoff. */
static void peer_failed(ecxi_ctrl_peer *p)
{
    if (p->redial_ms) return;
    p->redial_ms = ecxi_now_ms(NULL) + p->backoff_ms;
    p->backoff_ms = p->backoff_ms * 2 < ECXI_CTRL_REDIAL_MAX_MS ? p->backoff_ms * 2
                                                               : ECXI_CTRL_REDIAL_MAX_MS;
}

/* When the next dial is due (on ecxi_now_ms's clock), or -1. */
static int64_t peer_redial_at(const ecxi_ctrl_peer *p)
{
    if (p->lost || p->handshaken) return -1;
    if (p->redial_ms) return p->redial_ms;
    return p->heard ? -1 : p->dialed_ms + ECXI_CTRL_REDIAL_MAX_MS;
}

int ecxi_ctrl_peer_new(void *zctx, const char *host, int port, const ecxi_ctrl_opts *opts,
                      ecxi_ctrl_peer **out)
{
    char ep[300];
    if (!zctx || !host || !*host || port <= 0 || port > 65535 || !out ||
        endpoint(ep, sizeof ep, host, port))
        return ECX_EINVAL;
    ecxi_ctrl_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    zmq_msg_init(&p->parts[0]);
    zmq_msg_init(&p->parts[1]);
    int ivl = opts && opts->heartbeat_ivl_ms > 0 ? opts->heartbeat_ivl_ms
                                                 : ECXI_CTRL_HEARTBEAT_IVL_MS;
    int tmo = opts && opts->heartbeat_timeout_ms > 0 ? opts->heartbeat_timeout_ms
                                                     : ECXI_CTRL_HEARTBEAT_TIMEOUT_MS;
    int ttl = opts && opts->heartbeat_ttl_ms > 0 ? opts->heartbeat_ttl_ms
                                                 : ECXI_CTRL_HEARTBEAT_TTL_MS;
    memcpy(p->ep, ep, sizeof p->ep);
    p->backoff_ms = ECXI_CTRL_REDIAL_MIN_MS;
    p->sock = zmq_socket(zctx, ZMQ_DEALER);
    int rc = ECX_ESYS;
    int64_t frame = ECXI_CTRL_MAX_FRAME;
    if (!p->sock || apply_common(p->sock, opts, &frame) ||
        set_int(p->sock, ZMQ_HEARTBEAT_IVL, ivl) ||
        set_int(p->sock, ZMQ_HEARTBEAT_TIMEOUT, tmo) || set_int(p->sock, ZMQ_HEARTBEAT_TTL, ttl) ||
        /* Never stop reading, never reconnect (see above). */
        set_int(p->sock, ZMQ_RCVHWM, 0) || set_int(p->sock, ZMQ_RECONNECT_IVL, -1) ||
        guard_init(&p->g, zctx, p->sock,
                   ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_DELAYED | ZMQ_EVENT_CLOSED |
                       ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED,
                   port, false, frame, opts))
        goto fail;
    watchdog_add(&p->g);
    p->curve = opts && opts->curve_server_key;
    if (p->curve && (rc = curve_client(p->sock, opts->curve_server_key, opts->curve_secret_key))) {
        if (rc == ECX_EINVAL) ecxi_log(ECX_LOG_ERROR, "ctrl: a CURVE key is not Z85");
        goto fail;
    }
    if ((rc = peer_dial(p))) goto fail;
    *out = p;
    return 0;
fail:
    ecxi_ctrl_peer_free(p);
    return rc;
}

void ecxi_ctrl_peer_free(ecxi_ctrl_peer *p)
{
    if (!p) return;
    guard_fini(&p->g, p->sock);
    if (p->sock) zmq_close(p->sock);
    unsent_clear(p);
    zmq_msg_close(&p->parts[0]);
    zmq_msg_close(&p->parts[1]);
    free(p);
}

void *ecxi_ctrl_peer_socket(const ecxi_ctrl_peer *p)
{
    return p->sock;
}
ecxi_ctrl_stats ecxi_ctrl_peer_stats(const ecxi_ctrl_peer *p)
{
    return p->stats;
}

int ecxi_ctrl_peer_send(ecxi_ctrl_peer *p, const void *payload, size_t len)
{
    if (zmq_send(p->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->sock, payload, len, ZMQ_DONTWAIT) < 0) {
        p->stats.send_failed++;
        return ECX_ESYS;
    }
    if (!p->handshaken && p->n_unsent < ECXI_CTRL_UNSENT_MAX) {
        void *b = malloc(len ? len : 1);
        if (b) {
            memcpy(b, payload, len);
            p->unsent[p->n_unsent++] = (struct unsent){b, len};
        }
    }
    return 0;
}

/* Take the monitor's news of the connection: its fd, its handshake, its
 * loss. */
static void peer_events(ecxi_ctrl_peer *p)
{
    uint16_t ev = 0;
    uint32_t v = 0;
    while (!p->lost && guard_event(&p->g, &ev, &v)) {
        if (ev == ZMQ_EVENT_CONNECTED) {
            guard_track(&p->g, (int)v, true);
            p->connected = true;
            p->refused = false;
            if (!p->handshaken) p->greeting_by_ms = ecxi_now_ms(NULL) + ECXI_CTRL_GREETING_MS;
        } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            p->handshaken = true;
            p->greeting_by_ms = 0;
            unsent_clear(p); /* libzmq delivers its queue now */
        } else if (ev == ZMQ_EVENT_CLOSED && !p->handshaken) {
            p->greeting_by_ms = 0;
            /* The connect failed (closed before it connected: refused, or
             * no route); ctrl dials again, the caller may give up now. */
            if (!p->connected) p->refused = true;
            peer_failed(p);
        } else if (ev == ZMQ_EVENT_DISCONNECTED && !p->handshaken) {
            p->greeting_by_ms = 0; /* it answered, and hung up: a CURVE mismatch, say */
            /* Refused in the handshake: the request stays unanswered and
             * the consumer times out, as with an unreachable peer (ctrl
             * dials again, so a fixed key heals). */
            guard_track(&p->g, (int)v, false);
            p->stats.handshake_failed++;
            p->hung_up = true;
            peer_failed(p);
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "ctrl: handshake with %s failed: %s", p->ep,
                                p->curve ? "wrong CURVE server key, not in its allow-list, "
                                           "plaintext there, at its connection cap, or not a "
                                           "ZeroMQ peer"
                                         : "it encrypts (CURVE), is at its connection cap, or "
                                           "is not a ZeroMQ peer; `ecx ping` tells which");
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            p->lost = true;
        }
        p->heard = true;
    }
    int64_t at = peer_redial_at(p);
    if (at >= 0 && ecxi_now_ms(NULL) >= at) peer_dial(p);
}

int ecxi_ctrl_peer_recv(ecxi_ctrl_peer *p, const void **payload, size_t *len)
{
    peer_events(p);
    guard_check(&p->g, &p->stats);
    for (int dropped = 0; dropped < ECXI_CTRL_BAD_PER_RECV; dropped++) {
        int rc = recv_parts(p->sock, &p->g, p->parts, 2, NULL);
        if (rc == 0) return 0;
        if (rc == 1 && zmq_msg_size(&p->parts[0]) == 0) {
            *payload = zmq_msg_data(&p->parts[1]);
            *len = zmq_msg_size(&p->parts[1]);
            return 1;
        }
        p->stats.bad_framing++;
        ecxi_log(ECX_LOG_DEBUG, "ctrl: dropped a reply with bad framing");
    }
    return 0; /* more may wait: the caller comes back (and may count bad_framing) */
}

bool ecxi_ctrl_peer_refused(ecxi_ctrl_peer *p)
{
    peer_events(p);
    return p->refused;
}

bool ecxi_ctrl_peer_hung_up(ecxi_ctrl_peer *p)
{
    peer_events(p);
    return p->hung_up && !p->handshaken;
}

bool ecxi_ctrl_peer_silent(ecxi_ctrl_peer *p)
{
    peer_events(p);
    return p->greeting_by_ms && !p->handshaken && ecxi_now_ms(NULL) >= p->greeting_by_ms;
}

bool ecxi_ctrl_peer_lost(ecxi_ctrl_peer *p)
{
    peer_events(p);
    return p->lost;
}

bool ecxi_ctrl_peer_handshaken(ecxi_ctrl_peer *p)
{
    peer_events(p);
    return p->handshaken;
}

int64_t ecxi_ctrl_server_next_timeout(const ecxi_ctrl_server *s) { return guard_due(&s->g); }
int64_t ecxi_ctrl_peer_next_timeout(const ecxi_ctrl_peer *p)
{
    int64_t due = guard_due(&p->g), at = peer_redial_at(p);
    if (p->greeting_by_ms && !p->handshaken && (at < 0 || p->greeting_by_ms < at))
        at = p->greeting_by_ms;
    if (at < 0) return due;
    at -= ecxi_now_ms(NULL);
    if (at < 0) at = 0;
    return due < 0 || at < due ? at : due;
}
void *ecxi_ctrl_server_monitor_socket(const ecxi_ctrl_server *s) { return s->g.monitor; }
void *ecxi_ctrl_peer_monitor_socket(const ecxi_ctrl_peer *p) { return p->g.monitor; }
