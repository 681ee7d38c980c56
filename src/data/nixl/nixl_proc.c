/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_proc — the NIXL agent process, the parent's side and the protocol
 * (nixl_proc.h; the helper's loop is nixl_agent_main.c).
 */
#include "nixl_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "helper_proc.h"
#include "util.h"

#define HELPER_NAME "ecx-nixl-agent"
#define VERDICTS 16
#define NOTIF_QUEUE 1024
#define FREE_WAIT_MS 1000
#define REAP_WAIT_MS 50
/* Messages handled in one progress call. */
#define PROGRESS_MSGS 4096

typedef struct notif {
    char name[ECXI_NIXL_NAME_MAX + 1];
    char msg[ECXI_NIXL_MSG_MAX + 1];
} notif;

struct ecxi_nixl_proc_read {
    ecxi_nixl_proc_read *prev, *next; /* in p->reads while running */
    uint64_t id, gen;
    int state; /* 0 running, 1 done, negative failed */
};

struct ecxi_nixl_proc {
    bool producer;
    int region_fd;
    uint64_t region_bytes;
    int epfd;
    int sock; /* -1 while down */
    pid_t pid;
    uint64_t gen, gens; /* current (0: down), and how many were started */
    char name[ECXI_NIXL_NAME_MAX + 1];
    uint8_t *meta;
    size_t meta_len;
    uint64_t base;
    uint64_t restarts;
    ecxi_helper_starts starts;
    int64_t down_logged_ms;
    uint8_t *rx, *tx;
    uint64_t next_id;
    ecxi_nixl_proc_read *reads;
    /* the ADD waiting for its answer */
    uint64_t add_id;
    bool add_answered;
    int add_rc;
    uint64_t add_handle;
    notif *q;
    size_t q_head, q_len;
    uint64_t verdict_hash[VERDICTS], verdict_used[VERDICTS], verdict_clock;
};

/* ---- codec ---------------------------------------------------------------- */

void ecxi_nixl_proc_hdr_put(uint8_t *b, uint16_t type, uint64_t id)
{
    ecxi_helper_hdr_put(b, ECXI_NIXL_PROC_MAGIC, ECXI_NIXL_PROC_VERSION, type, id);
}

int ecxi_nixl_proc_hdr_get(const uint8_t *b, size_t len, uint16_t *type, uint64_t *id)
{
    return ecxi_helper_hdr_get(b, len, ECXI_NIXL_PROC_MAGIC, ECXI_NIXL_PROC_VERSION, type, id);
}

/* ---- the helper's life ---------------------------------------------------- */

static void epoll_set(ecxi_nixl_proc *p, int op)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = p->sock};
    if (epoll_ctl(p->epfd, op, p->sock, &ev) != 0)
        ecxi_log(ECX_LOG_WARN, "nixl: epoll_ctl: %s", strerror(errno));
}

/* The helper is gone or no longer trusted: kill, reap, fail what it held. */
static void die(ecxi_nixl_proc *p, const char *what)
{
    if (p->sock < 0) return;
    epoll_set(p, EPOLL_CTL_DEL);
    close(p->sock);
    p->sock = -1;
    char why[128];
    /* a violation or a hang: kill it at once; EOF: it is ending */
    ecxi_helper_reap(p->pid, what != NULL, REAP_WAIT_MS, why, sizeof why);
    ecxi_log(ECX_LOG_WARN, "nixl: the NIXL agent process (pid %d, agent %s) ended: %s%s%s; its "
             "READs in flight fail, its peers are forgotten; a new one starts",
             (int)p->pid, p->name, why, what ? ": " : "", what ? what : "");
    p->pid = 0;
    p->gen = 0;
    for (ecxi_nixl_proc_read *x = p->reads, *nx; x; x = nx) {
        nx = x->next;
        x->state = ECX_EDATA_PEER;
        x->prev = x->next = NULL;
    }
    p->reads = NULL;
}

/* A fresh agent name per helper: a vLLM process refuses a second remote
 * agent of one name. "ecx-" and 32 random hex digits. */
static void agent_name(char *out)
{
    uint8_t r[16];
    randombytes_buf(r, sizeof r);
    memcpy(out, "ecx-", 4);
    for (int i = 0; i < 16; i++)
        snprintf(out + 4 + 2 * i, 3, "%02x", r[i]);
}

