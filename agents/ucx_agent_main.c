/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx-ucx-agent — the UCX process of the ucx data path (ucx_proc.h): one
 * data_ucx.c context serving its parent, the library, over the socket on
 * fd 3, with the region file on fd 4. Started by libecx only.
 *
 * Its private memory is bounded first thing, before UCX starts:
 * RLIMIT_DATA at what it has mapped then plus ECXI_UCX_AGENT_DATA_MB (or
 * $ECX_UCX_AGENT_DATA_MB; 0: none).
 * It never blocks on its parent: what it sends waits in a queue until
 * the socket takes it, and it reads everything the parent sends at every
 * turn. A producer's grant checks go to the parent (ASK) and the request
 * waits in data_ucx.c's queue for the ANSWER (ECXI_DATA_GRANT_ASKED).
 *
 * It ends when the socket says EOF (the parent closed it, or died) or its
 * parent changes (checked at least once a second).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "data_impl.h"
#include "region.h"
#include "ucx_proc.h"
#include "util.h"

#define S ECXI_HELPER_SOCK_FD
/* Grant questions waiting for their answer, at most. */
#define MAX_ASKS 8192

typedef struct outmsg {
    struct outmsg *next;
    size_t len;
    uint8_t b[];
} outmsg;

typedef struct ask {
    struct ask *next;
    uint64_t id;
    bool answered;
    int rc;
    int64_t answered_ms;
    uint64_t nbytes, *blocks;
    size_t n;
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint16_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1];
} ask;

typedef struct hpeer {
    struct hpeer *next;
    uint64_t id;
    ecxi_data_peer *p;
    uint8_t addr[64]; /* the producer's UCX address, to connect again */
    size_t addr_len;
} hpeer;

typedef struct hxfer {
    struct hxfer *next;
    uint64_t id;
    ecxi_data_xfer *x;
} hxfer;

static struct {
    ecxi_region *r;
    ecxi_data *d;
    bool producer;
    outmsg *oq, **oq_tail;
    ask *asks, *given; /* given: the answer data_ucx.c is using now */
    size_t nasks;
    uint64_t next_ask;
    hpeer *peers;
    hxfer *xfers;
    ecxi_block_run *local; /* a READ's runs */
    size_t local_cap;
    uint8_t buf[ECXI_UCX_PROC_MSG_MAX];
} g;

static _Noreturn void bye(const char *why)
{
    if (why) ecxi_log(ECX_LOG_ERROR, "ucx agent process: %s", why);
    _exit(why ? 3 : 0);
}

/* ---- to the parent: a queue it takes from when it can ---------------- */

static uint8_t *out(uint16_t type, uint64_t id, size_t len)
{
    outmsg *m = malloc(sizeof *m + ECXI_HELPER_HDR + len);
    if (!m) bye("out of memory");
    m->next = NULL;
    m->len = ECXI_HELPER_HDR + len;
    ecxi_helper_hdr_put(m->b, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, type, id);
    *g.oq_tail = m;
    g.oq_tail = &m->next;
    return m->b + ECXI_HELPER_HDR;
}

static void flush(void)
{
    while (g.oq) {
        outmsg *m = g.oq;
        if (send(S, m->b, m->len, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)m->len) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            bye(NULL); /* the parent is gone */
        }
        if (!(g.oq = m->next)) g.oq_tail = &g.oq;
        free(m);
    }
}

/* A message of (prefix bytes the caller fills), 16B token, key: the prefix. */
static uint8_t *out_token_key(uint16_t type, uint64_t id, size_t prefix, const uint8_t *token,
                              const char *key, size_t key_len)
{
    uint8_t *b = out(type, id, prefix + ECXI_DATA_TOKEN_LEN + key_len);
    memcpy(b + prefix, token, ECXI_DATA_TOKEN_LEN);
    memcpy(b + prefix + ECXI_DATA_TOKEN_LEN, key, key_len);
    return b;
}

