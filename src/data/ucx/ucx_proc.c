/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx_proc — the ucx data path, the parent's side: an ecxi_data whose
 * UCX runs in the helper process ecx-ucx-agent (ucx_proc.h; the helper's
 * loop is ucx_agent_main.c, what it runs is data_ucx.c).
 */
#include "ucx_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "data_impl.h"
#include "util.h"

#define HELPER_NAME "ecx-ucx-agent"
#define REAP_WAIT_MS 50
#define FREE_WAIT_MS 1000
/* Messages handled in one progress call. */
#define PROGRESS_MSGS 1024
#define ADDR_MAX 64

/* A grant the helper claimed (its send may read the blocks), or, on the
 * ends list, one whose send ended. */
typedef struct claim {
    struct claim *next;
    int status;
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint16_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1];
} claim;

typedef struct up_peer {
    ecxi_data_peer head;
    struct up_peer *next;
    uint64_t id, gen; /* the helper's peer, and which helper added it */
    uint8_t addr[ADDR_MAX];
    size_t addr_len;
} up_peer;

typedef struct up_xfer {
    ecxi_data_xfer head;
    struct up_xfer *prev, *next; /* running */
    uint64_t id;
    int state;
    uint64_t peer_key; /* suspect_key of its peer's address */
} up_xfer;

/* A consumer's suspects: a producer whose READs alone were in flight when
 * its UCX process died, SUSPECT_DEATHS times within SUSPECT_MS, is refused
 * (ECX_EDATA_PEER, no READ reaches a helper) for the rest of that time, so
 * one hostile producer cannot spend the restart bound of every other. */
#define SUSPECTS 16
#define SUSPECT_DEATHS 2
#define SUSPECT_MS 60000
typedef struct suspect {
    uint64_t key;
    int deaths;
    int64_t first_ms;
} suspect;

typedef struct ucxp {
    ecxi_data base;
    bool producer;
    int region_fd;
    char *bind_host;
    uint16_t port; /* network order: a producer's helpers listen on it */
    uint8_t addr[ADDR_MAX]; /* a producer's published UCX address */
    size_t addr_len;
    int epfd, sock; /* sock: -1 while down */
    int tfd;        /* a producer's: fires when a helper may start again */
    pid_t pid;
    uint64_t gen, gens, restarts;
    ecxi_helper_starts starts;
    int64_t down_logged_ms;
    uint8_t *rx, *tx;
    claim *claims;
    claim *ends, **ends_tail;
    size_t nends;
    up_peer *peers;
    up_xfer *xfers; /* running */
    uint64_t next_id;
    uint64_t add_id;
    bool add_answered;
    int add_rc;
    ecxi_data_counts counts, helper_counts; /* of the helpers gone; of the current one */
    suspect suspects[SUSPECTS];
} ucxp;

static uint64_t suspect_key(const uint8_t *addr, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a: a table key, not a defence */
    for (size_t i = 0; i < len; i++) h = (h ^ addr[i]) * 0x100000001b3ull;
    return h | 1;
}

static suspect *suspect_of(ucxp *p, uint64_t key, bool add)
{
    int64_t now = ecxi_now_ms(NULL);
    suspect *free_slot = NULL, *oldest = &p->suspects[0];
    for (size_t i = 0; i < SUSPECTS; i++) {
        suspect *s = &p->suspects[i];
        if (s->key && now - s->first_ms >= SUSPECT_MS) s->key = 0; /* expired */
        if (s->key == key && key) return s;
        if (!s->key && !free_slot) free_slot = s;
        if (s->first_ms < oldest->first_ms) oldest = s;
    }
    if (!add) return NULL;
    suspect *s = free_slot ? free_slot : oldest;
    *s = (suspect){.key = key, .first_ms = now};
    return s;
}

static const struct ecxi_data_ops ucxp_ops;

static void hdr_put(uint8_t *b, uint16_t type, uint64_t id)
{
    ecxi_helper_hdr_put(b, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, type, id);
}

/* ---- the helper's life ----------------------------------------------- */

static void end_claim(ucxp *p, claim *c, int status)
{
    c->status = status;
    c->next = NULL;
    *p->ends_tail = c;
    p->ends_tail = &c->next;
    p->nends++;
}

