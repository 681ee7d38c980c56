/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_hostile — the UCX and tcp data paths against well-behaved and hostile
 * peers, each side in its own process (driven by test_ucx_hostile.sh and
 * test_tcp_hostile.sh). produce / consume use the backend named by
 * HOSTILE_DATA (ucx, the default, or tcp). The
 * producer publishes its agent_metadata and a set of grants (key, token,
 * blocks, descriptor) in a file, the way acks would carry them; a
 * consumer or an attacker reads what it needs from there (an attacker is
 * given every address too: the worst case, ASLR assumed known).
 *
 *   ucx_hostile produce DIR FILE TIMEOUT_MS
 *     region of NB blocks in DIR with a known pattern, UCX producer bound
 *     to 127.0.0.1, grants g0..g(NG-1); serve until SIGTERM or timeout;
 *     print every notification, then which blocks differ from the pattern
 *     ("region intact" if none); "requests_dropped N" each time the path's
 *     count of dropped requests changes. Exit 0, or 1 on setup errors.
 *   ucx_hostile consume DIR FILE FIRST COUNT LAYOUT EXPECT TIMEOUT_MS
 *     READ grants FIRST..FIRST+COUNT-1 at once (LAYOUT direct: into the
 *     same block indices; reverse: into NB-1-index) and expect each to end
 *     EXPECT (done: byte-exact too / failed / corrupt / timeout: still
 *     running at TIMEOUT_MS, then released and the peer dropped / any:
 *     whatever, but a DONE one byte-exact).
 *   ucx_hostile attack FILE TIMEOUT_MS
 *     a raw UCP client (RMA enabled) holding only grant g5's ticket:
 *     ucp_get / ucp_put with a crafted rkey at the region, below and past
 *     it, at the producer's heap and at an unmapped address; request AMs
 *     with a wrong token, another grant's key, declines of g6 (a wrong
 *     token, g5's), a replayed token, and garbage. Exit 0 if it obtained
 *     nothing but g5 (once).
 *   ucx_hostile bad-declines FILE BAD GOOD TIMEOUT_MS
 *     a raw UCP client holding grants BAD's and GOOD's tickets: declines of
 *     BAD that the producer must drop (type 1 with a tag, type 2 with and
 *     without one; nothing may come back under their tags), then one
 *     well-formed decline of GOOD. Exit 0 if nothing came back.
 *   ucx_hostile mutate DIR FILE N
 *     a hostile producer's acks (issue 10 #3): N agent_metadata whose UCX
 *     bytes are mutated (flipped, truncated, extended, random) but carry a
 *     valid digest, each registered and dropped by a consumer. Exit 0 if
 *     every one was refused or registered without a crash; prints counts.
 *   ucx_hostile uct-put FILE PORT BLOCK
 *     raw UCT tcp put of 8 bytes at the producer's block BLOCK, to its tcp
 *     interface port PORT (a UCX 1.13 hole: see data_ucx.c). Prints what
 *     UCT said.
 * attack and uct-put aim at the region's address in the producer, or,
 * with HOSTILE_UCX_BASE (hex) set, at that one: its UCX process's mapping.
 *   ucx_hostile evil-ucx FILE MODE SIZE SECONDS BLOCK_BYTES
 *     a hostile UCX producer: floods the consumer that asks it for a READ
 *     with active messages or 1 GiB of eager messages (issue 20 #5; see
 *     evil_ucx below).
 *   ucx_hostile conns META_HEX N ROUNDS
 *     N UCX connections from one address at a producer, held 2 s and
 *     force-closed, ROUNDS times (issue 20 #5).
 *   ucx_hostile tcp-attack FILE
 *     a raw TCP client of a tcp producer holding only grant g5's ticket:
 *     a wrong token, another grant's key, g5 (served once), its replay,
 *     garbage headers, a key length of 0 and over the limit, half a
 *     request then silence, 2000 pipelined requests, 100 connections at
 *     once. Exit 0 if it obtained nothing but g5 (once) and every bound
 *     held; prints what each step got.
 *   ucx_hostile tcp-evil DIR
 *     a hostile tcp producer (a forked raw server) against a real tcp
 *     consumer: a wrong xfer id, a bigger nbytes than the ticket, a bad
 *     status, a short stream then close, a stall, trailing bytes after a
 *     good reply, and good replies in between. Exit 0 if every hostile
 *     READ failed, the good ones are byte-exact, and nothing was written
 *     outside the READ's bytes (a guard pattern around them).
 * Every wait is bounded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#ifdef ECX_WITH_UCX
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
#endif
#include <unistd.h>

#include "checksum.h"
#include "data.h"
#include "data_impl.h"
#include "region.h"
#include "util.h"

#define NB 64
#define BS 65536
#define NG 40
#define AM_REQ_ID 0x3ed /* data_ucx.c's request, spoken by hand */

static uint8_t pat(uint64_t off)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (off * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17));
}

typedef struct grant {
    char key[64];
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint64_t blocks[NB];
    size_t n;
    uint64_t nbytes;
    bool claimed, released;
    char desc_hex[2 * ECXI_DATA_DESC_MAX + 1];
} grant;

static grant G[NG];

/* The shapes: one block; a run; scattered with a partial last block; the
 * whole region; a partial single block; then single blocks g5..g15 and
 * whole-region grants g16.. (for the stall test). */
static void shape(int i, grant *g)
{
    static const uint64_t scat[] = {30, 2, 3, 40, 41, 7};
    g->n = 0;
    if (i == 0) {
        g->blocks[g->n++] = 5;
        g->nbytes = BS;
    } else if (i == 1) {
        for (uint64_t b = 10; b < 20; b++) g->blocks[g->n++] = b;
        g->nbytes = 10 * BS;
    } else if (i == 2) {
        for (size_t k = 0; k < 6; k++) g->blocks[g->n++] = scat[k];
        g->nbytes = 5 * BS + 1234;
    } else if (i == 3 || i >= 16) {
        for (uint64_t b = 0; b < NB; b++) g->blocks[g->n++] = b;
        g->nbytes = (uint64_t)NB * BS;
    } else if (i == 4) {
        g->blocks[g->n++] = 50;
        g->nbytes = 777;
    } else {
        g->blocks[g->n++] = 50 + (uint64_t)i;
        g->nbytes = BS;
    }
}

/* HOSTILE_DATA: the backend produce and consume use. */
static int backend(void)
{
    const char *e = getenv("HOSTILE_DATA");
    return e && !strcmp(e, "tcp") ? ECX_DATA_TCP : ECX_DATA_UCX;
}

static volatile sig_atomic_t stop;
static void on_term(int s)
{
    (void)s;
    stop = 1;
}

static int grant_fn(void *arg, const char *key, size_t key_len, const uint8_t *token, int flags,
                    ecxi_data_grant *out)
{
    (void)arg;
    for (int i = 0; i < NG; i++) {
        grant *g = &G[i];
        if (strlen(g->key) != key_len || memcmp(g->key, key, key_len)) continue;
        if (g->released || sodium_memcmp(g->token, token, ECXI_DATA_TOKEN_LEN)) return ECX_EDATA_GRANT;
        if ((flags & ECXI_DATA_GRANT_CLAIM) && g->claimed) return ECX_EDATA_GRANT;
        if (flags & ECXI_DATA_GRANT_CLAIM) g->claimed = true;
        out->blocks = g->blocks;
        out->n = g->n;
        out->nbytes = g->nbytes;
        return 0;
    }
    return ECX_EDATA_GRANT;
}

static void on_notif(void *arg, const char *key, size_t key_len, const uint8_t *token, int status)
{
    (void)arg;
    for (int i = 0; i < NG; i++)
        if (strlen(G[i].key) == key_len && !memcmp(G[i].key, key, key_len) &&
            !sodium_memcmp(G[i].token, token, ECXI_DATA_TOKEN_LEN))
            G[i].released = true;
    printf("notif %s status %d\n", key, status);
    fflush(stdout);
}

static void wait_fd(ecxi_data *d, int ms)
{
    int fd = ecxi_data_fd(d);
    if (fd < 0 || ecxi_data_arm(d) != 0) return;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    (void)poll(&p, 1, ms);
}