/* Start a helper and wait for its HELLO. */
static int start(ecxi_nixl_proc *p)
{
    char path[PATH_MAX];
    int rc = ecxi_helper_find(HELPER_NAME, "ECX_NIXL_AGENT", path);
    if (rc) return rc;
    agent_name(p->name);
    if ((rc = ecxi_helper_spawn(path, "--ecx-nixl-agent", p->region_fd, &p->sock, &p->pid))) {
        p->sock = -1;
        p->pid = 0;
        return rc;
    }
    ecxi_helper_started(&p->starts, ecxi_now_ms(NULL));
    size_t nl = strlen(p->name);
    uint8_t hello[ECXI_NIXL_PROC_HDR + 12 + ECXI_NIXL_NAME_MAX];
    ecxi_nixl_proc_hdr_put(hello, ECXI_NIXL_P_HELLO, p->gens + 1); /* its generation */
    ecxi_put_le32(hello + ECXI_NIXL_PROC_HDR,
          p->producer ? ECXI_NIXL_ROLE_PRODUCER : ECXI_NIXL_ROLE_CONSUMER);
    ecxi_put_le64(hello + ECXI_NIXL_PROC_HDR + 4, p->region_bytes);
    memcpy(hello + ECXI_NIXL_PROC_HDR + 12, p->name, nl);
    /* a fresh socket takes it at once, unless the helper is already gone */
    ssize_t sent = send(p->sock, hello, ECXI_NIXL_PROC_HDR + 12 + nl, MSG_NOSIGNAL | MSG_DONTWAIT);
    long n = sent < 0 ? -1
                      : ecxi_helper_recv_wait(p->sock, p->rx, ECXI_NIXL_PROC_MSG_MAX,
                                              ecxi_now_ms(NULL) + ECXI_NIXL_PROC_START_MS);
    uint16_t type;
    uint64_t id;
    const uint8_t *b = p->rx + ECXI_NIXL_PROC_HDR;
    size_t blen = n > ECXI_NIXL_PROC_HDR ? (size_t)n - ECXI_NIXL_PROC_HDR : 0;
    if (n < ECXI_NIXL_PROC_HDR + 12 || ecxi_nixl_proc_hdr_get(p->rx, (size_t)n, &type, &id) ||
        type != ECXI_NIXL_H_HELLO || (int32_t)ecxi_get_le32(b) != 0 || (p->producer && blen == 12) ||
        (!p->producer && blen != 12)) {
        if (n >= ECXI_NIXL_PROC_HDR + 12 && (int32_t)ecxi_get_le32(b) < 0)
            ecxi_log(ECX_LOG_ERROR, "nixl: the NIXL agent process could not set up: %s",
                     ecx_strerror((int)(int32_t)ecxi_get_le32(b)));
        char why[128];
        close(p->sock);
        p->sock = -1;
        ecxi_helper_reap(p->pid, true, REAP_WAIT_MS, why, sizeof why);
        ecxi_log(ECX_LOG_ERROR, "nixl: the NIXL agent process %s did not start (%s)", path,
                 n < 0 ? "no answer" : "a bad answer");
        p->pid = 0;
        return ECX_EDATA_UCX;
    }
    uint8_t *m = NULL;
    if (p->producer) {
        const uint8_t *md = b + 12; /* the helper's metadata */
        ecxi_nixl_meta parsed;
        /* its metadata must offer exactly its mapping of the region */
        if (blen - 12 > ECXI_NIXL_META_MAX || ecxi_nixl_meta_decode(md, blen - 12, &parsed) ||
            parsed.nregs != 1 || parsed.regs[0].addr != ecxi_get_le64(b + 4) ||
            parsed.regs[0].len != p->region_bytes || !(m = malloc(blen - 12))) {
            char why[128];
            close(p->sock);
            p->sock = -1;
            ecxi_helper_reap(p->pid, true, REAP_WAIT_MS, why, sizeof why);
            p->pid = 0;
            ecxi_log(ECX_LOG_ERROR, "nixl: the NIXL agent process sent bad metadata");
            return ECX_EDATA_UCX;
        }
        memcpy(m, md, blen - 12);
    }
    free(p->meta);
    p->meta = m;
    p->meta_len = p->producer ? blen - 12 : 0;
    p->base = ecxi_get_le64(b + 4);
    p->gen = ++p->gens;
    int fl = fcntl(p->sock, F_GETFL);
    if (fl >= 0) fcntl(p->sock, F_SETFL, fl | O_NONBLOCK);
    epoll_set(p, EPOLL_CTL_ADD);
    ecxi_log(ECX_LOG_INFO, "nixl: NIXL agent %s runs in process %d", p->name, (int)p->pid);
    return 0;
}