/* The helper is gone or no longer trusted: kill, reap, then fail what it
 * held (after the reap: nothing reads the blocks any more). */
static void die(ucxp *p, const char *what)
{
    if (p->sock < 0) return;
    struct epoll_event ev = {0};
    (void)epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->sock, &ev);
    close(p->sock);
    p->sock = -1;
    char why[128];
    ecxi_helper_reap(p->pid, what != NULL, REAP_WAIT_MS, why, sizeof why);
    unsigned nx = 0, nc = 0;
    uint64_t only = p->xfers ? p->xfers->peer_key : 0;
    for (up_xfer *x = p->xfers; x; x = x->next)
        if (x->peer_key != only) only = 0;
    suspect *s = only ? suspect_of(p, only, true) : NULL;
    if (s && ++s->deaths == SUSPECT_DEATHS)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: a producer's READs were the only ones in "
                            "flight at %d deaths of the UCX process: it is refused for %d s",
                            SUSPECT_DEATHS, SUSPECT_MS / 1000);
    for (up_xfer *x = p->xfers, *n; x; x = n) {
        n = x->next;
        x->state = ECXI_XFER_FAILED;
        x->prev = x->next = NULL;
        nx++;
    }
    p->xfers = NULL;
    for (claim *c = p->claims, *n; c; c = n) {
        n = c->next;
        end_claim(p, c, ECX_EDATA_PEER);
        nc++;
    }
    p->claims = NULL;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: the UCX process (pid %d) ended: %s%s%s; %u "
                        "READs and %u sends in flight failed; a new one starts",
                        (int)p->pid, why, what ? ": " : "", what ? what : "", nx, nc);
    p->pid = 0;
    p->gen = 0;
    p->counts.conns_refused += p->helper_counts.conns_refused;
    p->counts.conns_evicted += p->helper_counts.conns_evicted;
    p->counts.conns_dropped += p->helper_counts.conns_dropped;
    p->counts.requests_dropped += p->helper_counts.requests_dropped;
    memset(&p->helper_counts, 0, sizeof p->helper_counts);
}

/* Send one message, waiting (bounded) while the socket is full; the
 * helper never stops reading, so a full socket that stays full is a hang. */
static int send_msg(ucxp *p, size_t len)
{
    int64_t end = ecxi_now_ms(NULL) + ECXI_UCX_PROC_SEND_MS;
    while (p->sock >= 0) {
        if (send(p->sock, p->tx, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len) return 0;
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
            die(p, strerror(errno));
            break;
        }
        if (ecxi_now_ms(NULL) >= end) {
            die(p, "it takes no messages");
            break;
        }
        struct pollfd q = {.fd = p->sock, .events = POLLOUT};
        (void)poll(&q, 1, 50);
    }
    return ECX_EDATA_PEER;
}

/* Send a "16B token, key" message. */
static int send_token_key(ucxp *p, uint16_t type, uint64_t id, const uint8_t *token,
                          const char *key, size_t key_len)
{
    uint8_t *t = p->tx;
    hdr_put(t, type, id);
    memcpy(t + ECXI_HELPER_HDR, token, ECXI_DATA_TOKEN_LEN);
    memcpy(t + ECXI_HELPER_HDR + ECXI_DATA_TOKEN_LEN, key, key_len);
    return send_msg(p, ECXI_HELPER_HDR + ECXI_DATA_TOKEN_LEN + key_len);
}

