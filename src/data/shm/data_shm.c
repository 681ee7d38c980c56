/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_shm — the same-host data path. The producer hands its region file,
 * as a read-only descriptor, to a consumer of its own uid that proves it
 * holds a live grant; the consumer checks the file (fstat / fstatfs: a
 * regular tmpfs file of the right size, device and inode) before mapping
 * it, copies the granted blocks out with the checksum folded into the copy
 * (shm_copy.h, guarded against a file that shrinks), and tells the producer
 * it is done ('D', also to decline a grant it will not read). The packets,
 * the checks and bounds, and what a same-uid peer can still do:
 * docs/PROTOCOL.md §6.6.
 *
 * How, here: nothing blocks. A READ posted before the descriptor arrived
 * waits (RUNNING) on the peer while progress collects the answer from the
 * socket (SHM_HANDSHAKE_MS at most); the copy runs in slices (data.h),
 * ECXI_DATA_CHUNK at a time, its XXH3 state carried from chunk to chunk; a
 * READ released, or whose peer is dropped, leaves the queue at once and
 * nothing more is written for it. With no copy queued, progress faults in
 * a ready peer's mapping (prefault_some: only what the file holds, so a
 * sparse file cannot make us allocate), so later READs run at memory
 * speed; a large first READ may fault ahead on a thread of its own on a
 * host with CPUs to spare (SHM_AHEAD_*). A 'D' that finds the producer's
 * queue full waits on the peer for up to SHM_NOTIF_RETRY_MS.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "data_impl.h"
#include "shm_copy.h"
#include "util.h"

#define SHM_PROTO 1
#define SHM_HELLO 'H'
#define SHM_DONE 'D'
#define SHM_FD 'F'
#define SHM_REFUSED 'R'
#define SHM_MSG_HEAD (2 + ECXI_DATA_TOKEN_LEN)
#define SHM_MSG_MAX (SHM_MSG_HEAD + ECXI_DATA_NOTIF_MAX)

/* The data plane's own protocol bounds and timeouts: internal to this path
 * (no ecx_config knob, so no ECX_DEFAULT_* in ecx.h), and kept here, beside
 * the protocol they bound. */
#define SHM_MAX_CONNS 256       /* producer: connections held at once */
#define SHM_BACKLOG 64
#define SHM_HELLO_MS 2000       /* producer: time to present a grant */
#define SHM_HANDSHAKE_MS 5000   /* consumer: time for the producer to answer */
#define SHM_NOTIF_RETRY_MS 30000
#define SHM_RECV_BATCH 256      /* packets per connection per poll */
#define SHM_EVENTS 64
/* Pre-fault an idle peer's mapping, a chunk per progress call (below). */
#ifndef SHM_PREFAULT
#define SHM_PREFAULT 1
#endif
/* Pre-fault at most this much of one producer's mapping: on 4 KiB pages
 * its page tables cost the consumer 2 MiB per GiB mapped, and a fleet's
 * regions can be far larger than what one consumer ever reads. */
#define SHM_PREFAULT_MAX (8ull << 30)
/* How the copy runs (shm_copy.h); ECXI_SHM_COPY_POPULATE measured no gain
 * on a first fetch (MADV_POPULATE_READ costs what the faults it saves do),
 * so it is off. */
#ifndef SHM_COPY_MODE
#define SHM_COPY_MODE ECXI_SHM_COPY_AUTO
#endif
/* A READ at least this large from a peer whose mapping is not all faulted
 * in yet (its first READs) copies with ECXI_SHM_COPY_AHEAD: a thread faults
 * the source in from the item's end while the copy runs from its start
 * (BENCHMARKS.md, issue 26: below this, starting the thread costs more
 * than it saves) — where this process may run on at least SHM_AHEAD_CPUS
 * CPUs: the thread only helps with a core to spare, and on two the copying
 * thread, the engine and the producer already take them (measured on the
 * 2-vCPU development VM: from 0.7x to 1.4x the plain cold copy's time,
 * with the load). */
#define SHM_AHEAD_MIN (16ull << 20)
#define SHM_AHEAD_CPUS 4

static bool ahead_cpus(void)
{
    static atomic_int ok = -1; /* the affinity mask, read once */
    int v = atomic_load_explicit(&ok, memory_order_relaxed);
    if (v < 0) {
        cpu_set_t set;
        v = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= SHM_AHEAD_CPUS;
        atomic_store_explicit(&ok, v, memory_order_relaxed);
    }
    return v;
}

typedef struct shm_peer shm_peer;

typedef struct shm_xfer {
    ecxi_data_xfer head;
    struct shm_xfer *next; /* free list, a peer's waiting list, the copy queue,
                              or the pending list */
    shm_peer *peer;        /* while waiting, copying or pending */
    int state;
    bool released, waiting, copying, pending;
    ecxi_shm_job *job; /* while copying */
    int64_t give_up_ms;
    ecxi_data_ticket t;
    ecxi_block_run *runs; /* while waiting: remote's nremote, then local's */
    size_t nremote, nlocal;
    uint64_t nbytes;
    size_t msg_len; /* the done message */
    uint8_t msg[SHM_MSG_MAX];
} shm_xfer;