static int produce(const char *dir, const char *file, int timeout_ms)
{
    ecxi_region *r;
    int rc = ecxi_region_create_in(dir, "ucxh", 0, (uint64_t)NB * BS, BS, &r);
    if (rc) return fprintf(stderr, "region: %s\n", ecx_strerror(rc)), 1;
    uint8_t *b = ecxi_region_base(r);
    for (uint64_t i = 0; i < ecxi_region_size(r); i++) b[i] = pat(i);
    /* Something secret on the heap, for the attacker to aim at. */
    char *secret = strdup("CURVE-SECRET-KEY-0123456789abcdef");
    ecxi_data_opts o = {.backend = backend(), .bind_host = "127.0.0.1"};
    ecxi_data *d;
    if ((rc = ecxi_data_new_producer(r, &o, &d))) return fprintf(stderr, "producer: %s\n", ecx_strerror(rc)), 1;
    ecxi_data_set_grant_fn(d, grant_fn, NULL);
    size_t ml;
    const uint8_t *meta = ecxi_data_agent_metadata(d, &ml);
    char *hex = malloc(2 * ml + 1);
    ecxi_hex_encode(meta, ml, hex);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f) return perror("fopen"), 1;
    ecxi_data_meta m;
    if (ecxi_data_meta_decode(meta, ml, &m) || !(m.has_tcp || (m.has_ucx && m.ucx_addr_len >= 4)))
        return 1;
    fprintf(f, "meta %s\nbase %" PRIxPTR " secret %" PRIxPTR "\nlistener %u\n", hex,
            (uintptr_t)b, (uintptr_t)secret,
            m.has_tcp ? m.tcp_port : (unsigned)(m.ucx_addr[2] << 8 | m.ucx_addr[3]));
    free(hex);
    for (int i = 0; i < NG; i++) {
        grant *g = &G[i];
        shape(i, g);
        snprintf(g->key, sizeof g->key, "sess%d:item%d", i, i);
        randombytes_buf(g->token, sizeof g->token);
        ecxi_data_ticket t = {.checksum = ecxi_checksum_blocks(b, BS, g->blocks, g->n, g->nbytes),
                             .nbytes = g->nbytes,
                             .lease_ms = 30000};
        memcpy(t.token, g->token, sizeof t.token);
        uint8_t db[ECXI_DATA_DESC_MAX];
        long dl = ecxi_data_grant_descriptor(d, &t, db, sizeof db);
        if (dl < 0) return fprintf(stderr, "descriptor: %s\n", ecx_strerror((int)dl)), 1;
        ecxi_hex_encode(db, (size_t)dl, g->desc_hex);
        char th[2 * ECXI_DATA_TOKEN_LEN + 1];
        ecxi_hex_encode(g->token, sizeof g->token, th);
        fprintf(f, "grant %d %s %s %" PRIu64 " %zu", i, g->key, th, g->nbytes, g->n);
        for (size_t k = 0; k < g->n; k++) fprintf(f, " %" PRIu64, g->blocks[k]);
        fprintf(f, " %s\n", g->desc_hex);
    }
    fclose(f);
    if (rename(tmp, file)) return perror("rename"), 1;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    printf("producer ready pid %d\n", (int)getpid());
    fflush(stdout);
    int64_t end = ecxi_now_ms(NULL) + timeout_ms;
    uint64_t dropped = 0;
    while (!stop && ecxi_now_ms(NULL) < end) {
        if ((rc = ecxi_data_poll_notifs(d, on_notif, NULL)) < 0)
            fprintf(stderr, "poll_notifs: %s\n", ecx_strerror(rc));
        /* The path's dropped requests (for ucx: the UCX process's count,
         * which reaches us in its STATS at most once a second). */
        ecxi_data_stats st = {0};
        ecxi_data_get_stats(d, &st);
        if (st.path[backend()].requests_dropped != dropped) {
            dropped = st.path[backend()].requests_dropped;
            printf("requests_dropped %" PRIu64 "\n", dropped);
            fflush(stdout);
        }
        wait_fd(d, 50);
    }
    ecxi_data_free(d);
    int changed = 0;
    for (uint64_t blk = 0; blk < NB; blk++)
        for (uint64_t i = blk * BS; i < (blk + 1) * BS; i++)
            if (b[i] != pat(i)) {
                printf("block %" PRIu64 " changed\n", blk);
                changed++;
                break;
            }
    if (!changed) printf("region intact\n");
    printf("secret %s\n", strcmp(secret, "CURVE-SECRET-KEY-0123456789abcdef") ? "changed" : "intact");
    free(secret);
    ecxi_region_free(r);
    return 0;
}

/* ---- reading the file ---------------------------------------------------- */

static uint8_t meta_b[ECXI_DATA_META_MAX];
static size_t meta_len;
static uintptr_t base_addr, secret_addr;

static int load(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) return perror(file), -1;
    static char line[3 * ECXI_DATA_DESC_MAX + 4096];
    while (fgets(line, sizeof line, f)) {
        char *save, *w = strtok_r(line, " \n", &save);
        if (!w) continue;
        if (!strcmp(w, "meta")) {
            char *h = strtok_r(NULL, " \n", &save);
            meta_len = (size_t)ecxi_hex_decode(h, strlen(h), meta_b);
        } else if (!strcmp(w, "base")) {
            base_addr = (uintptr_t)strtoull(strtok_r(NULL, " \n", &save), NULL, 16);
            const char *ucx_base = getenv("HOSTILE_UCX_BASE"); /* the UCX process's mapping */
            if (ucx_base && *ucx_base) base_addr = (uintptr_t)strtoull(ucx_base, NULL, 16);
            strtok_r(NULL, " \n", &save);
            secret_addr = (uintptr_t)strtoull(strtok_r(NULL, " \n", &save), NULL, 16);
        } else if (!strcmp(w, "grant")) {
            int i = atoi(strtok_r(NULL, " \n", &save));
            if (i < 0 || i >= NG) continue;
            grant *g = &G[i];
            snprintf(g->key, sizeof g->key, "%s", strtok_r(NULL, " \n", &save));
            char *th = strtok_r(NULL, " \n", &save);
            ecxi_hex_decode(th, strlen(th), g->token);
            g->nbytes = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
            g->n = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
            for (size_t k = 0; k < g->n && k < NB; k++)
                g->blocks[k] = strtoull(strtok_r(NULL, " \n", &save), NULL, 10);
            snprintf(g->desc_hex, sizeof g->desc_hex, "%s", strtok_r(NULL, " \n", &save));
        }
    }
    fclose(f);
    return meta_len ? 0 : -1;
}

/* ---- a well-behaved consumer -------------------------------------------- */

static const char *state_name(int s)
{
    return s == ECXI_XFER_RUNNING  ? "timeout"
           : s == ECXI_XFER_DONE   ? "done"
           : s == ECXI_XFER_FAILED ? "failed"
                                  : "corrupt";
}