/* Start a helper and wait for its HELLO. */
static int start(ucxp *p)
{
    char path[PATH_MAX];
    int rc = ecxi_helper_find(HELPER_NAME, "ECX_UCX_AGENT", path);
    if (rc) return rc;
    if ((rc = ecxi_helper_spawn(path, "--ecx-ucx-agent", p->region_fd, &p->sock, &p->pid))) {
        p->sock = -1;
        p->pid = 0;
        return rc;
    }
    ecxi_helper_started(&p->starts, ecxi_now_ms(NULL));
    size_t hl = p->bind_host ? strlen(p->bind_host) : 0;
    uint8_t *b = p->tx;
    hdr_put(b, ECXI_UCX_P_HELLO, p->gens + 1);
    ecxi_put_le32(b + ECXI_HELPER_HDR, p->producer ? ECXI_UCX_ROLE_PRODUCER : ECXI_UCX_ROLE_CONSUMER);
    ecxi_put_le64(b + ECXI_HELPER_HDR + 4, ecxi_region_block_bytes(p->base.region));
    memcpy(b + ECXI_HELPER_HDR + 12, &p->port, 2);
    if (hl) memcpy(b + ECXI_HELPER_HDR + 14, p->bind_host, hl);
    ssize_t sent = send(p->sock, b, ECXI_HELPER_HDR + 14 + hl, MSG_NOSIGNAL | MSG_DONTWAIT);
    long n = sent < 0 ? -1
                      : ecxi_helper_recv_wait(p->sock, p->rx, ECXI_UCX_PROC_MSG_MAX,
                                              ecxi_now_ms(NULL) + ECXI_UCX_PROC_START_MS);
    uint16_t type;
    uint64_t id;
    const uint8_t *r = p->rx + ECXI_HELPER_HDR;
    size_t rl = n >= ECXI_HELPER_HDR + 4 ? (size_t)n - ECXI_HELPER_HDR - 4 : 0;
    int hrc = n >= ECXI_HELPER_HDR + 4 ? (int32_t)ecxi_get_le32(r) : 0;
    const char *bad = NULL;
    if (n < ECXI_HELPER_HDR + 4 ||
        ecxi_helper_hdr_get(p->rx, (size_t)n, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, &type,
                            &id) ||
        type != ECXI_UCX_H_HELLO)
        bad = n < 0 ? "no answer" : "a bad answer";
    else if (hrc)
        bad = hrc < 0 ? ecx_strerror(hrc) : "a bad answer";
    else if (p->producer ? rl == 0 || rl > ADDR_MAX || (p->addr_len && (rl != p->addr_len ||
                                                                       memcmp(r + 4, p->addr, rl)))
                         : rl != 0)
        bad = p->producer && p->addr_len ? "another address than its predecessor's"
                                         : "a bad answer";
    if (bad) {
        char why[128];
        close(p->sock);
        p->sock = -1;
        ecxi_helper_reap(p->pid, true, REAP_WAIT_MS, why, sizeof why);
        ECXI_LOG_RATELIMITED(ECX_LOG_ERROR, "data ucx: the UCX process %s did not start (%s)",
                            path, bad);
        p->pid = 0;
        return hrc < 0 ? hrc : ECX_EDATA_UCX;
    }
    if (p->producer && !p->addr_len) {
        memcpy(p->addr, r + 4, rl);
        p->addr_len = rl;
        if (rl >= 4) memcpy(&p->port, r + 4 + 2, 2); /* data_ucx.c's format: u16 port at 2 */
    }
    p->gen = ++p->gens;
    int fl = fcntl(p->sock, F_GETFL);
    if (fl >= 0) fcntl(p->sock, F_SETFL, fl | O_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = p->sock};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->sock, &ev) != 0)
        ecxi_log(ECX_LOG_WARN, "data ucx: epoll_ctl: %s", strerror(errno));
    ecxi_log(ECX_LOG_INFO, "data ucx: UCX runs in process %d", (int)p->pid);
    return 0;
}

/* Start one if down and the bound allows: 0 when up. A producer's
 * timer wakes its caller when the bound allows the next start. */
static int ensure_up(ucxp *p)
{
    if (p->sock >= 0) return 0;
    int64_t now = ecxi_now_ms(NULL);
    int64_t left = ecxi_helper_may_start(&p->starts, now);
    if (left && p->tfd >= 0) {
        struct itimerspec ts = {.it_value = {.tv_sec = left / 1000,
                                             .tv_nsec = (left % 1000) * 1000000 + 1}};
        (void)timerfd_settime(p->tfd, 0, &ts, NULL);
    }
    if (left) {
        if (now - p->down_logged_ms >= 1000) {
            p->down_logged_ms = now;
            ecxi_log(ECX_LOG_WARN, "data ucx: the UCX process was started %d times in %d s: "
                     "the ucx path fails for %lld ms more", ECXI_HELPER_RESTARTS,
                     ECXI_HELPER_WINDOW_MS / 1000, (long long)left);
        }
        return ECX_EDATA_PEER;
    }
    int rc = start(p);
    if (!rc && p->gens > 1) p->restarts++;
    return rc;
}

/* ---- messages --------------------------------------------------------- */

