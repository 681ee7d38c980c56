/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_ucx — the data path over UCX, in which the producer decides what
 * leaves it: the consumer posts a tagged receive into its blocks and asks
 * by grant key and token; the producer sends a live grant's blocks from
 * its region under that tag, and nothing else. No rkey is ever packed or
 * published and the producer's context has no RMA feature, so no peer can
 * name an address of ours (tests/support/ucx_hostile.c). This file owns both
 * sides: the listener, its connections and bounds (MAX_* below), the
 * request queue (READs and declines), sends and their cuts at lease end,
 * and the consumer's peers, READs, declines and checksums. UCX 1.13's tcp transport is still open to a
 * peer that speaks UCT/UCP directly, so this file runs only in the UCX
 * helper process (ucx_proc.h), never in an engine. The wire formats, the
 * bounds and what is left open: docs/PROTOCOL.md §6.8.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sodium.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <ucs/config/global_opts.h>

#include "checksum.h"
#include "data_impl.h"
#include "util.h"

#define AM_REQ_ID 0x3ed
#define REQ_VERSION 1
#define REQ_GET 0     /* b[1]: send me the grant under the tag */
#define REQ_DECLINE 1 /* b[1]: I will not read it (tag 0, no reply) */
#define REQ_HDR 32
#define REQ_MAX (REQ_HDR + ECXI_DATA_NOTIF_MAX)
#define ADDR_VERSION 1
/* This file's timeouts and bounds (CLOSE_WAIT_MS, SEND_STALL_MS, the MAX_*
 * below) are the data plane's own, internal to this path: no ecx_config
 * knob, so no ECX_DEFAULT_* in ecx.h. */
#define CLOSE_WAIT_MS 2000
/* A dropped peer's declines still in UCX's hands get this long to leave. */
#define DECLINE_FLUSH_MS 250
#define WAIT_SLICE_MS 10 /* worker_wait's longest sleep on the worker's fd */

/* Producer bounds. */
#define MAX_CONNS 256 /* connections in total */
#define MAX_CONNS_PER_HOST 32
#define MAX_ACCEPTS 64 /* connection requests not yet accepted */
#define MAX_QUEUED 4096 /* requests waiting, in total */
#define MAX_QUEUED_PER_HOST 512
#define MAX_QUEUED_PER_CONN 64
#define MAX_SENDS 512 /* sends in flight or not yet collected, in total */
#define MAX_SENDS_PER_HOST 128
#define MAX_SENDS_PER_CONN 32
/* A connection whose sends make no progress for this long is closed (its
 * sends fail), so a peer that stops reading holds nothing for long. */
#define SEND_STALL_MS 30000

/* ---- types ------------------------------------------------------------ */

/* Everything from one client address: the per-host bounds. */
typedef struct host {
    struct host *next;
    struct sockaddr_storage addr;
    unsigned conns, queued, sends;
} host;

typedef struct conn {
    struct conn *next;
    ucp_ep_h ep;
    host *h;
    unsigned queued, sends;
    int64_t last_done_ms; /* last send ended (or first began) */
    bool failed;
} conn;

typedef struct request {
    conn *c;
    bool asked;   /* the grant check said ECXI_DATA_GRANT_ASKED: wait for its answer */
    bool decline; /* the consumer will not read the grant */
    uint64_t tag;
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint16_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1];
} request;

/* One producer send, from post until poll_notifs hands its end over. */
typedef struct psend {
    struct psend *next;     /* free list or done list */
    struct psend *all_next; /* every send ever allocated */
    struct ucx_data *u;
    conn *c;
    int status;   /* 0 / negative once done */
    int fail;     /* report this instead of the send's status */
    bool refusal; /* a 0-byte "no": nothing to report */
    bool running; /* UCX holds the request: it may still read the grant's blocks */
    ucp_dt_iov_t *iov;
    size_t iov_cap;
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint16_t key_len;
    char key[ECXI_DATA_NOTIF_MAX + 1];
} psend;

typedef struct ucx_peer ucx_peer;

typedef struct ucx_xfer {
    ecxi_data_xfer head;
    struct ucx_xfer *next;     /* free list, or the peer's running list */
    struct ucx_xfer *all_next; /* every xfer ever allocated */
    ucx_peer *peer;
    void *req; /* the tag receive, while UCX holds it */
    int state;
    bool released;
    bool recv_ended; /* recv_done_cb ran */
    bool am_pending; /* the request AM (msg) is still UCX's */
    bool decline;    /* msg is a decline: no receive, released at once */
    uint8_t msg[REQ_MAX];
    size_t received; /* bytes the receive reported */
    bool recv_ok;
    ucp_dt_iov_t *iov;
    size_t iov_cap;
    uint64_t nbytes, checksum;
    size_t niov; /* x->iov entries in use: the local runs */
    /* Verification, after the bytes landed, in slices (data.h): */
    bool verifying;
    struct ucx_xfer *vnext; /* the verify queue */
    ecxi_sum *sum;          /* 64-byte aligned; kept with the xfer */
    size_t v_i;             /* iov entry, and offset in it */
    uint64_t v_off;
} ucx_xfer;

struct ucx_peer {
    ecxi_data_peer head;
    struct ucx_peer *all_next, **all_prev;
    ucp_ep_h ep;
    unsigned refs; /* 1 while registered, +1 per xfer */
    bool broken;
    bool failed_reads; /* its receives were cancelled after its connection failed */
};

typedef struct closing {
    struct closing *next;
    void *req;
} closing;

typedef struct ucx_data {
    ecxi_data base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    /* producer */
    ucp_mem_h memh;
    ucp_listener_h listener;
    uint8_t addr[20];
    size_t addr_len;
    conn *conns;
    host *hosts;
    unsigned nconns;
    ucp_conn_request_h accepts[MAX_ACCEPTS];
    unsigned naccepts;
    request *queue; /* MAX_QUEUED, in arrival order */
    unsigned nqueued;
    psend *free_sends, *all_sends, *done, **done_tail;
    unsigned nsends;
    uint64_t refused, dropped, stalled, conns_refused, cuts;
    /* consumer */
    ucx_xfer *free_xfers, *all_xfers;
    ucx_xfer *verify_head, *verify_tail; /* landed, being checksummed */
    ucx_peer *peers;
    /* both */
    closing *closing;
} ucx_data;

static const struct ecxi_data_ops ucx_ops;

static int ucx_err(const char *what, ucs_status_t st)
{
    ecxi_log(ECX_LOG_WARN, "data ucx: %s: %s", what, ucs_status_string(st));
    return ECX_EDATA_UCX;
}

