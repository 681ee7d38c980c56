/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_agent — a NIXL peer made with our own UCX (nixl_agent.h; the bytes
 * are docs/NIXL.md's, the codec nixl_format.c).
 */
#include "nixl_agent.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "data_impl.h"
#include "util.h"

/* NIXL's UCX backend: the notification's active-message id (NOTIF_STR). */
#define AM_NOTIF 0
/* The rkey UCX packs for memory no md registers (md_map 0, host memory):
 * UCX then emulates get over active messages (docs/NIXL.md §5). */
static const uint8_t SW_RKEY[9] = {0};
/* UCX parses worker addresses and rkeys without a length: it gets copies
 * followed by this many zero bytes, so a truncated one reads zeros, not
 * past the buffer. */
#define PAD 512
#define CLOSE_WAIT_MS 2000
/* A notification's serdes: magic, then name and text with their tags. */
#define NOTIF_BYTES (11 + 4 + 8 + ECXI_NIXL_NAME_MAX + 1 + 3 + 8 + ECXI_NIXL_MSG_MAX + 1)

typedef struct notif {
    char name[ECXI_NIXL_NAME_MAX + 1];
    char msg[ECXI_NIXL_MSG_MAX + 1];
} notif;

struct ecxi_nixl_agent {
    ucp_context_h ctx;
    ucp_worker_h worker;
    bool peer_ucx;     /* on the peers' own UCX (nixl_agent.h) */
    ucp_mem_h memh;    /* with peer_ucx: the offered range's registration */
    void *rkey;        /* and its packed rkey */
    int efd;
    char name[ECXI_NIXL_NAME_MAX + 1];
    size_t name_len;
    uint8_t *meta;
    size_t meta_len;
    notif *q; /* ring of ECXI_NIXL_NOTIF_QUEUE */
    size_t q_head, q_len;
    uint64_t dropped;
};

struct ecxi_nixl_remote {
    ecxi_nixl_agent *a;
    uint8_t *md; /* our copy of the metadata; m's views point into it */
    ecxi_nixl_meta m;
    char name[ECXI_NIXL_NAME_MAX + 1];
    ucp_ep_h ep;
    ucp_rkey_h rkey[ECXI_NIXL_REGS_MAX];
    bool broken;
    bool dropped; /* kept, without endpoint, until its last READ is released */
    size_t reads;
};

enum { ST_FLUSH, ST_NOTIF, ST_DONE };

struct ecxi_nixl_read {
    ecxi_nixl_remote *r;
    int stage, status;
    void *req; /* the flush's, then the notification's */
    uint8_t notif[NOTIF_BYTES];
    size_t notif_len;
};

static int ucx_fail(const char *what, ucs_status_t st)
{
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: %s: %s", what, ucs_status_string(st));
    return ECX_EDATA_UCX;
}

/* The notification handler: a bounded copy into the queue, nothing else. */
static ucs_status_t am_notif(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    ecxi_nixl_agent *a = arg;
    const char *nm, *msg;
    size_t nl, ml;
    /* NIXL sends notifications eager and without a header; a rendezvous
     * one's data is not here (returning UCS_OK lets UCX drop it). */
    if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        ecxi_nixl_notif_decode(data, length, &nm, &nl, &msg, &ml) != 0 ||
        a->q_len == ECXI_NIXL_NOTIF_QUEUE) {
        a->dropped++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: notification dropped (malformed or queue full)");
        return UCS_OK;
    }
    notif *n = &a->q[(a->q_head + a->q_len++) % ECXI_NIXL_NOTIF_QUEUE];
    memcpy(n->name, nm, nl);
    n->name[nl] = 0;
    memcpy(n->msg, msg, ml);
    n->msg[ml] = 0;
    return UCS_OK;
}

static int setup(ecxi_nixl_agent *a)
{
    ecxi_data_ucx_log_setup();
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return ucx_fail("config_read", st);
    /* On our own UCX, tcp only (docs/NIXL.md §5), unless the operator chose. */
    if (!a->peer_ucx && !getenv("UCX_TLS") && (st = ucp_config_modify(cfg, "TLS", "tcp")) != UCS_OK) {
        ucp_config_release(cfg);
        return ucx_fail("config_modify", st);
    }
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
    };
    st = ucp_init(&p, cfg, &a->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return ucx_fail("init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(a->ctx, &wp, &a->worker)) != UCS_OK)
        return ucx_fail("worker_create", st);
    if ((st = ucp_worker_get_efd(a->worker, &a->efd)) != UCS_OK)
        return ucx_fail("worker_get_efd", st);
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = AM_NOTIF,
        .cb = am_notif,
        .arg = a,
    };
    if ((st = ucp_worker_set_am_recv_handler(a->worker, &hp)) != UCS_OK)
        return ucx_fail("set_am_recv_handler", st);
    return 0;
}

