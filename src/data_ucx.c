/*
 * data_ucx — the data path over UCX (the transport NIXL itself uses):
 * one-sided ucp_get from the producer's region, then an active message
 * carrying the completion notification.
 *
 * Producer: maps its region with ucp_mem_map, publishes its worker address
 * (agent_metadata) and the packed remote key plus the region's address
 * (mem_descriptor), and collects notifications from an AM handler into a
 * fixed ring that ecx_data_poll_notifs() drains. Over TCP, UCX emulates
 * get with active messages, so the producer must progress for a READ to
 * move: its ecx_poll() does that.
 *
 * Consumer: one ucp endpoint and unpacked rkey per peer; a READ is one
 * ucp_get_nbx per run of consecutive blocks (a whole encoding stored in one
 * run is one get); when the last get completes, the notification goes out
 * as an eager AM and the xfer reports DONE. Endpoints use peer error
 * handling, so a dead producer fails its READs instead of hanging them.
 *
 * Lifetimes: an xfer lives until it is released AND nothing UCX holds
 * refers to it (gets and the AM send); a peer lives until it is dropped
 * AND no xfer refers to it; its rkey is destroyed only once every
 * operation using it has ended. Endpoint closes run in the background of
 * progress; ecx_data_free() waits for them a bounded time.
 *
 * UCX parses worker addresses and rkeys itself, without a length. The
 * metadata codec checks a BLAKE2b digest over both (so truncated or
 * corrupted blobs never reach UCX), we check the rkey's own structure,
 * and both are handed to UCX inside zero-padded copies. A blob crafted to
 * exploit UCX's parser by a producer we chose to talk to is out of scope;
 * the control plane's authentication is what keeps strangers out.
 *
 * Tuning: unless UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE are set, we use
 * 64 KiB TCP segments instead of UCX's 8 KiB default: the emulated get
 * then runs about 2.5x faster (BENCHMARKS.md).
 */
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "checksum.h"
#include "data_impl.h"
#include "util.h"

#define AM_NOTIF_ID 0x3ec
#define NOTIF_RING 1024
#define PAD_BYTES 20480 /* > 64 md entries of 1 + 255 bytes */
#define CLOSE_WAIT_MS 2000

typedef struct ucx_peer ucx_peer;

typedef struct ucx_xfer {
    ecx_data_xfer head;
    struct ucx_xfer *next;     /* free list or notify queue */
    struct ucx_xfer *all_next; /* every xfer ever allocated */
    ucx_peer *peer;
    int state;
    unsigned gets_left;
    bool failed, released, queued, am_pending, in_use;
    void **reqs; /* outstanding get requests, for cancel */
    size_t nreqs, reqs_cap;
    uint64_t *local; /* where the bytes go, for the checksum */
    size_t n_local, local_cap;
    uint64_t nbytes, checksum;
    size_t notif_len; /* token + key */
    char notif[ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX];
} ucx_xfer;

struct ucx_peer {
    ecx_data_peer head;
    struct ucx_peer *all_next, **all_prev;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base;
    unsigned refs;  /* 1 while registered, +1 per xfer */
    unsigned reads; /* xfers with gets in flight */
    bool broken, dropped;
};

typedef struct closing {
    struct closing *next;
    void *req;
} closing;

typedef struct notif_slot {
    uint16_t len; /* of the key */
    uint8_t token[ECX_DATA_TOKEN_LEN];
    char msg[ECX_DATA_NOTIF_MAX + 1];
} notif_slot;

typedef struct ucx_data {
    ecx_data base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    ucp_mem_h memh;
    /* producer */
    ucp_address_t *addr;
    size_t addr_len;
    void *rkey_buf;
    size_t rkey_len;
    notif_slot *ring;
    unsigned ring_head, ring_count;
    uint64_t ring_dropped;
    /* consumer */
    ucx_xfer *free_xfers, *all_xfers;
    ucx_xfer *notify_q, **notify_tail;
    ucx_peer *peers; /* every peer not yet freed */
    closing *closing;
} ucx_data;

static const struct ecx_data_ops ucx_ops;

/* ---- setup ----------------------------------------------------------- */

static int ucx_err(const char *what, ucs_status_t st)
{
    ecx_log(ECX_LOG_WARN, "data ucx: %s: %s", what, ucs_status_string(st));
    return ECX_EDATA_UCX;
}