static void send_end(int status, const uint8_t *token, const char *key, size_t key_len)
{
    ecxi_put_le32(out_token_key(ECXI_UCX_H_END, 0, 4, token, key, key_len), (uint32_t)status);
}

/* ---- producer: the grant check is the parent's -------------------------- */

static void ask_free(ask *a)
{
    free(a->blocks);
    free(a);
}

static ask *ask_find(const char *key, size_t key_len, const uint8_t *token, ask ***where)
{
    for (ask **pp = &g.asks; *pp; pp = &(*pp)->next) {
        ask *a = *pp;
        if (a->key_len == key_len && !memcmp(a->key, key, key_len) &&
            !sodium_memcmp(a->token, token, ECXI_DATA_TOKEN_LEN)) {
            if (where) *where = pp;
            return a;
        }
    }
    return NULL;
}

static int grant_fn(void *arg, const char *key, size_t key_len, const uint8_t *token, int flags,
                    ecxi_data_grant *gr)
{
    (void)arg, (void)flags; /* data_ucx.c always claims */
    if (g.given) ask_free(g.given), g.given = NULL;
    ask **pp;
    ask *a = ask_find(key, key_len, token, &pp);
    if (a && !a->answered) return ECXI_DATA_GRANT_ASKED;
    if (a) {
        *pp = a->next;
        g.nasks--;
        if (a->rc) {
            int rc = a->rc;
            ask_free(a);
            return rc;
        }
        g.given = a; /* its blocks stay valid while data_ucx.c posts the send */
        *gr = (ecxi_data_grant){.blocks = a->blocks, .n = a->n, .nbytes = a->nbytes};
        return 0;
    }
    if (g.nasks >= MAX_ASKS) return ECX_EDATA_GRANT;
    if (!(a = calloc(1, sizeof *a))) return ECX_EDATA_GRANT;
    a->id = ++g.next_ask;
    memcpy(a->token, token, ECXI_DATA_TOKEN_LEN);
    memcpy(a->key, key, key_len);
    a->key_len = (uint16_t)key_len;
    a->next = g.asks;
    g.asks = a;
    g.nasks++;
    (void)out_token_key(ECXI_UCX_H_ASK, a->id, 0, token, key, key_len);
    return ECXI_DATA_GRANT_ASKED;
}

static void on_answer(uint64_t id, const uint8_t *b, size_t n)
{
    if (n < 16) bye("a malformed ANSWER");
    int rc = (int32_t)ecxi_get_le32(b);
    uint64_t nbytes = ecxi_get_le64(b + 4);
    uint32_t nruns = ecxi_get_le32(b + 12);
    if (n != 16 + 8 * (size_t)nruns || (rc == 0) != (nruns > 0) || rc > 0)
        bye("a malformed ANSWER");
    ask *a = NULL;
    for (ask *x = g.asks; x && !a; x = x->next)
        if (x->id == id && !x->answered) a = x;
    if (!a) bye("an ANSWER not asked for");
    const uint64_t nb = ecxi_region_num_blocks(g.r);
    size_t total = 0;
    for (uint32_t i = 0; i < nruns; i++) {
        uint64_t first = ecxi_get_le32(b + 16 + 8 * (size_t)i), k = ecxi_get_le32(b + 20 + 8 * (size_t)i);
        if (k == 0 || first >= nb || k > nb - first) bye("an ANSWER outside the region");
        total += k;
    }
    if (total && !(a->blocks = malloc(total * sizeof *a->blocks))) bye("out of memory");
    for (uint32_t i = 0, j = 0; i < nruns; i++) {
        uint64_t first = ecxi_get_le32(b + 16 + 8 * (size_t)i), k = ecxi_get_le32(b + 20 + 8 * (size_t)i);
        for (uint64_t q = 0; q < k; q++) a->blocks[j++] = first + q;
    }
    a->n = total;
    a->nbytes = nbytes;
    a->rc = rc;
    a->answered = true;
    a->answered_ms = ecxi_now_ms(NULL);
}

/* A claim whose request is gone (its connection failed before the send)
 * is given back after ECXI_UCX_PROC_ANSWER_MS, as a failed send. */