/* A record of the grant (token, key); NULL if out of memory. */
static claim *claim_new(const uint8_t *token, const char *key, size_t key_len)
{
    claim *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    memcpy(c->token, token, ECXI_DATA_TOKEN_LEN);
    memcpy(c->key, key, key_len);
    c->key_len = (uint16_t)key_len;
    return c;
}

/* The link to the claim of (key, token), or NULL if none. */
static claim **claim_find(ucxp *p, const char *key, size_t key_len, const uint8_t *token)
{
    for (claim **pp = &p->claims; *pp; pp = &(*pp)->next) {
        claim *c = *pp;
        if (c->key_len == key_len && !memcmp(c->key, key, key_len) &&
            !sodium_memcmp(c->token, token, ECXI_DATA_TOKEN_LEN))
            return pp;
    }
    return NULL;
}

/* The session's answer to the helper's ASK: claim, and tell it the runs. */
static void on_ask(ucxp *p, uint64_t id, const uint8_t *b, size_t n)
{
    const uint8_t *token = b;
    const char *key;
    size_t key_len;
    if (!ecxi_ucx_proc_token_key(b, n, &key, &key_len)) return die(p, "a malformed ASK");
    /* the claim's record first: a claim must never go untracked */
    claim *c = claim_new(token, key, key_len);
    ecxi_data_grant g = {0};
    int rc = c ? ecxi_data_grant_check(&p->base, key, key_len, token, ECXI_DATA_GRANT_CLAIM, &g)
               : ECX_ENOMEM;
    if (rc > 0) rc = ECX_EDATA_GRANT;
    uint8_t *t = p->tx;
    uint32_t nruns = 0;
    const uint64_t nb = ecxi_region_num_blocks(p->base.region);
    if (rc) free(c);
    if (rc == 0) {
        uint8_t *run = t + ECXI_HELPER_HDR + 16;
        if (g.n == 0) rc = ECX_EDATA_COUNT;
        for (size_t i = 0; i < g.n && rc == 0;) {
            size_t k = 1;
            while (i + k < g.n && g.blocks[i + k] == g.blocks[i] + k) k++;
            if (g.blocks[i] >= nb || k > nb - g.blocks[i]) rc = ECX_EDATA_INDEX;
            else if (nruns == ECXI_UCX_PROC_RUNS) rc = ECX_EDATA_COUNT;
            else {
                ecxi_put_le32(run + 8 * (size_t)nruns, (uint32_t)g.blocks[i]);
                ecxi_put_le32(run + 8 * (size_t)nruns + 4, (uint32_t)k);
                nruns++;
            }
            i += k;
        }
        if (rc) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: a grant that is empty, outside the "
                                "region or of more than %u runs of blocks cannot go through "
                                "the UCX process (%s)",
                                (unsigned)ECXI_UCX_PROC_RUNS, ecx_strerror(rc));
            end_claim(p, c, rc); /* claimed, never sent: it ends now */
            nruns = 0;
        } else {
            c->next = p->claims;
            p->claims = c;
        }
    }
    hdr_put(t, ECXI_UCX_P_ANSWER, id);
    ecxi_put_le32(t + ECXI_HELPER_HDR, (uint32_t)rc);
    ecxi_put_le64(t + ECXI_HELPER_HDR + 4, rc ? 0 : g.nbytes);
    ecxi_put_le32(t + ECXI_HELPER_HDR + 12, nruns);
    (void)send_msg(p, ECXI_HELPER_HDR + 16 + 8 * (size_t)nruns);
}

static void on_end(ucxp *p, const uint8_t *b, size_t n)
{
    const uint8_t *token = b + 4;
    const char *key;
    size_t key_len;
    if (n < 4 || !ecxi_ucx_proc_token_key(token, n - 4, &key, &key_len))
        return die(p, "a malformed END");
    int status = (int32_t)ecxi_get_le32(b);
    claim **pp = claim_find(p, key, key_len, token);
    if (!pp) return die(p, "an END of no claim");
    claim *c = *pp;
    *pp = c->next;
    end_claim(p, c, status > 0 ? ECX_EDATA_UCX : status);
}

