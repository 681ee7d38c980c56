/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx ping — is a producer there, and would it serve this consumer? Answers
 * within 2 s which of: nothing listening, not a ZeroMQ peer, CURVE mismatch,
 * protocol version differs, compatibility hash differs, or reachable and
 * compatible; the exit status says which.
 *
 * Three steps, each under the one deadline: a TCP connect (refused: nothing
 * listening); a ZMTP 3 greeting exchanged by hand (no 0xFF...0x7F signature
 * back: not a ZeroMQ peer; its mechanism NULL or CURVE against ours: a CURVE
 * mismatch); then one XferReq on a DEALER, as `ecx get` sends it, for an
 * mm_hash nobody holds, so it never pins anything: NACK_VERSION,
 * NACK_INCOMPAT, or NACK_MISSING (compatible). The request always carries
 * connector_version (encoded as the other version would), so a producer of
 * either version sees which one this is.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "cli.h"
#include "ecx.h"
#include "keys.h"
#include "opts.h"

enum {
    PING_OK = 0,
    PING_REFUSED = 3,
    PING_NOT_ZMQ = 4,
    PING_CURVE = 5,
    PING_VERSION = 6,
    PING_INCOMPAT = 7,
};

static const char HELP[] =
    "usage: ecx ping HOST:PORT [options]\n"
    "\n"
    "Ask a producer (ecx serve, or vLLM's ECCPUConnector) whether this consumer's\n"
    "settings would fetch from it, and say why not. Answers within 2 s; it never\n"
    "pins anything on the producer (it asks for an mm_hash nobody holds).\n"
    "\n"
    "options:\n"
    "  --curve-server-key FILE  the producer's public key, as for `ecx get`\n"
    "  --curve-secret FILE    this consumer's secret key, as for `ecx get`\n"
    COMMON_HELP
    "\n"
    "Exit status: 0 reachable and compatible; 3 nothing listening (connection\n"
    "refused); 4 not a ZeroMQ peer; 5 CURVE mismatch (one side encrypts, the other\n"
    "not, or the key or allow-list differs); 6 protocol version differs; 7\n"
    "compatibility hash differs (this side's factors are printed; the producer's\n"
    "are in its start-up line and its ecx_info metric); 1 no answer in time or\n"
    "another failure; 2 usage error.\n";

#define BUDGET_MS 1900

static int left_ms(double deadline)
{
    double l = (deadline - mono_s()) * 1000;
    return l < 0 ? 0 : (int)l;
}

/* TCP connect within the deadline: the fd, -PING_REFUSED, or -1. */
static int tcp_connect(const char *host, int port, double deadline, char *why, size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    int e = getaddrinfo(host, ps, &hints, &res);
    if (e) {
        snprintf(why, cap, "cannot resolve '%s': %s", host, gai_strerror(e));
        return -1;
    }
    int fd = -1, rc = -1;
    for (struct addrinfo *a = res; a && rc < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            rc = 0;
            break;
        }
        int err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, left_ms(deadline)) == 1) {
                socklen_t l = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
                if (!err) {
                    rc = 0;
                    break;
                }
            } else {
                err = ETIMEDOUT;
            }
        }
        snprintf(why, cap, "%s", strerror(err));
        if (err == ECONNREFUSED) rc = -PING_REFUSED;
        close(fd);
        fd = -1;
        if (rc == -PING_REFUSED) break;
    }
    freeaddrinfo(res);
    return rc < 0 ? rc : fd;
}

/* Read into r[*got..want) until the deadline, the peer's end, or bytes that
 * are no ZMTP signature. */
static void read_upto(int fd, uint8_t *r, size_t *got, size_t want, double deadline)
{
    while (*got < want) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left_ms(deadline)) != 1) return;
        ssize_t k = recv(fd, r + *got, want - *got, 0);
        if (k <= 0) return;
        *got += (size_t)k;
        if (r[0] != 0xff || (*got >= 10 && r[9] != 0x7f)) return; /* not ZMTP: stop early */
    }
}

/* Greet as a ZMTP 3 client step by step, as libzmq does (signature, then the
 * major version, which makes the peer send its mechanism), and read the
 * peer's greeting. 1 and mech filled: a ZeroMQ peer; 0: not one (why says
 * what came). */
static int zmtp_greeting(int fd, double deadline, char mech[21], char *why, size_t cap)
{
    static const uint8_t sig[10] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f}, major = 3;
    uint8_t r[64];
    size_t got = 0;
    if (send(fd, sig, sizeof sig, MSG_NOSIGNAL) != (ssize_t)sizeof sig) {
        snprintf(why, cap, "the connection closed at once (%s)", strerror(errno));
        return 0;
    }
    read_upto(fd, r, &got, 11, deadline);
    if (got < 10 || r[0] != 0xff || r[9] != 0x7f) {
        if (got == 0) snprintf(why, cap, "it sent no ZeroMQ greeting");
        else if (got >= 5 && !memcmp(r, "HTTP/", 5)) snprintf(why, cap, "it answered in HTTP");
        else snprintf(why, cap, "its first bytes are no ZeroMQ greeting");
        return 0;
    }
    if (got == 11 && r[10] >= 3 && send(fd, &major, 1, MSG_NOSIGNAL) == 1)
        read_upto(fd, r, &got, 32, deadline);
    if (got < 32 || r[10] < 3) {
        snprintf(why, cap, "it speaks no ZMTP 3 (a ZeroMQ older than 4.0?)");
        return 0;
    }
    memcpy(mech, r + 12, 20);
    mech[20] = '\0';
    return 1;
}