static void put_le16(uint8_t *b, uint16_t v)
{
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8);
}

static uint16_t get_le16(const uint8_t *b)
{
    return (uint16_t)(b[0] | b[1] << 8);
}

static void put_le64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> 8 * i);
}

static uint64_t get_le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << 8 * i;
    return v;
}

/* ---- closing endpoints ------------------------------------------------ */

/* One step of a bounded wait on the worker: progress it, and if nothing
 * moved sleep on its event fd (UCP_FEATURE_WAKEUP, as ucx_arm) for at most
 * left_ms, capped at WAIT_SLICE_MS in case a wakeup is missed: never a
 * spin. False if the worker cannot be armed (then the caller stops). */
static bool worker_wait(ucx_data *u, int64_t left_ms)
{
    if (ucp_worker_progress(u->worker)) return true; /* something moved: look again */
    ucs_status_t st = ucp_worker_arm(u->worker);
    if (st == UCS_ERR_BUSY) return true; /* events came in meanwhile */
    if (st != UCS_OK) {
        (void)ucx_err("worker_arm", st);
        return false;
    }
    struct pollfd q = {.fd = u->efd, .events = POLLIN};
    (void)poll(&q, 1, (int)(left_ms < WAIT_SLICE_MS ? left_ms : WAIT_SLICE_MS));
    return true;
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
        int64_t end = ecxi_now_ms(NULL) + CLOSE_WAIT_MS;
        for (;;) {
            int64_t left = end - ecxi_now_ms(NULL);
            if (ucp_request_check_status(req) != UCS_INPROGRESS || left <= 0 ||
                !worker_wait(u, left))
                break;
        }
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

/* ---- setup ------------------------------------------------------------ */

/* The interface that holds address a (for UCX_NET_DEVICES); 0 or ECX_EINVAL. */
static int ifname_of(const struct sockaddr *a, char name[IF_NAMESIZE])
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return ECX_EINVAL;
    int rc = ECX_EINVAL;
    for (struct ifaddrs *i = ifs; i && rc; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != a->sa_family) continue;
        bool same = a->sa_family == AF_INET
                        ? ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
                              ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr
                        : memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                                 &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, 16) == 0;
        if (same && strlen(i->ifa_name) < IF_NAMESIZE) {
            strcpy(name, i->ifa_name);
            rc = 0;
        }
    }
    freeifaddrs(ifs);
    return rc;
}

/* The first IPv4 address of interface ifname into *in; 0 or ECX_EINVAL. */
static int ipv4_of(const char *ifname, struct sockaddr_in *in)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return ECX_EINVAL;
    int rc = ECX_EINVAL;
    for (struct ifaddrs *i = ifs; i && rc; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !strcmp(i->ifa_name, ifname)) {
            memcpy(in, i->ifa_addr, sizeof *in);
            rc = 0;
        }
    freeifaddrs(ifs);
    return rc;
}

/* bind_host as a socket address (port 0). NULL, "", "*", "0.0.0.0" and
 * "::" mean any; then *any is set and the address published is the first
 * non-loopback IPv4 interface's (else 127.0.0.1). */
static ucs_status_t am_req_cb(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param);
static void conn_req_cb(ucp_conn_request_h req, void *arg);

/* UCX's log lines, through ours (stderr, rate-limited), never to UCX's
 * default stdout, where they would break `ecx get --json`. UCX warns, with
 * a backtrace and no limit, about each stray message a peer sends (a
 * ucp_get at us, say): unless UCX_LOG_LEVEL is set, UCX (process-wide) is
 * kept to errors. UCX calls the handler pushed last first; STOP keeps its
 * default handler from printing. */
static ucs_log_func_rc_t ucx_log(const char *file, unsigned line, const char *function,
                                 ucs_log_level_t level, const ucs_log_component_config_t *cc,
                                 const char *fmt, va_list ap)
{
    (void)file, (void)line, (void)function, (void)cc;
    char msg[512];
    va_list aq;
    va_copy(aq, ap);
    vsnprintf(msg, sizeof msg, fmt, aq);
    va_end(aq);
    int lvl = level <= UCS_LOG_LEVEL_ERROR  ? ECX_LOG_WARN
              : level <= UCS_LOG_LEVEL_WARN ? ECX_LOG_INFO
                                            : ECX_LOG_DEBUG;
    ECXI_LOG_RATELIMITED(lvl, "data ucx: UCX says: %s", msg);
    return UCS_LOG_FUNC_RC_STOP;
}

static void ucx_log_install(void)
{
    ucs_log_push_handler(ucx_log);
}

void ecxi_data_ucx_log_setup(void)
{
    static pthread_once_t log_once = PTHREAD_ONCE_INIT;
    pthread_once(&log_once, ucx_log_install);
    /* UCX warns, with a backtrace and no rate limit, about every message a
     * peer sends to a handler we did not register (a ucp_get at us, for
     * one): a peer could flood our log. Unless the operator chose a UCX
     * log level, keep UCX (process-wide) to errors. */
    if (!getenv("UCX_LOG_LEVEL") && ucs_global_opts.log_component.log_level > UCS_LOG_LEVEL_ERROR)
        ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_ERROR;
}

/* ifname: producer only, NULL for any interface. */
static int ucx_setup(ucx_data *u, bool producer, const char *ifname)
{
    ecxi_data_ucx_log_setup();
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return ucx_err("config_read", st);
    /* 64 KiB TCP segments instead of UCX's 8 KiB, unless set: data that
     * comes as active-message fragments (an IOV on either side) moves
     * about 2.5x faster (BENCHMARKS.md). UCP forwards these to tcp. */
    if (!getenv("UCX_TCP_TX_SEG_SIZE") && !getenv("UCX_TX_SEG_SIZE"))
        (void)ucp_config_modify(cfg, "TX_SEG_SIZE", "64k");
    if (!getenv("UCX_TCP_RX_SEG_SIZE") && !getenv("UCX_RX_SEG_SIZE"))
        (void)ucp_config_modify(cfg, "RX_SEG_SIZE", "64k");
    if (producer) {
        /* See the top of the file: no rkey in a rendezvous, no put
         * pipeline with peer-chosen offsets. */
        st = ucp_config_modify(cfg, "RNDV_SCHEME", "put_zcopy");
        if (st == UCS_OK) st = ucp_config_modify(cfg, "PROTO_ENABLE", "n");
        if (st == UCS_OK && ifname && !getenv("UCX_NET_DEVICES"))
            st = ucp_config_modify(cfg, "NET_DEVICES", ifname);
        if (st != UCS_OK) {
            ucp_config_release(cfg);
            return ucx_err("config_modify", st);
        }
    }
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        /* Never UCP_FEATURE_RMA: then UCP registers no software get/put
         * handlers, and nothing reads or writes our memory on request. */
        .features = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
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
    return 0;
}

