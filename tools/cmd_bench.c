/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx bench — load generators that print one machine-readable line.
 *
 * `bench ctrl` measures a producer's control plane: it reads mm_hashes and
 * the producer's address from an announcements file, keeps up to W real
 * XferReq frames outstanding on one DEALER (the socket a consumer uses),
 * decodes every XferAck, checks it answers the request it should (replies
 * on one connection come back in order from a single-threaded producer, so
 * the i-th ack answers the i-th request), and times each request from send
 * to ack. It speaks only the wire protocol, so it measures any producer:
 * `ecx serve` or a Python one (bench/compare.sh runs both).
 *
 * Every request uses one session id and cycles through the items, so an OK
 * grant for "session:mm_hash" is regranted (old pin released first) by the
 * next request for the same item: the producer holds at most one grant per
 * item however long the run. The bench never READs, so grants end by
 * regrant or lease, which is the same work for any producer that follows
 * docs/PROTOCOL.md §4.
 *
 * It uses only the public wire codec (ecx.h) and a plain libzmq DEALER with
 * the options a consumer's socket has.
 *
 * `bench data` (tools/cmd_bench_data.c) times whole fetches through the
 * public API; build/bench_data is the raw data-plane benchmark. `bench
 * stall` (tools/cmd_bench_stall.c) times an engine's calls while it fetches.
 */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "cli.h"
#include "ecx.h"
#include "opts.h"

static const char COMMON_TAIL[] =
    "\n"
    "It accepts the options serve takes in common; those that do not apply\n"
    "(--region-bytes, --data for ctrl) are accepted and ignored:\n" COMMON_HELP "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n";

static const char CTRL_HELP[] =
    "usage: ecx bench ctrl --params FILE [--requests N] [--window W] [options]\n"
    "\n"
    "ecx bench ctrl: control-plane load against a producer (ecx serve, or any peer\n"
    "speaking protocol version 1; its frames leave connector_version out, so a\n"
    "version-2 peer serves them as its own). Sends XferReq frames for the items of FILE (as\n"
    "`ecx serve --announce-out` writes it), in turn, from one DEALER with up to W\n"
    "outstanding, decodes every XferAck and times each request from send to ack.\n"
    "Items whose peer_host:peer_port differ from the first item's are skipped.\n"
    "  --params FILE          announcements file (required)\n"
    "  --requests N           requests measured (default 20000)\n"
    "  --warmup N             requests sent first and not measured (default 200)\n"
    "  --window W             requests outstanding at once, 1..1000 (default 64)\n"
    "  --timeout-ms MS        give up after MS in all (default 30000)\n"
    "  --session-id TEXT      session id of every request (default: a random UUID4\n"
    "                         ending in ecx's marker, as the library sends)\n"
    "  --require-ok           fail (exit 1) unless every ack is OK\n"
    "  --vllm-version, --model, --dtype, --block-bytes  compat hash factors, as for\n"
    "                         serve (they must match the producer's or it NACKs)\n"
    "  Output: a summary on stderr, then on stdout the line\n"
    "    requests=<n> ok=<n> nack=<n> window=<w> ack_bytes=<n> req_per_s=<n> p50_us=<n> "
    "p99_us=<n>\n"
    "  (ok / nack over the measured requests; ack_bytes is the mean ack size).\n"
    "  Exit 0 when every request got a well-formed ack for its item in time.\n";