typedef struct ping_opts {
    ecx_config cfg;
    char pub[KEY_Z85_LEN + 1], sec[KEY_Z85_LEN + 1];
    bool curve, own_secret;
} ping_opts;

/* One XferReq for an mm_hash nobody holds, on a DEALER as the consumer's. */
static int ask(const ping_opts *o, const char *host, int port, double deadline, const char *compat)
{
    void *z = zmq_ctx_new(), *s = z ? zmq_socket(z, ZMQ_DEALER) : NULL;
    int rc = EXIT_FAIL, zero = 0;
    if (!s) {
        fprintf(stderr, "ecx: ping: cannot make a ZeroMQ socket: %s\n", zmq_strerror(errno));
        if (z) zmq_ctx_term(z);
        return EXIT_FAIL;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://ecx-ping-%d", (int)getpid());
    zmq_socket_monitor(s, mon, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_DISCONNECTED);
    void *m = zmq_socket(z, ZMQ_PAIR);
    zmq_connect(m, mon);
    if (o->curve) {
        char pk[KEY_Z85_LEN + 1], sk[KEY_Z85_LEN + 1];
        if (o->own_secret) {
            memcpy(sk, o->sec, sizeof sk);
            zmq_curve_public(pk, sk);
        } else {
            zmq_curve_keypair(pk, sk);
        }
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, o->pub, KEY_Z85_LEN);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pk, KEY_Z85_LEN);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sk, KEY_Z85_LEN);
        sodium_memzero(sk, sizeof sk);
    }
    char ep[300];
    snprintf(ep, sizeof ep, strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    if (strchr(host, ':')) {
        int one = 1;
        zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
    }
    char hash[40];
    unsigned char rnd[8];
    randombytes_buf(rnd, sizeof rnd);
    hex_encode(rnd, sizeof rnd, hash + snprintf(hash, sizeof hash, "ecx-ping-"));
    ecx_req r;
    ecx_req_init(&r);
    r.mm_hash = (ecx_span){hash, strlen(hash)};
    r.compatibility_hash = (ecx_span){compat, ECX_COMPAT_HASH_HEX};
    r.session_id = (ecx_span){"ecx-ping", 8};
    r.connector_version = o->cfg.connector_version;
    uint8_t frame[512];
    size_t len;
    /* Encoded as the other version would, so connector_version is always sent. */
    int other = o->cfg.connector_version == 1 ? 2 : 1;
    if (zmq_connect(s, ep) || ecx_wire_encode_req_v(&r, other, frame, sizeof frame, &len) ||
        zmq_send(s, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(s, frame, len, 0) < 0) {
        fprintf(stderr, "ecx: ping: cannot send the request to %s\n", ep);
        goto out;
    }
    bool handshake_failed = false;
    for (;;) {
        zmq_pollitem_t it[2] = {{s, 0, ZMQ_POLLIN, 0}, {m, 0, ZMQ_POLLIN, 0}};
        int t = left_ms(deadline);
        if (t == 0 || zmq_poll(it, 2, t) <= 0) break;
        if (it[1].revents & ZMQ_POLLIN) {
            /* A monitor event: [u16 event, u32 value] then the endpoint. */
            uint8_t ev[6];
            char endpoint[300];
            int n = zmq_recv(m, ev, sizeof ev, 0);
            zmq_recv(m, endpoint, sizeof endpoint, 0);
            uint16_t id = 0;
            if (n >= 2) memcpy(&id, ev, 2);
            /* A wrong CURVE server key shows as the producer hanging up. */
            if (n >= 2 && (id != ZMQ_EVENT_DISCONNECTED || o->curve)) {
                handshake_failed = true;
                break;
            }
        }
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        uint8_t buf[4096];
        int n = zmq_recv(s, buf, sizeof buf, 0), more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &ml);
        if (n == 0 && more) n = zmq_recv(s, buf, sizeof buf, 0);
        ecx_ack a;
        if (n < 0 || (size_t)n > sizeof buf || ecx_wire_decode_ack(buf, (size_t)n, &a)) {
            fprintf(stderr, "ecx: ping: %s:%d answered with something that is not an XferAck\n",
                    host, port);
            goto out;
        }
        switch (a.status) {
        case ECX_STATUS_NACK_VERSION:
            fprintf(stderr, "ecx: ping: %s:%d speaks another protocol version than this "
                    "side's %d (NACK_VERSION): set --connector-version (or --vllm-version) "
                    "as the producer's\n", host, port, o->cfg.connector_version);
            rc = PING_VERSION;
            break;
        case ECX_STATUS_NACK_INCOMPAT:
            fprintf(stderr, "ecx: ping: %s:%d: compatibility hashes differ (NACK_INCOMPAT)\n",
                    host, port);
            print_factors("this side", &o->cfg);
            fprintf(stderr, "ecx: the producer's factors: its start-up line, or the ecx_info "
                    "metric on its /metrics\n");
            rc = PING_INCOMPAT;
            break;
        default:
            printf("ecx: %s:%d is a producer this consumer can fetch from (protocol version %d, "
                   "compat hash %s; it answered %s)\n", host, port, o->cfg.connector_version,
                   compat, ecx_status_name(a.status));
            rc = PING_OK;
        }
        goto out;
    }
    if (handshake_failed) {
        fprintf(stderr, "ecx: ping: %s:%d refused the CURVE handshake: the server key is not "
                "the producer's, or this key is not in its allow-list\n", host, port);
        rc = PING_CURVE;
    } else {
        fprintf(stderr, "ecx: ping: %s:%d: no answer within %d ms\n", host, port, BUDGET_MS);
    }
out:
    zmq_close(m);
    zmq_close(s);
    zmq_ctx_term(z);
    return rc;
}