static int producer_setup(ucx_data *u, ecxi_region *r, const char *bind_host, uint16_t port)
{
    struct sockaddr_storage ss, bind; /* published; listened on */
    bool any;
    int rc = ecxi_data_bind_addr(bind_host, &bind, &ss, &any);
    if (rc) return rc;
    char ifname[IF_NAMESIZE];
    bool have_if = !any && ifname_of((struct sockaddr *)&ss, ifname) == 0;
    if (!any && !have_if)
        ecxi_log(ECX_LOG_WARN, "data ucx: no interface holds %s; UCX may use every one",
                bind_host);
    /* UCX 1.13's tcp transport speaks IPv4 on an interface that has both
     * (a consumer reaching us by an IPv6 address finds no lane): listen
     * and publish the interface's IPv4 address when it has one. */
    struct sockaddr_in v4;
    if (have_if && ss.ss_family == AF_INET6 && ipv4_of(ifname, &v4) == 0) {
        memset(&ss, 0, sizeof ss);
        memcpy(&ss, &v4, sizeof v4);
        bind = ss;
    }
    if (port) { /* network order, as published */
        if (bind.ss_family == AF_INET6) ((struct sockaddr_in6 *)&bind)->sin6_port = port;
        else ((struct sockaddr_in *)&bind)->sin_port = port;
    }
    if ((rc = ucx_setup(u, true, have_if ? ifname : NULL))) return rc;

    /* Read only: the UCX process maps a producer's region read-only
     * (ucx_proc.h); a send only reads it. */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT,
        .address = ecxi_region_base(r),
        .length = ecxi_region_size(r),
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ,
    };
    ucs_status_t st = ucp_mem_map(u->ctx, &mp, &u->memh);
    if (st != UCS_OK) return ucx_err("mem_map", st);
    if (!(u->queue = calloc(MAX_QUEUED, sizeof *u->queue))) return ECX_ENOMEM;
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = AM_REQ_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = am_req_cb,
        .arg = u,
    };
    st = ucp_worker_set_am_recv_handler(u->worker, &hp);
    if (st != UCS_OK) return ucx_err("set_am_recv_handler", st);

    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (struct sockaddr *)&bind,
                     .addrlen = bind.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                           : sizeof(struct sockaddr_in)},
        .conn_handler = {.cb = conn_req_cb, .arg = u},
    };
    st = ucp_listener_create(u->worker, &lp, &u->listener);
    if (st != UCS_OK) return ucx_err("listener_create", st);
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    st = ucp_listener_query(u->listener, &la);
    if (st != UCS_OK) return ucx_err("listener_query", st);
    uint16_t bound = la.sockaddr.ss_family == AF_INET6
                         ? ((struct sockaddr_in6 *)&la.sockaddr)->sin6_port
                         : ((struct sockaddr_in *)&la.sockaddr)->sin_port;
    u->addr[0] = ADDR_VERSION;
    memcpy(u->addr + 2, &bound, 2); /* network order */
    if (ss.ss_family == AF_INET6) {
        u->addr[1] = 6;
        memcpy(u->addr + 4, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        u->addr_len = 20;
    } else {
        u->addr[1] = 4;
        memcpy(u->addr + 4, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        u->addr_len = 8;
    }
    return 0;
}

static void ucx_free(ecxi_data *d);

static ucx_data *ucx_alloc(ecxi_region *r)
{
    ucx_data *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->base.ops = &ucx_ops;
    u->base.region = r;
    u->efd = -1;
    u->done_tail = &u->done;
    return u;
}

int ecxi_data_ucx_new_producer(ecxi_region *r, const char *bind_host, uint16_t port,
                               ecxi_data_meta *m, ecxi_data **out)
{
    ucx_data *u = ucx_alloc(r);
    if (!u) return ECX_ENOMEM;
    int rc = producer_setup(u, r, bind_host, port);
    if (rc) {
        ucx_free(&u->base);
        return rc;
    }
    m->has_ucx = true;
    m->ucx_addr = u->addr;
    m->ucx_addr_len = u->addr_len;
    u->base.role = ECXI_DATA_PRODUCER;
    *out = &u->base;
    return 0;
}

int ecxi_data_ucx_new_consumer(ecxi_region *r, ecxi_data **out)
{
    ucx_data *u = ucx_alloc(r);
    if (!u) return ECX_ENOMEM;
    int rc = ucx_setup(u, false, NULL);
    if (rc) {
        ucx_free(&u->base);
        return rc;
    }
    u->base.role = ECXI_DATA_CONSUMER;
    *out = &u->base;
    return 0;
}

/* ---- producer: connections -------------------------------------------- */

static void conn_req_cb(ucp_conn_request_h req, void *arg)
{
    ucx_data *u = arg;
    if (u->naccepts == MAX_ACCEPTS || u->nconns + u->naccepts >= MAX_CONNS) {
        u->conns_refused++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: too many connections; rejected one");
        (void)ucp_listener_reject(u->listener, req);
        return;
    }
    u->accepts[u->naccepts++] = req;
}

static void conn_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    conn *c = arg;
    c->failed = true;
    ECXI_LOG_RATELIMITED(ECX_LOG_INFO, "data ucx: a consumer connection ended: %s",
                        ucs_status_string(status));
}

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
    return true;
}

static host *host_of(ucx_data *u, const struct sockaddr_storage *a)
{
    for (host *h = u->hosts; h; h = h->next)
        if (same_host(&h->addr, a)) return h;
    host *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->addr = *a;
    h->next = u->hosts;
    u->hosts = h;
    return h;
}