static int make_meta(ecxi_nixl_agent *a, const void *base, size_t len)
{
    ucp_address_t *addr;
    size_t alen;
    ucs_status_t st = ucp_worker_get_address(a->worker, &addr, &alen);
    if (st != UCS_OK) return ucx_fail("worker_get_address", st);
    ecxi_nixl_meta m = {.name = a->name, .name_len = a->name_len, .nregs = 1};
    m.ucx_addr = (const uint8_t *)addr, m.ucx_addr_len = alen;
    m.regs[0] = (ecxi_nixl_reg){(uintptr_t)base, len, 0, SW_RKEY, sizeof SW_RKEY};
    if (a->peer_ucx) { /* the peers' UCX unpacks our rkey: a real one, read-only */
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                          UCP_MEM_MAP_PARAM_FIELD_PROT,
            .address = (void *)base,
            .length = len,
            .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ,
        };
        size_t klen;
        if ((st = ucp_mem_map(a->ctx, &mp, &a->memh)) != UCS_OK ||
            (st = ucp_rkey_pack(a->ctx, a->memh, &a->rkey, &klen)) != UCS_OK) {
            ucp_worker_release_address(a->worker, addr);
            return ucx_fail(a->memh ? "rkey_pack" : "mem_map", st);
        }
        m.regs[0].rkey = a->rkey, m.regs[0].rkey_len = klen;
    }
    size_t cap = 1024 + alen + a->name_len;
    int rc = ECX_ENOMEM;
    if ((a->meta = malloc(cap))) {
        long k = ecxi_nixl_meta_encode(&m, a->meta, cap);
        rc = k < 0 ? (int)k : 0;
        a->meta_len = k < 0 ? 0 : (size_t)k;
    }
    ucp_worker_release_address(a->worker, addr);
    return rc;
}

int ecxi_nixl_agent_new(const char *name, const void *base, size_t len, bool peer_ucx,
                        ecxi_nixl_agent **out)
{
    if (!out || !name || !*name || strlen(name) > ECXI_NIXL_NAME_MAX || (len && !base))
        return ECX_EINVAL;
    *out = NULL;
    ecxi_nixl_agent *a = calloc(1, sizeof *a);
    if (!a || !(a->q = calloc(ECXI_NIXL_NOTIF_QUEUE, sizeof *a->q))) {
        free(a);
        return ECX_ENOMEM;
    }
    a->efd = -1;
    a->peer_ucx = peer_ucx;
    a->name_len = strlen(name);
    memcpy(a->name, name, a->name_len);
    int rc = setup(a);
    if (!rc && len) rc = make_meta(a, base, len);
    if (rc) {
        ecxi_nixl_agent_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void ecxi_nixl_agent_free(ecxi_nixl_agent *a)
{
    if (!a) return;
    if (a->rkey) ucp_rkey_buffer_release(a->rkey);
    if (a->memh) ucp_mem_unmap(a->ctx, a->memh);
    if (a->worker) ucp_worker_destroy(a->worker);
    if (a->ctx) ucp_cleanup(a->ctx);
    free(a->meta);
    free(a->q);
    free(a);
}

const uint8_t *ecxi_nixl_agent_metadata(const ecxi_nixl_agent *a, size_t *len)
{
    *len = a->meta_len;
    return a->meta;
}

int ecxi_nixl_agent_fd(const ecxi_nixl_agent *a)
{
    return a->efd;
}

int ecxi_nixl_agent_arm(ecxi_nixl_agent *a)
{
    if (a->q_len) return 1;
    ucs_status_t st = ucp_worker_arm(a->worker);
    return st == UCS_OK ? 0 : st == UCS_ERR_BUSY ? 1 : ucx_fail("worker_arm", st);
}

int ecxi_nixl_agent_progress(ecxi_nixl_agent *a)
{
    int n = 0;
    for (int i = 0; i < 64 && ucp_worker_progress(a->worker); i++)
        n++;
    return n;
}

bool ecxi_nixl_agent_wait(ecxi_nixl_agent *a, bool (*cond)(void *), void *arg, int timeout_ms)
{
    int64_t end = ecxi_now_ms(NULL) + timeout_ms;
    for (;;) {
        ecxi_nixl_agent_progress(a);
        if (cond(arg)) return true;
        int64_t left = end - ecxi_now_ms(NULL);
        if (left <= 0) return false;
        if (ecxi_nixl_agent_arm(a) == 0) {
            struct pollfd p = {.fd = a->efd, .events = POLLIN};
            (void)poll(&p, 1, left > 10 ? 10 : (int)left);
        }
    }
}

int ecxi_nixl_agent_notif_pop(ecxi_nixl_agent *a, char *name, char *msg)
{
    if (!a->q_len) return 0;
    notif *n = &a->q[a->q_head];
    memcpy(name, n->name, strlen(n->name) + 1);
    memcpy(msg, n->msg, strlen(n->msg) + 1);
    a->q_head = (a->q_head + 1) % ECXI_NIXL_NOTIF_QUEUE;
    a->q_len--;
    return 1;
}

uint64_t ecxi_nixl_agent_notifs_dropped(const ecxi_nixl_agent *a)
{
    return a->dropped;
}

/* ---- remote agents ------------------------------------------------------ */

static void remote_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    ecxi_nixl_remote *r = arg;
    r->broken = true;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "nixl: connection to %s failed: %s", r->name,
                        ucs_status_string(status));
}