int cmd_ping(int argc, char **argv)
{
    enum { O_CURVE_SERVER = 2000, O_CURVE_SECRET };
    static const struct option opts[] = {{"curve-server-key", required_argument, 0, O_CURVE_SERVER},
                                         {"curve-secret", required_argument, 0, O_CURVE_SECRET},
                                         {"help", no_argument, 0, 'h'},
                                         COMMON_LONG_OPTS,
                                         {0, 0, 0, 0}};
    static ping_opts o;
    ecx_config_init(&o.cfg);
    const char *server_path = NULL, *secret_path = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = common_opt(c, optarg, &o.cfg, NULL);
        if (r < 0) return EXIT_USAGE;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(HELP, stdout); return EXIT_OK;
        case O_CURVE_SERVER: server_path = optarg; break;
        case O_CURVE_SECRET: secret_path = optarg; break;
        default: return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) return usage_error("ping takes one HOST:PORT; try 'ecx ping --help'");
    char host[256];
    int port;
    if (parse_host_port(argv[optind], host, &port) || port == 0)
        return usage_error("ping takes HOST:PORT (port 1..65535), not '%s'", argv[optind]);
    if (secret_path && !server_path) return usage_error("--curve-secret needs --curve-server-key");
    if (common_finish(&o.cfg)) return EXIT_USAGE;
    if (server_path && (key_file_read("--curve-server-key", server_path, false, o.pub) ||
                        (secret_path && key_file_read("--curve-secret", secret_path, true, o.sec))))
        return EXIT_FAIL;
    o.curve = server_path != NULL;
    o.own_secret = secret_path != NULL;
    const char *dt = ecx_dtype_name(o.cfg.dtype);
    char compat[ECX_COMPAT_HASH_HEX + 1];
    if (ecx_compat_hash(o.cfg.vllm_version, strlen(o.cfg.vllm_version), o.cfg.model,
                        strlen(o.cfg.model), dt, strlen(dt), (int64_t)o.cfg.block_bytes, compat)) {
        fprintf(stderr, "ecx: ping: the factors are not UTF-8\n");
        return EXIT_FAIL;
    }

    double deadline = mono_s() + BUDGET_MS / 1000.0;
    char why[400] = "";
    int fd = tcp_connect(host, port, deadline, why, sizeof why);
    if (fd == -PING_REFUSED) {
        fprintf(stderr, "ecx: ping: nothing listening on %s:%d (%s)\n", host, port, why);
        return PING_REFUSED;
    }
    if (fd < 0) {
        fprintf(stderr, "ecx: ping: cannot reach %s:%d: %s\n", host, port, why);
        return EXIT_FAIL;
    }
    char mech[21];
    double greet_by = mono_s() + 0.6 < deadline ? mono_s() + 0.6 : deadline;
    int zmtp = zmtp_greeting(fd, greet_by, mech, why, sizeof why);
    close(fd);
    if (!zmtp) {
        fprintf(stderr, "ecx: ping: %s:%d is not a ZeroMQ peer: %s\n", host, port, why);
        return PING_NOT_ZMQ;
    }
    bool peer_curve = !strncmp(mech, "CURVE", 5);
    if (peer_curve != o.curve) {
        fprintf(stderr, "ecx: ping: CURVE mismatch: %s:%d %s\n", host, port,
                peer_curve ? "encrypts its control plane (CURVE): give --curve-server-key with "
                             "its public key"
                           : "speaks plaintext: drop --curve-server-key");
        return PING_CURVE;
    }
    return ask(&o, host, port, deadline, compat);
}