static void host_unref(ucx_data *u, host *h)
{
    if (--h->conns) return;
    for (host **pp = &u->hosts; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    free(h);
}

static int accept_conns(ucx_data *u)
{
    int n = 0;
    for (unsigned i = 0; i < u->naccepts; i++, n++) {
        ucp_conn_request_h req = u->accepts[i];
        ucp_conn_request_attr_t qa = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
        if (ucp_conn_request_query(req, &qa) != UCS_OK)
            memset(&qa.client_address, 0, sizeof qa.client_address);
        host *h = host_of(u, &qa.client_address);
        bool full = h && h->conns >= MAX_CONNS_PER_HOST;
        if (h) h->conns++; /* this one, until it fails */
        conn *c = h && !full ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            u->conns_refused++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: connection refused (%s)",
                                full ? "per-host limit" : "no memory");
            (void)ucp_listener_reject(u->listener, req);
            if (h) host_unref(u, h);
            continue;
        }
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .conn_request = req,
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = conn_err_cb, .arg = c},
        };
        ucs_status_t st = ucp_ep_create(u->worker, &ep, &c->ep);
        if (st != UCS_OK) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: accept: %s", ucs_status_string(st));
            host_unref(u, h);
            free(c);
            continue;
        }
        c->h = h;
        c->next = u->conns;
        u->conns = c;
        u->nconns++;
    }
    u->naccepts = 0;
    return n;
}

/* Close failed connections; free each once nothing refers to it. */
static void reap_conns(ucx_data *u)
{
    int64_t now = ecxi_now_ms(NULL);
    for (conn **pp = &u->conns; *pp;) {
        conn *c = *pp;
        if (!c->failed && c->sends && now - c->last_done_ms > SEND_STALL_MS) {
            u->stalled++;
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data ucx: closed a connection whose sends stalled (%" PRIu64
                                " so far)",
                                u->stalled);
            c->failed = true;
        }
        if (c->failed && c->ep) {
            close_ep(u, c->ep, true);
            c->ep = NULL;
        }
        if (c->ep || c->queued || c->sends) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        u->nconns--;
        host_unref(u, c->h);
        free(c);
    }
}

/* ---- producer: requests ------------------------------------------------ */

static ucs_status_t am_req_cb(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
    (void)header; /* the request is the data; a header makes it malformed */
    ucx_data *u = arg;
    const uint8_t *b = data;
    conn *c = NULL;
    /* Only endpoints we accepted: UCX owns any other reply endpoint and may
     * free it once its peer fails. */
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
        for (c = u->conns; c && c->ep != param->reply_ep; c = c->next) {}
    /* A request is small and eager: a rendezvous one is not ours
     * (returning UCS_OK releases it unread). */
    if (!c || c->failed || header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        length < REQ_HDR || length > REQ_MAX || b[0] != REQ_VERSION ||
        (b[1] != REQ_GET && (b[1] != REQ_DECLINE || get_le64(b + 8) != 0)) ||
        get_le16(b + 2) != length - REQ_HDR || length == REQ_HDR) {
        u->dropped++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: dropped a malformed request (%zu bytes)",
                            length);
        return UCS_OK;
    }
    if (u->nqueued == MAX_QUEUED || c->queued == MAX_QUEUED_PER_CONN ||
        c->h->queued == MAX_QUEUED_PER_HOST) {
        u->dropped++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: request queue full; dropped one");
        return UCS_OK;
    }
    request *q = &u->queue[u->nqueued++];
    q->c = c;
    q->asked = false;
    q->decline = b[1] == REQ_DECLINE;
    q->tag = get_le64(b + 8);
    memcpy(q->token, b + 16, ECXI_DATA_TOKEN_LEN);
    q->key_len = (uint16_t)(length - REQ_HDR);
    memcpy(q->key, b + REQ_HDR, q->key_len);
    q->key[q->key_len] = 0;
    c->queued++, c->h->queued++;
    return UCS_OK;
}

/* s has ended with st: onto the done list, for poll_notifs. */
static void send_ended(ucx_data *u, psend *s, ucs_status_t st)
{
    s->running = false;
    s->status = s->fail ? s->fail : st == UCS_OK ? 0 : ECX_EDATA_UCX;
    s->c->sends--, s->c->h->sends--;
    s->next = NULL;
    *u->done_tail = s;
    u->done_tail = &s->next;
}

static void send_done_cb(void *req, ucs_status_t status, void *user_data)
{
    psend *s = user_data;
    ucp_request_free(req);
    if (status != UCS_OK)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: a send failed: %s", ucs_status_string(status));
    s->c->last_done_ms = ecxi_now_ms(NULL);
    send_ended(s->u, s, status);
}

static psend *send_get(ucx_data *u, conn *c)
{
    psend *s = u->free_sends;
    if (s)
        u->free_sends = s->next;
    else if ((s = calloc(1, sizeof *s)))
        s->all_next = u->all_sends, u->all_sends = s;
    else
        return NULL;
    u->nsends++;
    if (c->sends++ == 0) c->last_done_ms = ecxi_now_ms(NULL);
    c->h->sends++;
    s->next = NULL;
    s->u = u;
    s->c = c;
    s->refusal = false;
    s->running = false;
    s->fail = 0;
    return s;
}

/* Undo a send_get whose send was never posted. */
static void send_unget(ucx_data *u, psend *s)
{
    s->c->sends--, s->c->h->sends--;
    u->nsends--;
    s->next = u->free_sends;
    u->free_sends = s;
}

static void send_put(ucx_data *u, psend *s)
{
    u->nsends--;
    s->next = u->free_sends;
    u->free_sends = s;
}

/* Post the tagged send s describes (buf / count / datatype); an immediate
 * end goes straight to the done list. */
static void post_send(ucx_data *u, psend *s, uint64_t tag, void *buf, size_t count,
                      ucp_datatype_t dt, bool memh)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | (memh ? UCP_OP_ATTR_FIELD_MEMH : 0),
        .cb.send = send_done_cb,
        .user_data = s,
        .datatype = dt,
        .memh = u->memh,
    };
    s->running = true; /* before the call: the callback may run inside it */
    void *req = ucp_tag_send_nbx(s->c->ep, buf, count, tag, &prm);
    if (req != NULL && !UCS_PTR_IS_ERR(req)) return;
    ucs_status_t st = UCS_PTR_STATUS(req);
    if (st != UCS_OK)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: tag_send: %s", ucs_status_string(st));
    send_ended(u, s, st);
}

/* The grant's blocks as an IOV over the region: one entry per run of
 * consecutive blocks, the last cut to nbytes. */