enum peer_state {
    PEER_IDLE,      /* no connection: the next READ connects */
    PEER_CONNECTED, /* connected, no hello sent */
    PEER_HELLO,     /* hello sent, waiting for the descriptor */
    PEER_READY,     /* region in hand */
};

struct shm_peer {
    ecxi_data_peer head;
    shm_peer *next; /* the context's peers */
    int state;
    int sock;
    bool watch_out;           /* EPOLLOUT requested */
    size_t npending;          /* notifications queued for it */
    int64_t hello_by_ms;
    shm_xfer *wait_head, *wait_tail;
    char sock_name[ECXI_DATA_SOCK_MAX];
    size_t sock_len;
    uint64_t dev, ino, map_len;
    ecxi_shm_src src; /* fd -1, map NULL until READY */
    uint64_t warm;    /* bytes of the mapping pre-faulted when idle */
    /* When the last set-up began, was connected and said hello (ns), for
     * the debug line that breaks a cold fetch's set-up down. */
    int64_t connect_ns, connected_ns, hello_ns;
};

typedef struct conn {
    struct conn *next;
    int fd;
    bool served; /* the descriptor was sent */
    int64_t hello_by_ms;
} conn;

typedef struct shm_data {
    ecxi_data base;
    uint8_t boot_id[16];
    int epfd;
    /* producer */
    int lsock, region_fd;
    uid_t uid;
    char sock_name[ECXI_DATA_SOCK_MAX + 1];
    conn *conns;
    size_t nconns;
    uint64_t refused_uid, refused_full, refused_grant, bad_msgs, hello_timeouts;
    /* consumer */
    shm_peer *peers;
    shm_xfer *free_xfers;
    shm_xfer *pending; /* done messages waiting for room */
    shm_xfer *copy_head, *copy_tail; /* READs being copied, oldest first */
} shm_data;

static const struct ecxi_data_ops shm_ops;

static socklen_t abstract_addr(struct sockaddr_un *sa, const char *name, size_t len)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    sa->sun_path[0] = 0;
    memcpy(sa->sun_path + 1, name, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

static shm_data *shm_alloc(void)
{
    shm_data *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base.ops = &shm_ops;
    s->lsock = s->region_fd = -1;
    s->uid = geteuid();
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        ecxi_log(ECX_LOG_WARN, "data shm: epoll_create1: %s", strerror(errno));
        free(s);
        return NULL;
    }
    return s;
}

static int watch(shm_data *s, int op, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    if (epoll_ctl(s->epfd, op, fd, &ev) == 0) return 0;
    ecxi_log(ECX_LOG_WARN, "data shm: epoll_ctl: %s", strerror(errno));
    return ECX_ESYS;
}

/* ---- producer ---------------------------------------------------------- */

int ecxi_data_shm_new_producer(ecxi_region *r, ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out)
{
    (void)dd;
    const char *path = ecxi_region_path(r);
    if (!path || path[0] != '/' || strlen(path) > ECXI_DATA_PATH_MAX) return ECX_EINVAL;
    shm_data *s = shm_alloc();
    if (!s) return ECX_ESYS;
    int rc = ecxi_data_boot_id(s->boot_id);
    if (rc) goto fail;
    /* The descriptor we hand out: read-only, of our own file. */
    struct stat st;
    s->region_fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (s->region_fd < 0 || fstat(s->region_fd, &st) != 0) goto sysfail;
    if (!S_ISREG(st.st_mode) || st.st_uid != s->uid ||
        (uint64_t)st.st_size != ecxi_region_size(r)) {
        ecxi_log(ECX_LOG_WARN, "data shm: %s is not this region's file", path);
        rc = ECX_EREGION_BADFILE;
        goto fail;
    }
    snprintf(s->sock_name, sizeof s->sock_name, "ecx-shm-%08x-%016llx", (unsigned)getpid(),
             (unsigned long long)m->nonce);
    s->lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lsock < 0) goto sysfail;
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, s->sock_name, strlen(s->sock_name));
    if (bind(s->lsock, (struct sockaddr *)&sa, sl) != 0 || listen(s->lsock, SHM_BACKLOG) != 0)
        goto sysfail;
    if ((rc = watch(s, EPOLL_CTL_ADD, s->lsock, EPOLLIN, NULL))) goto fail;
    m->has_shm = true;
    memcpy(m->boot_id, s->boot_id, 16);
    m->dev = (uint64_t)st.st_dev;
    m->ino = (uint64_t)st.st_ino;
    m->path = path;
    m->path_len = strlen(path);
    m->sock = s->sock_name;
    m->sock_len = strlen(s->sock_name);
    *out = &s->base;
    return 0;