static int consume(const char *dir, const char *file, int first, int count, const char *layout,
                   const char *expect, int timeout_ms)
{
    if (load(file) || first < 0 || count < 1 || first + count > NG) return 1;
    char inst[32];
    snprintf(inst, sizeof inst, "ucxc%d", (int)getpid());
    ecxi_region *r;
    int rc = ecxi_region_create_in(dir, inst, 0, (uint64_t)NB * BS, BS, &r);
    if (rc) return fprintf(stderr, "region: %s\n", ecx_strerror(rc)), 1;
    memset(ecxi_region_base(r), 0xee, ecxi_region_size(r));
    ecxi_data_opts o = {.backend = backend()};
    ecxi_data *d;
    if ((rc = ecxi_data_new_consumer(r, &o, &d))) return fprintf(stderr, "consumer: %s\n", ecx_strerror(rc)), 1;
    uint8_t db[ECXI_DATA_DESC_MAX];
    long dl = ecxi_hex_decode(G[first].desc_hex, strlen(G[first].desc_hex), db);
    ecxi_data_peer *p;
    ecxi_data_desc dd;
    if (dl < 0 || (rc = ecxi_data_desc_decode(db, (size_t)dl, &dd)) ||
        (rc = ecxi_data_peer_add(d, meta_b, meta_len, &dd, &p)))
        return fprintf(stderr, "peer_add: %s\n", ecx_strerror(rc)), 1;
    ecxi_data_xfer *x[NG];
    uint64_t local[NG][NB];
    ecxi_block_run rr[NB], lr[NB];
    for (int i = first; i < first + count; i++) {
        grant *g = &G[i];
        for (size_t k = 0; k < g->n; k++)
            local[i][k] = !strcmp(layout, "reverse") ? NB - 1 - g->blocks[k] : g->blocks[k];
        size_t nr = ecxi_block_runs_of(g->blocks, g->n, rr),
               nl = ecxi_block_runs_of(local[i], g->n, lr);
        dl = ecxi_hex_decode(g->desc_hex, strlen(g->desc_hex), db);
        rc = dl < 0 ? ECX_EDATA_DESC : ecxi_data_desc_decode(db, (size_t)dl, &dd);
        if (!rc)
            rc = ecxi_data_read_post(p, &dd, rr, nr, lr, nl, g->nbytes, g->key, strlen(g->key),
                                     &x[i]);
        if (rc) return fprintf(stderr, "read_post g%d: %s\n", i, ecx_strerror(rc)), 1;
    }
    int64_t t0 = ecxi_now_ms(NULL), end = t0 + timeout_ms;
    int st[NG], left = count;
    while (left && ecxi_now_ms(NULL) < end) {
        ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
        left = 0;
        for (int i = first; i < first + count; i++)
            left += (st[i] = ecxi_data_read_poll(x[i])) == ECXI_XFER_RUNNING;
        if (left) wait_fd(d, 20);
    }
    int bad = 0;
    const uint8_t *lb = ecxi_region_base(r);
    for (int i = first; i < first + count; i++) {
        grant *g = &G[i];
        bool exact = st[i] == ECXI_XFER_DONE;
        for (size_t k = 0; exact && k < g->n; k++) {
            uint64_t len = k + 1 < g->n ? BS : g->nbytes - (g->n - 1) * (uint64_t)BS;
            for (uint64_t j = 0; j < len && exact; j++)
                exact = lb[local[i][k] * BS + j] == pat(g->blocks[k] * BS + j);
        }
        printf("g%d %s%s after %" PRId64 " ms\n", i, state_name(st[i]),
               st[i] == ECXI_XFER_DONE ? (exact ? " (byte-exact)" : " (BYTES DIFFER)") : "",
               ecxi_now_ms(NULL) - t0);
        if ((strcmp(expect, "any") && strcmp(state_name(st[i]), expect)) ||
            (st[i] == ECXI_XFER_DONE && !exact))
            bad++;
        ecxi_data_read_release(x[i]);
    }
    ecxi_data_peer_drop(p);
    ecxi_data_free(d);
    ecxi_region_free(r);
    return bad ? 2 : 0;
}

/* ---- the attacker (the ucx path's, built with it) ------------------------ */
#ifdef ECX_WITH_UCX

static ucp_context_h ctx;
static ucp_worker_h wk;

static void wait_req(void *r, int ms, ucs_status_t *st)
{
    *st = UCS_OK;
    if (r == NULL) return;
    if (UCS_PTR_IS_ERR(r)) {
        *st = UCS_PTR_STATUS(r);
        return;
    }
    int64_t end = ecxi_now_ms(NULL) + ms;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && ecxi_now_ms(NULL) < end)
        ucp_worker_progress(wk);
    *st = ucp_request_check_status(r);
    if (*st == UCS_INPROGRESS) return; /* left to UCX: we exit soon */
    ucp_request_free(r);
}

static void noop_err(void *a, ucp_ep_h ep, ucs_status_t st)
{
    (void)a, (void)ep;
    printf("  (endpoint error: %s)\n", ucs_status_string(st));
}

static void recv_cb(void *r, ucs_status_t st, const ucp_tag_recv_info_t *info, void *u)
{
    (void)r;
    *(long *)u = st == UCS_OK ? (long)info->length : -1;
}

/* Send a request AM (raw bytes) and wait for what comes back under tag:
 * the length received, -1 on error, -2 if nothing came. */
static long ask(ucp_ep_h ep, uint64_t tag, const void *msg, size_t len, bool reply, bool eager,
                void *buf, size_t cap, int ms)
{
    long got = -3;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv = recv_cb,
                              .user_data = &got};
    void *rr = ucp_tag_recv_nbx(wk, buf, cap, tag, UINT64_MAX, &rp);
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = (reply ? UCP_AM_SEND_FLAG_REPLY : 0) |
                                       (eager ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV)};
    ucs_status_t st;
    wait_req(ucp_am_send_nbx(ep, AM_REQ_ID, NULL, 0, msg, len, &sp), ms, &st);
    int64_t end = ecxi_now_ms(NULL) + ms;
    while (got == -3 && ecxi_now_ms(NULL) < end) ucp_worker_progress(wk);
    if (got == -3) {
        ucp_request_cancel(wk, rr);
        while (ucp_request_check_status(rr) == UCS_INPROGRESS) ucp_worker_progress(wk);
        got = -2;
    }
    ucp_request_free(rr);
    return got;
}

static size_t req_msg(uint8_t *m, uint64_t tag, const uint8_t *token, const char *key)
{
    size_t kl = strlen(key);
    memset(m, 0, 32);
    m[0] = 1;
    m[2] = (uint8_t)kl, m[3] = (uint8_t)(kl >> 8);
    for (int i = 0; i < 8; i++) m[8 + i] = (uint8_t)(tag >> 8 * i);
    memcpy(m + 16, token, ECXI_DATA_TOKEN_LEN);
    memcpy(m + 32, key, kl);
    return 32 + kl;
}

/* Send a request AM (eager, with a reply endpoint) and wait until it left. */
static void am_send(ucp_ep_h ep, const void *msg, size_t len, int ms)
{
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
    ucs_status_t st;
    wait_req(ucp_am_send_nbx(ep, AM_REQ_ID, NULL, 0, msg, len, &sp), ms, &st);
}

/* A UCP context with `features` and one single-threaded worker; 0 or 1. */
static int ucp_open(uint64_t features, ucp_context_h *ctx, ucp_worker_h *w)
{
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return 1;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucs_status_t st = ucp_init(&p, cfg, ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return 1;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    return ucp_worker_create(*ctx, &wp, w) != UCS_OK;
}

/* A UCP endpoint to the producer's ucx listener, whose address the loaded
 * metadata gives (IPv4), on a fresh context (ctx, wk) with these features. */
static int dial_producer(uint64_t features, ucp_ep_h *e)
{
    ecxi_data_meta m;
    if (ecxi_data_meta_decode(meta_b, meta_len, &m) || !m.has_ucx || m.ucx_addr_len != 8) return 1;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    memcpy(&sa.sin_port, m.ucx_addr + 2, 2);
    memcpy(&sa.sin_addr, m.ucx_addr + 4, 4);
    if (ucp_open(features, &ctx, &wk)) return 1;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = noop_err}};
    return ucp_ep_create(wk, &ep, e) != UCS_OK;
}