static void expire_answers(void)
{
    int64_t now = ecxi_now_ms(NULL);
    for (ask **pp = &g.asks; *pp;) {
        ask *a = *pp;
        if (!a->answered || now - a->answered_ms < ECXI_UCX_PROC_ANSWER_MS) {
            pp = &a->next;
            continue;
        }
        *pp = a->next;
        g.nasks--;
        if (a->rc == 0) send_end(ECX_EDATA_PEER, a->token, a->key, a->key_len);
        ask_free(a);
    }
}

static void on_cut(const uint8_t *b, size_t n)
{
    const uint8_t *token = b;
    const char *key;
    size_t key_len;
    if (!ecxi_ucx_proc_token_key(b, n, &key, &key_len)) bye("a malformed CUT");
    if (ecxi_data_cut(g.d, key, key_len, token)) return; /* its END follows */
    ask *a = ask_find(key, key_len, token, NULL);
    if (a && a->answered && a->rc == 0) {
        /* claimed, not sent yet: it ends now, and the request waiting for
         * it is refused (asking again would claim it anew) */
        send_end(ECX_EDATA_PEER, a->token, a->key, a->key_len);
        a->rc = ECX_EDATA_GRANT;
        free(a->blocks);
        a->blocks = NULL;
        a->n = 0;
    }
    /* else its send has ended and its END is queued or sent */
}

/* A send's end, or a consumer's decline (not a claim's end: its own message). */
static void on_notif(void *arg, const char *key, size_t key_len, const uint8_t *token, int status)
{
    (void)arg;
    if (status == ECXI_DATA_DECLINED)
        (void)out_token_key(ECXI_UCX_H_DECLINED, 0, 0, token, key, key_len);
    else
        send_end(status, token, key, key_len);
}

/* ---- consumer ----------------------------------------------------------- */

static hpeer *peer_of(uint64_t id, hpeer ***where)
{
    for (hpeer **pp = &g.peers; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            if (where) *where = pp;
            return *pp;
        }
    return NULL;
}

static int connect_peer(hpeer *h)
{
    ecxi_data_meta m = {.has_ucx = true, .ucx_addr = h->addr, .ucx_addr_len = h->addr_len};
    return g.d->ops->peer_add(g.d, &m, NULL, &h->p);
}

static void on_add(uint64_t id, const uint8_t *b, size_t n)
{
    hpeer *h = n <= sizeof h->addr ? calloc(1, sizeof *h) : NULL;
    int rc = n > sizeof h->addr ? ECX_EDATA_META : !h ? ECX_ENOMEM : 0;
    if (!rc) {
        memcpy(h->addr, b, n);
        h->addr_len = n;
        rc = connect_peer(h);
    }
    if (rc) free(h);
    else h->id = id, h->next = g.peers, g.peers = h;
    ecxi_put_le32(out(ECXI_UCX_H_ADDED, id, 4), (uint32_t)rc);
}

static void on_drop(uint64_t id)
{
    hpeer **pp;
    hpeer *h = peer_of(id, &pp);
    if (!h) return;
    *pp = h->next;
    if (h->p) g.d->ops->peer_drop(h->p);
    free(h);
}

/* A READ of nruns g.local runs (x), or with x NULL a decline, to h's
 * producer, connecting again once if its connection failed (its UCX
 * process was started again, on the same address: ucx_proc.h). */
static int to_peer(hpeer *h, const ecxi_data_ticket *t, size_t nruns, const char *key,
                   size_t key_len, ecxi_data_xfer **x)
{
    int rc = 0;
    for (int try = 0; try < 2; try++) {
        if (!h->p && (rc = connect_peer(h))) return rc; /* or its last reconnect failed */
        rc = x ? g.d->ops->read_post(h->p, t, g.local, nruns, g.local, nruns, t->nbytes, key,
                                     key_len, x)
               : g.d->ops->decline(h->p, t, key, key_len);
        if (rc != ECX_EDATA_PEER) return rc;
        g.d->ops->peer_drop(h->p);
        h->p = NULL;
    }
    return rc;
}