static ucs_status_t am_notif_cb(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param);

static int ucx_setup(ucx_data *u, ecx_region *r, bool producer)
{
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return ucx_err("config_read", st);
    /* UCP forwards these to the transports that have them (only tcp). */
    if (!getenv("UCX_TCP_TX_SEG_SIZE") && !getenv("UCX_TX_SEG_SIZE"))
        (void)ucp_config_modify(cfg, "TX_SEG_SIZE", "64k");
    if (!getenv("UCX_TCP_RX_SEG_SIZE") && !getenv("UCX_RX_SEG_SIZE"))
        (void)ucp_config_modify(cfg, "RX_SEG_SIZE", "64k");
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    st = ucp_init(&p, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return ucx_err("init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (st != UCS_OK) return ucx_err("worker_create", st);
    st = ucp_worker_get_efd(u->worker, &u->efd);
    if (st != UCS_OK) return ucx_err("worker_get_efd", st);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = ecx_region_base(r),
        .length = ecx_region_size(r),
    };
    st = ucp_mem_map(u->ctx, &mp, &u->memh);
    if (st != UCS_OK) return ucx_err("mem_map", st);
    if (!producer) return 0;

    st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
    if (st != UCS_OK) return ucx_err("worker_get_address", st);
    st = ucp_rkey_pack(u->ctx, u->memh, &u->rkey_buf, &u->rkey_len);
    if (st != UCS_OK) return ucx_err("rkey_pack", st);
    u->ring = calloc(NOTIF_RING, sizeof *u->ring);
    if (!u->ring) return ECX_ENOMEM;
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = AM_NOTIF_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = am_notif_cb,
        .arg = u,
    };
    st = ucp_worker_set_am_recv_handler(u->worker, &hp);
    if (st != UCS_OK) return ucx_err("set_am_recv_handler", st);
    return 0;
}

static void ucx_free(ecx_data *d);

static int ucx_new(ecx_region *r, bool producer, ucx_data **out)
{
    ucx_data *u = calloc(1, sizeof *u);
    if (!u) return ECX_ENOMEM;
    u->base.ops = &ucx_ops;
    u->base.region = r;
    u->efd = -1;
    u->notify_tail = &u->notify_q;
    int rc = ucx_setup(u, r, producer);
    if (rc) {
        ucx_free(&u->base);
        return rc;
    }
    *out = u;
    return 0;
}

int ecx_data_ucx_new_producer(ecx_region *r, ecx_data_meta *m, ecx_data_desc *dd, ecx_data **out)
{
    ucx_data *u;
    int rc = ucx_new(r, true, &u);
    if (rc) return rc;
    m->has_ucx = true;
    m->ucx_addr = (const uint8_t *)u->addr;
    m->ucx_addr_len = u->addr_len;
    dd->has_ucx = true;
    dd->ucx_base = (uint64_t)(uintptr_t)ecx_region_base(r);
    dd->rkey = u->rkey_buf;
    dd->rkey_len = u->rkey_len;
    *out = &u->base;
    return 0;
}

int ecx_data_ucx_new_consumer(ecx_region *r, ecx_data **out)
{
    ucx_data *u;
    int rc = ucx_new(r, false, &u);
    if (rc == 0) *out = &u->base;
    return rc;
}

/* ---- producer: notifications ---------------------------------------- */

static ucs_status_t am_notif_cb(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    (void)header, (void)header_length;
    ucx_data *u = arg;
    /* Notifications are small and sent eagerly; anything else is not ours
     * (returning UCS_OK releases a rendezvous message unread). */
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length <= ECX_DATA_TOKEN_LEN ||
        length > ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX) {
        ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: dropped a notification of %zu bytes", length);
        return UCS_OK;
    }
    if (u->ring_count == NOTIF_RING) {
        u->ring_dropped++;
        ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: notification ring full; dropped one");
        return UCS_OK;
    }
    notif_slot *s = &u->ring[(u->ring_head + u->ring_count) % NOTIF_RING];
    memcpy(s->token, data, ECX_DATA_TOKEN_LEN);
    length -= ECX_DATA_TOKEN_LEN;
    memcpy(s->msg, (const uint8_t *)data + ECX_DATA_TOKEN_LEN, length);
    s->msg[length] = 0;
    s->len = (uint16_t)length;
    u->ring_count++;
    return UCS_OK;
}