/* A consumer declined a grant: the session hears of it as of a send that
 * ended (status 0) and checks the token itself. Not if the grant is
 * claimed: then its send may still read the blocks, and only the send's
 * END may release them (the session would take the decline for the end
 * of a send it cut). */
static void on_declined(ucxp *p, const uint8_t *b, size_t n)
{
    const char *key;
    size_t key_len;
    if (!ecxi_ucx_proc_token_key(b, n, &key, &key_len)) return die(p, "a malformed DECLINED");
    if (claim_find(p, key, key_len, b)) return; /* its END releases it */
    claim *c = p->nends < ECXI_UCX_PROC_ENDS_MAX ? claim_new(b, key, key_len) : NULL;
    if (!c) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: a decline was dropped (%zu notifications "
                            "waiting, or no memory); its lease releases the grant", p->nends);
        return;
    }
    end_claim(p, c, 0);
}

static void handle(ucxp *p, const uint8_t *m, size_t len)
{
    uint16_t type;
    uint64_t id;
    if (ecxi_helper_hdr_get(m, len, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, &type, &id))
        return die(p, "a message not of its protocol");
    const uint8_t *b = m + ECXI_HELPER_HDR;
    size_t n = len - ECXI_HELPER_HDR;
    switch (type) {
    case ECXI_UCX_H_ASK:
        if (!p->producer) break;
        return on_ask(p, id, b, n);
    case ECXI_UCX_H_END:
        if (!p->producer) break;
        return on_end(p, b, n);
    case ECXI_UCX_H_DECLINED:
        if (!p->producer) break;
        return on_declined(p, b, n);
    case ECXI_UCX_H_ADDED:
        if (p->producer || n != 4 || !p->add_id || id != p->add_id || p->add_answered ||
            (int32_t)ecxi_get_le32(b) > 0)
            break;
        p->add_answered = true;
        p->add_rc = (int32_t)ecxi_get_le32(b);
        return;
    case ECXI_UCX_H_STATS:
        if (n != 32) break;
        p->helper_counts = (ecxi_data_counts){ecxi_get_le64(b), ecxi_get_le64(b + 8),
                                              ecxi_get_le64(b + 16), ecxi_get_le64(b + 24)};
        return;
    case ECXI_UCX_H_READ_END: {
        int32_t st = n == 4 ? (int32_t)ecxi_get_le32(b) : -1;
        if (p->producer || id == 0 || id > p->next_id ||
            (st != ECXI_XFER_DONE && st != ECXI_XFER_FAILED && st != ECXI_XFER_CORRUPT))
            break;
        for (up_xfer *x = p->xfers; x; x = x->next)
            if (x->id == id) {
                x->state = st;
                if (x->prev) x->prev->next = x->next;
                else p->xfers = x->next;
                if (x->next) x->next->prev = x->prev;
                x->prev = x->next = NULL;
                return;
            }
        return; /* a READ released meanwhile */
    }
    default:
        break;
    }
    die(p, "a message it was not asked for");
}

/* Read what is there (at most max messages): the number handled; -1 once
 * the helper is gone. */
static int drain(ucxp *p, int max)
{
    int n = 0;
    while (p->sock >= 0 && n < max) {
        ssize_t k = recv(p->sock, p->rx, ECXI_UCX_PROC_MSG_MAX, MSG_DONTWAIT | MSG_TRUNC);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) break;
        if (k <= 0) { /* EOF, or a reset: it ended by itself */
            die(p, k < 0 && errno != ECONNRESET ? strerror(errno) : NULL);
            return -1;
        }
        if (k > (ssize_t)ECXI_UCX_PROC_MSG_MAX) {
            die(p, "a message too large");
            return -1;
        }
        handle(p, p->rx, (size_t)k);
        n++;
    }
    return p->sock >= 0 ? n : -1;
}

/* ---- ops: both ---------------------------------------------------------- */

static int ucxp_progress(ecxi_data *d, ecxi_slice *sl)
{
    (void)sl; /* the bytes move in the helper */
    ucxp *p = (ucxp *)d;
    int n = drain(p, PROGRESS_MSGS);
    if (n < 0) n = 1; /* the death was an event */
    uint64_t fired;
    if (p->tfd >= 0 && read(p->tfd, &fired, sizeof fired) < 0) { /* EAGAIN: not yet */
    }
    if (p->sock < 0 && p->producer) (void)ensure_up(p);
    return n;
}