/* Start one if down and the bound allows: 0 when up. */
static int ensure_up(ecxi_nixl_proc *p)
{
    if (p->sock >= 0) return 0;
    int64_t now = ecxi_now_ms(NULL);
    int64_t left = ecxi_helper_may_start(&p->starts, now);
    if (left) {
        if (now - p->down_logged_ms >= 1000) {
            p->down_logged_ms = now;
            ecxi_log(ECX_LOG_WARN, "nixl: the NIXL agent process was started %d times in "
                     "%d s: NIXL fetches fail for %lld ms more",
                     ECXI_HELPER_RESTARTS, ECXI_HELPER_WINDOW_MS / 1000, (long long)left);
        }
        return ECX_EDATA_PEER;
    }
    int rc = start(p);
    if (!rc) p->restarts++;
    return rc;
}

/* ---- messages --------------------------------------------------------------- */

static void handle(ecxi_nixl_proc *p, const uint8_t *b, size_t len);

/* Read what is there (at most max messages): the number handled; -1 once
 * the helper is gone. */
static int drain(ecxi_nixl_proc *p, int max)
{
    int n = 0;
    while (p->sock >= 0 && n < max) {
        ssize_t k = recv(p->sock, p->rx, ECXI_NIXL_PROC_MSG_MAX, MSG_DONTWAIT | MSG_TRUNC);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) break;
        if (k <= 0) {
            die(p, k < 0 ? strerror(errno) : NULL);
            return -1;
        }
        if (k > (ssize_t)ECXI_NIXL_PROC_MSG_MAX) {
            die(p, "a message too large");
            return -1;
        }
        handle(p, p->rx, (size_t)k);
        n++;
    }
    return p->sock >= 0 ? n : -1;
}

static int send_all(ecxi_nixl_proc *p, const uint8_t *b, size_t len)
{
    int64_t end = ecxi_now_ms(NULL) + ECXI_NIXL_PROC_SEND_MS;
    while (p->sock >= 0) {
        if (send(p->sock, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len) return 0;
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
            die(p, strerror(errno));
            break;
        }
        if (ecxi_now_ms(NULL) >= end) {
            die(p, "it takes no messages");
            break;
        }
        /* full: take what it sends meanwhile (it may be waiting on us) */
        struct pollfd q = {.fd = p->sock, .events = POLLIN | POLLOUT};
        (void)poll(&q, 1, 50);
        if (q.revents & POLLIN) drain(p, PROGRESS_MSGS);
    }
    return ECX_EDATA_PEER;
}