/* ---- progress -------------------------------------------------------- */

static void xfer_put(ucx_data *u, ucx_xfer *x);
static void send_notif(ucx_data *u, ucx_xfer *x);

static void peer_unref(ucx_data *u, ucx_peer *p)
{
    if (--p->refs) return;
    /* Nothing uses the rkey any more; the endpoint was closed at drop. */
    if (p->rkey) ucp_rkey_destroy(p->rkey);
    *p->all_prev = p->all_next;
    if (p->all_next) p->all_next->all_prev = p->all_prev;
    (void)u;
    free(p);
}

static void close_ep(ucx_data *u, ucp_ep_h ep, bool force)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(ep, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) return;
    closing *c = malloc(sizeof *c);
    if (!c) {
        /* Cannot track it: wait here, bounded. */
        int64_t end = ecx_now_ms(NULL) + CLOSE_WAIT_MS;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && ecx_now_ms(NULL) < end)
            ucp_worker_progress(u->worker);
        if (ucp_request_check_status(req) != UCS_INPROGRESS) ucp_request_free(req);
        return;
    }
    c->req = req;
    c->next = u->closing;
    u->closing = c;
}

static int reap_closing(ucx_data *u)
{
    int n = 0;
    for (closing **pp = &u->closing; *pp;) {
        closing *c = *pp;
        if (ucp_request_check_status(c->req) == UCS_INPROGRESS) {
            pp = &c->next;
            continue;
        }
        ucp_request_free(c->req);
        *pp = c->next;
        free(c);
        n++;
    }
    return n;
}

/* Longest stretch one ecx_data_progress() spends moving UCX data. */
#define PROGRESS_BUDGET_MS 2

static int ucx_progress(ecx_data *d)
{
    ucx_data *u = (ucx_data *)d;
    int n = 0;
    /* Bounded in time too, so one engine step never stalls for long behind
     * a large transfer: the caller's next poll carries on. */
    int64_t until = ecx_now_ms(NULL) + PROGRESS_BUDGET_MS;
    for (int i = 0; i < 256 && ucp_worker_progress(u->worker); i++) {
        n++;
        if (ecx_now_ms(NULL) >= until) break;
    }
    while (u->notify_q) {
        ucx_xfer *x = u->notify_q;
        u->notify_q = x->next;
        if (!u->notify_q) u->notify_tail = &u->notify_q;
        x->queued = false;
        send_notif(u, x);
        n++;
    }
    if (u->closing) n += reap_closing(u);
    return n;
}

static int ucx_fd(ecx_data *d)
{
    return ((ucx_data *)d)->efd;
}

static int ucx_arm(ecx_data *d)
{
    ucx_data *u = (ucx_data *)d;
    if (u->notify_q || u->ring_count) return 1;
    ucs_status_t st = ucp_worker_arm(u->worker);
    if (st == UCS_OK) return 0;
    if (st == UCS_ERR_BUSY) return 1;
    return ucx_err("worker_arm", st);
}

static int ucx_poll_notifs(ecx_data *d, ecx_data_notif_cb cb, void *arg)
{
    ucx_data *u = (ucx_data *)d;
    int rc = ucx_progress(d);
    if (rc < 0) return rc;
    int count = 0;
    while (u->ring_count) {
        notif_slot *s = &u->ring[u->ring_head];
        u->ring_head = (u->ring_head + 1) % NOTIF_RING;
        u->ring_count--;
        cb(arg, s->msg, s->len, s->token, 0);
        count++;
    }
    return count;
}

/* ---- consumer: peers ------------------------------------------------- */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    ucx_peer *p = arg;
    p->broken = true;
    ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: peer endpoint failed: %s",
                        ucs_status_string(status));
}

/* Walk the packed rkey as UCX will: u64 md_map, u8 mem_type, then one
 * (u8 size, bytes) per md bit, all inside len. */
static bool rkey_shape_ok(const uint8_t *b, size_t len)
{
    if (len < 9) return false;
    uint64_t md_map;
    memcpy(&md_map, b, 8);
    if (b[8] >= UCS_MEMORY_TYPE_LAST) return false;
    size_t off = 9;
    for (int i = 0; i < 64; i++) {
        if (!(md_map & (1ull << i))) continue;
        if (off >= len) return false;
        size_t sz = b[off++];
        if (sz > len - off) return false;
        off += sz;
    }
    return true;
}