static int ucxp_fd(ecxi_data *d)
{
    return ((ucxp *)d)->epfd;
}

static int ucxp_arm(ecxi_data *d)
{
    ucxp *p = (ucxp *)d;
    return p->ends != NULL ||
           (p->producer && p->sock < 0 && !ecxi_helper_may_start(&p->starts, ecxi_now_ms(NULL)));
}

static int ucxp_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    ucxp *p = (ucxp *)d;
    int rc = ucxp_progress(d, sl);
    if (rc < 0) return rc;
    int count = 0;
    while (p->ends) {
        claim *c = p->ends;
        if (!(p->ends = c->next)) p->ends_tail = &p->ends;
        p->nends--;
        cb(arg, c->key, c->key_len, c->token, c->status);
        free(c);
        count++;
    }
    return count;
}

/* The session lets go of a claimed grant: if the helper may still send
 * it, tell it to cut the send; its END (or the helper's death) follows. */
static int ucxp_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    ucxp *p = (ucxp *)d;
    if (!claim_find(p, key, key_len, token)) return 0;
    (void)send_token_key(p, ECXI_UCX_P_CUT, 0, token, key, key_len); /* or it died */
    return 1;
}

static void ucxp_free(ecxi_data *d)
{
    ucxp *p = (ucxp *)d;
    if (p->sock >= 0) {
        close(p->sock); /* EOF: the helper ends */
        char why[128];
        ecxi_helper_reap(p->pid, false, FREE_WAIT_MS, why, sizeof why);
    }
    for (claim *c = p->claims, *n; c; c = n) n = c->next, free(c);
    for (claim *c = p->ends, *n; c; c = n) n = c->next, free(c);
    for (up_peer *x = p->peers, *n; x; x = n) n = x->next, free(x);
    for (up_xfer *x = p->xfers; x; x = x->next) x->state = ECXI_XFER_FAILED, x->prev = NULL;
    if (p->epfd >= 0) close(p->epfd);
    if (p->tfd >= 0) close(p->tfd);
    if (p->region_fd >= 0) close(p->region_fd);
    free(p->bind_host);
    free(p->rx);
    free(p->tx);
    free(p);
}

static void ucxp_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const ucxp *p = (const ucxp *)d;
    ecxi_data_counts *c = &st->path[ECX_DATA_UCX];
    c->conns_refused += p->counts.conns_refused + p->helper_counts.conns_refused;
    c->conns_evicted += p->counts.conns_evicted + p->helper_counts.conns_evicted;
    c->conns_dropped += p->counts.conns_dropped + p->helper_counts.conns_dropped;
    c->requests_dropped += p->counts.requests_dropped + p->helper_counts.requests_dropped;
    st->ucx_agent_restarts += p->restarts;
}

/* ---- ops: consumer ------------------------------------------------------ */

/* Register the peer in the current helper (waits for its answer, bounded). */
static int add_in_helper(ucxp *p, up_peer *x)
{
    int rc = ensure_up(p);
    if (rc) return rc;
    x->id = ++p->next_id;
    uint8_t *t = p->tx;
    hdr_put(t, ECXI_UCX_P_ADD, x->id);
    memcpy(t + ECXI_HELPER_HDR, x->addr, x->addr_len);
    p->add_id = x->id;
    p->add_answered = false;
    if ((rc = send_msg(p, ECXI_HELPER_HDR + x->addr_len))) return rc;
    int64_t end = ecxi_now_ms(NULL) + ECXI_UCX_PROC_ADD_MS;
    while (!p->add_answered && p->sock >= 0) {
        if (ecxi_now_ms(NULL) >= end) {
            die(p, "no answer to an ADD");
            break;
        }
        struct pollfd q = {.fd = p->sock, .events = POLLIN};
        (void)poll(&q, 1, 50);
        drain(p, PROGRESS_MSGS);
    }
    p->add_id = 0;
    if (!p->add_answered) return ECX_EDATA_PEER;
    x->gen = p->gen;
    return p->add_rc;
}

