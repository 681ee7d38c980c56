/* ucx_hostile — the UCX data path against well-behaved and hostile peers,
 * each side in its own process (driven by test_ucx_hostile.sh). The
 * producer publishes its agent_metadata and a set of grants (key, token,
 * blocks, descriptor) in a file, the way acks would carry them; a
 * consumer or an attacker reads what it needs from there (an attacker is
 * given every address too: the worst case, ASLR assumed known).
 *
 *   ucx_hostile produce DIR FILE TIMEOUT_MS
 *     region of NB blocks in DIR with a known pattern, UCX producer bound
 *     to 127.0.0.1, grants g0..g(NG-1); serve until SIGTERM or timeout;
 *     print every notification, then which blocks differ from the pattern
 *     ("region intact" if none). Exit 0, or 1 on setup errors.
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
 *     with a wrong token, another grant's key, a replayed token, and
 *     garbage. Exit 0 if it obtained nothing but g5 (once).
 *   ucx_hostile mutate DIR FILE N
 *     a hostile producer's acks (issue 10 #3): N agent_metadata whose UCX
 *     bytes are mutated (flipped, truncated, extended, random) but carry a
 *     valid digest, each registered and dropped by a consumer. Exit 0 if
 *     every one was refused or registered without a crash; prints counts.
 *   ucx_hostile uct-put FILE PORT BLOCK
 *     raw UCT tcp put of 8 bytes at the producer's block BLOCK, to its tcp
 *     interface port PORT (a UCX 1.13 hole: see data_ucx.c). Prints what
 *     UCT said.
 * Every wait is bounded.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
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
    uint8_t token[ECX_DATA_TOKEN_LEN];
    uint64_t blocks[NB];
    size_t n;
    uint64_t nbytes;
    bool claimed, released;
    char desc_hex[2 * ECX_DATA_DESC_MAX + 1];
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

static volatile sig_atomic_t stop;
static void on_term(int s)
{
    (void)s;
    stop = 1;
}

static int grant_fn(void *arg, const char *key, size_t key_len, const uint8_t *token, int flags,
                    ecx_data_grant *out)
{
    (void)arg;
    for (int i = 0; i < NG; i++) {
        grant *g = &G[i];
        if (strlen(g->key) != key_len || memcmp(g->key, key, key_len)) continue;
        if (g->released || sodium_memcmp(g->token, token, ECX_DATA_TOKEN_LEN)) return ECX_EDATA_GRANT;
        if ((flags & ECX_DATA_GRANT_CLAIM) && g->claimed) return ECX_EDATA_GRANT;
        if (flags & ECX_DATA_GRANT_CLAIM) g->claimed = true;
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
            !sodium_memcmp(G[i].token, token, ECX_DATA_TOKEN_LEN))
            G[i].released = true;
    printf("notif %s status %d\n", key, status);
    fflush(stdout);
}

static void wait_fd(ecx_data *d, int ms)
{
    int fd = ecx_data_fd(d);
    if (fd < 0 || ecx_data_arm(d) != 0) return;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    (void)poll(&p, 1, ms);
}

static int produce(const char *dir, const char *file, int timeout_ms)
{
    ecx_region *r;
    int rc = ecx_region_create_in(dir, "ucxh", 0, (uint64_t)NB * BS, BS, &r);
    if (rc) return fprintf(stderr, "region: %s\n", ecx_strerror(rc)), 1;
    uint8_t *b = ecx_region_base(r);
    for (uint64_t i = 0; i < ecx_region_size(r); i++) b[i] = pat(i);
    /* Something secret on the heap, for the attacker to aim at. */
    char *secret = strdup("CURVE-SECRET-KEY-0123456789abcdef");
    ecx_data_opts o = {.backend = ECX_DATA_UCX, .bind_host = "127.0.0.1"};
    ecx_data *d;
    if ((rc = ecx_data_new_producer(r, &o, &d))) return fprintf(stderr, "producer: %s\n", ecx_strerror(rc)), 1;
    ecx_data_set_grant_fn(d, grant_fn, NULL);
    size_t ml;
    const uint8_t *meta = ecx_data_agent_metadata(d, &ml);
    char *hex = malloc(2 * ml + 1);
    ecx_hex_encode(meta, ml, hex);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f) return perror("fopen"), 1;
    ecx_data_meta m;
    if (ecx_data_meta_decode(meta, ml, &m) || !m.has_ucx || m.ucx_addr_len < 4) return 1;
    fprintf(f, "meta %s\nbase %" PRIxPTR " secret %" PRIxPTR "\nlistener %u\n", hex,
            (uintptr_t)b, (uintptr_t)secret, (unsigned)(m.ucx_addr[2] << 8 | m.ucx_addr[3]));
    free(hex);
    for (int i = 0; i < NG; i++) {
        grant *g = &G[i];
        shape(i, g);
        snprintf(g->key, sizeof g->key, "sess%d:item%d", i, i);
        randombytes_buf(g->token, sizeof g->token);
        ecx_data_ticket t = {.checksum = ecx_checksum_blocks(b, BS, g->blocks, g->n, g->nbytes),
                             .nbytes = g->nbytes,
                             .lease_ms = 30000};
        memcpy(t.token, g->token, sizeof t.token);
        uint8_t db[ECX_DATA_DESC_MAX];
        long dl = ecx_data_grant_descriptor(d, &t, db, sizeof db);
        if (dl < 0) return fprintf(stderr, "descriptor: %s\n", ecx_strerror((int)dl)), 1;
        ecx_hex_encode(db, (size_t)dl, g->desc_hex);
        char th[2 * ECX_DATA_TOKEN_LEN + 1];
        ecx_hex_encode(g->token, sizeof g->token, th);
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
    int64_t end = ecx_now_ms(NULL) + timeout_ms;
    while (!stop && ecx_now_ms(NULL) < end) {
        if ((rc = ecx_data_poll_notifs(d, on_notif, NULL)) < 0)
            fprintf(stderr, "poll_notifs: %s\n", ecx_strerror(rc));
        wait_fd(d, 50);
    }
    ecx_data_free(d);
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
    ecx_region_free(r);
    return 0;
}