/* The consumer will not read a grant: tell its producer. Nothing is
 * answered: if this fails, the producer's lease releases the grant. */
static void on_decline(uint64_t id, const uint8_t *b, size_t n)
{
    const char *key;
    size_t key_len;
    if (!ecxi_ucx_proc_token_key(b, n, &key, &key_len)) bye("a malformed DECLINE");
    ecxi_data_ticket t = {0};
    memcpy(t.token, b, ECXI_DATA_TOKEN_LEN);
    hpeer *h = peer_of(id, NULL);
    if (h) (void)to_peer(h, &t, 0, key, key_len, NULL);
}

static void on_read(uint64_t id, const uint8_t *b, size_t n)
{
    const size_t fixed = 8 * 3 + ECXI_DATA_TOKEN_LEN + 8;
    if (n < fixed) bye("a malformed READ");
    uint32_t key_len = ecxi_get_le32(b + 24 + ECXI_DATA_TOKEN_LEN);
    uint32_t nruns = ecxi_get_le32(b + 28 + ECXI_DATA_TOKEN_LEN);
    if (key_len == 0 || key_len > ECXI_DATA_NOTIF_MAX || nruns == 0 ||
        n != fixed + key_len + 8 * (size_t)nruns)
        bye("a malformed READ");
    const uint64_t nb = ecxi_region_num_blocks(g.r), bs = ecxi_region_block_bytes(g.r);
    ecxi_data_ticket t = {.checksum = ecxi_get_le64(b + 16), .nbytes = ecxi_get_le64(b + 8)};
    memcpy(t.token, b + 24, ECXI_DATA_TOKEN_LEN);
    const uint8_t *run = b + fixed + key_len;
    size_t total = 0;
    int rc = 0;
    if (nruns > g.local_cap) {
        ecxi_block_run *l = realloc(g.local, nruns * sizeof *l);
        if (!l) rc = ECX_ENOMEM;
        else g.local = l, g.local_cap = nruns;
    }
    for (uint32_t i = 0; i < nruns && !rc; i++) {
        uint64_t first = ecxi_get_le32(run + 8 * (size_t)i), k = ecxi_get_le32(run + 8 * (size_t)i + 4);
        if (k == 0 || first >= nb || k > nb - first) rc = ECX_EDATA_INDEX;
        else total += k, g.local[i] = (ecxi_block_run){first, k};
    }
    if (!rc && (t.nbytes == 0 || t.nbytes > total * bs || t.nbytes <= (total - 1) * bs))
        rc = ECX_EDATA_COUNT;
    hpeer *h = rc ? NULL : peer_of(ecxi_get_le64(b), NULL);
    hxfer *x = h ? calloc(1, sizeof *x) : NULL;
    if (!rc && !h) rc = ECX_EDATA_PEER;
    if (!rc && !x) rc = ECX_ENOMEM;
    if (!rc) rc = to_peer(h, &t, nruns, (const char *)b + fixed, key_len, &x->x);
    if (rc) {
        free(x);
        ecxi_put_le32(out(ECXI_UCX_H_READ_END, id, 4), (uint32_t)ECXI_XFER_FAILED);
        return;
    }
    x->id = id;
    x->next = g.xfers;
    g.xfers = x;
}

static void on_release(uint64_t id)
{
    for (hxfer **pp = &g.xfers; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            hxfer *x = *pp;
            *pp = x->next;
            g.d->ops->read_release(x->x);
            free(x);
            return;
        }
}

static void reads_ended(void)
{
    for (hxfer **pp = &g.xfers; *pp;) {
        hxfer *x = *pp;
        int st = g.d->ops->read_poll(x->x);
        if (st == ECXI_XFER_RUNNING) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        ecxi_put_le32(out(ECXI_UCX_H_READ_END, x->id, 4), (uint32_t)st);
        g.d->ops->read_release(x->x);
        free(x);
    }
}