static int grant_iov(ucx_data *u, psend *s, const ecxi_data_grant *g, size_t *count)
{
    const uint64_t bs = ecxi_region_block_bytes(u->base.region);
    const uint64_t nb = ecxi_region_num_blocks(u->base.region);
    uint8_t *base = ecxi_region_base(u->base.region);
    if (g->n == 0 || g->nbytes == 0 || g->nbytes > g->n * bs || g->nbytes <= (g->n - 1) * bs)
        return ECX_EDATA_COUNT;
    size_t k = 0;
    uint64_t left = g->nbytes;
    for (size_t i = 0; i < g->n;) {
        if (g->blocks[i] >= nb) return ECX_EDATA_INDEX;
        size_t run = 1;
        while (i + run < g->n && g->blocks[i + run] == g->blocks[i] + run &&
               g->blocks[i + run] < nb)
            run++;
        if (k == s->iov_cap) {
            size_t cap = s->iov_cap ? 2 * s->iov_cap : 8;
            ucp_dt_iov_t *v = realloc(s->iov, cap * sizeof *v);
            if (!v) return ECX_ENOMEM;
            s->iov = v, s->iov_cap = cap;
        }
        uint64_t len = run * bs < left ? run * bs : left;
        s->iov[k].buffer = base + g->blocks[i] * bs;
        s->iov[k].length = len;
        left -= len;
        k++;
        i += run;
    }
    *count = k;
    return 0;
}

/* The grant s is about, as q named it (its end reports it). */
static void send_name(psend *s, const request *q)
{
    memcpy(s->token, q->token, ECXI_DATA_TOKEN_LEN);
    memcpy(s->key, q->key, q->key_len + 1u);
    s->key_len = q->key_len;
}

/* A decline: no grant check and no reply; its (key, token) goes to the
 * session, which checks the token and releases the grant (data.h,
 * ECXI_DATA_DECLINED). It waits in a send of its own, ended at once, so
 * that the sends' total bounds what waits for poll_notifs; the
 * connection may have failed since: nothing is sent to it. */
static bool serve_decline(ucx_data *u, request *q)
{
    psend *s = u->nsends < MAX_SENDS ? send_get(u, q->c) : NULL;
    if (!s) return false;
    send_name(s, q);
    s->fail = ECXI_DATA_DECLINED;
    send_ended(u, s, UCS_OK);
    return true;
}

/* Serve (or refuse) one request; false if it must wait for capacity. */
static bool serve(ucx_data *u, request *q)
{
    conn *c = q->c;
    if (q->decline) return serve_decline(u, q);
    if (c->failed || !c->ep) return true; /* nobody to answer */
    if (u->nsends >= MAX_SENDS || c->sends >= MAX_SENDS_PER_CONN ||
        c->h->sends >= MAX_SENDS_PER_HOST)
        return false;
    psend *s = send_get(u, c);
    if (!s) return false;
    ecxi_data_grant g;
    int rc = ecxi_data_grant_check(&u->base, q->key, q->key_len, q->token, ECXI_DATA_GRANT_CLAIM, &g);
    if (rc == ECXI_DATA_GRANT_ASKED) {
        /* The answer comes later (the session is in another process:
         * ucx_proc.h): the request waits for it in the queue. */
        send_unget(u, s);
        q->asked = true;
        return false;
    }
    size_t count = 0;
    if (rc == 0) {
        send_name(s, q);
        rc = grant_iov(u, s, &g, &count);
        if (rc) {
            /* Cannot happen with a sane session; the grant is claimed, so
             * its end is still reported (as a failure), and the consumer
             * told at once. */
            ecxi_log(ECX_LOG_ERROR, "data ucx: a grant does not fit the region: %s",
                    ecx_strerror(rc));
            s->fail = rc;
            post_send(u, s, q->tag, NULL, 0, ucp_dt_make_contig(1), false);
            return true;
        }
        if (count == 1)
            post_send(u, s, q->tag, s->iov[0].buffer, s->iov[0].length, ucp_dt_make_contig(1), true);
        else
            post_send(u, s, q->tag, s->iov, count, ucp_dt_make_iov(), false);
        return true;
    }
    u->refused++;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: refused a request without a live grant (%" PRIu64
                                      " so far)", u->refused);
    s->refusal = true;
    post_send(u, s, q->tag, NULL, 0, ucp_dt_make_contig(1), false);
    return true;
}

/* The session lets go of a claimed grant (data.h, ecxi_data_cut): a send
 * of it still in UCX's hands (a rendezvous waiting for the consumer's
 * receive, or a stream of fragments) reads the region until it ends, so
 * its connection's endpoint is force-closed now, which ends the send with
 * an error; the session unpins when that end comes through poll_notifs. */
static int ucx_cut(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token)
{
    ucx_data *u = (ucx_data *)d;
    for (psend *s = u->all_sends; s; s = s->all_next) {
        if (!s->running || s->refusal || s->key_len != key_len ||
            sodium_memcmp(s->token, token, ECXI_DATA_TOKEN_LEN) != 0 || memcmp(s->key, key, key_len))
            continue;
        conn *c = s->c;
        if (c->failed && !c->ep) return 1; /* cut already: its end is on the way */
        u->cuts++;
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                            "data ucx: cut a send whose grant was let go (lease expired, "
                            "replaced or completed; %" PRIu64 " so far)",
                            u->cuts);
        s->fail = ECX_EDATA_PEER;
        c->failed = true;
        if (c->ep) {
            close_ep(u, c->ep, true);
            c->ep = NULL;
        }
        return 1;
    }
    return 0;
}

/* Serve what can be served, in arrival order; the rest waits. */
static int serve_queue(ucx_data *u)
{
    unsigned keep = 0;
    int n = 0;
    for (unsigned i = 0; i < u->nqueued; i++) {
        request *q = &u->queue[i];
        if (serve(u, q)) {
            q->c->queued--, q->c->h->queued--;
            n++;
        } else if (keep != i) {
            u->queue[keep++] = *q;
        } else {
            keep++;
        }
    }
    u->nqueued = keep;
    return n;
}

/* ---- progress ---------------------------------------------------------- */

static int verify_some(ucx_data *u, ecxi_slice *sl);

/* Most ucp_worker_progress calls in one slice. */
#define PROGRESS_MAX 256

static int ucx_progress(ecxi_data *d, ecxi_slice *sl)
{
    ucx_data *u = (ucx_data *)d;
    int n = 0;
    /* Bounded by the slice's budget (data.h), so one engine step never
     * stalls behind a large transfer: the caller's next call carries on.
     * One ucp_worker_progress call is UCX's to bound (a fragment or a
     * segment on the transports ecx configures; data_ucx.c's top). */
    int64_t until = sl->start_ns + (sl->budget_ns > 0 ? sl->budget_ns : 0);
    for (int i = 0; ucp_worker_progress(u->worker); i++) {
        n++;
        if (i + 1 >= PROGRESS_MAX || ecxi_now_ns() >= until) {
            sl->more = true; /* it was still doing something */
            break;
        }
    }
    if (u->verify_head) n += verify_some(u, sl);
    /* A producer connection that failed sends nothing more: its READs
     * fail now, not at their lease (receives are the worker's, not the
     * endpoint's). */
    for (ucx_peer *p = u->peers; p; p = p->all_next)
        if (p->broken && !p->failed_reads) {
            p->failed_reads = true;
            for (ucx_xfer *x = u->all_xfers; x; x = x->all_next)
                if (x->peer == p && x->req) ucp_request_cancel(u->worker, x->req), n++;
        }
    if (u->naccepts) n += accept_conns(u);
    if (u->nqueued) n += serve_queue(u);
    if (u->conns) reap_conns(u);
    if (u->closing) n += reap_closing(u);
    return n;
}