/* ---- reading the file ---------------------------------------------------- */

static uint8_t meta_b[ECX_DATA_META_MAX];
static size_t meta_len;
static uintptr_t base_addr, secret_addr;

static int load(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) return perror(file), -1;
    static char line[3 * ECX_DATA_DESC_MAX + 4096];
    while (fgets(line, sizeof line, f)) {
        char *save, *w = strtok_r(line, " \n", &save);
        if (!w) continue;
        if (!strcmp(w, "meta")) {
            char *h = strtok_r(NULL, " \n", &save);
            meta_len = (size_t)ecx_hex_decode(h, strlen(h), meta_b);
        } else if (!strcmp(w, "base")) {
            base_addr = (uintptr_t)strtoull(strtok_r(NULL, " \n", &save), NULL, 16);
            strtok_r(NULL, " \n", &save);
            secret_addr = (uintptr_t)strtoull(strtok_r(NULL, " \n", &save), NULL, 16);
        } else if (!strcmp(w, "grant")) {
            int i = atoi(strtok_r(NULL, " \n", &save));
            if (i < 0 || i >= NG) continue;
            grant *g = &G[i];
            snprintf(g->key, sizeof g->key, "%s", strtok_r(NULL, " \n", &save));
            char *th = strtok_r(NULL, " \n", &save);
            ecx_hex_decode(th, strlen(th), g->token);
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
    return s == ECX_XFER_RUNNING  ? "timeout"
           : s == ECX_XFER_DONE   ? "done"
           : s == ECX_XFER_FAILED ? "failed"
                                  : "corrupt";
}

static int consume(const char *dir, const char *file, int first, int count, const char *layout,
                   const char *expect, int timeout_ms)
{
    if (load(file) || first < 0 || count < 1 || first + count > NG) return 1;
    char inst[32];
    snprintf(inst, sizeof inst, "ucxc%d", (int)getpid());
    ecx_region *r;
    int rc = ecx_region_create_in(dir, inst, 0, (uint64_t)NB * BS, BS, &r);
    if (rc) return fprintf(stderr, "region: %s\n", ecx_strerror(rc)), 1;
    memset(ecx_region_base(r), 0xee, ecx_region_size(r));
    ecx_data_opts o = {.backend = ECX_DATA_UCX};
    ecx_data *d;
    if ((rc = ecx_data_new_consumer(r, &o, &d))) return fprintf(stderr, "consumer: %s\n", ecx_strerror(rc)), 1;
    uint8_t db[ECX_DATA_DESC_MAX];
    long dl = ecx_hex_decode(G[first].desc_hex, strlen(G[first].desc_hex), db);
    ecx_data_peer *p;
    if ((rc = ecx_data_peer_add(d, meta_b, meta_len, db, (size_t)dl, &p)))
        return fprintf(stderr, "peer_add: %s\n", ecx_strerror(rc)), 1;
    ecx_data_xfer *x[NG];
    uint64_t local[NG][NB];
    for (int i = first; i < first + count; i++) {
        grant *g = &G[i];
        for (size_t k = 0; k < g->n; k++)
            local[i][k] = !strcmp(layout, "reverse") ? NB - 1 - g->blocks[k] : g->blocks[k];
        dl = ecx_hex_decode(g->desc_hex, strlen(g->desc_hex), db);
        rc = ecx_data_read_post(p, db, (size_t)dl, g->blocks, local[i], g->n, g->nbytes, g->key,
                                strlen(g->key), &x[i]);
        if (rc) return fprintf(stderr, "read_post g%d: %s\n", i, ecx_strerror(rc)), 1;
    }
    int64_t t0 = ecx_now_ms(NULL), end = t0 + timeout_ms;
    int st[NG], left = count;
    while (left && ecx_now_ms(NULL) < end) {
        ecx_data_progress(d);
        left = 0;
        for (int i = first; i < first + count; i++)
            left += (st[i] = ecx_data_read_poll(x[i])) == ECX_XFER_RUNNING;
        if (left) wait_fd(d, 20);
    }
    int bad = 0;
    const uint8_t *lb = ecx_region_base(r);
    for (int i = first; i < first + count; i++) {
        grant *g = &G[i];
        bool exact = st[i] == ECX_XFER_DONE;
        for (size_t k = 0; exact && k < g->n; k++) {
            uint64_t len = k + 1 < g->n ? BS : g->nbytes - (g->n - 1) * (uint64_t)BS;
            for (uint64_t j = 0; j < len && exact; j++)
                exact = lb[local[i][k] * BS + j] == pat(g->blocks[k] * BS + j);
        }
        printf("g%d %s%s after %" PRId64 " ms\n", i, state_name(st[i]),
               st[i] == ECX_XFER_DONE ? (exact ? " (byte-exact)" : " (BYTES DIFFER)") : "",
               ecx_now_ms(NULL) - t0);
        if ((strcmp(expect, "any") && strcmp(state_name(st[i]), expect)) ||
            (st[i] == ECX_XFER_DONE && !exact))
            bad++;
        ecx_data_read_release(x[i]);
    }
    ecx_data_peer_drop(p);
    ecx_data_free(d);
    ecx_region_free(r);
    return bad ? 2 : 0;
}

/* ---- the attacker ------------------------------------------------------- */

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
    int64_t end = ecx_now_ms(NULL) + ms;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && ecx_now_ms(NULL) < end)
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
    int64_t end = ecx_now_ms(NULL) + ms;
    while (got == -3 && ecx_now_ms(NULL) < end) ucp_worker_progress(wk);
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
    memcpy(m + 16, token, ECX_DATA_TOKEN_LEN);
    memcpy(m + 32, key, kl);
    return 32 + kl;
}