sysfail:
    ecxi_log(ECX_LOG_WARN, "data shm: %s", strerror(errno));
    rc = ECX_ESYS;
fail:
    if (s->lsock >= 0) close(s->lsock);
    if (s->region_fd >= 0) close(s->region_fd);
    close(s->epfd);
    free(s);
    return rc;
}

static void conn_close(shm_data *s, conn *c)
{
    for (conn **pp = &s->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    close(c->fd); /* also leaves the epoll set */
    free(c);
    s->nconns--;
}

static void accept_some(shm_data *s, int64_t now)
{
    for (int i = 0; i < SHM_EVENTS; i++) {
        int fd = accept4(s->lsock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: accept: %s", strerror(errno));
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;
        }
        struct ucred cr = {.uid = (uid_t)-1};
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != s->uid) {
            s->refused_uid++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data shm: refused a connection from uid %u (not ours); "
                                "%llu refused so far",
                                (unsigned)cr.uid, (unsigned long long)s->refused_uid);
            close(fd);
            continue;
        }
        conn *c = s->nconns < SHM_MAX_CONNS ? calloc(1, sizeof *c) : NULL;
        if (!c || watch(s, EPOLL_CTL_ADD, fd, EPOLLIN, c) != 0) {
            s->refused_full++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data shm: refused a connection: %zu held; %llu refused so far",
                                s->nconns, (unsigned long long)s->refused_full);
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->hello_by_ms = now + SHM_HELLO_MS;
        c->next = s->conns;
        s->conns = c;
        s->nconns++;
    }
}

static int send_reply(int fd, char type, int pass_fd)
{
    uint8_t b[2] = {SHM_PROTO, (uint8_t)type};
    struct iovec iov = {.iov_base = b, .iov_len = sizeof b};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        memset(&u, 0, sizeof u);
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof u.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    return sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof b ? 0 : ECX_ESYS;
}

/* Handle what one connection sent; close it on hang-up, refusal or a bad packet. */
static void conn_service(shm_data *s, conn *c, ecxi_data_notif_cb cb, void *arg, int *count)
{
    uint8_t b[SHM_MSG_MAX + 1];
    for (int i = 0; i < SHM_RECV_BATCH; i++) {
        ssize_t n = recv(c->fd, b, sizeof b, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) break; /* the consumer has gone */
        if (n <= SHM_MSG_HEAD || n > SHM_MSG_MAX || b[0] != SHM_PROTO ||
            b[1] != (c->served ? SHM_DONE : SHM_HELLO)) {
            s->bad_msgs++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data shm: closed a connection that sent a malformed or "
                                "unexpected packet (%zd bytes); %llu so far",
                                n, (unsigned long long)s->bad_msgs);
            break;
        }
        const uint8_t *token = b + 2;
        char *key = (char *)b + SHM_MSG_HEAD;
        size_t key_len = (size_t)n - SHM_MSG_HEAD;
        key[key_len] = 0;
        if (c->served) {
            cb(arg, key, key_len, token, 0);
            (*count)++;
            continue;
        }
        ecxi_data_grant g;
        if (ecxi_data_grant_check(&s->base, key, key_len, token, 0, &g) != 0) {
            s->refused_grant++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data shm: refused a connection that holds no live grant; "
                                "%llu so far",
                                (unsigned long long)s->refused_grant);
            (void)send_reply(c->fd, SHM_REFUSED, -1);
            break;
        }
        if (send_reply(c->fd, SHM_FD, s->region_fd) != 0 && errno != EPIPE &&
            errno != ECONNRESET) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: cannot send the region: %s",
                                strerror(errno));
            break;
        }
        /* Served, or the consumer has gone (a hello and a decline's 'D',
         * then exit): the packets it sent before it went are still read. */
        c->served = true;
    }
    conn_close(s, c);
}

static int shm_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    (void)sl; /* a producer moves no bytes here: it hands out a descriptor */
    shm_data *s = (shm_data *)d;
    if (s->lsock < 0) return 0;
    int64_t now = ecxi_now_ms(NULL);
    for (conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (!c->served && now >= c->hello_by_ms) {
            s->hello_timeouts++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data shm: closed a connection that presented no grant in "
                                "%d ms; %llu so far",
                                SHM_HELLO_MS, (unsigned long long)s->hello_timeouts);
            conn_close(s, c);
        }
    }
    struct epoll_event ev[SHM_EVENTS];
    int ne = epoll_wait(s->epfd, ev, SHM_EVENTS, 0);
    if (ne < 0) return errno == EINTR ? 0 : ECX_ESYS;
    int count = 0;
    for (int i = 0; i < ne; i++) {
        if (!ev[i].data.ptr)
            accept_some(s, now);
        else
            conn_service(s, ev[i].data.ptr, cb, arg, &count);
    }
    return count;
}

/* ---- consumer ---------------------------------------------------------- */