static const char DATA_HELP[] =
    "usage: ecx bench data [--size SIZE]... [--count N] [--data all|shm|tcp|ucx] [options]\n"
    "\n"
    "ecx bench data: what a fetch costs an engine, through the public API. For each\n"
    "path, a producer and a consumer context in this process (their progress\n"
    "threads do the work; this thread waits in ecx_poll, as an idle engine does),\n"
    "their regions faulted in first (as an engine's are by its first request;\n"
    "stderr says how long that took); each iteration saves a fresh item of SIZE\n"
    "bytes at the producer and times the consumer's fetch of it until it is\n"
    "ready, so the figure is fetch-to-ready including one control round trip\n"
    "(XferReq/XferAck) and the checksum check; every byte is then verified. A\n"
    "plain memcpy of the same size is timed in the same run, interleaved, the way\n"
    "a fetch is: between mappings of files where the regions live ($ECX_SHM_DIR,\n"
    "else /dev/shm), its source written just before as a save writes the item,\n"
    "its destination checked after. Each path's figure is also printed as a\n"
    "ratio to it (<path>_ratio). (build/bench_data measures the raw data plane\n"
    "alone.)\n"
    "  --size SIZE            bytes per fetch (repeatable, up to 8; default 4718592 and\n"
    "                         28835840: llava-1.5's 576 and 3520 rows of 4096 bf16).\n"
    "                         Under protocol version 2 (the default) whole blocks of\n"
    "                         --block-bytes, else a usage error naming the size to give\n"
    "  --count N              timed fetches per size and path (default 30)\n"
    "  --warmup N             untimed fetches first (default 3)\n"
    "  --data all|shm|tcp|ucx paths to measure (default all; auto means all; all\n"
    "                         skips a path this libecx is built without)\n"
    "  --block-bytes SIZE     block size of the regions (default 8Ki: one row of\n"
    "                         4096 bf16; the figures before version 2 used 1Mi:\n"
    "                         --vllm-version 0.31.0 --block-bytes 1Mi)\n"
    "  Output: one line per size, the last being the last size:\n"
    "    size=<bytes> shm_gbps=<x> ucx_gbps=<x> memcpy_gbps=<x> shm_ratio=<x> ucx_ratio=<x>\n"
    "      tcp_gbps=<x> tcp_ratio=<x> rawtcp_gbps=<x> tcp_vs_raw=<x>   (on the same line)\n"
    "  (a path not measured reads 0; UCX_TLS=tcp measures UCX over TCP). With tcp,\n"
    "  each iteration also times raw TCP, tcp's own baseline: one plain loopback\n"
    "  connection to a sender process, blocking reads into the same kind of\n"
    "  destination; tcp_vs_raw = raw TCP's time / tcp's fetch-to-ready time. Both\n"
    "  contexts share this machine's CPUs: for tcp between two processes, each on\n"
    "  a CPU of its own as on two hosts, see bench/tcp_vs_raw.sh.\n";

static const char HELP[] =
    "usage: ecx bench ctrl --params FILE [--requests N] [--window W] [options]\n"
    "       ecx bench data [--size SIZE]... [--count N] [--data all|shm|tcp|ucx] [options]\n"
    "       ecx bench stall [--data LIST] [--size LIST] [--step-ms LIST] [--count N] [options]\n"
    "\n"
    "  ctrl    control-plane load against a producer (requests/s, p50, p99)\n"
    "  data    fetch-to-ready throughput through the API against memcpy\n"
    "  stall   what fetching costs an engine's step\n"
    "\n"
    "Each has its own help: ecx bench ctrl --help, and so on.\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n";

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static uint64_t pct(const uint64_t *v, size_t n, double p)
{
    size_t k = (size_t)(p * (double)n + 0.999999);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

/* ---------- bench ctrl ---------- */

typedef struct target {
    char *hash;
    uint8_t *frame; /* the XferReq, encoded once */
    size_t frame_len;
} target;

typedef struct slot {
    uint64_t sent_ns;
    size_t item;
} slot;

/* Read FILE: the items at the first item's address. Returns the count (> 0)
 * or -1 with a message. */
static int load_targets(const char *path, target **out, char host[256], int *port)
{
    json_error_t err;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!j) {
        if (err.line > 0)
            fprintf(stderr, "ecx: --params %s: %s (line %d)\n", path, err.text, err.line);
        else
            fprintf(stderr, "ecx: --params %s: %s\n", path, err.text);
        return -1;
    }
    if (!json_is_object(j)) {
        fprintf(stderr, "ecx: --params %s: must be a JSON object {mm_hash: announcement}\n", path);
        json_decref(j);
        return -1;
    }
    target *t = calloc(json_object_size(j) + 1, sizeof *t);
    int n = 0, skipped = 0;
    const char *k;
    json_t *v;
    if (!t) {
        json_decref(j);
        return -1;
    }
    json_object_foreach(j, k, v)
    {
        json_t *h = json_object_get(v, "peer_host"), *p = json_object_get(v, "peer_port");
        if (!json_is_string(h) || !json_is_integer(p) || json_integer_value(p) < 1 ||
            json_integer_value(p) > 65535 || strlen(json_string_value(h)) > 255) {
            skipped++;
            continue;
        }
        if (n == 0) {
            snprintf(host, 256, "%s", json_string_value(h));
            *port = (int)json_integer_value(p);
        } else if (strcmp(host, json_string_value(h)) || *port != json_integer_value(p)) {
            skipped++;
            continue;
        }
        if (!(t[n].hash = strdup(k))) break;
        n++;
    }
    json_decref(j);
    if (skipped)
        fprintf(stderr, "ecx: --params %s: skipped %d item(s) with no or another address\n", path,
                skipped);
    if (n == 0) {
        fprintf(stderr, "ecx: --params %s: no item has a peer_host and peer_port\n", path);
        free(t);
        return -1;
    }
    *out = t;
    return n;
}