static int attack(const char *file, int timeout_ms)
{
    if (load(file)) return 1;
    ecx_data_meta m;
    if (ecx_data_meta_decode(meta_b, meta_len, &m) || !m.has_ucx || m.ucx_addr_len != 8) return 1;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    memcpy(&sa.sin_port, m.ucx_addr + 2, 2);
    memcpy(&sa.sin_addr, m.ucx_addr + 4, 4);
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return 1;
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_RMA};
    if (ucp_init(&pp, cfg, &ctx) != UCS_OK) return 1;
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(ctx, &wp, &wk) != UCS_OK) return 1;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof sa},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = noop_err}};
    ucp_ep_h e;
    if (ucp_ep_create(wk, &ep, &e) != UCS_OK) return 1;
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
    uint8_t msg[1024], bad[ECX_DATA_TOKEN_LEN];
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
    for (int i = 0; i < 2000; i++) {
        ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
        size_t l = req_msg(msg, 5000 + (uint64_t)i, bad, G[7].key);
        wait_req(ucp_am_send_nbx(e, AM_REQ_ID, NULL, 0, msg, l, &sp), timeout_ms, &st);
    }
    /* Collect the 0-byte refusals that came back (unexpected messages). */
    int64_t end = ecx_now_ms(NULL) + 500;
    while (ecx_now_ms(NULL) < end) ucp_worker_progress(wk);
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