int ecxi_data_shm_new_consumer(ecxi_region *r, ecxi_data **out)
{
    (void)r;
    shm_data *s = shm_alloc();
    if (!s) return ECX_ESYS;
    int rc = ecxi_data_boot_id(s->boot_id);
    if (rc) {
        close(s->epfd);
        free(s);
        return rc;
    }
    (void)ecxi_shm_copy_init(); /* without the guard, copies use pread */
    *out = &s->base;
    return 0;
}

static void xfer_put(shm_data *s, shm_xfer *x)
{
    free(x->runs);
    x->runs = NULL;
    x->next = s->free_xfers;
    s->free_xfers = x;
}

static void peer_watch_out(shm_data *s, shm_peer *p, bool out)
{
    if (p->watch_out == out || p->sock < 0) return;
    if (watch(s, EPOLL_CTL_MOD, p->sock, EPOLLIN | (out ? EPOLLOUT : 0), p) == 0)
        p->watch_out = out;
}

/* Try to send a done message; 0 sent or given up, 1 no room yet. */
static int done_send(shm_peer *p, const uint8_t *msg, size_t len)
{
    if (p->sock < 0) return 0;
    ssize_t n = send(p->sock, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == (ssize_t)len) return 0;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) return 1;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: notification not delivered: %s",
                        n < 0 ? strerror(errno) : "short send");
    return 0;
}

static void unpend(shm_data *s, shm_xfer **pp)
{
    shm_xfer *x = *pp;
    *pp = x->next;
    x->pending = false;
    if (x->peer && --x->peer->npending == 0) peer_watch_out(s, x->peer, false);
    x->peer = NULL;
    if (x->released) xfer_put(s, x);
}

/* Fail the READs waiting for the peer's region. */
static void fail_waiting(shm_data *s, shm_peer *p)
{
    while (p->wait_head) {
        shm_xfer *x = p->wait_head;
        p->wait_head = x->next;
        x->waiting = false;
        x->peer = NULL;
        x->state = ECXI_XFER_FAILED;
        if (x->released) xfer_put(s, x);
    }
    p->wait_tail = NULL;
}

/* Back to no connection (the region is released too): waiting READs fail,
 * queued notifications are dropped. */
static void copy_unlink(shm_data *s, shm_xfer *x);

static void peer_reset(shm_data *s, shm_peer *p)
{
    fail_waiting(s, p);
    /* Copies out of its mapping stop here, between two chunks. */
    for (shm_xfer *x = s->copy_head, *next; x; x = next) {
        next = x->next;
        if (x->peer != p) continue;
        copy_unlink(s, x);
        x->state = ECXI_XFER_FAILED;
        if (x->released) xfer_put(s, x);
    }
    for (shm_xfer **pp = &s->pending; *pp;) {
        if ((*pp)->peer == p)
            unpend(s, pp);
        else
            pp = &(*pp)->next;
    }
    if (p->sock >= 0) close(p->sock);
    p->sock = -1;
    p->watch_out = false;
    if (p->src.map) {
        ecxi_shm_ahead_drain(p->src.map); /* its copies' fault-ahead threads are done */
        munmap((void *)p->src.map, p->src.map_len);
    }
    if (p->src.fd >= 0) close(p->src.fd);
    p->src = (ecxi_shm_src){.fd = -1};
    p->warm = 0;
    p->state = PEER_IDLE;
}

/* Connect to the producer's socket; the peer must run as our uid. */
static int peer_connect(shm_data *s, shm_peer *p)
{
    p->connect_ns = ecxi_now_ns();
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return ECX_ESYS;
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, p->sock_name, p->sock_len);
    struct ucred cr;
    socklen_t cl = sizeof cr;
    int rc = ECX_EDATA_NOPATH;
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0) {
        ecxi_log(ECX_LOG_DEBUG, "data shm: producer socket unreachable: %s", strerror(errno));
    } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != s->uid) {
        ecxi_log(ECX_LOG_DEBUG, "data shm: producer runs as another uid; not using this path");
    } else if ((rc = watch(s, EPOLL_CTL_ADD, fd, EPOLLIN, p)) == 0) {
        p->sock = fd;
        p->state = PEER_CONNECTED;
        p->connected_ns = ecxi_now_ns();
        return 0;
    }
    close(fd);
    return rc;
}

static int shm_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                        ecxi_data_peer **out)
{
    shm_data *s = (shm_data *)d;
    if (!m->has_shm || memcmp(m->boot_id, s->boot_id, 16) != 0) return ECX_EDATA_NOPATH;
    shm_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    p->sock = -1;
    p->src.fd = -1;
    memcpy(p->sock_name, m->sock, m->sock_len);
    p->sock_len = m->sock_len;
    p->dev = m->dev;
    p->ino = m->ino;
    p->map_len = desc->num_blocks * desc->block_bytes; /* fits: checked when parsed */
    int rc = peer_connect(s, p);
    if (rc) {
        free(p);
        return rc;
    }
    p->head.owner = d;
    p->head.backend = "shm";
    p->next = s->peers;
    s->peers = p;
    *out = &p->head;
    return 0;
}