static void handle(ecxi_nixl_proc *p, const uint8_t *m, size_t len)
{
    uint16_t type;
    uint64_t id;
    if (ecxi_nixl_proc_hdr_get(m, len, &type, &id)) return die(p, "a message not of its protocol");
    const uint8_t *b = m + ECXI_NIXL_PROC_HDR;
    size_t n = len - ECXI_NIXL_PROC_HDR;
    switch (type) {
    case ECXI_NIXL_H_ADDED:
        if (n != 12 || !p->add_id || id != p->add_id || p->add_answered ||
            (int32_t)ecxi_get_le32(b) > 0 ||
            (ecxi_get_le32(b) == 0 &&
             (ecxi_get_le64(b + 4) == 0 || ecxi_get_le64(b + 4) > UINT32_MAX)))
            return die(p, "an ADDED it was not asked for");
        p->add_answered = true;
        p->add_rc = (int32_t)ecxi_get_le32(b);
        p->add_handle = ecxi_get_le64(b + 4);
        return;
    case ECXI_NIXL_H_READ_END: {
        if (n != 4 || id == 0 || id > p->next_id) return die(p, "a READ_END it was not asked for");
        for (ecxi_nixl_proc_read *x = p->reads; x; x = x->next)
            if (x->id == id) {
                x->state = ecxi_get_le32(b) == 0 ? 1 : ECX_EDATA_PEER;
                if (x->prev) x->prev->next = x->next;
                else p->reads = x->next;
                if (x->next) x->next->prev = x->prev;
                x->prev = x->next = NULL;
                return;
            }
        return; /* a READ released meanwhile */
    }
    case ECXI_NIXL_H_NOTIF: {
        uint32_t nl = n >= 8 ? ecxi_get_le32(b) : 0, ml = n >= 8 ? ecxi_get_le32(b + 4) : 0;
        if (n < 8 || nl == 0 || nl > ECXI_NIXL_NAME_MAX || ml == 0 || ml > ECXI_NIXL_MSG_MAX ||
            n != 8 + (size_t)nl + ml)
            return die(p, "a malformed notification");
        if (p->q_len == NOTIF_QUEUE) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: notification dropped (queue full)");
            return;
        }
        notif *q = &p->q[(p->q_head + p->q_len++) % NOTIF_QUEUE];
        memcpy(q->name, b + 8, nl);
        q->name[nl] = 0;
        memcpy(q->msg, b + 8 + nl, ml);
        q->msg[ml] = 0;
        return;
    }
    default:
        return die(p, "an unexpected message");
    }
}

/* ---- the calls ------------------------------------------------------------- */