static int attack(const char *file, int timeout_ms)
{
    ucp_ep_h e;
    if (load(file) || dial_producer(UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_RMA, &e))
        return 1;
    int leaks = 0;
    ucs_status_t st;

    /* 1. One-sided get / put with an rkey packed from our own memory (over
     * software RMA its contents are never checked). */
    static uint8_t mine[4096];
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = mine,
                               .length = sizeof mine};
    ucp_mem_h mh;
    void *rkb;
    size_t rkl;
    ucp_rkey_h rkey;
    if (ucp_mem_map(ctx, &mp, &mh) != UCS_OK || ucp_rkey_pack(ctx, mh, &rkb, &rkl) != UCS_OK ||
        ucp_ep_rkey_unpack(e, rkb, &rkey) != UCS_OK)
        return fprintf(stderr, "attack: cannot craft an rkey\n"), 1;
    const struct {
        const char *what;
        uintptr_t addr;
    } at[] = {
        {"a granted block", base_addr + 55 * (uintptr_t)BS},
        {"a block never granted", base_addr + 20 * (uintptr_t)BS},
        {"below the region", base_addr - 4096},
        {"past the region", base_addr + (uintptr_t)NB * BS},
        {"the heap (secret)", secret_addr},
        {"an unmapped address", 0x1000},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        uint64_t got[4] = {0};
        ucp_request_param_t prm = {.op_attr_mask = 0};
        wait_req(ucp_get_nbx(e, got, sizeof got, at[i].addr, rkey, &prm), timeout_ms, &st);
        bool leaked = st == UCS_OK && (got[0] || got[1] || got[2] || got[3]);
        printf("get at %s: %s%s\n", at[i].what, ucs_status_string(st), leaked ? " -- LEAKED" : "");
        leaks += leaked;
        static const uint64_t mark[2] = {0x4e574f5044454e57ull, 0x4e574f5044454e57ull};
        wait_req(ucp_put_nbx(e, mark, sizeof mark, at[i].addr, rkey, &prm), timeout_ms, &st);
        printf("put at %s: %s (the producer checks its memory)\n", at[i].what,
               ucs_status_string(st));
    }

    /* 2. Requests. We hold g5's ticket only. */
    static uint8_t buf[(size_t)NB * BS];
    uint8_t msg[1024], bad[ECXI_DATA_TOKEN_LEN];
    uint64_t tag = 1000;
    memcpy(bad, G[5].token, sizeof bad);
    bad[3] ^= 1;
    tag++;
    long n = ask(e, tag, msg, req_msg(msg, tag, bad, G[5].key), true, true, buf, sizeof buf, timeout_ms);
    printf("wrong token: got %ld bytes\n", n);
    leaks += n > 0;
    tag++;
    n = ask(e, tag, msg, req_msg(msg, tag, G[5].token, G[6].key), true, true, buf, sizeof buf, timeout_ms);
    printf("another grant's key: got %ld bytes\n", n);
    leaks += n > 0;
    /* Declines (type 1, tag 0: nothing answers them) of g6, with a wrong
     * token and with ours: the producer's session releases nothing
     * (test_ucx_hostile.sh reads g6 after the attack). */
    for (int i = 0; i < 2; i++) {
        size_t l = req_msg(msg, 0, i ? G[5].token : bad, G[6].key);
        msg[1] = 1;
        am_send(e, msg, l, timeout_ms);
    }
    printf("forged declines of another grant: 2 sent\n");
    tag++;
    n = ask(e, tag, msg, req_msg(msg, tag, G[5].token, G[5].key), true, true, buf, sizeof buf, timeout_ms);
    printf("our own grant: got %ld bytes (expected %" PRIu64 ")\n", n, G[5].nbytes);
    if (n != (long)G[5].nbytes) leaks++; /* the control: it must work */
    tag++;
    n = ask(e, tag, msg, req_msg(msg, tag, G[5].token, G[5].key), true, true, buf, sizeof buf, timeout_ms);
    printf("replayed token: got %ld bytes\n", n);
    leaks += n > 0;
    /* Garbage: each must be dropped (nothing comes back) or refused. */
    size_t len = req_msg(msg, ++tag, G[6].token, G[6].key);
    struct {
        const char *what;
        size_t len;
        int patch_at, patch;
        bool reply, eager;
    } junk[] = {
        {"version 2", len, 0, 2, true, true},
        {"a short header", 20, -1, 0, true, true},
        {"key_len past the end", len, 2, 200, true, true},
        {"no reply endpoint", len, -1, 0, false, true},
        {"an empty key", 32, 2, 0, true, true},
    };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        uint8_t copy[1024];
        memcpy(copy, msg, sizeof copy);
        if (junk[i].patch_at >= 0) copy[junk[i].patch_at] = (uint8_t)junk[i].patch;
        n = ask(e, tag, copy, junk[i].len, junk[i].reply, junk[i].eager, buf, sizeof buf, 300);
        printf("garbage (%s): got %ld bytes\n", junk[i].what, n);
        leaks += n > 0;
    }
    /* A request far too large (rendezvous): dropped unread. */
    static uint8_t big[256 * 1024];
    memcpy(big, msg, len);
    n = ask(e, tag, big, sizeof big, true, false, buf, sizeof buf, 300);
    printf("garbage (256 KiB rendezvous request): got %ld bytes\n", n);
    leaks += n > 0;
    /* A flood of valid-looking requests: bounded queue, all refused. */
    int answered = 0;
    for (int i = 0; i < 2000; i++)
        am_send(e, msg, req_msg(msg, 5000 + (uint64_t)i, bad, G[7].key), timeout_ms);
    /* Collect the 0-byte refusals that came back (unexpected messages). */
    int64_t end = ecxi_now_ms(NULL) + 500;
    while (ecxi_now_ms(NULL) < end) ucp_worker_progress(wk);
    for (int i = 0; i < 2000; i++) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h mh2 = ucp_tag_probe_nb(wk, 5000 + (uint64_t)i, UINT64_MAX, 0, &info);
        if (mh2) {
            answered++;
            leaks += info.length > 0;
        }
    }
    printf("flood of 2000 wrong-token requests: %d refusals came back, no data\n", answered);

    printf("attack: %s\n", leaks ? "SOMETHING LEAKED" : "got nothing beyond its own grant");
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    wait_req(ucp_ep_close_nbx(e, &cp), 1000, &st);
    ucp_rkey_destroy(rkey);
    ucp_rkey_buffer_release(rkb);
    ucp_mem_unmap(ctx, mh);
    ucp_worker_destroy(wk);
    ucp_cleanup(ctx);
    return leaks ? 2 : 0;
}

/* ---- a hostile producer's metadata ------------------------------------- */

/* Declines that am_req_cb must drop (PROTOCOL.md §6.8: a decline is type
 * 1 with tag 0; any other type, or a decline with a tag, is dropped), all
 * of grant BAD with its own token, then one well-formed decline of grant
 * GOOD, the control: the producer prints requests_dropped up by 3 and
 * releases GOOD only (test_ucx_hostile.sh reads BAD afterwards). */
static int bad_declines(const char *file, int bad_g, int good_g, int timeout_ms)
{
    ucp_ep_h e;
    if (load(file) || bad_g < 0 || bad_g >= NG || good_g < 0 || good_g >= NG ||
        dial_producer(UCP_FEATURE_AM | UCP_FEATURE_TAG, &e))
        return 1;
    static uint8_t buf[(size_t)NB * BS];
    uint8_t msg[1024];
    const struct {
        const char *what;
        uint8_t type;
        uint64_t tag;
    } bad[] = {
        {"type 1 (decline) with tag 77", 1, 77},
        {"type 2, tag 0", 2, 0},
        {"type 2 with tag 78", 2, 78},
    };
    int got = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t l = req_msg(msg, bad[i].tag, G[bad_g].token, G[bad_g].key);
        msg[1] = bad[i].type;
        /* Whatever comes back under the tag (a GET's data or refusal) is
         * an answer the producer must not give. */
        long n = ask(e, bad[i].tag, msg, l, true, true, buf, sizeof buf, 300);
        printf("malformed decline of g%d (%s): got %ld\n", bad_g, bad[i].what, n);
        got += n != -2;
    }
    size_t l = req_msg(msg, 0, G[good_g].token, G[good_g].key);
    msg[1] = 1;
    am_send(e, msg, l, timeout_ms);
    printf("a well-formed decline of g%d: sent\n", good_g);
    ucs_status_t st;
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
    wait_req(ucp_ep_close_nbx(e, &cp), 1000, &st); /* a flush first: the decline leaves */
    ucp_worker_destroy(wk);
    ucp_cleanup(ctx);
    printf("bad-declines: %s\n", got ? "SOMETHING CAME BACK" : "nothing came back");
    return got ? 1 : 0;
}