static void shm_peer_drop(ecxi_data_peer *hp)
{
    shm_peer *p = (shm_peer *)hp;
    shm_data *s = (shm_data *)hp->owner;
    peer_reset(s, p);
    for (shm_peer **pp = &s->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

/* Take x off the copy queue and drop its job: nothing is written for it
 * after this. */
static void copy_unlink(shm_data *s, shm_xfer *x)
{
    shm_xfer *prev = NULL;
    for (shm_xfer *w = s->copy_head; w; prev = w, w = w->next)
        if (w == x) {
            if (prev)
                prev->next = x->next;
            else
                s->copy_head = x->next;
            if (s->copy_tail == x) s->copy_tail = prev;
            break;
        }
    x->next = NULL;
    x->copying = false;
    x->peer = NULL;
    ecxi_shm_job_free(x->job);
    x->job = NULL;
}

/* Finished with the grant's blocks, whatever the outcome: tell the
 * producer (now, or when its queue has room). */
static void say_done(shm_data *s, shm_peer *p, shm_xfer *x)
{
    if (done_send(p, x->msg, x->msg_len) == 1) {
        x->peer = p;
        x->pending = true;
        x->give_up_ms = ecxi_now_ms(NULL) + SHM_NOTIF_RETRY_MS;
        x->next = s->pending;
        s->pending = x;
        if (p->npending++ == 0) peer_watch_out(s, p, true);
    } else if (x->released) {
        xfer_put(s, x);
    }
}

/* The copy of x ended (rc: the job's last step) or was cancelled (rc 0):
 * judge it, then release the grant. */
static void copy_end(shm_data *s, shm_xfer *x, int rc, uint64_t sum)
{
    shm_peer *p = x->peer;
    copy_unlink(s, x);
    if (rc < 0)
        x->state = ECXI_XFER_FAILED;
    else if (rc == 0)
        ; /* cancelled (released): its state no longer matters */
    else if (sum != x->t.checksum) {
        x->state = ECXI_XFER_CORRUPT;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: an item's bytes do not match its checksum");
    } else
        x->state = ECXI_XFER_DONE;
    say_done(s, p, x);
}

static uint64_t prefault_end(const shm_peer *p);

/* Queue x's copy (the bytes move in progress slices); on failure to start
 * it the READ fails at once (and the grant is released). */
static void start_copy(shm_data *s, shm_peer *p, shm_xfer *x, const ecxi_block_run *remote,
                       const ecxi_block_run *local)
{
    const uint64_t bs = ecxi_region_block_bytes(s->base.region);
    x->state = ECXI_XFER_RUNNING;
    int mode = SHM_COPY_MODE;
    if (x->nbytes >= SHM_AHEAD_MIN && p->warm < prefault_end(p) && ahead_cpus())
        mode |= ECXI_SHM_COPY_AHEAD;
    if (ecxi_shm_job_new(&p->src, bs, remote, x->nremote, local, x->nlocal, x->nbytes, mode,
                         &x->job) != 0) {
        x->job = NULL;
        x->state = ECXI_XFER_FAILED;
        say_done(s, p, x);
        return;
    }
    x->copying = true;
    x->peer = p;
    x->next = NULL;
    if (s->copy_tail)
        s->copy_tail->next = x;
    else
        s->copy_head = x;
    s->copy_tail = x;
}

/* Copy the queued READs, oldest first, a chunk at a time, until the slice
 * is spent. Returns READs ended. */
static int copy_some(shm_data *s, ecxi_slice *sl)
{
    int ended = 0;
    uint8_t *base = ecxi_region_base(s->base.region);
    while (s->copy_head) {
        if (ecxi_slice_spent(sl)) break;
        shm_xfer *x = s->copy_head;
        uint64_t moved = 0, sum = 0;
        ecxi_region_busy(s->base.region);
        int rc = ecxi_shm_job_step(x->job, &x->peer->src, base, ECXI_DATA_CHUNK, &moved, &sum);
        sl->bytes += moved;
        if (rc != 0) {
            copy_end(s, x, rc, sum);
            ended++;
        }
    }
    return ended;
}

/* Where pre-faulting a peer's mapping stops. */
static uint64_t prefault_end(const shm_peer *p)
{
    return p->map_len < SHM_PREFAULT_MAX ? p->map_len : SHM_PREFAULT_MAX;
}

/* A ready peer whose mapping is not all faulted in yet, or NULL. */
static shm_peer *prefault_next(const shm_data *s)
{
    for (shm_peer *p = s->peers; p; p = p->next)
        if (p->state == PEER_READY && p->warm < prefault_end(p)) return p;
    return NULL;
}

/* Fault in the pages of [map, map + len) that the file holds (len at most
 * a chunk, map page-aligned). A hole faulted in through a shared mapping
 * is a page allocated, charged to us, so a producer's sparse file (a
 * 2 GiB memfd with nothing in it) must not make us allocate its size; a
 * real region is allocated whole when it is made (region.c), so for it
 * this changes nothing. mincore says which pages of a file mapping are in
 * the file's cache, in time bounded by len (lseek's SEEK_HOLE, used
 * before, walked the file to its next hole from every chunk: for a
 * region with none, the whole file again per 256 KiB, 5x the copy's own
 * time in a profile of a 768 MB region). Where mincore fails, nothing. */
static void populate_data(const uint8_t *map, uint64_t len)
{
    long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    unsigned char in[ECXI_DATA_CHUNK / 4096];
    uint64_t pages = (len + (uint64_t)page - 1) / (uint64_t)page;
    if (pages > sizeof in || mincore((void *)map, (size_t)len, in) != 0) return;
    for (uint64_t i = 0; i < pages;) {
        uint64_t j = i;
        while (j < pages && (in[j] & 1))
            j++;
        if (j > i) {
            uint64_t lo = i * (uint64_t)page, hi = j * (uint64_t)page;
            ecxi_shm_populate(map + lo, (hi < len ? hi : len) - lo, false);
        }
        i = j + 1;
    }
}

/* With nothing to copy, fault in more of a peer's mapping, a chunk at a
 * time, so that later READs of blocks never read before run at memory
 * speed (a first touch costs about as much again as the copy; see
 * shm_copy.h). In the background (a progress thread steps us: arm says 1
 * while some is left), chunks until the slice's budget is spent;
 * otherwise one chunk, riding on progress calls made anyway (an engine's
 * poll is not held up for it). Never counted as bytes moved. */
static void prefault_some(shm_data *s, ecxi_slice *sl)
{
    if (s->copy_head || sl->bytes) return;
    shm_peer *p;
    while ((p = prefault_next(s))) {
        uint64_t at = p->warm, end = prefault_end(p);
        uint64_t len = end - at < ECXI_DATA_CHUNK ? end - at : ECXI_DATA_CHUNK;
        populate_data(p->src.map + at, len);
        p->warm = at + len;
        if (!s->base.background || ecxi_now_ns() - sl->start_ns >= sl->budget_ns) return;
    }
}

#ifdef MADV_HUGEPAGE
/* Whether the tmpfs of device dev is mounted huge=advise (its files then
 * say 4 KiB in st_blksize, and get huge pages on the mappings that ask). */
static bool huge_advise_mount(dev_t dev)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) return false;
    char line[4096];
    bool yes = false;
    unsigned maj, min;
    while (!yes && fgets(line, sizeof line, f))
        yes = sscanf(line, "%*u %*u %u:%u", &maj, &min) == 2 && maj == major(dev) &&
              min == minor(dev) && strstr(line, " - tmpfs ") && strstr(line, "huge=advise");
    fclose(f);
    return yes;
}
#endif