static int mutate(const char *dir, const char *file, int count)
{
    if (load(file)) return 1;
    ecx_data_meta m;
    if (ecx_data_meta_decode(meta_b, meta_len, &m) || !m.has_ucx) return 1;
    uint8_t orig[64];
    size_t olen = m.ucx_addr_len < sizeof orig ? m.ucx_addr_len : sizeof orig;
    memcpy(orig, m.ucx_addr, olen);
    char inst[32];
    snprintf(inst, sizeof inst, "ucxm%d", (int)getpid());
    ecx_region *r;
    if (ecx_region_create_in(dir, inst, 0, (uint64_t)NB * BS, BS, &r)) return 1;
    ecx_data_opts o = {.backend = ECX_DATA_UCX};
    ecx_data *d;
    if (ecx_data_new_consumer(r, &o, &d)) return 1;
    uint8_t db[ECX_DATA_DESC_MAX];
    long dl = ecx_hex_decode(G[0].desc_hex, strlen(G[0].desc_hex), db);
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
        uint8_t mb[ECX_DATA_META_MAX];
        long ml = ecx_data_meta_encode(&m, mb, sizeof mb);
        if (ml < 0) return 1;
        ecx_data_peer *p;
        if (ecx_data_peer_add(d, mb, (size_t)ml, db, (size_t)dl, &p) == 0) {
            added++;
            ecx_data_progress(d);
            ecx_data_peer_drop(p);
        } else {
            refused++;
        }
    }
    ecx_data_free(d);
    ecx_region_free(r);
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
        int64_t end = ecx_now_ms(NULL) + 3000;
        do {
            st = uct_ep_put_zcopy(e, &iov, 1, addr, 0, NULL);
            uct_worker_progress(w);
        } while (st == UCS_ERR_NO_RESOURCE && ecx_now_ms(NULL) < end);
        end = ecx_now_ms(NULL) + 1000;
        while (ecx_now_ms(NULL) < end) uct_worker_progress(w);
        printf("uct put_zcopy at block %d: %s\n", block, ucs_status_string(st));
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (sodium_init() < 0) return 1;
    if (argc == 5 && !strcmp(argv[1], "produce")) return produce(argv[2], argv[3], atoi(argv[4]));
    if (argc == 9 && !strcmp(argv[1], "consume"))
        return consume(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6], argv[7], atoi(argv[8]));
    if (argc == 4 && !strcmp(argv[1], "attack")) return attack(argv[2], atoi(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "mutate")) return mutate(argv[2], argv[3], atoi(argv[4]));
    if (argc == 5 && !strcmp(argv[1], "uct-put")) return uct_put(argv[2], atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: see the top of tests/ucx_hostile.c\n");
    return 2;
}
