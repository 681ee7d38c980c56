/*
 * ctrl — ZeroMQ ROUTER / DEALER sockets with the framing, size caps,
 * heartbeats and disconnect monitor of the control plane. See ctrl.h.
 */
#include "ctrl.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ecx.h"
#include "util.h"

struct ecx_ctrl_server {
    void *sock;
    int port;
    ecx_ctrl_stats stats;
};

struct ecx_ctrl_peer {
    void *sock, *monitor;
    zmq_msg_t parts[2];
    bool parts_open, lost;
    ecx_ctrl_stats stats;
};

int ecx_ctrl_parse_addr(const char *addr, char host[256], int *port)
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

static int apply_common(void *sock, const ecx_ctrl_opts *o)
{
    int64_t max = o && o->max_frame_bytes > 0 ? o->max_frame_bytes : ECX_CTRL_MAX_FRAME;
    if (set_int(sock, ZMQ_LINGER, 0) || set_int(sock, ZMQ_IPV6, 1) ||
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max))
        return ECX_ESYS;
    return 0;
}

/* ---------- server ---------- */

int ecx_ctrl_server_new(void *zctx, const char *host, int port, const ecx_ctrl_opts *opts,
                        ecx_ctrl_server **out)
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
            ecx_log(ECX_LOG_ERROR, "ctrl: cannot resolve listen host '%s': %s", host,
                    gai_strerror(g));
            return ECX_EINVAL;
        }
        g = getnameinfo(ai->ai_addr, ai->ai_addrlen, numeric, sizeof numeric, NULL, 0,
                        NI_NUMERICHOST);
        freeaddrinfo(ai);
        if (g) return ECX_EINVAL;
    }
    if (endpoint(ep, sizeof ep, numeric, port)) return ECX_EINVAL;

    ecx_ctrl_server *s = calloc(1, sizeof *s);
    if (!s) return ECX_ENOMEM;
    s->sock = zmq_socket(zctx, ZMQ_ROUTER);
    if (!s->sock || apply_common(s->sock, opts) || set_int(s->sock, ZMQ_ROUTER_MANDATORY, 1)) {
        ecx_ctrl_server_free(s);
        return ECX_ESYS;
    }
    if (zmq_bind(s->sock, ep)) {
        ecx_log(ECX_LOG_ERROR, "ctrl: cannot listen on %s: %s", ep, zmq_strerror(zmq_errno()));
        ecx_ctrl_server_free(s);
        return ECX_ESYS;
    }
    char last[300];
    size_t n = sizeof last;
    const char *colon;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, last, &n) || !(colon = strrchr(last, ':'))) {
        ecx_ctrl_server_free(s);
        return ECX_ESYS;
    }
    s->port = atoi(colon + 1);
    *out = s;
    return 0;
}

void ecx_ctrl_server_free(ecx_ctrl_server *s)
{
    if (!s) return;
    if (s->sock) zmq_close(s->sock);
    free(s);
}

int ecx_ctrl_server_port(const ecx_ctrl_server *s)
{
    return s->port;
}
void *ecx_ctrl_server_socket(const ecx_ctrl_server *s)
{
    return s->sock;
}
ecx_ctrl_stats ecx_ctrl_server_stats(const ecx_ctrl_server *s)
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

/* Receive one whole message of exactly `want` parts into parts[]. Returns 1
 * on a message of that shape, 0 if none is waiting, -1 if one of another
 * shape was received and dropped. */
static int recv_parts(void *sock, zmq_msg_t *parts, int want)
{
    for (int i = 0; i < want; i++) {
        if (zmq_msg_recv(&parts[i], sock, ZMQ_DONTWAIT) < 0) {
            /* Only the first part can be absent: ZMQ delivers a message's
             * parts together. */
            return i == 0 ? 0 : -1;
        }
        bool more = has_more(sock);
        if (i < want - 1 && !more) return -1;
        if (i == want - 1 && more) {
            drain(sock, &parts[i]);
            return -1;
        }
    }
    return 1;
}

int ecx_ctrl_server_recv(ecx_ctrl_server *s, ecx_ctrl_msg *m)
{
    for (;;) {
        int rc = recv_parts(s->sock, m->parts, 3);
        if (rc == 0) return 0;
        if (rc == 1 && zmq_msg_size(&m->parts[1]) == 0) {
            m->identity = zmq_msg_data(&m->parts[0]);
            m->identity_len = zmq_msg_size(&m->parts[0]);
            m->payload = zmq_msg_data(&m->parts[2]);
            m->payload_len = zmq_msg_size(&m->parts[2]);
            return 1;
        }
        s->stats.bad_framing++;
        ecx_log(ECX_LOG_DEBUG, "ctrl: dropped a request with bad framing");
    }
}

void ecx_ctrl_msg_init(ecx_ctrl_msg *m)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < 3; i++)
        zmq_msg_init(&m->parts[i]);
}

void ecx_ctrl_msg_fini(ecx_ctrl_msg *m)
{
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&m->parts[i]);
}