static int ucx_fd(ecxi_data *d)
{
    return ((ucx_data *)d)->efd;
}

static int ucx_arm(ecxi_data *d)
{
    ucx_data *u = (ucx_data *)d;
    if (u->done || u->naccepts || u->verify_head) return 1;
    /* Queued requests wait for a send to end, which wakes the fd. */
    if (u->nqueued && u->nsends < MAX_SENDS) {
        for (unsigned i = 0; i < u->nqueued; i++)
            if (u->queue[i].c->failed || u->queue[i].decline || (!u->queue[i].asked &&
                                          u->queue[i].c->sends < MAX_SENDS_PER_CONN &&
                                          u->queue[i].c->h->sends < MAX_SENDS_PER_HOST))
                return 1;
    }
    ucs_status_t st = ucp_worker_arm(u->worker);
    if (st == UCS_OK) return 0;
    if (st == UCS_ERR_BUSY) return 1;
    return ucx_err("worker_arm", st);
}

static int ucx_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    ucx_data *u = (ucx_data *)d;
    int rc = ucx_progress(d, sl);
    if (rc < 0) return rc;
    int count = 0;
    while (u->done) {
        psend *s = u->done;
        if (!(u->done = s->next)) u->done_tail = &u->done;
        if (!s->refusal) {
            cb(arg, s->key, s->key_len, s->token, s->status);
            count++;
        }
        send_put(u, s);
    }
    return count;
}

/* ---- consumer: peers --------------------------------------------------- */

/* Lifetimes: an xfer lives until it is released AND its receive request
 * has ended; a peer lives until it is dropped AND no xfer refers to it.
 * Dropping a peer cancels its receives and force-closes its endpoint.
 * Endpoint closes run in the background of progress; ucx_free waits for
 * them CLOSE_WAIT_MS at most. */

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    ucx_peer *p = arg;
    p->broken = true;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: producer connection failed: %s",
                        ucs_status_string(status));
}

/* The producer's listener address, from our own format (PROTOCOL.md §6.2,
 * the ucx section, after the front's digest): u8 version (1) | u8 family
 * (4 / 6) | u16 port (BE) | 4 / 16 address bytes; a unicast address and
 * a port, else ECX_EDATA_META. The consumer never hands UCX a peer's
 * packed worker address, so no byte string in an ack reaches UCX's
 * address parser. */
static int parse_addr(const uint8_t *b, size_t len, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof *ss);
    if (len < 4 || b[0] != ADDR_VERSION) return ECX_EDATA_META;
    uint16_t port;
    memcpy(&port, b + 2, 2);
    if (port == 0) return ECX_EDATA_META;
    if (b[1] == 4 && len == 8) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_port = port;
        memcpy(&in->sin_addr, b + 4, 4);
        *sl = sizeof *in;
        uint32_t a = ntohl(in->sin_addr.s_addr);
        return a == INADDR_ANY || a == INADDR_BROADCAST || IN_MULTICAST(a) ? ECX_EDATA_META : 0;
    }
    if (b[1] == 6 && len == 20) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = port;
        memcpy(&in6->sin6_addr, b + 4, 16);
        *sl = sizeof *in6;
        return IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) || IN6_IS_ADDR_MULTICAST(&in6->sin6_addr)
                   ? ECX_EDATA_META
                   : 0;
    }
    return ECX_EDATA_META;
}

static int ucx_peer_add(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                        ecxi_data_peer **out)
{
    (void)desc;
    ucx_data *u = (ucx_data *)d;
    if (!m->has_ucx) return ECX_EDATA_NOPATH;
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = parse_addr(m->ucx_addr, m->ucx_addr_len, &ss, &sl);
    if (rc) return rc;
    ucx_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = (struct sockaddr *)&ss, .addrlen = sl},
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = peer_err_cb, .arg = p},
    };
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        free(p);
        ecxi_log(ECX_LOG_WARN, "data ucx: ep_create: %s", ucs_status_string(st));
        return st == UCS_ERR_UNREACHABLE ? ECX_EDATA_NOPATH : ECX_EDATA_UCX;
    }
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

static void peer_unref(ucx_peer *p)
{
    if (--p->refs) return;
    *p->all_prev = p->all_next;
    if (p->all_next) p->all_next->all_prev = p->all_prev;
    free(p);
}

/* The forced close below would drop p's declines that UCX still holds
 * (sent just before, while the connection was still being set up): they
 * get DECLINE_FLUSH_MS to leave, waiting as worker_wait does. */
static void declines_flush(ucx_data *u, ucx_peer *p)
{
    int64_t end = ecxi_now_ms(NULL) + DECLINE_FLUSH_MS;
    for (;;) {
        bool held = false;
        for (ucx_xfer *x = u->all_xfers; x && !held; x = x->all_next)
            held = x->decline && x->am_pending && x->peer == p;
        int64_t left = end - ecxi_now_ms(NULL);
        if (!held || p->broken || left <= 0 || !worker_wait(u, left)) return;
    }
}

static void ucx_peer_drop(ecxi_data_peer *hp)
{
    ucx_peer *p = (ucx_peer *)hp;
    ucx_data *u = (ucx_data *)hp->owner;
    /* What UCX ended up using (after wire-up), for whoever debugs a path. */
    if (ecxi_log_level() >= ECX_LOG_DEBUG && p->ep) ucp_ep_print_info(p->ep, stderr);
    if (p->ep) declines_flush(u, p);
    /* Receives are posted on the worker, not the endpoint: cancel them
     * (one already matched ends when the forced close purges it). */
    for (ucx_xfer *x = u->all_xfers; x; x = x->all_next)
        if (x->peer == p && x->req) ucp_request_cancel(u->worker, x->req);
    close_ep(u, p->ep, true);
    p->ep = NULL;
    p->broken = p->failed_reads = true;
    peer_unref(p);
}