static int ucx_peer_add(ecx_data *d, const ecx_data_meta *m, const ecx_data_desc *desc,
                        ecx_data_peer **out)
{
    ucx_data *u = (ucx_data *)d;
    if (!m->has_ucx || !desc->has_ucx) return ECX_EDATA_NOPATH;
    if (!rkey_shape_ok(desc->rkey, desc->rkey_len)) return ECX_EDATA_DESC;
    ucx_peer *p = calloc(1, sizeof *p);
    uint8_t *pad = calloc(1, (m->ucx_addr_len > desc->rkey_len ? m->ucx_addr_len : desc->rkey_len) +
                                 PAD_BYTES);
    if (!p || !pad) {
        free(p), free(pad);
        return ECX_ENOMEM;
    }
    memcpy(pad, m->ucx_addr, m->ucx_addr_len);
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)pad,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_err_cb, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        free(pad), free(p);
        ecx_log(ECX_LOG_WARN, "data ucx: ep_create: %s", ucs_status_string(st));
        return st == UCS_ERR_UNREACHABLE ? ECX_EDATA_NOPATH : ECX_EDATA_UCX;
    }
    memset(pad, 0, m->ucx_addr_len);
    memcpy(pad, desc->rkey, desc->rkey_len);
    st = ucp_ep_rkey_unpack(p->ep, pad, &p->rkey);
    free(pad);
    if (st != UCS_OK) {
        close_ep(u, p->ep, true);
        free(p);
        ecx_log(ECX_LOG_WARN, "data ucx: rkey_unpack: %s", ucs_status_string(st));
        return ECX_EDATA_DESC;
    }
    p->base = desc->ucx_base;
    p->refs = 1;
    p->head.owner = d;
    p->head.backend = "ucx";
    p->all_next = u->peers;
    p->all_prev = &u->peers;
    if (u->peers) u->peers->all_prev = &p->all_next;
    u->peers = p;
    *out = &p->head;
    return 0;
}

static void ucx_peer_drop(ecx_data_peer *hp)
{
    ucx_peer *p = (ucx_peer *)hp;
    ucx_data *u = (ucx_data *)hp->owner;
    p->dropped = true;
    /* What UCX ended up using (after wire-up), for whoever debugs a path. */
    if (ecx_log_level() >= ECX_LOG_DEBUG && p->ep) ucp_ep_print_info(p->ep, stderr);
    /* READs still running are failed by a forced close. With none, the
     * endpoint is flushed only if a notification is still on its way, so
     * that it arrives; else it is closed at once. */
    bool busy = p->refs > 1;
    if (!busy && p->rkey) {
        ucp_rkey_destroy(p->rkey);
        p->rkey = NULL;
    }
    close_ep(u, p->ep, p->reads > 0 || !busy || p->broken);
    p->ep = NULL;
    peer_unref(u, p);
}

/* ---- consumer: READs -------------------------------------------------- */

static ucx_xfer *xfer_get(ucx_data *u)
{
    ucx_xfer *x = u->free_xfers;
    if (x) {
        u->free_xfers = x->next;
    } else {
        x = calloc(1, sizeof *x);
        if (!x) return NULL;
        x->all_next = u->all_xfers;
        u->all_xfers = x;
    }
    x->head.owner = &u->base;
    x->next = NULL;
    x->peer = NULL;
    x->state = ECX_XFER_RUNNING;
    x->gets_left = 0;
    x->failed = x->released = x->queued = x->am_pending = false;
    x->in_use = true;
    x->nreqs = 0;
    return x;
}

static void xfer_put(ucx_data *u, ucx_xfer *x)
{
    if (x->peer) peer_unref(u, x->peer);
    x->peer = NULL;
    x->in_use = false;
    x->next = u->free_xfers;
    u->free_xfers = x;
}

/* Free it if the user is done with it and UCX no longer refers to it. */
static void xfer_maybe_put(ucx_data *u, ucx_xfer *x)
{
    if (x->released && x->gets_left == 0 && !x->am_pending && !x->queued) xfer_put(u, x);
}