/* Check the descriptor the producer sent and map it. */
static int take_region(shm_peer *p, int fd)
{
    struct stat st;
    struct statfs sf;
    const char *why = NULL;
    if (fstat(fd, &st) != 0 || fstatfs(fd, &sf) != 0)
        why = "cannot stat it";
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    else if (sf.f_type != TMPFS_MAGIC)
        why = "not on tmpfs";
    else if ((uint64_t)st.st_dev != p->dev || (uint64_t)st.st_ino != p->ino)
        why = "not the file its metadata names";
    else if (st.st_size < 0 || (uint64_t)st.st_size < p->map_len)
        why = "smaller than its region";
    if (why) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: refused the producer's descriptor: %s", why);
        close(fd);
        return ECX_EDATA_PEER;
    }
    void *map = mmap(NULL, p->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: cannot map the producer's region: %s",
                            strerror(errno));
        close(fd);
        return ECX_ESYS;
    }
#ifdef MADV_HUGEPAGE
    /* Where the producer's region has huge pages (its directory is a tmpfs
     * mounted huge=always|within_size, whose files say so in st_blksize:
     * 2 MiB, or huge=advise, which its mount options say), a first touch maps 2 MiB at once: a cold fetch then runs at
     * memory speed instead of paying a fault per 4 KiB page. The kernel
     * places the mapping at a 2 MiB boundary for such a mount by itself;
     * the hint is for kernels that also want it on the reader's side. On a
     * file of 4 KiB pages it only costs: a cold 256 MB fetch took 104-112
     * ms with it against 88-93 without. */
    if (st.st_blksize >= (2 << 20) || huge_advise_mount(st.st_dev))
        (void)madvise(map, p->map_len, MADV_HUGEPAGE);
#endif
    p->src = (ecxi_shm_src){.fd = fd, .map = map, .map_len = p->map_len};
    return 0;
}

/* Read what the producer sent. In HELLO: the answer; otherwise only a
 * hang-up is expected. */