/* ---- consumer: READs --------------------------------------------------- */

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
    x->req = NULL;
    x->state = ECXI_XFER_RUNNING;
    x->released = x->recv_ok = x->recv_ended = x->am_pending = x->verifying = x->decline = false;
    x->received = 0;
    return x;
}

static void xfer_put(ucx_data *u, ucx_xfer *x)
{
    if (x->peer) peer_unref(x->peer);
    x->peer = NULL;
    x->next = u->free_xfers;
    u->free_xfers = x;
}

/* Free it once the user is done with it and UCX no longer refers to it. */
static void xfer_maybe_put(ucx_data *u, ucx_xfer *x)
{
    if (x->released && !x->req && !x->am_pending) xfer_put(u, x);
}

/* The receive has ended: judge what landed. */
static void xfer_land(ucx_data *u, ucx_xfer *x)
{
    if (x->released) {
        xfer_maybe_put(u, x);
        return;
    }
    if (!x->recv_ok || x->received != x->nbytes) {
        if (x->recv_ok)
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "data ucx: producer sent %zu of %" PRIu64 " bytes (refused?)",
                                x->received, x->nbytes);
        x->state = ECXI_XFER_FAILED;
        return;
    }
    /* Checked in progress slices (an item's hash is milliseconds of work,
     * and this runs inside ucp_worker_progress). */
    if (!x->sum && !(x->sum = aligned_alloc(64, (sizeof(ecxi_sum) + 63) & ~(size_t)63))) {
        x->state = ECXI_XFER_FAILED;
        return;
    }
    ecxi_sum_reset(x->sum);
    x->v_i = 0;
    x->v_off = 0;
    x->verifying = true;
    x->vnext = NULL;
    if (u->verify_tail)
        u->verify_tail->vnext = x;
    else
        u->verify_head = x;
    u->verify_tail = x;
}

static void verify_unlink(ucx_data *u, ucx_xfer *x)
{
    ucx_xfer *prev = NULL;
    for (ucx_xfer *w = u->verify_head; w; prev = w, w = w->vnext)
        if (w == x) {
            if (prev)
                prev->vnext = x->vnext;
            else
                u->verify_head = x->vnext;
            if (u->verify_tail == x) u->verify_tail = prev;
            break;
        }
    x->vnext = NULL;
    x->verifying = false;
}

/* Checksum landed READs, oldest first, a chunk at a time, until the slice
 * is spent; returns READs judged. */
static int verify_some(ucx_data *u, ecxi_slice *sl)
{
    int n = 0;
    while (u->verify_head) {
        if (ecxi_slice_spent(sl)) break;
        ucx_xfer *x = u->verify_head;
        if (x->v_i < x->niov) {
            const ucp_dt_iov_t *v = &x->iov[x->v_i];
            uint64_t len = v->length - x->v_off;
            if (len > ECXI_DATA_CHUNK) len = ECXI_DATA_CHUNK;
            ecxi_sum_update(x->sum, (const uint8_t *)v->buffer + x->v_off, (size_t)len);
            sl->bytes += len;
            x->v_off += len;
            if (x->v_off == v->length) x->v_i++, x->v_off = 0;
            continue;
        }
        verify_unlink(u, x);
        x->state = ecxi_sum_digest(x->sum) == x->checksum ? ECXI_XFER_DONE : ECXI_XFER_CORRUPT;
        n++;
    }
    return n;
}

static void recv_done_cb(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info,
                         void *user_data)
{
    ucx_xfer *x = user_data;
    ucx_data *u = (ucx_data *)x->head.owner;
    ucp_request_free(req);
    x->req = NULL;
    x->recv_ended = true;
    x->recv_ok = status == UCS_OK;
    x->received = x->recv_ok ? info->length : 0;
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: receive failed: %s",
                            ucs_status_string(status));
    xfer_land(u, x);
}

static void req_sent_cb(void *req, ucs_status_t status, void *user_data)
{
    ucx_xfer *x = user_data;
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: request not sent: %s",
                            ucs_status_string(status));
    ucp_request_free(req);
    x->am_pending = false;
    xfer_maybe_put((ucx_data *)x->head.owner, x);
}

/* Send x's request AM to p (x holds p from now on): 0, or ECX_EDATA_UCX
 * if UCX refused it at once. */
static int request_send(ucx_peer *p, ucx_xfer *x, uint8_t type, uint64_t tag,
                        const uint8_t *token, const char *key, size_t key_len)
{
    uint8_t *msg = x->msg;
    memset(msg, 0, REQ_HDR);
    msg[0] = REQ_VERSION;
    msg[1] = type;
    put_le16(msg + 2, (uint16_t)key_len);
    put_le64(msg + 8, tag);
    memcpy(msg + 16, token, ECXI_DATA_TOKEN_LEN);
    memcpy(msg + REQ_HDR, key, key_len);
    x->peer = p;
    p->refs++;
    ucp_request_param_t sp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
        .cb.send = req_sent_cb,
        .user_data = x,
    };
    void *sr = ucp_am_send_nbx(p->ep, AM_REQ_ID, NULL, 0, msg, REQ_HDR + key_len, &sp);
    if (sr && !UCS_PTR_IS_ERR(sr)) x->am_pending = true;
    if (!UCS_PTR_IS_ERR(sr)) return 0;
    ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: request not sent: %s",
                        ucs_status_string(UCS_PTR_STATUS(sr)));
    return ECX_EDATA_UCX;
}

/* The local runs as an IOV: one entry per run, the last cut to nbytes. */
static int local_iov(ucx_data *u, ucx_xfer *x, const ecxi_block_run *local, size_t n,
                     size_t *count)
{
    const uint64_t bs = ecxi_region_block_bytes(u->base.region);
    uint8_t *base = ecxi_region_base(u->base.region);
    size_t k = 0;
    uint64_t left = x->nbytes;
    for (size_t i = 0; i < n && left; i++) {
        if (k == x->iov_cap) {
            size_t cap = x->iov_cap ? 2 * x->iov_cap : 8;
            ucp_dt_iov_t *v = realloc(x->iov, cap * sizeof *v);
            if (!v) return ECX_ENOMEM;
            x->iov = v, x->iov_cap = cap;
        }
        uint64_t len = local[i].count * bs < left ? local[i].count * bs : left;
        x->iov[k].buffer = base + local[i].first * bs;
        x->iov[k].length = len;
        left -= len;
        k++;
    }
    *count = k;
    return 0;
}