static int ucxp_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                         ecxi_data_peer **out)
{
    (void)desc;
    ucxp *p = (ucxp *)d;
    if (!m->has_ucx) return ECX_EDATA_NOPATH;
    if (m->ucx_addr_len == 0 || m->ucx_addr_len > ADDR_MAX) return ECX_EDATA_META;
    up_peer *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    memcpy(x->addr, m->ucx_addr, m->ucx_addr_len);
    x->addr_len = m->ucx_addr_len;
    int rc = add_in_helper(p, x);
    if (rc) {
        free(x);
        return rc;
    }
    x->head.owner = d;
    x->head.backend = "ucx";
    x->next = p->peers;
    p->peers = x;
    *out = &x->head;
    return 0;
}

static void ucxp_peer_drop(ecxi_data_peer *hp)
{
    up_peer *x = (up_peer *)hp;
    ucxp *p = (ucxp *)hp->owner;
    for (up_peer **pp = &p->peers; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    if (p->sock >= 0 && x->gen == p->gen) {
        hdr_put(p->tx, ECXI_UCX_P_DROP, x->id);
        (void)send_msg(p, ECXI_HELPER_HDR);
    }
    free(x);
}

/* x registered in the current helper, unless its producer is a suspect. */
static int peer_ready(ucxp *p, up_peer *x, uint64_t skey)
{
    suspect *s = suspect_of(p, skey, false);
    if (s && s->deaths >= SUSPECT_DEATHS) return ECX_EDATA_PEER;
    return p->sock < 0 || x->gen != p->gen ? add_in_helper(p, x) : 0;
}

static int ucxp_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t,
                          const ecxi_block_run *remote, size_t nremote,
                          const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                          const char *key, size_t key_len, ecxi_data_xfer **out)
{
    (void)remote, (void)nremote; /* the producer sends the grant's blocks; it never takes ours */
    up_peer *x = (up_peer *)hp;
    ucxp *p = (ucxp *)hp->owner;
    uint64_t skey = suspect_key(x->addr, x->addr_len);
    int rc = peer_ready(p, x, skey);
    if (rc) return rc;
    uint8_t *b = p->tx;
    size_t fixed = ECXI_HELPER_HDR + 8 * 3 + ECXI_DATA_TOKEN_LEN + 8;
    uint8_t *run = b + fixed + key_len;
    if (nlocal > ECXI_UCX_PROC_RUNS) return ECX_EDATA_COUNT;
    uint32_t nruns = (uint32_t)nlocal;
    for (size_t i = 0; i < nlocal; i++) {
        ecxi_put_le32(run + 8 * i, (uint32_t)local[i].first);
        ecxi_put_le32(run + 8 * i + 4, (uint32_t)local[i].count);
    }
    up_xfer *u = calloc(1, sizeof *u);
    if (!u) return ECX_ENOMEM;
    u->id = ++p->next_id;
    u->peer_key = skey;
    hdr_put(b, ECXI_UCX_P_READ, u->id);
    uint8_t *f = b + ECXI_HELPER_HDR;
    ecxi_put_le64(f, x->id);
    ecxi_put_le64(f + 8, nbytes);
    ecxi_put_le64(f + 16, t->checksum);
    memcpy(f + 24, t->token, ECXI_DATA_TOKEN_LEN);
    ecxi_put_le32(f + 24 + ECXI_DATA_TOKEN_LEN, (uint32_t)key_len);
    ecxi_put_le32(f + 28 + ECXI_DATA_TOKEN_LEN, nruns);
    memcpy(b + fixed, key, key_len);
    if ((rc = send_msg(p, fixed + key_len + 8 * (size_t)nruns))) {
        free(u);
        return rc;
    }
    u->head.owner = hp->owner;
    u->state = ECXI_XFER_RUNNING;
    u->next = p->xfers;
    if (p->xfers) p->xfers->prev = u;
    p->xfers = u;
    *out = &u->head;
    return 0;
}

/* The consumer will not read the grant: the helper tells the producer
 * (no answer; if the message is lost, the lease releases the grant). */
static int ucxp_decline(ecxi_data_peer *hp, const ecxi_data_ticket *t, const char *key,
                        size_t key_len)
{
    up_peer *x = (up_peer *)hp;
    ucxp *p = (ucxp *)hp->owner;
    int rc = peer_ready(p, x, suspect_key(x->addr, x->addr_len));
    return rc ? rc : send_token_key(p, ECXI_UCX_P_DECLINE, x->id, t->token, key, key_len);
}