static void am_done_cb(void *req, ucs_status_t status, void *user_data)
{
    ucx_xfer *x = user_data;
    ucx_data *u = (ucx_data *)x->head.owner;
    if (status != UCS_OK)
        ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: notification not delivered: %s",
                            ucs_status_string(status));
    ucp_request_free(req);
    x->am_pending = false;
    xfer_maybe_put(u, x);
}

/* The gets are over: send the notification (best effort: a lost one only
 * makes the producer wait for its pin lease) and report the end state. */
static void send_notif(ucx_data *u, ucx_xfer *x)
{
    ucx_peer *p = x->peer;
    if (x->failed) {
        x->state = ECX_XFER_FAILED;
    } else {
        const ecx_region *r = u->base.region;
        uint64_t sum = ecx_checksum_blocks(ecx_region_base(r), ecx_region_block_bytes(r), x->local,
                                           x->n_local, x->nbytes);
        x->state = sum == x->checksum ? ECX_XFER_DONE : ECX_XFER_CORRUPT;
        if (p && p->ep && !p->broken) {
            ucp_request_param_t prm = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_FLAGS,
                .flags = UCP_AM_SEND_FLAG_EAGER,
                .cb.send = am_done_cb,
                .user_data = x,
            };
            void *req = ucp_am_send_nbx(p->ep, AM_NOTIF_ID, NULL, 0, x->notif, x->notif_len, &prm);
            if (UCS_PTR_IS_ERR(req))
                ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: notification not sent: %s",
                                    ucs_status_string(UCS_PTR_STATUS(req)));
            else if (req)
                x->am_pending = true;
        }
    }
    xfer_maybe_put(u, x);
}

static void get_done_cb(void *req, ucs_status_t status, void *user_data)
{
    ucx_xfer *x = user_data;
    ucx_data *u = (ucx_data *)x->head.owner;
    for (size_t i = 0; i < x->nreqs; i++)
        if (x->reqs[i] == req) {
            x->reqs[i] = x->reqs[--x->nreqs];
            break;
        }
    ucp_request_free(req);
    if (status != UCS_OK) {
        if (!x->failed && status != UCS_ERR_CANCELED)
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: get failed: %s",
                                ucs_status_string(status));
        x->failed = true;
    }
    if (--x->gets_left) return;
    if (x->peer) x->peer->reads--;
    /* Sending from inside UCX's callback is avoided: queue it for
     * ucx_progress(), which runs right after the worker progress. */
    x->queued = true;
    x->next = NULL;
    *u->notify_tail = x;
    u->notify_tail = &x->next;
}

/* Cancel every get still in flight. A cancel may complete its request at
 * once, and the callback shrinks x->reqs: cancel from the back. */
static void cancel_gets(ucx_data *u, ucx_xfer *x)
{
    size_t n = x->nreqs;
    while (n--)
        if (n < x->nreqs) ucp_request_cancel(u->worker, x->reqs[n]);
}