static int mutate(const char *dir, const char *file, int count)
{
    if (load(file)) return 1;
    ecxi_data_meta m;
    if (ecxi_data_meta_decode(meta_b, meta_len, &m) || !m.has_ucx) return 1;
    uint8_t orig[64];
    size_t olen = m.ucx_addr_len < sizeof orig ? m.ucx_addr_len : sizeof orig;
    memcpy(orig, m.ucx_addr, olen);
    char inst[32];
    snprintf(inst, sizeof inst, "ucxm%d", (int)getpid());
    ecxi_region *r;
    if (ecxi_region_create_in(dir, inst, 0, (uint64_t)NB * BS, BS, &r)) return 1;
    ecxi_data_opts o = {.backend = ECX_DATA_UCX};
    ecxi_data *d;
    if (ecxi_data_new_consumer(r, &o, &d)) return 1;
    uint8_t db[ECXI_DATA_DESC_MAX];
    long dl = ecxi_hex_decode(G[0].desc_hex, strlen(G[0].desc_hex), db);
    ecxi_data_desc dd;
    if (dl < 0 || ecxi_data_desc_decode(db, (size_t)dl, &dd)) return 1;
    int refused = 0, added = 0;
    for (int i = 0; i < count; i++) {
        uint8_t blob[64];
        size_t len = olen;
        memcpy(blob, orig, olen);
        uint32_t how = randombytes_uniform(4);
        if (how == 0) { /* flip 1..4 bytes */
            for (uint32_t k = 0, n = 1 + randombytes_uniform(4); k < n; k++)
                blob[randombytes_uniform((uint32_t)len)] ^= (uint8_t)(1 + randombytes_uniform(255));
        } else if (how == 1) { /* truncate */
            len = 1 + randombytes_uniform((uint32_t)len);
        } else if (how == 2) { /* extend with junk */
            size_t extra = 1 + randombytes_uniform((uint32_t)(sizeof blob - len));
            randombytes_buf(blob + len, extra);
            len += extra;
        } else { /* random bytes of a random length */
            len = 1 + randombytes_uniform(sizeof blob);
            randombytes_buf(blob, len);
        }
        m.ucx_addr = blob;
        m.ucx_addr_len = len;
        uint8_t mb[ECXI_DATA_META_MAX];
        long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
        if (ml < 0) return 1;
        ecxi_data_peer *p;
        if (ecxi_data_peer_add(d, mb, (size_t)ml, &dd, &p) == 0) {
            added++;
            ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
            ecxi_data_peer_drop(p);
        } else {
            refused++;
        }
    }
    ecxi_data_free(d);
    ecxi_region_free(r);
    printf("mutated UCX metadata: %d refused, %d registered (a well-formed address), no crash\n",
           refused, added);
    return 0;
}

/* ---- raw UCT ------------------------------------------------------------- */

static int uct_put(const char *file, int port, int block)
{
    if (load(file)) return 1;
    uct_component_h *comps;
    unsigned nc;
    if (uct_query_components(&comps, &nc) != UCS_OK) return 1;
    for (unsigned c = 0; c < nc; c++) {
        uct_component_attr_t ca = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME |
                                                 UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        uct_component_query(comps[c], &ca);
        if (strcmp(ca.name, "tcp") || ca.md_resource_count < 1) continue;
        uct_md_resource_desc_t mrd[8];
        ca.md_resources = mrd;
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        uct_component_query(comps[c], &ca);
        uct_md_config_t *mc;
        uct_md_h md;
        ucs_async_context_t *async;
        uct_worker_h w;
        uct_iface_config_t *ic;
        uct_iface_h ifc;
        if (uct_md_config_read(comps[c], NULL, NULL, &mc) != UCS_OK ||
            uct_md_open(comps[c], mrd[0].md_name, mc, &md) != UCS_OK ||
            ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async) != UCS_OK ||
            uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &w) != UCS_OK ||
            uct_md_iface_config_read(md, "tcp", NULL, NULL, &ic) != UCS_OK)
            return 1;
        uct_iface_params_t ip = {.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE,
                                 .open_mode = UCT_IFACE_OPEN_MODE_DEVICE,
                                 .mode.device = {.tl_name = "tcp", .dev_name = "lo"}};
        if (uct_iface_open(md, w, &ip, ic, &ifc) != UCS_OK) return 1;
        uct_iface_progress_enable(ifc, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
        uint8_t dev[256], ifa[64];
        if (uct_iface_get_device_address(ifc, (void *)dev) != UCS_OK ||
            uct_iface_get_address(ifc, (void *)ifa) != UCS_OK)
            return 1;
        uint16_t p = htons((uint16_t)port); /* the victim's tcp iface port */
        memcpy(ifa, &p, 2);
        uct_ep_params_t ep = {.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                                            UCT_EP_PARAM_FIELD_IFACE_ADDR,
                              .iface = ifc,
                              .dev_addr = (void *)dev,
                              .iface_addr = (void *)ifa};
        uct_ep_h e;
        if (uct_ep_create(&ep, &e) != UCS_OK) return 1;
        static uint64_t mark = 0x4e574f5044454e57ull;
        uct_iov_t iov = {.buffer = &mark, .length = 8, .memh = UCT_MEM_HANDLE_NULL, .count = 1};
        uint64_t addr = base_addr + (uint64_t)block * BS;
        ucs_status_t st;
        int64_t end = ecxi_now_ms(NULL) + 3000;
        do {
            st = uct_ep_put_zcopy(e, &iov, 1, addr, 0, NULL);
            uct_worker_progress(w);
        } while (st == UCS_ERR_NO_RESOURCE && ecxi_now_ms(NULL) < end);
        end = ecxi_now_ms(NULL) + 1000;
        while (ecxi_now_ms(NULL) < end) uct_worker_progress(w);
        printf("uct put_zcopy at block %d: %s\n", block, ucs_status_string(st));
        return 0;
    }
    return 1;
}

#endif /* ECX_WITH_UCX */

/* ---- the tcp path, spoken by hand ---------------------------------------- */

#define TREQ_HEAD 28 /* data_tcp.c's request head */

static int tcp_dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* A request: version, 'G', id, token, key_len, key. Its length. */
static size_t treq(uint8_t *b, uint8_t version, uint64_t id, const uint8_t *token, const char *key,
                   size_t kl)
{
    b[0] = version, b[1] = 'G';
    for (int i = 0; i < 8; i++) b[2 + i] = (uint8_t)(id >> (8 * i));
    memcpy(b + 10, token, ECXI_DATA_TOKEN_LEN);
    b[26] = (uint8_t)kl, b[27] = (uint8_t)(kl >> 8);
    if (key) memcpy(b + TREQ_HEAD, key, kl);
    return TREQ_HEAD + (key ? kl : 0);
}

static bool send_all(int fd, const void *b, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t s = send(fd, (const uint8_t *)b + off, n - off, MSG_NOSIGNAL);
        if (s <= 0) return false;
        off += (size_t)s;
    }
    return true;
}