int ecxi_nixl_proc_new(int region_fd, uint64_t region_bytes, bool producer, ecxi_nixl_proc **out)
{
    if (!out || region_fd < 0 || !region_bytes) return ECX_EINVAL;
    *out = NULL;
    if (sodium_init() < 0) return ECX_ECRYPTO;
    ecxi_nixl_proc *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    p->sock = p->epfd = -1;
    p->producer = producer;
    p->region_bytes = region_bytes;
    p->region_fd = fcntl(region_fd, F_DUPFD_CLOEXEC, 10);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->rx = malloc(ECXI_NIXL_PROC_MSG_MAX);
    p->tx = malloc(ECXI_NIXL_PROC_MSG_MAX);
    p->q = calloc(NOTIF_QUEUE, sizeof *p->q);
    int rc = p->region_fd < 0 || p->epfd < 0  ? ECX_ESYS
             : !p->rx || !p->tx || !p->q ? ECX_ENOMEM
                                         : 0;
    if (!rc) rc = start(p);
    if (rc) {
        ecxi_nixl_proc_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void ecxi_nixl_proc_free(ecxi_nixl_proc *p)
{
    if (!p) return;
    if (p->sock >= 0) {
        close(p->sock); /* EOF: the helper ends */
        char why[128];
        ecxi_helper_reap(p->pid, false, FREE_WAIT_MS, why, sizeof why);
    }
    for (ecxi_nixl_proc_read *x = p->reads; x; x = x->next)
        x->state = ECX_EDATA_PEER, x->prev = NULL; /* their owner releases them */
    if (p->epfd >= 0) close(p->epfd);
    if (p->region_fd >= 0) close(p->region_fd);
    free(p->meta);
    free(p->rx);
    free(p->tx);
    free(p->q);
    free(p);
}

int ecxi_nixl_proc_fd(const ecxi_nixl_proc *p)
{
    return p->epfd;
}

int ecxi_nixl_proc_arm(ecxi_nixl_proc *p)
{
    return p->q_len > 0;
}

int ecxi_nixl_proc_progress(ecxi_nixl_proc *p)
{
    int n = drain(p, PROGRESS_MSGS);
    if (n < 0) {
        n = 1; /* the death was an event */
        (void)ensure_up(p);
    } else if (p->sock < 0 && p->producer) {
        (void)ensure_up(p); /* a producer down past its backoff */
    }
    return n;
}

uint64_t ecxi_nixl_proc_generation(const ecxi_nixl_proc *p)
{
    return p->gen;
}

const uint8_t *ecxi_nixl_proc_metadata(const ecxi_nixl_proc *p, size_t *len, uint64_t *base)
{
    *len = p->meta_len;
    *base = p->base;
    return p->meta;
}

const char *ecxi_nixl_proc_name(const ecxi_nixl_proc *p)
{
    return p->name;
}

uint64_t ecxi_nixl_proc_restarts(const ecxi_nixl_proc *p)
{
    return p->restarts;
}

int ecxi_nixl_proc_pid(const ecxi_nixl_proc *p)
{
    return p->sock >= 0 ? (int)p->pid : 0;
}

int ecxi_nixl_proc_notif_pop(ecxi_nixl_proc *p, char *name, char *msg)
{
    if (!p->q_len) return 0;
    notif *n = &p->q[p->q_head];
    memcpy(name, n->name, strlen(n->name) + 1);
    memcpy(msg, n->msg, strlen(n->msg) + 1);
    p->q_head = (p->q_head + 1) % NOTIF_QUEUE;
    p->q_len--;
    return 1;
}

/* ---- remote agents ----------------------------------------------------------- */

/* The verdicts' key: the worker address and the rkeys, each after its
 * length, hashed. */
static uint64_t verdict_key(const ecxi_nixl_meta *m)
{
    XXH3_state_t *s = XXH3_createState();
    if (!s) return 0;
    XXH3_64bits_reset(s);
    uint64_t l = m->ucx_addr_len;
    XXH3_64bits_update(s, &l, 8);
    XXH3_64bits_update(s, m->ucx_addr, m->ucx_addr_len);
    for (size_t i = 0; i < m->nregs; i++) {
        l = m->regs[i].rkey_len;
        XXH3_64bits_update(s, &l, 8);
        XXH3_64bits_update(s, m->regs[i].rkey, m->regs[i].rkey_len);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h | 1; /* 0 marks a free slot */
}

static bool verdict_known(ecxi_nixl_proc *p, uint64_t h)
{
    for (size_t i = 0; i < VERDICTS; i++)
        if (p->verdict_hash[i] == h) {
            p->verdict_used[i] = ++p->verdict_clock;
            return true;
        }
    return false;
}

static void verdict_add(ecxi_nixl_proc *p, uint64_t h)
{
    size_t lru = 0;
    for (size_t i = 1; i < VERDICTS; i++)
        if (p->verdict_used[i] < p->verdict_used[lru]) lru = i;
    p->verdict_hash[lru] = h;
    p->verdict_used[lru] = ++p->verdict_clock;
}

int ecxi_nixl_proc_remote_add(ecxi_nixl_proc *p, const uint8_t *md, size_t md_len,
                              uint64_t *handle)
{
    ecxi_nixl_meta m;
    if (md_len > ECXI_NIXL_PROC_MSG_MAX - ECXI_NIXL_PROC_HDR || ecxi_nixl_meta_decode(md, md_len, &m))
        return ECX_EDATA_META;
    uint64_t h = verdict_key(&m);
    if (verdict_known(p, h)) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: agent metadata refused: its UCX address and "
                            "rkeys ended a NIXL agent process before");
        return ECX_EDATA_META;
    }
    int rc = ensure_up(p);
    if (rc) return rc == ECX_EDATA_NOPATH || rc == ECX_EDATA_UCX ? ECX_EDATA_PEER : rc;
    uint64_t gen = p->gen;
    p->add_id = ++p->next_id;
    p->add_answered = false;
    ecxi_nixl_proc_hdr_put(p->tx, ECXI_NIXL_P_ADD, p->add_id);
    memcpy(p->tx + ECXI_NIXL_PROC_HDR, md, md_len);
    if (send_all(p, p->tx, ECXI_NIXL_PROC_HDR + md_len)) {
        p->add_id = 0;
        return ECX_EDATA_PEER; /* gone before it had the bytes: not theirs */
    }
    int64_t end = ecxi_now_ms(NULL) + ECXI_NIXL_PROC_ADD_MS;
    while (p->gen == gen && !p->add_answered) {
        if (ecxi_now_ms(NULL) >= end) {
            die(p, "an ADD unanswered");
            break;
        }
        struct pollfd q = {.fd = p->sock, .events = POLLIN};
        (void)poll(&q, 1, 50);
        drain(p, PROGRESS_MSGS);
    }
    p->add_id = 0;
    if (p->gen != gen) {
        /* it died with these bytes: never again to a helper */
        verdict_add(p, h);
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: agent metadata refused: the NIXL agent process "
                            "died adding it");
        return ECX_EDATA_META;
    }
    if (p->add_rc) return p->add_rc == ECX_ENOMEM ? ECX_ENOMEM : ECX_EDATA_META;
    *handle = gen << 32 | p->add_handle;
    return 0;
}