/* A zero-padded copy of a blob UCX parses without a length. */
static uint8_t *padded(const uint8_t *b, size_t n)
{
    uint8_t *c = calloc(1, n + PAD);
    if (c) memcpy(c, b, n);
    return c;
}

/* An endpoint from m's worker address and its rkeys unpacked. UCS_OK, or
 * the failing step in *what. */
static ucs_status_t open_ucx(const ecxi_nixl_agent *a, const ecxi_nixl_meta *m,
                             ucp_err_handler_cb_t cb, void *arg, ucp_ep_h *ep, ucp_rkey_h *rkey,
                             const char **what)
{
    *what = "ep_create";
    uint8_t *addr = padded(m->ucx_addr, m->ucx_addr_len);
    if (!addr) return UCS_ERR_NO_MEMORY;
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)addr,
        /* On the peers' UCX, no peer failure handling (NIXL's UCX backend
         * offers both modes): that is what lets UCX pick its shared-memory
         * transports (a failure may then end this process: the library
         * starts another). */
        .err_mode = a->peer_ucx ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = cb, .arg = arg},
    };
    ucs_status_t st = ucp_ep_create(a->worker, &p, ep);
    free(addr);
    if (st != UCS_OK) {
        *ep = NULL;
        return st;
    }
    *what = "rkey_unpack";
    for (size_t i = 0; i < m->nregs; i++) {
        uint8_t *k = padded(m->regs[i].rkey, m->regs[i].rkey_len);
        st = k ? ucp_ep_rkey_unpack(*ep, k, &rkey[i]) : UCS_ERR_NO_MEMORY;
        free(k);
        if (st != UCS_OK) {
            rkey[i] = NULL;
            return st;
        }
    }
    return UCS_OK;
}

int ecxi_nixl_remote_add(ecxi_nixl_agent *a, const uint8_t *md, size_t md_len,
                         ecxi_nixl_remote **out)
{
    if (!a || !out || (!md && md_len)) return ECX_EINVAL;
    *out = NULL;
    ecxi_nixl_remote *r = calloc(1, sizeof *r);
    if (!r || !(r->md = malloc(md_len + 1))) {
        free(r);
        return ECX_ENOMEM;
    }
    r->a = a;
    if (md_len) memcpy(r->md, md, md_len);
    int rc = ecxi_nixl_meta_decode(r->md, md_len, &r->m);
    if (!rc && r->m.name_len == a->name_len && !memcmp(r->m.name, a->name, a->name_len))
        rc = ECX_EDATA_META; /* NIXL refuses its own name too */
    const char *what;
    ucs_status_t st;
    if (!rc && (st = open_ucx(a, &r->m, remote_err, r, &r->ep, r->rkey, &what)) != UCS_OK) {
        ucx_fail(what, st); /* bytes UCX cannot use: the metadata's fault */
        rc = st == UCS_ERR_NO_MEMORY ? ECX_ENOMEM : ECX_EDATA_META;
    }
    if (rc) {
        ecxi_nixl_remote_drop(r);
        return rc;
    }
    memcpy(r->name, r->m.name, r->m.name_len);
    *out = r;
    return 0;
}

bool ecxi_nixl_remote_covers(const ecxi_nixl_remote *r, uint64_t addr, uint64_t len)
{
    return ecxi_nixl_meta_covers(&r->m, addr, len);
}

const char *ecxi_nixl_remote_name(const ecxi_nixl_remote *r)
{
    return r->name;
}

static void wait_req(ecxi_nixl_agent *a, void *req)
{
    if (!req || UCS_PTR_IS_ERR(req)) return;
    int64_t end = ecxi_now_ms(NULL) + CLOSE_WAIT_MS;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && ecxi_now_ms(NULL) < end)
        ucp_worker_progress(a->worker);
    if (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_request_cancel(a->worker, req);
    ucp_request_free(req);
}

static void remote_free(ecxi_nixl_remote *r)
{
    free(r->md);
    free(r);
}

/* Closing the endpoint (forced) ends its READs' requests with an error;
 * their xfers stay valid (failed) until released. */