static void peer_input(shm_data *s, shm_peer *p)
{
    uint8_t b[8];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = b, .iov_len = sizeof b};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(p->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    int fds[4], nfd = 0;
    for (struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k && nfd < 4; j++)
            memcpy(&fds[nfd++], CMSG_DATA(cm) + j * sizeof(int), sizeof(int));
    }
    bool ok = p->state == PEER_HELLO && n == 2 && b[0] == SHM_PROTO && b[1] == SHM_FD &&
              nfd == 1 && !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
    if (!ok) {
        for (int i = 0; i < nfd; i++)
            close(fds[i]);
        if (n == 2 && b[1] == SHM_REFUSED)
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: the producer refused our grant");
        else if (n != 0 || p->state == PEER_HELLO)
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: unexpected answer from the producer");
        peer_reset(s, p);
        return;
    }
    int64_t answer_ns = ecxi_now_ns();
    if (take_region(p, fds[0]) != 0) {
        peer_reset(s, p);
        return;
    }
    int64_t mapped_ns = ecxi_now_ns();
    ecxi_log(ECX_LOG_DEBUG,
             "data shm: the producer's region mapped %.0f us after connecting (connect %.0f, "
             "then hello %.0f, hello -> answer %.0f, check + map %.0f)",
             (double)(mapped_ns - p->connect_ns) / 1e3,
             (double)(p->connected_ns - p->connect_ns) / 1e3,
             (double)(p->hello_ns - p->connected_ns) / 1e3,
             (double)(answer_ns - p->hello_ns) / 1e3, (double)(mapped_ns - answer_ns) / 1e3);
    p->state = PEER_READY;
    while (p->wait_head) {
        shm_xfer *x = p->wait_head;
        p->wait_head = x->next;
        x->waiting = false;
        x->peer = NULL;
        start_copy(s, p, x, x->runs, x->runs + x->nremote);
        free(x->runs);
        x->runs = NULL;
    }
    p->wait_tail = NULL;
}

static int shm_progress(ecxi_data *d, ecxi_slice *sl)
{
    shm_data *s = (shm_data *)d;
    if (s->base.role == ECXI_DATA_PRODUCER) return 0; /* all in poll_notifs */
    int done = 0;
    struct epoll_event ev[SHM_EVENTS];
    int ne = epoll_wait(s->epfd, ev, SHM_EVENTS, 0);
    for (int i = 0; i < ne; i++) {
        shm_peer *p = ev[i].data.ptr;
        if (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
            peer_input(s, p);
            done++;
        }
    }
    int64_t now = (s->pending || s->peers) ? ecxi_now_ms(NULL) : 0;
    for (shm_peer *p = s->peers; p; p = p->next)
        if (p->state == PEER_HELLO && now >= p->hello_by_ms) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: the producer did not answer in %d ms",
                                SHM_HANDSHAKE_MS);
            peer_reset(s, p);
            done++;
        }
    for (shm_xfer **pp = &s->pending; *pp;) {
        shm_xfer *x = *pp;
        int rc = done_send(x->peer, x->msg, x->msg_len);
        if (rc == 1 && now < x->give_up_ms) {
            pp = &x->next;
            continue;
        }
        if (rc == 1)
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: producer never drained its "
                                              "notification queue; notification dropped");
        unpend(s, pp);
        done++;
    }
    done += copy_some(s, sl);
    if (SHM_PREFAULT) prefault_some(s, sl);
    return done;
}

/* A READ (read_post), or with decline only the grant's 'D': an xfer of
 * no blocks, released from the start, that says 'D' at once (after a
 * hello with its grant if nobody has said one: the producer reads the
 * two in order, and answers the hello before it reads the 'D'), then
 * goes; out is NULL then. */