static int ucx_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t,
                         const ecxi_block_run *remote, size_t nremote,
                         const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                         const char *key, size_t key_len, ecxi_data_xfer **out)
{
    (void)remote, (void)nremote; /* the producer sends the grant's blocks; it never takes ours */
    ucx_peer *p = (ucx_peer *)hp;
    ucx_data *u = (ucx_data *)hp->owner;
    if (p->broken || !p->ep) return ECX_EDATA_PEER;
    ucx_xfer *x = xfer_get(u);
    if (!x) return ECX_ENOMEM;
    size_t count = 0;
    x->nbytes = nbytes;
    x->checksum = t->checksum;
    int rc = local_iov(u, x, local, nlocal, &count);
    x->niov = count;
    uint64_t tag;
    randombytes_buf(&tag, sizeof tag);
    if (rc == 0) {
        /* One run (the usual case) is received contiguously: only then
         * can UCX's rendezvous put straight into it (an IOV receive
         * makes the data come as active-message fragments). */
        ucp_request_param_t rp = {
            /* Always a request and a callback, even if it ends at once. */
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            .cb.recv = recv_done_cb,
            .user_data = x,
            .datatype = count == 1 ? ucp_dt_make_contig(1) : ucp_dt_make_iov(),
        };
        void *req = count == 1 ? ucp_tag_recv_nbx(u->worker, x->iov[0].buffer, x->iov[0].length,
                                                  tag, UINT64_MAX, &rp)
                               : ucp_tag_recv_nbx(u->worker, x->iov, count, tag, UINT64_MAX, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "data ucx: tag_recv: %s",
                                ucs_status_string(UCS_PTR_STATUS(req)));
            rc = ECX_EDATA_UCX;
        } else if (!x->recv_ended) {
            x->req = req; /* else its callback already ran (and freed it) */
        }
    }
    if (rc) {
        x->released = true;
        xfer_put(u, x);
        return rc;
    }
    if (request_send(p, x, REQ_GET, tag, t->token, key, key_len))
        ucp_request_cancel(u->worker, x->req); /* still posted: fail the xfer through it */
    *out = &x->head;
    return 0;
}

/* The consumer will not read the grant: say so (fire and forget; if it is
 * lost, the producer's lease releases the grant). An xfer released at once
 * carries the message until UCX has sent it. */
static int ucx_decline(ecxi_data_peer *hp, const ecxi_data_ticket *t, const char *key,
                       size_t key_len)
{
    ucx_peer *p = (ucx_peer *)hp;
    ucx_data *u = (ucx_data *)hp->owner;
    if (p->broken || !p->ep) return ECX_EDATA_PEER;
    ucx_xfer *x = xfer_get(u);
    if (!x) return ECX_ENOMEM;
    x->released = x->decline = true;
    int rc = request_send(p, x, REQ_DECLINE, 0, t->token, key, key_len);
    xfer_maybe_put(u, x);
    return rc;
}

static int ucx_read_poll(ecxi_data_xfer *hx)
{
    return ((ucx_xfer *)hx)->state;
}

static void ucx_read_release(ecxi_data_xfer *hx)
{
    ucx_xfer *x = (ucx_xfer *)hx;
    ucx_data *u = (ucx_data *)hx->owner;
    x->released = true;
    if (x->verifying) verify_unlink(u, x);
    if (x->req) {
        /* Ends through recv_done_cb (an unmatched receive at once; one
         * already matched when its data is in or its peer is dropped). */
        ucp_request_cancel(u->worker, x->req);
        return;
    }
    xfer_maybe_put(u, x);
}

/* ---- teardown ---------------------------------------------------------- */

static void ucx_free(ecxi_data *d)
{
    ucx_data *u = (ucx_data *)d;
    if (u->worker) {
        /* Close every endpoint, then wait (bounded) for the closes to
         * finish so the peers hear about it. */
        for (ucx_peer *p = u->peers; p; p = p->all_next)
            if (p->ep) {
                close_ep(u, p->ep, true);
                p->ep = NULL;
            }
        for (conn *c = u->conns; c; c = c->next)
            if (c->ep) {
                close_ep(u, c->ep, true);
                c->ep = NULL;
            }
        int64_t end = ecxi_now_ms(NULL) + CLOSE_WAIT_MS;
        for (;;) {
            reap_closing(u);
            int64_t left = end - ecxi_now_ms(NULL);
            if (!u->closing || left <= 0 || !worker_wait(u, left)) break;
        }
        for (ucx_xfer *x = u->all_xfers; x; x = x->all_next)
            if (x->req) ucp_request_cancel(u->worker, x->req);
        for (unsigned i = 0; i < u->naccepts; i++)
            (void)ucp_listener_reject(u->listener, u->accepts[i]);
    }
    for (closing *c = u->closing, *n; c; c = n) {
        n = c->next;
        ucp_request_free(c->req); /* UCX finishes it in worker_destroy */
        free(c);
    }
    if (u->listener) ucp_listener_destroy(u->listener);
    if (u->memh) ucp_mem_unmap(u->ctx, u->memh);
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->ctx) ucp_cleanup(u->ctx);
    for (ucx_peer *p = u->peers, *n; p; p = n) {
        n = p->all_next;
        free(p);
    }
    for (ucx_xfer *x = u->all_xfers, *n; x; x = n) {
        n = x->all_next;
        free(x->iov);
        free(x->sum);
        free(x);
    }
    for (conn *c = u->conns, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    for (host *h = u->hosts, *n; h; h = n) {
        n = h->next;
        free(h);
    }
    for (psend *s = u->all_sends, *n; s; s = n) {
        n = s->all_next;
        free(s->iov);
        free(s);
    }
    free(u->queue);
    free(u);
}

static void ucx_stats(const ecxi_data *d, ecxi_data_stats *st)
{
    const ucx_data *u = (const ucx_data *)d;
    ecxi_data_counts *c = &st->path[ECX_DATA_UCX];
    c->conns_refused += u->conns_refused;
    c->conns_dropped += u->stalled + u->cuts;
    c->requests_dropped += u->dropped;
}

static const struct ecxi_data_ops ucx_ops = {
    .name = "ucx",
    .stats = ucx_stats,
    .free = ucx_free,
    .progress = ucx_progress,
    .fd = ucx_fd,
    .arm = ucx_arm,
    .poll_notifs = ucx_poll_notifs,
    .cut = ucx_cut,
    .peer_add = ucx_peer_add,
    .peer_drop = ucx_peer_drop,
    .read_post = ucx_read_post,
    .decline = ucx_decline,
    .read_poll = ucx_read_poll,
    .read_release = ucx_read_release,
};