/* The path's counters to the parent when they changed, at most every
 * STATS_MS: a refusal is counted even when UCX aborts this process soon
 * after (the flood that trips UCX 1.13.1's connection manager assertion
 * is the flood whose refusals we count). Returns how long the loop may
 * sleep before counters that changed are owed (-1: nothing owed). */
#define STATS_MS 100
static int stats(void)
{
    static int64_t last_ms = INT64_MIN / 2;
    static ecxi_data_counts last;
    ecxi_data_stats st = {0};
    ecxi_data_get_stats(g.d, &st);
    const ecxi_data_counts *c = &st.path[ECX_DATA_UCX];
    if (!memcmp(c, &last, sizeof last)) return -1;
    int64_t now = ecxi_now_ms(NULL);
    if (now - last_ms < STATS_MS) return (int)(STATS_MS - (now - last_ms));
    last_ms = now;
    last = *c;
    uint8_t *b = out(ECXI_UCX_H_STATS, 0, 32);
    ecxi_put_le64(b, c->conns_refused);
    ecxi_put_le64(b + 8, c->conns_evicted);
    ecxi_put_le64(b + 16, c->conns_dropped);
    ecxi_put_le64(b + 24, c->requests_dropped);
    return -1;
}

/* ---- the loop -------------------------------------------------------------- */