static void free_targets(target *t, int n)
{
    for (int i = 0; i < n; i++) {
        free(t[i].hash);
        free(t[i].frame);
    }
    free(t);
}

/* A UUID4 text whose last group is ecx's marker (docs/PROTOCOL.md §5.4), as
 * the library's consumer sends: a producer in nixl mode then answers with
 * ecx's own form, as it would an ecx engine. */
static void uuid4(char out[37])
{
    uint8_t b[16];
    randombytes_buf(b, sizeof b);
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
    static const char hex[] = "0123456789abcdef";
    char *o = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
        *o++ = hex[b[i] >> 4];
        *o++ = hex[b[i] & 15];
    }
    *o = 0;
    memcpy(out + 24, "ec5ec5ec5ec5", 12);
}

/* Encode r into a malloc'd frame (grown once to the size the codec names). */
static int encode_req(const ecx_req *r, uint8_t **out, size_t *len)
{
    size_t cap = 512;
    for (int tries = 0; tries < 2; tries++) {
        uint8_t *b = malloc(cap);
        if (!b) return ECX_ENOMEM;
        int e = ecx_wire_encode_req(r, b, cap, len);
        if (e == 0) {
            *out = b;
            return 0;
        }
        free(b);
        if (e != ECX_ERANGE) return e;
        cap = *len;
    }
    return ECX_ERANGE;
}

/* ---------- the DEALER: a consumer's control socket, in libzmq alone ---------- */

/* An ack frame of at most 16 MiB, as the library's consumer takes. */
#define MAX_ACK_FRAME (16 << 20)

typedef struct dealer {
    void *sock, *mon;
    zmq_msg_t parts[2];
    bool handshaken, lost;
} dealer;

static int set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

static void dealer_close(dealer *d)
{
    if (d->sock && d->mon) zmq_socket_monitor(d->sock, NULL, 0);
    if (d->mon) zmq_close(d->mon);
    if (d->sock) zmq_close(d->sock);
    zmq_msg_close(&d->parts[0]);
    zmq_msg_close(&d->parts[1]);
    d->sock = d->mon = NULL;
}

/* Connect a DEALER to host:port: heartbeats (2 s, 4 s timeout) so a dead
 * producer is noticed, reconnects backing off to 5 s, no linger, and a
 * monitor that says when an established connection was lost. */