static int ucx_read_post(ecx_data_peer *hp, const ecx_data_ticket *t, const uint64_t *remote,
                         const uint64_t *local, size_t n, uint64_t nbytes, const char *key,
                         size_t key_len, ecx_data_xfer **out)
{
    ucx_peer *p = (ucx_peer *)hp;
    ucx_data *u = (ucx_data *)hp->owner;
    if (p->broken || !p->ep) return ECX_EDATA_PEER;
    ucx_xfer *x = xfer_get(u);
    if (!x) return ECX_ENOMEM;
    if (n > x->local_cap) {
        uint64_t *l = realloc(x->local, n * sizeof *l);
        if (!l) {
            x->released = true;
            xfer_put(u, x);
            return ECX_ENOMEM;
        }
        x->local = l, x->local_cap = n;
    }
    memcpy(x->local, local, n * sizeof *local);
    x->n_local = n;
    x->nbytes = nbytes;
    x->checksum = t->checksum;
    x->peer = p;
    p->refs++;
    memcpy(x->notif, t->token, ECX_DATA_TOKEN_LEN);
    memcpy(x->notif + ECX_DATA_TOKEN_LEN, key, key_len);
    x->notif_len = ECX_DATA_TOKEN_LEN + key_len;

    const uint64_t bs = ecx_region_block_bytes(u->base.region);
    uint8_t *lbase = ecx_region_base(u->base.region);
    int rc = 0;
    for (size_t i = 0; i < n;) {
        size_t k = ecx_data_run_len(remote, local, i, n);
        if (x->nreqs == x->reqs_cap) {
            size_t cap = x->reqs_cap ? 2 * x->reqs_cap : 8;
            void **r = realloc(x->reqs, cap * sizeof *r);
            if (!r) {
                rc = ECX_ENOMEM;
                break;
            }
            x->reqs = r;
            x->reqs_cap = cap;
        }
        ucp_request_param_t prm = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
            .cb.send = get_done_cb,
            .user_data = x,
            .memh = u->memh,
        };
        uint64_t len = k * bs < nbytes ? k * bs : nbytes;
        void *req =
            ucp_get_nbx(p->ep, lbase + local[i] * bs, len, p->base + remote[i] * bs, p->rkey, &prm);
        nbytes -= len;
        if (UCS_PTR_IS_ERR(req)) {
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: get_nbx: %s",
                                ucs_status_string(UCS_PTR_STATUS(req)));
            rc = ECX_EDATA_UCX;
            break;
        }
        if (req) {
            x->reqs[x->nreqs++] = req;
            if (x->gets_left++ == 0) p->reads++;
        }
        i += k;
    }
    if (rc && x->gets_left == 0) {
        /* Nothing in flight: refuse the post outright. */
        x->released = true;
        xfer_put(u, x);
        return rc;
    }
    if (rc) {
        /* Some gets are in flight: the xfer fails once they end. */
        x->failed = true;
        cancel_gets(u, x);
    }
    if (x->gets_left == 0 && !x->queued) send_notif(u, x);
    *out = &x->head;
    return 0;
}

static int ucx_read_poll(ecx_data_xfer *hx)
{
    return ((ucx_xfer *)hx)->state;
}

static void ucx_read_release(ecx_data_xfer *hx)
{
    ucx_xfer *x = (ucx_xfer *)hx;
    ucx_data *u = (ucx_data *)hx->owner;
    x->released = true;
    if (x->gets_left) {
        x->failed = true;
        cancel_gets(u, x);
    }
    xfer_maybe_put(u, x);
}

/* ---- teardown -------------------------------------------------------- */

static void ucx_free(ecx_data *d)
{
    ucx_data *u = (ucx_data *)d;
    if (u->worker) {
        /* Close what the caller did not drop, then wait (bounded) for
         * every close to finish so the peers hear about it. */
        for (ucx_peer *p = u->peers; p; p = p->all_next)
            if (p->ep) {
                close_ep(u, p->ep, true);
                p->ep = NULL;
            }
        int64_t end = ecx_now_ms(NULL) + CLOSE_WAIT_MS;
        while (u->closing && ecx_now_ms(NULL) < end) {
            ucp_worker_progress(u->worker);
            reap_closing(u);
        }
        for (ucx_peer *p = u->peers; p; p = p->all_next)
            if (p->rkey) ucp_rkey_destroy(p->rkey), p->rkey = NULL;
    }
    for (closing *c = u->closing, *n; c; c = n) {
        n = c->next;
        ucp_request_free(c->req); /* UCX finishes it in worker_destroy */
        free(c);
    }
    for (ucx_peer *p = u->peers, *n; p; p = n) {
        n = p->all_next;
        free(p);
    }
    for (ucx_xfer *x = u->all_xfers, *n; x; x = n) {
        n = x->all_next;
        free(x->reqs);
        free(x->local);
        free(x);
    }
    if (u->rkey_buf) ucp_rkey_buffer_release(u->rkey_buf);
    if (u->addr) ucp_worker_release_address(u->worker, u->addr);
    if (u->memh) ucp_mem_unmap(u->ctx, u->memh);
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->ctx) ucp_cleanup(u->ctx);
    free(u->ring);
    free(u);
}

static const struct ecx_data_ops ucx_ops = {
    .name = "ucx",
    .free = ucx_free,
    .progress = ucx_progress,
    .fd = ucx_fd,
    .arm = ucx_arm,
    .poll_notifs = ucx_poll_notifs,
    .peer_add = ucx_peer_add,
    .peer_drop = ucx_peer_drop,
    .read_post = ucx_read_post,
    .read_poll = ucx_read_poll,
    .read_release = ucx_read_release,
};