static int post(ecxi_data_peer *hp, const ecxi_data_ticket *t, const ecxi_block_run *remote,
                size_t nremote, const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                const char *key, size_t key_len, bool decline, ecxi_data_xfer **out)
{
    shm_peer *p = (shm_peer *)hp;
    shm_data *s = (shm_data *)hp->owner;
    shm_xfer *x = s->free_xfers;
    if (x)
        s->free_xfers = x->next;
    else if (!(x = malloc(sizeof *x)))
        return ECX_ENOMEM;
    memset(x, 0, offsetof(shm_xfer, msg));
    x->head.owner = hp->owner;
    x->t = *t;
    x->nremote = nremote;
    x->nlocal = nlocal;
    x->nbytes = nbytes;
    x->msg[0] = SHM_PROTO;
    x->msg[1] = SHM_DONE;
    memcpy(x->msg + 2, t->token, ECXI_DATA_TOKEN_LEN);
    memcpy(x->msg + SHM_MSG_HEAD, key, key_len);
    x->msg_len = SHM_MSG_HEAD + key_len;
    x->released = decline;
    if (p->state == PEER_READY) {
        if (decline)
            say_done(s, p, x);
        else
            start_copy(s, p, x, remote, local);
        if (out) *out = &x->head;
        return 0;
    }
    /* The region is not here yet: wait for it, saying hello first if
     * nobody has. */
    int rc = ECX_ENOMEM;
    if (nremote + nlocal) {
        if (!(x->runs = malloc((nremote + nlocal) * sizeof *x->runs))) goto fail;
        memcpy(x->runs, remote, nremote * sizeof *remote);
        memcpy(x->runs + nremote, local, nlocal * sizeof *local);
    }
    /* A connection that has said nothing yet may have been closed by the
     * producer (SHM_HELLO_MS) without our noticing: then connect again,
     * once. */
    for (int attempt = 0; p->state == PEER_IDLE || p->state == PEER_CONNECTED; attempt++) {
        if (p->state == PEER_IDLE && (attempt == 2 || peer_connect(s, p) != 0)) {
            rc = ECX_EDATA_PEER;
            goto fail;
        }
        x->msg[1] = SHM_HELLO;
        ssize_t k = send(p->sock, x->msg, x->msg_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        x->msg[1] = SHM_DONE;
        if (k != (ssize_t)x->msg_len) {
            ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "data shm: hello not sent: %s",
                                k < 0 ? strerror(errno) : "short send");
            peer_reset(s, p);
            continue;
        }
        p->state = PEER_HELLO;
        p->hello_ns = ecxi_now_ns();
        p->hello_by_ms = ecxi_now_ms(NULL) + SHM_HANDSHAKE_MS;
    }
    if (decline) {
        say_done(s, p, x);
        return 0;
    }
    x->waiting = true;
    x->peer = p;
    x->state = ECXI_XFER_RUNNING;
    if (p->wait_tail)
        p->wait_tail->next = x;
    else
        p->wait_head = x;
    p->wait_tail = x;
    if (out) *out = &x->head;
    return 0;
fail:
    xfer_put(s, x);
    return rc;
}

static int shm_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t,
                         const ecxi_block_run *remote, size_t nremote,
                         const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                         const char *key, size_t key_len, ecxi_data_xfer **out)
{
    return post(hp, t, remote, nremote, local, nlocal, nbytes, key, key_len, false, out);
}

static int shm_decline(ecxi_data_peer *hp, const ecxi_data_ticket *t, const char *key,
                       size_t key_len)
{
    return post(hp, t, NULL, 0, NULL, 0, 0, key, key_len, true, NULL);
}

static int shm_read_poll(ecxi_data_xfer *hx)
{
    return ((shm_xfer *)hx)->state;
}

static void shm_read_release(ecxi_data_xfer *hx)
{
    shm_xfer *x = (shm_xfer *)hx;
    shm_data *s = (shm_data *)hx->owner;
    if (x->waiting) { /* cancelled before its region came */
        shm_peer *p = x->peer;
        shm_xfer *prev = NULL;
        for (shm_xfer *w = p->wait_head; w; prev = w, w = w->next)
            if (w == x) {
                if (prev)
                    prev->next = x->next;
                else
                    p->wait_head = x->next;
                if (p->wait_tail == x) p->wait_tail = prev;
                break;
            }
        x->waiting = false;
        x->peer = NULL;
    }
    x->released = true;
    if (x->copying) { /* stops between two chunks; the grant is released */
        copy_end(s, x, 0, 0);
        return;
    }
    if (!x->pending) xfer_put(s, x);
}

static int shm_fd(ecxi_data *d)
{
    return ((shm_data *)d)->epfd;
}

static int shm_arm(ecxi_data *d)
{
    /* A queued copy needs progress, not an event; so does pre-faulting,
     * when a thread of the caller's does the progress (prefault_some). */
    shm_data *s = (shm_data *)d;
    return s->copy_head || (s->base.background && SHM_PREFAULT && prefault_next(s)) ? 1 : 0;
}

static void shm_free(ecxi_data *d)
{
    shm_data *s = (shm_data *)d;
    /* Peers are dropped by the caller first; their xfers may remain. */
    while (s->peers)
        shm_peer_drop(&s->peers->head);
    while (s->conns)
        conn_close(s, s->conns);
    for (shm_xfer *x = s->free_xfers, *n; x; x = n) {
        n = x->next;
        free(x);
    }
    if (s->lsock >= 0) close(s->lsock);
    if (s->region_fd >= 0) close(s->region_fd);
    close(s->epfd);
    free(s);
}

static void shm_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const shm_data *s = (const shm_data *)d;
    ecxi_data_counts *c = &st->path[ECX_DATA_SHM];
    c->conns_refused += s->refused_uid + s->refused_full;
    c->conns_dropped += s->bad_msgs + s->hello_timeouts;
}

static const struct ecxi_data_ops shm_ops = {
    .name = "shm",
    .stats = shm_stats,
    .free = shm_free,
    .progress = shm_progress,
    .fd = shm_fd,
    .arm = shm_arm,
    .poll_notifs = shm_poll_notifs,
    .peer_add = shm_peer_add,
    .peer_drop = shm_peer_drop,
    .read_post = shm_read_post,
    .read_poll = shm_read_poll,
    .read_release = shm_read_release,
    .decline = shm_decline,
};