static int dealer_open(dealer *d, void *zctx, const char *host, int port)
{
    char ep[300];
    int64_t max = MAX_ACK_FRAME;
    memset(d, 0, sizeof *d);
    zmq_msg_init(&d->parts[0]);
    zmq_msg_init(&d->parts[1]);
    snprintf(ep, sizeof ep, strchr(host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    if (!(d->sock = zmq_socket(zctx, ZMQ_DEALER)) || set_int(d->sock, ZMQ_LINGER, 0) ||
        set_int(d->sock, ZMQ_IPV6, 1) ||
        zmq_setsockopt(d->sock, ZMQ_MAXMSGSIZE, &max, sizeof max) ||
        set_int(d->sock, ZMQ_HEARTBEAT_IVL, 2000) || set_int(d->sock, ZMQ_HEARTBEAT_TIMEOUT, 4000) ||
        set_int(d->sock, ZMQ_HEARTBEAT_TTL, 8000) || set_int(d->sock, ZMQ_RECONNECT_IVL_MAX, 5000) ||
        zmq_socket_monitor(d->sock, "inproc://ecx-bench-ctrl-monitor",
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) ||
        !(d->mon = zmq_socket(zctx, ZMQ_PAIR)) || set_int(d->mon, ZMQ_LINGER, 0) ||
        zmq_connect(d->mon, "inproc://ecx-bench-ctrl-monitor") || zmq_connect(d->sock, ep)) {
        fprintf(stderr, "ecx: cannot open a socket to %s: %s\n", ep, zmq_strerror(zmq_errno()));
        dealer_close(d);
        return -1;
    }
    return 0;
}

/* Send ["", frame] without blocking: 0, or -1 if it cannot be queued. */
static int dealer_send(dealer *d, const void *frame, size_t len)
{
    if (zmq_send(d->sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(d->sock, frame, len, ZMQ_DONTWAIT) < 0)
        return -1;
    return 0;
}

static bool more(void *sock)
{
    int m = 0;
    size_t sz = sizeof m;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &m, &sz) == 0 && m;
}

/* Receive one ["", payload] reply without blocking: 1 (view valid until the
 * next call), 0 none waiting. Replies of another shape are dropped. */
static int dealer_recv(dealer *d, const void **payload, size_t *len)
{
    for (;;) {
        if (zmq_msg_recv(&d->parts[0], d->sock, ZMQ_DONTWAIT) < 0) return 0;
        int n = 1;
        bool m = more(d->sock);
        if (m && zmq_msg_recv(&d->parts[1], d->sock, ZMQ_DONTWAIT) >= 0) n = 2, m = more(d->sock);
        if (!m && n == 2 && zmq_msg_size(&d->parts[0]) == 0) {
            *payload = zmq_msg_data(&d->parts[1]);
            *len = zmq_msg_size(&d->parts[1]);
            return 1;
        }
        zmq_msg_t x; /* drop the rest of a message of another shape */
        zmq_msg_init(&x);
        while (m && zmq_msg_recv(&x, d->sock, ZMQ_DONTWAIT) >= 0) m = more(d->sock);
        zmq_msg_close(&x);
    }
}

/* True once a connection that completed its handshake was lost (a
 * heartbeat timeout included). A connection refused in its handshake is
 * not lost: the requests just go unanswered. Sticky. */
static bool dealer_lost(dealer *d)
{
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    while (!d->lost && zmq_msg_recv(&ev, d->mon, ZMQ_DONTWAIT) >= 0) {
        /* Frame 1: uint16 event + uint32 value; frame 2: the endpoint. */
        uint16_t e = 0;
        if (zmq_msg_size(&ev) >= 6) memcpy(&e, zmq_msg_data(&ev), sizeof e);
        while (more(d->mon) && zmq_msg_recv(&ev, d->mon, ZMQ_DONTWAIT) >= 0) {
        }
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) d->handshaken = true;
        else if (e == ZMQ_EVENT_DISCONNECTED && d->handshaken) d->lost = true;
    }
    zmq_msg_close(&ev);
    return d->lost;
}

typedef struct ctrl_run {
    int64_t requests, warmup, window, timeout_ms;
    bool require_ok;
    const char *session_id;
} ctrl_run;

static int run_ctrl(const ctrl_run *o, const ecx_config *cfg, const char *params)
{
    char host[256], compat[ECX_COMPAT_HASH_HEX + 1], sid[37];
    int port = 0, rc = EXIT_FAIL;
    target *t = NULL;
    int nt = load_targets(params, &t, host, &port);
    if (nt < 0) return EXIT_FAIL;
    int e = ecx_compat_hash(cfg->vllm_version, strlen(cfg->vllm_version), cfg->model,
                            strlen(cfg->model), cfg->dtype, strlen(cfg->dtype),
                            (int64_t)cfg->block_bytes, compat);
    if (e) {
        fprintf(stderr, "ecx: cannot compute the compatibility hash: %s\n", ecx_strerror(e));
        free_targets(t, nt);
        return EXIT_FAIL;
    }
    const char *session = o->session_id;
    if (!session) uuid4(sid), session = sid;
    for (int i = 0; i < nt; i++) {
        ecx_req r;
        ecx_req_init(&r);
        r.mm_hash = (ecx_span){t[i].hash, strlen(t[i].hash)};
        r.compatibility_hash = (ecx_span){compat, strlen(compat)};
        r.session_id = (ecx_span){session, strlen(session)};
        if ((e = encode_req(&r, &t[i].frame, &t[i].frame_len))) {
            fprintf(stderr, "ecx: cannot encode a request for '%s': %s\n", t[i].hash,
                    ecx_strerror(e));
            free_targets(t, nt);
            return EXIT_FAIL;
        }
    }

    void *zctx = zmq_ctx_new();
    dealer peer = {0};
    bool open = false;
    size_t total = (size_t)(o->warmup + o->requests), window = (size_t)o->window;
    slot *ring = calloc(window, sizeof *ring);
    uint64_t *lat = malloc((size_t)o->requests * sizeof *lat);
    if (!zctx || !ring || !lat) {
        fprintf(stderr, "ecx: out of memory\n");
        goto out;
    }
    if (dealer_open(&peer, zctx, host, port)) goto out;
    open = true;
    fprintf(stderr,
            "ecx: bench ctrl: %s:%d, %d item(s), window %lld, %lld requests (+%lld warm-up)\n",
            host, port, nt, (long long)o->window, (long long)o->requests, (long long)o->warmup);

    size_t sent = 0, answered = 0, malformed = 0, mismatched = 0;
    uint64_t status[6] = {0}, ack_bytes = 0;
    uint64_t start = now_ns(), deadline = start + (uint64_t)o->timeout_ms * 1000000ull;
    uint64_t t_first = 0, t_last = 0;
    zmq_pollitem_t pi = {.socket = peer.sock, .events = ZMQ_POLLIN};
    bool lost = false;
    /* Send while the window allows, drain acks without blocking, and only
     * block in zmq_poll (or look at the connection) when neither moved. */
    while (answered < total) {
        uint64_t now = now_ns();
        if (now >= deadline) break;
        bool moved = false;
        while (sent < total && sent - answered < window) {
            const target *x = &t[sent % (size_t)nt];
            uint64_t ts = now_ns();
            if (dealer_send(&peer, x->frame, x->frame_len)) break; /* queue full */
            if (sent == (size_t)o->warmup) t_first = ts;
            ring[sent % window] = (slot){ts, sent % (size_t)nt};
            sent++;
            moved = true;
        }
        const void *payload;
        size_t len;
        while (answered < sent && dealer_recv(&peer, &payload, &len) == 1) {
            uint64_t ts = now_ns();
            slot *s = &ring[answered % window];
            ecx_ack a;
            if (ecx_wire_decode_ack(payload, len, &a)) {
                malformed++;
            } else {
                const char *want = t[s->item].hash;
                if (a.mm_hash.n != strlen(want) || memcmp(a.mm_hash.p, want, a.mm_hash.n))
                    mismatched++;
                if (answered >= (size_t)o->warmup) status[a.status]++;
            }
            if (answered >= (size_t)o->warmup) {
                lat[answered - (size_t)o->warmup] = ts - s->sent_ns;
                ack_bytes += len;
                t_last = ts;
            }
            answered++;
            moved = true;
        }
        if (moved) continue;
        if (dealer_lost(&peer)) {
            lost = true;
            break;
        }
        long wait_ms = (long)((deadline - now) / 1000000ull);
        if (wait_ms > 100) wait_ms = 100;
        zmq_poll(&pi, 1, wait_ms); /* EINTR or not, the loop looks again */
    }
    if (answered < total) {
        fprintf(stderr,
                "ecx: bench ctrl: %zu of %zu requests answered %s %lld ms (is a producer "
                "listening on %s:%d?)\n",
                answered, total, lost ? "before the connection was lost, after" : "within",
                (long long)((now_ns() - start) / 1000000), host, port);
        goto out;
    }
    size_t n = (size_t)o->requests;
    uint64_t ok = status[ECX_STATUS_OK], nack = 0;
    for (int i = 1; i < 6; i++)
        nack += status[i];
    qsort(lat, n, sizeof *lat, cmp_u64);
    double secs = (double)(t_last - t_first) / 1e9;
    double rate = secs > 0 ? (double)n / secs : 0;
    fprintf(stderr, "ecx: bench ctrl: %zu requests in %.3f s; acks:", n, secs);
    for (int i = 0; i < 6; i++)
        if (status[i])
            fprintf(stderr, " %s %llu", ecx_status_name(i), (unsigned long long)status[i]);
    fputc('\n', stderr);
    if (malformed || mismatched)
        fprintf(stderr, "ecx: bench ctrl: %zu undecodable ack(s), %zu for the wrong item\n",
                malformed, mismatched);
    printf("requests=%zu ok=%llu nack=%llu window=%lld ack_bytes=%llu req_per_s=%.0f p50_us=%.1f "
           "p99_us=%.1f\n",
           n, (unsigned long long)ok, (unsigned long long)nack, (long long)o->window,
           (unsigned long long)(ack_bytes / n), rate, (double)pct(lat, n, 0.50) / 1e3,
           (double)pct(lat, n, 0.99) / 1e3);
    fflush(stdout);
    rc = EXIT_OK;
    if (malformed || mismatched) rc = EXIT_FAIL;
    if (o->require_ok && nack) {
        fprintf(stderr, "ecx: bench ctrl: --require-ok: %llu request(s) were NACKed\n",
                (unsigned long long)nack);
        rc = EXIT_FAIL;
    }
out:
    if (open) dealer_close(&peer);
    if (zctx) zmq_ctx_term(zctx);
    free(ring);
    free(lat);
    free_targets(t, nt);
    return rc;
}

static int cmd_bench_ctrl(int argc, char **argv)
{
    enum { O_PARAMS = 2000, O_REQUESTS, O_WARMUP, O_WINDOW, O_TIMEOUT, O_SESSION, O_REQUIRE_OK };
    static const struct option opts[] = {{"params", required_argument, 0, O_PARAMS},
                                         {"requests", required_argument, 0, O_REQUESTS},
                                         {"warmup", required_argument, 0, O_WARMUP},
                                         {"window", required_argument, 0, O_WINDOW},
                                         {"timeout-ms", required_argument, 0, O_TIMEOUT},
                                         {"session-id", required_argument, 0, O_SESSION},
                                         {"require-ok", no_argument, 0, O_REQUIRE_OK},
                                         {"help", no_argument, 0, 'h'},
                                         COMMON_LONG_OPTS,
                                         {0, 0, 0, 0}};
    ecx_config cfg;
    ecx_config_init(&cfg);
    ctrl_run o = {.requests = 20000, .warmup = 200, .window = 64, .timeout_ms = 30000};
    const char *params = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = common_opt(c, optarg, &cfg, NULL);
        if (r < 0) return EXIT_USAGE;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(CTRL_HELP, stdout); fputs(COMMON_TAIL, stdout); return EXIT_OK;
        case O_PARAMS: params = optarg; break;
        case O_REQUESTS:
            if (parse_int("--requests", optarg, 1, 10000000, &o.requests)) return EXIT_USAGE;
            break;
        case O_WARMUP:
            if (parse_int("--warmup", optarg, 0, 10000000, &o.warmup)) return EXIT_USAGE;
            break;
        case O_WINDOW:
            if (parse_int("--window", optarg, 1, 1000, &o.window)) return EXIT_USAGE;
            break;
        case O_TIMEOUT:
            if (parse_int("--timeout-ms", optarg, 1, 86400000, &o.timeout_ms)) return EXIT_USAGE;
            break;
        case O_SESSION: o.session_id = optarg; break;
        case O_REQUIRE_OK: o.require_ok = true; break;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return usage_error("bench ctrl takes no arguments ('%s'); try 'ecx bench ctrl --help'",
                           argv[optind]);
    if (common_finish(&cfg)) return EXIT_USAGE;
    if (!params) return usage_error("bench ctrl needs --params FILE; try 'ecx bench ctrl --help'");
    return run_ctrl(&o, &cfg, params);
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        fputs(HELP, stderr);
        return EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        fputs(HELP, stdout);
        return EXIT_OK;
    }
    if (!strcmp(sub, "ctrl")) return cmd_bench_ctrl(argc - 1, argv + 1);
    if (!strcmp(sub, "data")) return cmd_bench_data(argc - 1, argv + 1, DATA_HELP, COMMON_TAIL);
    if (!strcmp(sub, "stall")) return cmd_bench_stall(argc - 1, argv + 1);
    return usage_error(
        "bench: unknown benchmark '%s' (ctrl, data or stall; try 'ecx bench --help')", sub);
}