bool ecxi_nixl_proc_remote_live(const ecxi_nixl_proc *p, uint64_t handle)
{
    return p->sock >= 0 && handle >> 32 == p->gen;
}

void ecxi_nixl_proc_remote_drop(ecxi_nixl_proc *p, uint64_t handle)
{
    if (!ecxi_nixl_proc_remote_live(p, handle)) return; /* its helper is gone */
    uint8_t b[ECXI_NIXL_PROC_HDR];
    ecxi_nixl_proc_hdr_put(b, ECXI_NIXL_P_DROP, handle & UINT32_MAX);
    (void)send_all(p, b, sizeof b);
}

/* ---- READ -------------------------------------------------------------------- */

int ecxi_nixl_proc_read_post(ecxi_nixl_proc *p, uint64_t handle, const uint64_t *remote,
                             const uint64_t *local, const uint64_t *len, size_t n, const char *msg,
                             size_t msg_len, ecxi_nixl_proc_read **out)
{
    if (!n || n > ECXI_NIXL_PROC_PIECES_MAX || !msg_len || msg_len > ECXI_NIXL_MSG_MAX)
        return ECX_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!len[i] || local[i] > p->region_bytes || len[i] > p->region_bytes - local[i])
            return ECX_EDATA_INDEX;
    if (!ecxi_nixl_proc_remote_live(p, handle)) return ECX_EDATA_PEER;
    ecxi_nixl_proc_read *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->id = ++p->next_id;
    x->gen = p->gen;
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        size_t k = n - i < ECXI_NIXL_PROC_PIECES ? n - i : ECXI_NIXL_PROC_PIECES;
        bool last = i + k == n;
        uint8_t *b = p->tx + ECXI_NIXL_PROC_HDR;
        ecxi_nixl_proc_hdr_put(p->tx, ECXI_NIXL_P_READ, x->id);
        ecxi_put_le64(b, handle & UINT32_MAX);
        ecxi_put_le32(b + 8, last ? 0 : ECXI_NIXL_READ_MORE);
        ecxi_put_le32(b + 12, (uint32_t)k);
        ecxi_put_le32(b + 16, last ? (uint32_t)msg_len : 0);
        b += 20;
        for (size_t j = 0; j < k; j++, b += 24)
            ecxi_put_le64(b, remote[i + j]), ecxi_put_le64(b + 8, local[i + j]),
                ecxi_put_le64(b + 16, len[i + j]);
        if (last) memcpy(b, msg, msg_len), b += msg_len;
        rc = send_all(p, p->tx, (size_t)(b - p->tx));
        i += k;
    }
    if (rc || p->gen != x->gen) {
        free(x);
        return ECX_EDATA_PEER;
    }
    x->next = p->reads;
    if (p->reads) p->reads->prev = x;
    p->reads = x;
    *out = x;
    return 0;
}

int ecxi_nixl_proc_read_poll(const ecxi_nixl_proc_read *x)
{
    return x->state;
}

void ecxi_nixl_proc_read_release(ecxi_nixl_proc *p, ecxi_nixl_proc_read *x)
{
    if (!x) return;
    if (x->state == 0) { /* running: out of the list, and out of the helper */
        if (x->prev) x->prev->next = x->next;
        else p->reads = x->next;
        if (x->next) x->next->prev = x->prev;
        if (p->sock >= 0 && x->gen == p->gen) {
            uint8_t b[ECXI_NIXL_PROC_HDR];
            ecxi_nixl_proc_hdr_put(b, ECXI_NIXL_P_RELEASE, x->id);
            (void)send_all(p, b, sizeof b);
        }
    }
    free(x);
}