/* Read up to n bytes within ms; how many came (fewer: closed or late). */
static size_t read_n(int fd, void *buf, size_t n, int ms)
{
    size_t got = 0;
    int64_t end = ecxi_now_ms(NULL) + ms;
    while (got < n) {
        int64_t left = end - ecxi_now_ms(NULL);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) break;
        ssize_t r = recv(fd, (uint8_t *)buf + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* Wait up to ms for fd to be closed by the producer: the ms it took, or -1.
 * Bytes that arrive instead are added to *leak. */
static int64_t closed_after(int fd, int ms, uint64_t *leak)
{
    int64_t t0 = ecxi_now_ms(NULL), end = t0 + ms;
    uint8_t b[4096];
    for (;;) {
        int64_t left = end - ecxi_now_ms(NULL);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) return -1;
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r > 0) {
            *leak += (uint64_t)r;
            continue;
        }
        if (r == 0 || errno == ECONNRESET) return ecxi_now_ms(NULL) - t0;
    }
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* One request on fd, expecting a refusal: true if refused, with our id. */
static bool refused(int fd, uint8_t version, uint64_t id, const uint8_t *token, const char *key)
{
    uint8_t b[TREQ_HEAD + ECXI_DATA_NOTIF_MAX], r[9];
    size_t n = treq(b, version, id, token, key, strlen(key));
    return send_all(fd, b, n) && read_n(fd, r, 9, 3000) == 9 && le64(r) == id && r[8] == 1;
}

static int tcp_attack(const char *file)
{
    if (load(file)) return 1;
    ecxi_data_meta m;
    if (ecxi_data_meta_decode(meta_b, meta_len, &m) || !m.has_tcp) return 1;
    const grant *g5 = &G[5];
    uint8_t wrong[ECXI_DATA_TOKEN_LEN];
    memcpy(wrong, g5->token, sizeof wrong);
    wrong[0] ^= 1;
    int bad = 0;
#define CHECK(c, ...) \
    do { \
        bool ok_ = (c); \
        printf("%s ", ok_ ? "ok  " : "FAIL"); \
        printf(__VA_ARGS__); \
        printf("\n"); \
        bad += !ok_; \
    } while (0)
    int fd = tcp_dial(m.tcp_port);
    if (fd < 0) return perror("connect"), 1;
    CHECK(refused(fd, 1, 1, wrong, g5->key), "g5's key with a wrong token: refused");
    CHECK(refused(fd, 1, 2, g5->token, G[6].key), "g6's key with g5's token: refused");
    /* g5 itself: served once, byte-exact. */
    uint8_t b[TREQ_HEAD + 1024], h[17];
    size_t n = treq(b, 1, 3, g5->token, g5->key, strlen(g5->key));
    bool ok = send_all(fd, b, n) && read_n(fd, h, 17, 3000) == 17 && le64(h) == 3 && h[8] == 0 &&
              le64(h + 9) == g5->nbytes;
    uint8_t *item = malloc(g5->nbytes);
    ok = ok && read_n(fd, item, g5->nbytes, 5000) == g5->nbytes;
    for (uint64_t j = 0; ok && j < g5->nbytes; j++) ok = item[j] == pat(g5->blocks[0] * BS + j);
    free(item);
    CHECK(ok, "g5 with its token: served, %" PRIu64 " bytes, byte-exact", g5->nbytes);
    CHECK(refused(fd, 1, 4, g5->token, g5->key), "g5 replayed: refused (claimed once)");
    close(fd);

    /* Malformed requests close the connection, and nothing comes back. */
    static const struct {
        const char *what;
        uint8_t version;
        size_t kl;
    } garbage[] = {{"an HTTP request", 0, 0},
                   {"version 9", 9, 5},
                   {"a key length of 0", 1, 0},
                   {"a key length of 600 (over the limit)", 1, 600},
                   {"a key length of 65535", 1, 65535}};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        uint64_t leak = 0;
        fd = tcp_dial(m.tcp_port);
        if (garbage[i].version == 0) {
            static const char http[] = "GET / HTTP/1.0\r\n\r\n";
            send_all(fd, http, sizeof http - 1);
        } else {
            n = treq(b, garbage[i].version, 5, g5->token, NULL, garbage[i].kl);
            send_all(fd, b, n);
        }
        int64_t ms = closed_after(fd, 3000, &leak);
        CHECK(ms >= 0 && leak == 0, "%s: closed after %" PRId64 " ms, %" PRIu64 " bytes back",
              garbage[i].what, ms, leak);
        close(fd);
    }
    /* Half a request, then silence: closed after the request timeout. */
    {
        uint64_t leak = 0;
        fd = tcp_dial(m.tcp_port);
        n = treq(b, 1, 6, g5->token, G[7].key, strlen(G[7].key));
        send_all(fd, b, 20);
        int64_t ms = closed_after(fd, 12000, &leak);
        CHECK(ms >= 3000 && leak == 0, "half a request, then silence: closed after %" PRId64 " ms",
              ms);
        close(fd);
    }
    /* 2000 requests at once: wrong tokens, other keys, g5 again. */
    {
        enum { FLOOD = 2000 };
        fd = tcp_dial(m.tcp_port);
        size_t cap = FLOOD * (TREQ_HEAD + 64), len = 0;
        uint8_t *fl = malloc(cap);
        for (int i = 0; i < FLOOD; i++) {
            const grant *g = &G[i % NG];
            uint8_t tok[ECXI_DATA_TOKEN_LEN];
            memcpy(tok, i % 3 == 0 ? g5->token : g->token, sizeof tok);
            if (i % 3 != 0) tok[i % ECXI_DATA_TOKEN_LEN] ^= 0x80;
            const char *key = i % 3 == 0 ? g5->key : g->key;
            len += treq(fl + len, 1, 1000 + (uint64_t)i, tok, key, strlen(key));
        }
        bool sent = send_all(fd, fl, len);
        size_t want = (size_t)FLOOD * 9;
        uint8_t *rep = malloc(want + 1);
        size_t got = read_n(fd, rep, want + 1, 10000);
        int refusals = 0;
        for (int i = 0; i < FLOOD && (size_t)(i + 1) * 9 <= got; i++)
            refusals += le64(rep + 9 * i) == 1000 + (uint64_t)i && rep[9 * i + 8] == 1;
        CHECK(sent && got == want && refusals == FLOOD,
              "%d pipelined requests: %d refusals, %zu bytes back (want %zu)", FLOOD, refusals,
              got, want);
        free(fl);
        free(rep);
        close(fd);
    }
    /* 100 connections from one address: at most 32 held. */
    {
        enum { MANY = 100 };
        usleep(300000); /* the producer notices the closes above */
        int fds[MANY], open_ = 0, shut = 0;
        for (int i = 0; i < MANY; i++) fds[i] = tcp_dial(m.tcp_port);
        usleep(500000);
        for (int i = 0; i < MANY; i++) {
            uint64_t leak = 0;
            if (fds[i] < 0 || closed_after(fds[i], 1, &leak) >= 0)
                shut++;
            else
                open_++;
            if (fds[i] >= 0) close(fds[i]);
        }
        CHECK(open_ <= 32 && open_ > 0 && shut >= MANY - 32,
              "%d connections at once: %d held, %d closed", MANY, open_, shut);
    }
    printf("%s\n", bad ? "the attacker got something, or a bound did not hold" : "attacker got only g5, once");
    return bad ? 1 : 0;
#undef CHECK
}

/* A hostile tcp producer: what its reply does to one READ. */
enum evil { E_GOOD, E_WRONG_ID, E_BIG, E_STATUS, E_SHORT, E_STALL, E_TRAILING };

static const struct {
    const char *what;
    enum evil how;
    int expect;
} evil_cases[] = {
    {"a good reply", E_GOOD, ECXI_XFER_DONE},
    {"a reply with another xfer id", E_WRONG_ID, ECXI_XFER_FAILED},
    {"a good reply", E_GOOD, ECXI_XFER_DONE},
    {"nbytes one more than the ticket's", E_BIG, ECXI_XFER_FAILED},
    {"a status that is not 0 / 1", E_STATUS, ECXI_XFER_FAILED},
    {"half the bytes, then close", E_SHORT, ECXI_XFER_FAILED},
    {"1000 bytes, then a stall past the lease", E_STALL, ECXI_XFER_FAILED},
    {"a good reply with 100 bytes more", E_TRAILING, ECXI_XFER_DONE},
    {"a good reply", E_GOOD, ECXI_XFER_DONE},
};
#define EVIL_N (sizeof evil_cases / sizeof evil_cases[0])
static const uint64_t evil_remote[3] = {1, 2, 7}, evil_local[3] = {10, 20, 21};
#define EVIL_NBYTES (2 * (uint64_t)BS + 100)

/* The next request's xfer id, from *cfd or, when it closes, a new
 * connection on lfd; false if none comes. */
static bool evil_next(int lfd, int *cfd, uint64_t *id)
{
    for (int tries = 0; tries < 4; tries++) {
        if (*cfd < 0 && (*cfd = accept(lfd, NULL, NULL)) < 0) return false;
        uint8_t h[TREQ_HEAD], key[ECXI_DATA_NOTIF_MAX];
        if (read_n(*cfd, h, TREQ_HEAD, 15000) == TREQ_HEAD) {
            size_t kl = (size_t)h[26] | (size_t)h[27] << 8;
            if (kl <= sizeof key && read_n(*cfd, key, kl, 5000) == kl) {
                *id = le64(h + 2);
                return true;
            }
        }
        close(*cfd);
        *cfd = -1;
    }
    return false;
}

static void evil_serve(int lfd)
{
    alarm(90);
    uint8_t *body = malloc(EVIL_NBYTES + 100);
    for (uint64_t j = 0; j < EVIL_NBYTES + 100; j++)
        body[j] = j < EVIL_NBYTES ? pat(evil_remote[j / BS] * BS + j % BS) : 0x5a;
    int cfd = -1, stalled = -1;
    for (size_t c = 0; c < EVIL_N; c++) {
        uint64_t id;
        if (!evil_next(lfd, &cfd, &id)) break;
        enum evil how = evil_cases[c].how;
        uint8_t h[17];
        uint64_t nb = how == E_BIG ? EVIL_NBYTES + 1 : EVIL_NBYTES;
        for (int i = 0; i < 8; i++) {
            h[i] = (uint8_t)((how == E_WRONG_ID ? id ^ 1 : id) >> (8 * i));
            h[9 + i] = (uint8_t)(nb >> (8 * i));
        }
        h[8] = how == E_STATUS ? 7 : 0;
        send_all(cfd, h, 17);
        size_t len = how == E_SHORT ? EVIL_NBYTES / 2 : how == E_STALL ? 1000
                     : how == E_TRAILING || how == E_BIG ? EVIL_NBYTES + 100 : EVIL_NBYTES;
        send_all(cfd, body, len);
        if (how == E_SHORT || how == E_STALL) {
            if (how == E_STALL) stalled = cfd; /* held open, silent */
            else close(cfd);
            cfd = -1;
        }
    }
    if (stalled >= 0) close(stalled);
    free(body);
    _exit(0);
}