static int ucxp_read_poll(ecxi_data_xfer *hx)
{
    return ((up_xfer *)hx)->state;
}

static void ucxp_read_release(ecxi_data_xfer *hx)
{
    up_xfer *u = (up_xfer *)hx;
    ucxp *p = (ucxp *)hx->owner;
    if (u->state == ECXI_XFER_RUNNING) {
        if (u->prev) u->prev->next = u->next;
        else if (p->xfers == u) p->xfers = u->next;
        if (u->next) u->next->prev = u->prev;
        if (p->sock >= 0) {
            hdr_put(p->tx, ECXI_UCX_P_RELEASE, u->id);
            (void)send_msg(p, ECXI_HELPER_HDR);
        }
    }
    free(u);
}

static const struct ecxi_data_ops ucxp_ops = {
    .name = "ucx",
    .free = ucxp_free,
    .progress = ucxp_progress,
    .fd = ucxp_fd,
    .arm = ucxp_arm,
    .poll_notifs = ucxp_poll_notifs,
    .cut = ucxp_cut,
    .stats = ucxp_stats,
    .peer_add = ucxp_peer_add,
    .peer_drop = ucxp_peer_drop,
    .read_post = ucxp_read_post,
    .decline = ucxp_decline,
    .read_poll = ucxp_read_poll,
    .read_release = ucxp_read_release,
};

/* ---- constructors --------------------------------------------------------- */

static int ucxp_new(ecxi_region *r, bool producer, const char *bind_host, ucxp **out)
{
    if (sodium_init() < 0) return ECX_ECRYPTO;
    if (bind_host && strlen(bind_host) > 255) return ECX_EINVAL; /* no host name is longer */
    ucxp *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    p->base.ops = &ucxp_ops;
    p->base.region = r;
    p->base.role = producer ? ECXI_DATA_PRODUCER : ECXI_DATA_CONSUMER;
    p->producer = producer;
    p->sock = p->tfd = -1;
    p->ends_tail = &p->ends;
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (producer && p->epfd >= 0) {
        p->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = p->tfd};
        if (p->tfd < 0 || epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->tfd, &ev) != 0) {
            ecxi_log(ECX_LOG_ERROR, "data ucx: timerfd: %s", strerror(errno));
            close(p->epfd);
            p->epfd = -1;
        }
    }
    p->region_fd = open(ecxi_region_path(r), (producer ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (p->region_fd >= 0 && p->region_fd < 10) {
        int fd = fcntl(p->region_fd, F_DUPFD_CLOEXEC, 10);
        close(p->region_fd);
        p->region_fd = fd;
    }
    p->rx = malloc(ECXI_UCX_PROC_MSG_MAX);
    p->tx = malloc(ECXI_UCX_PROC_MSG_MAX);
    if (bind_host) p->bind_host = strdup(bind_host);
    int rc = p->region_fd < 0 || p->epfd < 0 ? ECX_ESYS
             : !p->rx || !p->tx || (bind_host && !p->bind_host) ? ECX_ENOMEM
                                                                : 0;
    if (rc == ECX_ESYS)
        ecxi_log(ECX_LOG_ERROR, "data ucx: cannot open the region file %s: %s",
                 ecxi_region_path(r), strerror(errno));
    if (!rc) rc = start(p);
    if (rc) {
        ucxp_free(&p->base);
        return rc;
    }
    *out = p;
    return 0;
}

int ecxi_ucx_proc_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data_meta *m,
                               ecxi_data **out)
{
    ucxp *p;
    int rc = ucxp_new(r, true, opts ? opts->bind_host : NULL, &p);
    if (rc) return rc;
    m->has_ucx = true;
    m->ucx_addr = p->addr;
    m->ucx_addr_len = p->addr_len;
    *out = &p->base;
    return 0;
}

int ecxi_ucx_proc_pid(const ecxi_data *d)
{
    const ucxp *p = (const ucxp *)d;
    return d && d->ops == &ucxp_ops && p->sock >= 0 ? (int)p->pid : 0;
}

int ecxi_ucx_proc_new_consumer(ecxi_region *r, ecxi_data **out)
{
    ucxp *p;
    int rc = ucxp_new(r, false, NULL, &p);
    if (rc) return rc;
    *out = &p->base;
    return 0;
}