/* Everything the parent sent: false on EOF. */
static bool from_parent(void)
{
    for (;;) {
        ssize_t n = recv(S, g.buf, sizeof g.buf, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return true;
        if (n <= 0) return false;
        if (n > (ssize_t)sizeof g.buf) bye("a message too large");
        uint16_t type;
        uint64_t id;
        if (ecxi_helper_hdr_get(g.buf, (size_t)n, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, &type,
                                &id))
            bye("a message not of the protocol");
        const uint8_t *b = g.buf + ECXI_HELPER_HDR;
        size_t len = (size_t)n - ECXI_HELPER_HDR;
        if (g.producer && type == ECXI_UCX_P_ANSWER) on_answer(id, b, len);
        else if (g.producer && type == ECXI_UCX_P_CUT) on_cut(b, len);
        else if (!g.producer && type == ECXI_UCX_P_ADD && len > 0) on_add(id, b, len);
        else if (!g.producer && type == ECXI_UCX_P_DROP) on_drop(id);
        else if (!g.producer && type == ECXI_UCX_P_READ) on_read(id, b, len);
        else if (!g.producer && type == ECXI_UCX_P_RELEASE) on_release(id);
        else if (!g.producer && type == ECXI_UCX_P_DECLINE) on_decline(id, b, len);
        else bye("an unexpected message");
    }
}

/* The HELLO: role, block size, port, bind host; then the region and UCX. */
static void hello(void)
{
    struct pollfd q = {.fd = S, .events = POLLIN};
    if (poll(&q, 1, ECXI_UCX_PROC_START_MS) != 1) bye("no HELLO");
    ssize_t n = recv(S, g.buf, sizeof g.buf, MSG_TRUNC);
    uint16_t type;
    uint64_t id;
    if (n < ECXI_HELPER_HDR + 14 || n > ECXI_HELPER_HDR + 14 + 255 ||
        ecxi_helper_hdr_get(g.buf, (size_t)n, ECXI_UCX_PROC_MAGIC, ECXI_UCX_PROC_VERSION, &type,
                            &id) ||
        type != ECXI_UCX_P_HELLO)
        bye("a bad HELLO");
    const uint8_t *b = g.buf + ECXI_HELPER_HDR;
    uint32_t role = ecxi_get_le32(b);
    uint64_t bs = ecxi_get_le64(b + 4);
    uint16_t port;
    memcpy(&port, b + 12, 2);
    char host[256];
    size_t hl = (size_t)n - ECXI_HELPER_HDR - 14;
    memcpy(host, b + 14, hl);
    host[hl] = 0;
    g.producer = role == ECXI_UCX_ROLE_PRODUCER;
    int rc = !g.producer && role != ECXI_UCX_ROLE_CONSUMER ? ECX_EINVAL : 0;
    if (!rc) rc = ecxi_region_map_fd(ECXI_HELPER_REGION_FD, bs, !g.producer, &g.r);
    close(ECXI_HELPER_REGION_FD);
    ecxi_data_meta m = {0};
    if (!rc)
        rc = g.producer ? ecxi_data_ucx_new_producer(g.r, hl ? host : NULL, port, &m, &g.d)
                        : ecxi_data_ucx_new_consumer(g.r, &g.d);
    if (!rc && g.producer) ecxi_data_set_grant_fn(g.d, grant_fn, NULL);
    size_t al = !rc && g.producer ? m.ucx_addr_len : 0;
    uint8_t *r = out(ECXI_UCX_H_HELLO, 0, 4 + al);
    ecxi_put_le32(r, (uint32_t)rc);
    if (al) memcpy(r + 4, m.ucx_addr, al);
    while (g.oq) { /* a fresh socket takes it at once */
        flush();
        if (g.oq) poll(&(struct pollfd){.fd = S, .events = POLLOUT}, 1, 100);
    }
    if (rc) bye(NULL);
}

/* The private memory mapped so far (VmData, bytes), 0 if unknown. */
static uint64_t vm_data(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmData: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb << 10;
}

/* RLIMIT_DATA, before UCX allocates anything: what is mapped now (the
 * libraries; a sanitizer's shadow, in such a build) plus the bound. */
static void limit_memory(void)
{
    const char *e = getenv("ECX_UCX_AGENT_DATA_MB");
    long mb = e && *e ? atol(e) : ECXI_UCX_AGENT_DATA_MB;
    if (mb <= 0) return; /* 0: no bound (an operator's choice) */
    rlim_t lim = (rlim_t)vm_data() + ((rlim_t)mb << 20);
    struct rlimit rl = {.rlim_cur = lim, .rlim_max = lim};
    if (setrlimit(RLIMIT_DATA, &rl) != 0)
        ecxi_log(ECX_LOG_WARN, "ucx agent process: setrlimit(RLIMIT_DATA): %s", strerror(errno));
}

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "--ecx-ucx-agent")) {
        fprintf(stderr, "ecx-ucx-agent: the UCX process of libecx's ucx data path; started by "
                        "the library only (src/data/ucx/ucx_proc.h)\n");
        return 2;
    }
    limit_memory();
    dup2(STDERR_FILENO, STDOUT_FILENO); /* whatever UCX prints never mixes into the parent's output */
    signal(SIGPIPE, SIG_IGN);
    if (sodium_init() < 0) bye("libsodium");
    /* a new helper listens on its predecessor's port, past the closed
     * connections the old one left (TIME_WAIT) */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    setenv("UCX_RDMA_CM_REUSEADDR", "y", 0);
    g.oq_tail = &g.oq;
    pid_t parent = getppid();
    hello();
    int efd = ecxi_data_fd(g.d);
    for (;;) {
        if (!from_parent()) break;
        bool more = false;
        if (g.producer) {
            if (ecxi_data_poll_notifs(g.d, on_notif, NULL) < 0) bye("UCX failed");
            expire_answers();
        } else {
            if (ecxi_data_progress(g.d, ECXI_DATA_SLICE_NS, &more) < 0) bye("UCX failed");
            reads_ended();
        }
        int owed = stats();
        flush();
        if (getppid() != parent) break;
        int busy = more ? 1 : ecxi_data_arm(g.d);
        if (busy < 0) bye("UCX cannot arm its worker");
        struct pollfd q[2] = {{.fd = S, .events = POLLIN | (g.oq ? POLLOUT : 0)},
                              {.fd = efd, .events = POLLIN}};
        int wait = busy ? 0 : g.asks || g.xfers ? 10 : 1000;
        (void)poll(q, 2, owed >= 0 && owed < wait ? owed : wait);
    }
    /* EOF: the parent is done or gone; no cleanup is owed to anyone */
    bye(NULL);
}