void ecxi_nixl_remote_drop(ecxi_nixl_remote *r)
{
    if (!r) return;
    for (size_t i = 0; i < ECXI_NIXL_REGS_MAX; i++)
        if (r->rkey[i]) ucp_rkey_destroy(r->rkey[i]);
    memset(r->rkey, 0, sizeof r->rkey);
    if (r->ep) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        wait_req(r->a, ucp_ep_close_nbx(r->ep, &p));
        r->ep = NULL;
    }
    r->dropped = true;
    if (r->reads == 0) remote_free(r);
}

/* ---- READ --------------------------------------------------------------- */

/* The range holding [addr, addr + len), or -1. */
static int reg_of(const ecxi_nixl_meta *m, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < m->nregs; i++)
        if (addr >= m->regs[i].addr && len <= m->regs[i].len &&
            addr - m->regs[i].addr <= m->regs[i].len - len)
            return (int)i;
    return -1;
}

int ecxi_nixl_read_post(ecxi_nixl_remote *r, const uint64_t *remote, void *const *local,
                        const uint64_t *len, size_t n, const char *msg, size_t msg_len,
                        ecxi_nixl_read **out)
{
    if (!r || !out || !n || !remote || !local || !len || !msg) return ECX_EINVAL;
    *out = NULL;
    if (r->broken || r->dropped) return ECX_EDATA_PEER;
    for (size_t i = 0; i < n; i++)
        if (!len[i] || reg_of(&r->m, remote[i], len[i]) < 0) return ECX_EDATA_INDEX;
    ecxi_nixl_read *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->r = r;
    long k = ecxi_nixl_notif_encode(r->a->name, r->a->name_len, msg, msg_len, x->notif,
                                    sizeof x->notif);
    if (k < 0) {
        free(x);
        return ECX_EDATA_NOTIF;
    }
    x->notif_len = (size_t)k;
    ucp_request_param_t p = {0};
    for (size_t i = 0; i < n;) {
        /* a run: pieces that continue each other on both sides */
        uint64_t run = len[i];
        size_t j = i + 1;
        while (j < n && remote[j] == remote[i] + run && (uint8_t *)local[j] == (uint8_t *)local[i] + run &&
               reg_of(&r->m, remote[i], run + len[j]) >= 0)
            run += len[j++];
        int g = reg_of(&r->m, remote[i], run);
        void *req = ucp_get_nbx(r->ep, local[i], run, remote[i], r->rkey[g], &p);
        if (UCS_PTR_IS_ERR(req)) {
            free(x);
            return ucx_fail("get", UCS_PTR_STATUS(req));
        }
        if (req) ucp_request_free(req); /* the flush completes after it */
        i = j;
    }
    x->req = ucp_ep_flush_nbx(r->ep, &p);
    if (UCS_PTR_IS_ERR(x->req)) {
        int rc = ucx_fail("flush", UCS_PTR_STATUS(x->req));
        free(x);
        return rc;
    }
    x->stage = ST_FLUSH;
    r->reads++;
    *out = x;
    return 0;
}

/* Status of x's current request: 0 done, 1 running, negative failed. */
static int req_state(ecxi_nixl_read *x)
{
    if (!x->req) return 0;
    ucs_status_t st = ucp_request_check_status(x->req);
    if (st == UCS_INPROGRESS) return 1;
    ucp_request_free(x->req);
    x->req = NULL;
    return st == UCS_OK ? 0 : ucx_fail("read", st);
}

int ecxi_nixl_read_poll(ecxi_nixl_read *x)
{
    if (!x) return ECX_EINVAL;
    if (x->status) return x->status;
    if (x->stage == ST_DONE) return 1;
    if (x->r->dropped) return x->status = ECX_EDATA_PEER;
    int s = req_state(x);
    if (s == 1) return x->r->broken ? (x->status = ECX_EDATA_PEER) : 0;
    if (s < 0) return x->status = s;
    if (x->stage == ST_FLUSH) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_AM_SEND_FLAG_EAGER};
        x->req = ucp_am_send_nbx(x->r->ep, AM_NOTIF, NULL, 0, x->notif, x->notif_len, &p);
        if (UCS_PTR_IS_ERR(x->req)) {
            int rc = ucx_fail("notification", UCS_PTR_STATUS(x->req));
            x->req = NULL;
            return x->status = rc;
        }
        x->stage = ST_NOTIF;
        return ecxi_nixl_read_poll(x);
    }
    x->stage = ST_DONE;
    return 1;
}

void ecxi_nixl_read_release(ecxi_nixl_read *x)
{
    if (!x) return;
    ecxi_nixl_remote *r = x->r;
    wait_req(r->a, x->req);
    free(x);
    if (--r->reads == 0 && r->dropped) remote_free(r);
}