static int tcp_evil(const char *dir)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 8) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl))
        return perror("listen"), 1;
    pid_t child = fork();
    if (child == 0) evil_serve(lfd);
    close(lfd);
    ecxi_data_meta m = {.nonce = 42, .has_tcp = true, .tcp_family = 4, .tcp_port = ntohs(sa.sin_port)};
    memcpy(m.tcp_addr, &sa.sin_addr, 4);
    ecxi_data_desc dd = {.nonce = 42, .block_bytes = BS, .num_blocks = NB, .has_ticket = true};
    dd.ticket.nbytes = EVIL_NBYTES;
    ecxi_sum s;
    ecxi_sum_reset(&s);
    for (uint64_t j = 0; j < EVIL_NBYTES; j++) {
        uint8_t v = pat(evil_remote[j / BS] * BS + j % BS);
        ecxi_sum_update(&s, &v, 1);
    }
    dd.ticket.checksum = ecxi_sum_digest(&s);
    uint8_t mb[ECXI_DATA_META_MAX];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
    ecxi_region *r;
    char inst[32];
    snprintf(inst, sizeof inst, "tcpe%d", (int)getpid());
    if (ml < 0 || ecxi_region_create_in(dir, inst, 0, (uint64_t)NB * BS, BS, &r)) return 1;
    ecxi_data_opts o = {.backend = ECX_DATA_TCP};
    ecxi_data *d;
    ecxi_data_peer *p;
    dd.ticket.lease_ms = 10000;
    if (ecxi_data_new_consumer(r, &o, &d) || ecxi_data_peer_add(d, mb, (size_t)ml, &dd, &p))
        return fprintf(stderr, "consumer setup failed\n"), 1;
    uint8_t *lb = ecxi_region_base(r);
    int bad = 0;
    for (size_t c = 0; c < EVIL_N; c++) {
        memset(lb, 0xa5, ecxi_region_size(r));
        dd.ticket.lease_ms = evil_cases[c].how == E_STALL ? 1500 : 10000;
        ecxi_data_xfer *x;
        ecxi_block_run er[3], el[3];
        size_t ner = ecxi_block_runs_of(evil_remote, 3, er),
               nel = ecxi_block_runs_of(evil_local, 3, el);
        if (ecxi_data_read_post(p, &dd, er, ner, el, nel, EVIL_NBYTES, "evil:item", 9, &x))
            return fprintf(stderr, "read_post failed\n"), 1;
        int64_t t0 = ecxi_now_ms(NULL);
        int st;
        while ((st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < t0 + 10000) {
            ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
            wait_fd(d, 10);
        }
        ecxi_data_read_release(x);
        /* Let trailing bytes arrive before the next READ is posted. */
        for (int64_t e = ecxi_now_ms(NULL) + 200; ecxi_now_ms(NULL) < e;) {
            ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
            wait_fd(d, 10);
        }
        /* Outside the READ's bytes the guard is intact; a DONE is exact. */
        uint64_t outside = 0, wrong = 0;
        for (uint64_t i = 0; i < ecxi_region_size(r); i++) {
            uint64_t blk = i / BS, off = i % BS;
            int k = blk == 10 ? 0 : blk == 20 ? 1 : blk == 21 ? 2 : -1;
            bool inside = k >= 0 && (uint64_t)k * BS + off < EVIL_NBYTES;
            if (!inside)
                outside += lb[i] != 0xa5;
            else if (st == ECXI_XFER_DONE)
                wrong += lb[i] != pat(evil_remote[k] * BS + off);
        }
        bool ok = st == evil_cases[c].expect && !outside && !wrong;
        printf("%s %s: %s after %" PRId64 " ms, %" PRIu64 " bytes written outside, %" PRIu64
               " wrong inside\n",
               ok ? "ok  " : "FAIL", evil_cases[c].what, state_name(st), ecxi_now_ms(NULL) - t0,
               outside, wrong);
        bad += !ok;
    }
    ecxi_data_peer_drop(p);
    ecxi_data_free(d);
    ecxi_region_free(r);
    int ws;
    waitpid(child, &ws, 0);
    printf("%s\n", bad ? "the hostile producer got through" : "every hostile reply failed its READ, nothing written outside");
    return bad ? 1 : 0;
}

/* ---- a hostile UCX producer, and a connection flood (issue 20 #5) -------- */
#ifdef ECX_WITH_UCX

static volatile int evil_out; /* sends in flight */
static bool evil_ep_failed;
#define EVIL_EPS 64
static struct {
    ucp_listener_h l;
    ucp_worker_h w;
    ucp_ep_h eps[EVIL_EPS];
    int neps;
    ucp_ep_h req_ep; /* the consumer's request came on it */
    uint64_t tag;
    bool have_req;
} E;

static void evil_err(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg, (void)ep, (void)st;
    evil_ep_failed = true;
}

static void evil_conn(ucp_conn_request_h req, void *arg)
{
    (void)arg;
    if (E.neps == EVIL_EPS) {
        ucp_listener_reject(E.l, req);
        return;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .conn_request = req,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = evil_err}};
    if (ucp_ep_create(E.w, &ep, &E.eps[E.neps]) == UCS_OK) E.neps++;
}