int ecx_ctrl_server_send(ecx_ctrl_server *s, const void *identity, size_t identity_len,
                         const void *payload, size_t len)
{
    if (zmq_send(s->sock, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->sock, payload, len, ZMQ_DONTWAIT) < 0) {
        s->stats.send_failed++;
        ecx_log(ECX_LOG_DEBUG, "ctrl: reply not sent: %s", zmq_strerror(zmq_errno()));
        return ECX_ESYS;
    }
    return 0;
}

/* ---------- peer ---------- */

int ecx_ctrl_peer_new(void *zctx, const char *host, int port, const ecx_ctrl_opts *opts,
                      ecx_ctrl_peer **out)
{
    static unsigned long monitor_seq;
    char ep[300], mon[64];
    if (!zctx || !host || !*host || port <= 0 || port > 65535 || !out ||
        endpoint(ep, sizeof ep, host, port))
        return ECX_EINVAL;
    ecx_ctrl_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    zmq_msg_init(&p->parts[0]);
    zmq_msg_init(&p->parts[1]);
    int ivl = opts && opts->heartbeat_ivl_ms > 0 ? opts->heartbeat_ivl_ms : 2000;
    int tmo = opts && opts->heartbeat_timeout_ms > 0 ? opts->heartbeat_timeout_ms : 4000;
    int ttl = opts && opts->heartbeat_ttl_ms > 0 ? opts->heartbeat_ttl_ms : 8000;
    /* The monitor endpoint must be unique in the context; the pointer and a
     * counter make it so. */
    snprintf(mon, sizeof mon, "inproc://ecx-mon-%p-%lu", (void *)p,
             __atomic_add_fetch(&monitor_seq, 1, __ATOMIC_RELAXED));
    p->sock = zmq_socket(zctx, ZMQ_DEALER);
    int rc = ECX_ESYS;
    if (!p->sock || apply_common(p->sock, opts) || set_int(p->sock, ZMQ_HEARTBEAT_IVL, ivl) ||
        set_int(p->sock, ZMQ_HEARTBEAT_TIMEOUT, tmo) || set_int(p->sock, ZMQ_HEARTBEAT_TTL, ttl) ||
        zmq_socket_monitor(p->sock, mon, ZMQ_EVENT_DISCONNECTED))
        goto fail;
    p->monitor = zmq_socket(zctx, ZMQ_PAIR);
    if (!p->monitor || set_int(p->monitor, ZMQ_LINGER, 0) || zmq_connect(p->monitor, mon))
        goto fail;
    if (zmq_connect(p->sock, ep)) {
        ecx_log(ECX_LOG_WARN, "ctrl: cannot connect to %s: %s", ep, zmq_strerror(zmq_errno()));
        rc = ECX_EINVAL;
        goto fail;
    }
    *out = p;
    return 0;
fail:
    ecx_ctrl_peer_free(p);
    return rc;
}

void ecx_ctrl_peer_free(ecx_ctrl_peer *p)
{
    if (!p) return;
    if (p->sock) {
        zmq_socket_monitor(p->sock, NULL, 0);
        zmq_close(p->sock);
    }
    if (p->monitor) zmq_close(p->monitor);
    zmq_msg_close(&p->parts[0]);
    zmq_msg_close(&p->parts[1]);
    free(p);
}

void *ecx_ctrl_peer_socket(const ecx_ctrl_peer *p)
{
    return p->sock;
}
ecx_ctrl_stats ecx_ctrl_peer_stats(const ecx_ctrl_peer *p)
{
    return p->stats;
}

int ecx_ctrl_peer_send(ecx_ctrl_peer *p, const void *payload, size_t len)
{
    if (zmq_send(p->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->sock, payload, len, ZMQ_DONTWAIT) < 0) {
        p->stats.send_failed++;
        return ECX_ESYS;
    }
    return 0;
}

int ecx_ctrl_peer_recv(ecx_ctrl_peer *p, const void **payload, size_t *len)
{
    for (;;) {
        int rc = recv_parts(p->sock, p->parts, 2);
        if (rc == 0) return 0;
        if (rc == 1 && zmq_msg_size(&p->parts[0]) == 0) {
            *payload = zmq_msg_data(&p->parts[1]);
            *len = zmq_msg_size(&p->parts[1]);
            return 1;
        }
        p->stats.bad_framing++;
        ecx_log(ECX_LOG_DEBUG, "ctrl: dropped a reply with bad framing");
    }
}

bool ecx_ctrl_peer_lost(ecx_ctrl_peer *p)
{
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    while (!p->lost && zmq_msg_recv(&ev, p->monitor, ZMQ_DONTWAIT) >= 0) {
        /* Frame 1: uint16 event + uint32 value; frame 2: the endpoint. */
        if (zmq_msg_size(&ev) >= 2) {
            uint16_t event;
            memcpy(&event, zmq_msg_data(&ev), sizeof event);
            if (event == ZMQ_EVENT_DISCONNECTED) p->lost = true;
        }
        drain(p->monitor, &ev);
    }
    zmq_msg_close(&ev);
    return p->lost;
}