static ucs_status_t evil_am(void *arg, const void *h, size_t hl, void *data, size_t len,
                            const ucp_am_recv_param_t *prm)
{
    (void)arg, (void)h, (void)hl;
    if (len >= 16 && (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && !E.have_req) {
        E.req_ep = prm->reply_ep;
        memcpy(&E.tag, (const uint8_t *)data + 8, 8); /* little-endian, as sent */
        E.have_req = true;
    }
    return UCS_OK;
}

static void evil_sent(void *req, ucs_status_t st, void *arg)
{
    (void)arg;
    if (st != UCS_OK) evil_ep_failed = true;
    ucp_request_free(req);
    evil_out--;
}

/* Keep what a nbx call returned in flight (at most 256 at once). */
static bool evil_track(void *r)
{
    if (UCS_PTR_IS_ERR(r)) {
        evil_ep_failed = true;
        return false;
    }
    if (r) evil_out++;
    while (evil_out >= 256 && !evil_ep_failed) ucp_worker_progress(E.w);
    return !evil_ep_failed;
}

/*   ucx_hostile evil-ucx FILE MODE SIZE SECONDS BLOCK_BYTES
 *     a hostile UCX producer on 127.0.0.1: writes "meta HEX", "desc HEX"
 *     (a grant of SIZE bytes in blocks of BLOCK_BYTES, the consumer's, so
 *     that it asks for the READ; random token and checksum) and "blocks N"
 *     (the grant's block count) to FILE, then answers the first READ request: MODE am-flood: active
 *     messages of every kind (random ids, headers, sizes, reply / eager /
 *     rendezvous flags) for SECONDS; eager-flood: 1 GiB of eager tagged
 *     messages (64 KiB) under random tags. Then a 0-byte reply under the
 *     request's tag, and it waits SECONDS for more requests (ignored).
 *     Prints what it sent. */
static int evil_ucx(const char *file, const char *mode, uint64_t size, int seconds,
                    uint64_t block)
{
    if (!block || size > (uint64_t)NB * block) return 2;
    bool eager = !strcmp(mode, "eager-flood");
    if (!eager && strcmp(mode, "am-flood")) return 2;
    if (eager) setenv("UCX_RNDV_THRESH", "inf", 1); /* every tagged send eager */
    ucp_context_h ctx;
    if (ucp_open(UCP_FEATURE_AM | UCP_FEATURE_TAG, &ctx, &E.w)) return 1;
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                 .id = AM_REQ_ID,
                                 .flags = UCP_AM_FLAG_WHOLE_MSG,
                                 .cb = evil_am};
    if (ucp_worker_set_am_recv_handler(E.w, &hp) != UCS_OK) return 1;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                                .conn_handler = {.cb = evil_conn}};
    if (ucp_listener_create(E.w, &lp, &E.l) != UCS_OK) return 1;
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (ucp_listener_query(E.l, &la) != UCS_OK) return 1;
    uint8_t addr[8] = {1, 4};
    memcpy(addr + 2, &((struct sockaddr_in *)&la.sockaddr)->sin_port, 2);
    memcpy(addr + 4, &sa.sin_addr, 4);
    ecxi_data_meta m = {.has_ucx = true, .ucx_addr = addr, .ucx_addr_len = 8};
    randombytes_buf(&m.nonce, sizeof m.nonce);
    ecxi_data_desc dd = {.nonce = m.nonce, .block_bytes = block, .num_blocks = NB,
                         .has_ticket = true, .ticket = {.nbytes = size, .lease_ms = 30000}};
    randombytes_buf(dd.ticket.token, sizeof dd.ticket.token);
    randombytes_buf(&dd.ticket.checksum, sizeof dd.ticket.checksum);
    uint8_t mb[ECXI_DATA_META_MAX], db[ECXI_DATA_DESC_MAX];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb), dl = ecxi_data_desc_encode(&dd, db, sizeof db);
    if (ml < 0 || dl < 0) return fprintf(stderr, "encode: %ld %ld\n", ml, dl), 1;
    char mh[2 * ECXI_DATA_META_MAX + 1], dh[2 * ECXI_DATA_DESC_MAX + 1], tmp[4096];
    ecxi_hex_encode(mb, (size_t)ml, mh);
    ecxi_hex_encode(db, (size_t)dl, dh);
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f) return perror(tmp), 1;
    fprintf(f, "meta %s\ndesc %s\nblocks %llu\n", mh, dh,
            (unsigned long long)((size + block - 1) / block));
    fclose(f);
    if (rename(tmp, file)) return perror("rename"), 1;
    printf("evil producer ready\n");
    int64_t end = ecxi_now_ms(NULL) + 60000;
    while (!E.have_req && ecxi_now_ms(NULL) < end) {
        ucp_worker_progress(E.w);
        usleep(100);
    }
    if (!E.have_req) return printf("no request came\n"), 1;
    static uint8_t buf[256 << 10];
    randombytes_buf(buf, sizeof buf);
    uint64_t sent = 0, msgs = 0;
    int64_t stop = ecxi_now_ms(NULL) + (int64_t)seconds * 1000;
    while (!evil_ep_failed && ecxi_now_ms(NULL) < stop) {
        void *r;
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                  UCP_OP_ATTR_FIELD_FLAGS,
                                  .cb.send = evil_sent};
        size_t len;
        if (eager) {
            if (sent >= (1ull << 30)) break;
            uint64_t t;
            do randombytes_buf(&t, sizeof t); while (t == E.tag);
            len = 64 << 10;
            rp.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FIELD_FLAGS;
            r = ucp_tag_send_nbx(E.req_ep, buf, len, t, &rp);
        } else {
            uint32_t x = randombytes_random();
            static const uint32_t fl[] = {0, UCP_AM_SEND_FLAG_REPLY, UCP_AM_SEND_FLAG_EAGER,
                                          UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                                          UCP_AM_SEND_FLAG_RNDV,
                                          UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_RNDV};
            rp.flags = fl[x % 6];
            unsigned id = (x >> 3) % 4 == 0 ? AM_REQ_ID : (x >> 5) & 0xffff;
            size_t hl = (x >> 21) % 4 == 0 ? (x >> 23) % 64 : 0;
            len = (x >> 25) % 4 == 0 ? sizeof buf : (x >> 27) % 2 ? 16 : randombytes_uniform(9000);
            r = ucp_am_send_nbx(E.req_ep, id, buf, hl, buf, len, &rp);
        }
        if (!evil_track(r)) break;
        sent += len;
        msgs++;
    }
    int64_t drain = ecxi_now_ms(NULL) + 5000;
    while (evil_out > 0 && !evil_ep_failed && ecxi_now_ms(NULL) < drain) ucp_worker_progress(E.w);
    printf("%s: %" PRIu64 " messages, %" PRIu64 " MiB sent%s\n", mode, msgs, sent >> 20,
           evil_ep_failed ? " (the consumer's connection failed)" : "");
    if (!evil_ep_failed) {
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = evil_sent};
        evil_track(ucp_tag_send_nbx(E.req_ep, buf, 0, E.tag, &rp));
    }
    end = ecxi_now_ms(NULL) + (int64_t)seconds * 1000;
    while (ecxi_now_ms(NULL) < end) {
        ucp_worker_progress(E.w);
        usleep(200);
    }
    return 0; /* the process exit closes everything */
}

/*   ucx_hostile conns META_HEX N ROUNDS
 *     N UCX connections from one address (127.0.0.1) at the producer whose
 *     agent_metadata is META_HEX, held 2 s, then all force-closed; ROUNDS
 *     times. Prints how many connected and failed per round. */
static int conns(const char *meta_hex, int n, int rounds)
{
    static uint8_t mb[ECXI_DATA_META_MAX];
    long ml = ecxi_hex_decode(meta_hex, strlen(meta_hex), mb);
    ecxi_data_meta m;
    if (ml <= 0 || ecxi_data_meta_decode(mb, (size_t)ml, &m) || !m.has_ucx || m.ucx_addr_len != 8)
        return fprintf(stderr, "conns: no IPv4 UCX address in the metadata\n"), 1;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    memcpy(&sa.sin_port, m.ucx_addr + 2, 2);
    memcpy(&sa.sin_addr, m.ucx_addr + 4, 4);
    ucp_context_h ctx;
    ucp_worker_h w;
    if (ucp_open(UCP_FEATURE_AM | UCP_FEATURE_TAG, &ctx, &w)) return 1;
    ucp_ep_h *eps = calloc((size_t)n, sizeof *eps);
    if (!eps) return 1;
    for (int round = 0; round < rounds; round++) {
        int made = 0;
        evil_ep_failed = false;
        for (int i = 0; i < n; i++) {
            ucp_ep_params_t ep = {
                .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                .err_handler = {.cb = evil_err}};
            eps[i] = NULL;
            if (ucp_ep_create(w, &ep, &eps[i]) == UCS_OK) made++;
            ucp_worker_progress(w);
        }
        int64_t end = ecxi_now_ms(NULL) + 2000;
        while (ecxi_now_ms(NULL) < end) ucp_worker_progress(w);
        printf("round %d: %d of %d endpoints created%s\n", round + 1, made, n,
               evil_ep_failed ? ", some failed (refused)" : "");
        for (int i = 0; i < n; i++) {
            if (!eps[i]) continue;
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                       .flags = UCP_EP_CLOSE_FLAG_FORCE};
            void *r = ucp_ep_close_nbx(eps[i], &prm);
            if (r && !UCS_PTR_IS_ERR(r)) {
                int64_t e2 = ecxi_now_ms(NULL) + 100;
                while (ucp_request_check_status(r) == UCS_INPROGRESS && ecxi_now_ms(NULL) < e2)
                    ucp_worker_progress(w);
                if (ucp_request_check_status(r) != UCS_INPROGRESS) ucp_request_free(r);
            }
        }
    }
    return 0; /* the process exit closes the rest */
}
#endif /* ECX_WITH_UCX */

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (sodium_init() < 0) return 1;
    if (argc == 5 && !strcmp(argv[1], "produce")) return produce(argv[2], argv[3], atoi(argv[4]));
    if (argc == 9 && !strcmp(argv[1], "consume"))
        return consume(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6], argv[7], atoi(argv[8]));
#ifdef ECX_WITH_UCX
    if (argc == 4 && !strcmp(argv[1], "attack")) return attack(argv[2], atoi(argv[3]));
    if (argc == 6 && !strcmp(argv[1], "bad-declines"))
        return bad_declines(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 5 && !strcmp(argv[1], "mutate")) return mutate(argv[2], argv[3], atoi(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "uct-put")) return uct_put(argv[2], atoi(argv[3]), atoi(argv[4]));
#endif
    if (argc == 3 && !strcmp(argv[1], "tcp-attack")) return tcp_attack(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "tcp-evil")) return tcp_evil(argv[2]);
#ifdef ECX_WITH_UCX
    if (argc == 7 && !strcmp(argv[1], "evil-ucx"))
        return evil_ucx(argv[2], argv[3], strtoull(argv[4], NULL, 10), atoi(argv[5]),
                        strtoull(argv[6], NULL, 10));
    if (argc == 5 && !strcmp(argv[1], "conns")) return conns(argv[2], atoi(argv[3]), atoi(argv[4]));
#endif
    fprintf(stderr, "usage: see the top of tests/support/ucx_hostile.c\n");
    return 2;
}
