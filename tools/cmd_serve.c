/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx serve — a producer daemon: serves a directory of files or synthetic
 * encodings, writes their announcements for consumers, exposes Prometheus
 * metrics, and shuts down cleanly on SIGINT / SIGTERM.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ecx.h"
#include "file.h"
#include "keys.h"
#include "opts.h"

static const char HELP[] =
    "usage: ecx serve [options]\n"
    "\n"
    "Run a producer: serve encodings to consumers until SIGINT or SIGTERM.\n"
    "\n"
    "content (either or both):\n"
    "  --preload DIR          serve each regular file in DIR as one encoding: its\n"
    "                         mm_hash is the file name, its bytes the file's bytes.\n"
    "                         Names outside [A-Za-z0-9._-] or over 255 bytes,\n"
    "                         links and non-regular files are skipped, with a message;\n"
    "                         one that changes before it is read stops the start.\n"
    "  --synthetic COUNT:BYTES  serve COUNT encodings of BYTES each, item i with\n"
    "                         mm_hash = hex SHA-256 of \"ecx-synthetic:<i>:<BYTES>\" and\n"
    "                         content = splitmix64 stream seeded by that hash\n"
    "                         (`ecx get --verify-synthetic` checks it)\n"
    "  --ready-delay-ms MS    mark each item ready MS after reserving it (items\n"
    "                         answer NACK_NOT_READY until then)\n"
    "  --width N              with --connector-version 2: each --preload file holds\n"
    "                         rows of N elements of --dtype (e.g. an encoder output\n"
    "                         wider than the model's hidden size): it is stored in\n"
    "                         whole blocks (zero padding after its bytes) and\n"
    "                         announced with shape [file bytes / (N x element size), N];\n"
    "                         a file that is not whole rows is skipped, with a message.\n"
    "                         Without it a version-2 file holds rows of one block\n"
    "                         (--block-bytes / element size elements) and is announced\n"
    "                         as [blocks, that width]. --synthetic items are not\n"
    "                         affected: under version 2 their BYTES must be whole blocks\n"
    "\n"
    "network and output:\n"
    "  --listen HOST:PORT     control-plane address (default " ECX_DEFAULT_LISTEN ");\n"
    "                         plaintext unless --curve-secret: anyone who reaches it\n"
    "                         can fetch items it knows the mm_hash of (trusted network)\n"
    "  --advertise-host HOST  peer_host written in announcements (default: the\n"
    "                         listen host; required with a wildcard --listen)\n"
    "  --announce-out FILE    once listening, write {mm_hash: announcement} for\n"
    "                         everything served, atomically (scripts wait for it)\n"
    "  --metrics HOST:PORT    serve Prometheus text at http://HOST:PORT/metrics (with\n"
    "                         ecx_info: the compatibility factors, hash, protocol\n"
    "                         version), and \"ok\" at /healthz\n"
    "                         (at most 8 connections per client address, 128 in all,\n"
    "                         the idlest of the heaviest address closed for a newcomer;\n"
    "                         closed 3 s idle, 5 s after accept or the last answer)\n"
    "  --lease-ms MS          pin lease per grant (default 30000)\n"
    "  --region-bytes SIZE    region size (default: what the content needs)\n"
    "  --conn-grants N        active grants one consumer connection may hold\n"
    "                         (default 1024; past it NACK_INTERNAL,\n"
    "                         ecx_producer_refused_conn_grants_total)\n"
    "  --conn-pin-pct PCT     share of the region one connection's pins may cover\n"
    "                         (default 100: serve's region holds only what it\n"
    "                         serves, so pins starve nothing; the library's\n"
    "                         default is 50; ecx_producer_refused_conn_pins_total)\n"
    "  --pin-pct PCT          share of the region all consumers' pins may cover\n"
    "                         together (default 100, as above; the library's\n"
    "                         default is 75, so an encoder's saves find room);\n"
    "                         past it NACK_NOT_READY, and the consumer retries\n"
    "                         (ecx_producer_refused_pins_total)\n"
    "  --events-endpoint HOST:PORT  publish encoder-cache events for routers\n"
    "                         (docs/EVENTS.md) on a ZeroMQ PUB socket at HOST:PORT,\n"
    "                         with their replay socket on PORT + 1 (`ecx events`)\n"
    "  --events-topic TOPIC   first frame of every event message (default empty)\n"
    "\n"
    "security (opt-in; see `ecx keygen`):\n"
    "  --curve-secret FILE    encrypt the control plane with ZeroMQ CURVE, with the\n"
    "                         secret key in FILE (a regular file, at most 64 KiB);\n"
    "                         consumers need the matching .pub\n"
    "                         (plaintext and Python reference peers can no longer talk)\n"
    "  --curve-allow FILE     admit only consumers whose public key is listed in FILE\n"
    "                         (one Z85 key per line, # comments; at most 4 MiB);\n"
    "                         without it, any consumer that knows this producer's\n"
    "                         public key gets in\n"
    COMMON_HELP
    "\n"
    "limits on peers (fixed; counted in --metrics): a request frame of at most\n"
    "1 MiB; at most 2 MiB of unfinished multipart messages per connection and\n"
    "256 MiB in all, else the connection is dropped\n"
    "(ecx_producer_pending_drops_total); connections up to the fd limit less 64\n"
    "(ecx_producer_refused_connections_total). At most 65536 active grants in\n"
    "all; when that table is full, a connection holding less than its share\n"
    "(65536 / connections holding grants) is still granted and the connection\n"
    "holding the most loses its oldest grant (ecx_producer_evicted_grants_total).\n"
    "Data plane: a grant's bytes leave once, to a request with its key and token\n"
    "(else ecx_producer_refused_reads_total); tcp and ucx take 256 connections,\n"
    "32 per client address, and close silent, malformed or stalled ones; shm\n"
    "takes 256 connections of this uid, each with a live grant within 2 s\n"
    "(ecx_producer_data_*_total{path=...}).\n"
    "\n"
    "Exit status: 0 after a clean shutdown, 1 on failure, 2 on usage error.\n";

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* One item to serve. */
typedef struct item {
    char hash[ECX_MM_HASH_MAX + 1];
    char *path; /* preload: file path; NULL for synthetic */
    uint64_t size;
    uint64_t rows, width; /* --width: the announced shape; rows 0: none given */
    uint64_t stored;      /* bytes saved: size, or (with --width) size in whole blocks */
} item;

typedef struct items {
    item *v;
    size_t n, cap;
} items;

static item *items_add(items *it)
{
    if (it->n == it->cap) {
        size_t cap = it->cap ? it->cap * 2 : 64;
        item *v = realloc(it->v, cap * sizeof *v);
        if (!v) return NULL;
        it->v = v, it->cap = cap;
    }
    item *x = &it->v[it->n++];
    memset(x, 0, sizeof *x);
    return x;
}

/* Collect DIR's regular files (sorted by name, so the order is stable). */
static int scan_dir(const char *dir, items *it)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "ecx: --preload %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..")) goto next;
        if (!item_name_ok(name)) {
            fprintf(stderr, "ecx: skipping '%s': names must be 1..%d of [A-Za-z0-9._-]\n", name,
                    ECX_MM_HASH_MAX);
            goto next;
        }
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
            fprintf(stderr, "ecx: skipping '%s': path too long\n", name);
            goto next;
        }
        struct stat st;
        if (lstat(path, &st)) {
            fprintf(stderr, "ecx: skipping '%s': %s\n", name, strerror(errno));
            goto next;
        }
        if (!S_ISREG(st.st_mode)) {
            fprintf(stderr, "ecx: skipping '%s': not a regular file (links are not followed)\n",
                    name);
            goto next;
        }
        if (st.st_size == 0) {
            fprintf(stderr, "ecx: skipping '%s': empty\n", name);
            goto next;
        }
        item *x = items_add(it);
        if (!x || !(x->path = strdup(path))) {
            rc = -1;
            goto next;
        }
        memcpy(x->hash, name, strlen(name) + 1); /* name_ok: at most ECX_MM_HASH_MAX bytes */
        x->size = x->stored = (uint64_t)st.st_size;
    next:
        free(ents[i]);
    }
    free(ents);
    return rc;
}

/* Read a preloaded file into its segments (no link followed, size checked),
 * and zero what they hold past its bytes (the padding of --width). */
static int load_file(const item *x, const ecx_segment *segs, size_t n)
{
    uint64_t size;
    int fd = file_open("--preload", x->path, x->size, true, &size);
    if (fd >= 0 && size != x->size) fprintf(stderr, "ecx: --preload '%s': shrank\n", x->path);
    int rc = fd < 0 || size != x->size ? -1 : 0;
    uint64_t left = x->size;
    for (size_t i = 0; !rc && i < n; i++) {
        size_t take = segs[i].len < left ? segs[i].len : (size_t)left;
        if (take) rc = file_read_fd("--preload", x->path, fd, segs[i].ptr, take);
        memset(segs[i].ptr + take, 0, segs[i].len - take);
        left -= take;
    }
    if (fd >= 0) close(fd);
    return rc;
}

/* --width: each preloaded file becomes rows of width elements of elem bytes,
 * stored in whole blocks; a file that is not whole rows is dropped. */
static void apply_width(items *it, uint64_t width, bool given, int elem, uint64_t block)
{
    uint64_t row = width * (uint64_t)elem; /* width <= 2^40, elem <= 8 */
    size_t kept = 0;
    for (size_t i = 0; i < it->n; i++) {
        item *x = &it->v[i];
        if (x->path && x->size % row) {
            fprintf(stderr, "ecx: skipping '%s': %llu bytes are not whole rows of %s %llu "
                    "(%llu bytes each)%s\n", x->hash, (unsigned long long)x->size,
                    given ? "--width" : "the default width, --block-bytes / element size,",
                    (unsigned long long)width, (unsigned long long)row,
                    given ? "" : ": give --width with the encoder output's row width");
            free(x->path);
            continue;
        }
        if (x->path) {
            x->rows = x->size / row, x->width = width;
            x->stored = (x->size + block - 1) / block * block;
        }
        it->v[kept++] = *x;
    }
    it->n = kept;
}

static int save_item(ecx_ctx *ctx, item *x, bool commit)
{
    const ecx_segment *segs; /* the library's, valid until commit or abort */
    size_t n = 0;
    int rc = ecx_save_begin(ctx, x->hash, x->stored, &segs, &n);
    if (rc) {
        fprintf(stderr, "ecx: cannot store %s (%llu bytes): %s\n", x->hash,
                (unsigned long long)x->stored, ecx_strerror(rc));
        return -1;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (!x->path) synthetic_fill(x->hash, segs[i].ptr, off, segs[i].len);
        off += segs[i].len;
    }
    if (x->path && load_file(x, segs, n)) {
        ecx_save_abort(ctx, x->hash);
        return -1;
    }
    if (x->rows && (rc = ecx_save_shape(ctx, x->hash, x->rows, x->width))) {
        fprintf(stderr, "ecx: cannot announce %s as [%llu, %llu]: %s\n", x->hash,
                (unsigned long long)x->rows, (unsigned long long)x->width, ecx_strerror(rc));
        ecx_save_abort(ctx, x->hash);
        return -1;
    }
    return commit && ecx_save_commit(ctx, x->hash) ? -1 : 0;
}

static int write_announcements(ecx_ctx *ctx, const items *it, const char *path)
{
    json_t *root = json_object();
    size_t cap = 1024, len = 0;
    char *buf = malloc(cap);
    for (size_t i = 0; buf && i < it->n; i++) {
        int e = ecx_announce(ctx, it->v[i].hash, buf, cap, &len);
        if (e == ECX_ERANGE) { /* len says how long it is: grow once */
            char *nb = realloc(buf, len + 1);
            if (nb) buf = nb, cap = len + 1, e = ecx_announce(ctx, it->v[i].hash, buf, cap, &len);
        }
        json_t *a = e == 0 ? json_loadb(buf, len, 0, NULL) : NULL;
        if (!a) {
            fprintf(stderr, "ecx: cannot announce %s: %s\n", it->v[i].hash,
                    e ? ecx_strerror(e) : "not JSON");
            free(buf);
            json_decref(root);
            return -1;
        }
        json_object_set_new(root, it->v[i].hash, a);
    }
    if (!buf) {
        json_decref(root);
        return -1;
    }
    free(buf);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "ecx: --announce-out path too long\n");
        json_decref(root);
        return -1;
    }
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc || rename(tmp, path)) {
        fprintf(stderr, "ecx: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ---------- metrics over HTTP ---------- */

/* HTTP connections on --metrics: a scrape takes milliseconds, so a
 * connection is closed METRICS_IDLE_S after its last byte and METRICS_REQ_S
 * after it was accepted or last answered, however it drips (libmicrohttpd's
 * own timeout counts from the last byte). At most METRICS_CONNS_PER_IP from
 * one address (more are refused) and METRICS_CONNS in all: a newcomer at the
 * total cap closes the connection idle longest of the address that holds
 * the most, if that holds more than the newcomer's, so however many
 * addresses hold connections, a scraper gets in (the tcp data plane's rule,
 * src/conn_budget.h, per address). Counted in the text served:
 * ecx_metrics_http_connections_{refused,evicted,timed_out}_total. */
#define METRICS_CONNS 128u
#define METRICS_CONNS_PER_IP 8u
#define METRICS_IDLE_S 3u
#define METRICS_REQ_S 5.0
#define METRICS_SLACK 32u /* libmicrohttpd's own cap: evicted ones close on its next run */

typedef struct hconn {
    struct MHD_Connection *conn; /* NULL: free */
    int fd;
    uint8_t key[16];
    double since; /* accepted, or last answered */
} hconn;

typedef struct http_state {
    ecx_ctx *ctx;
    hconn c[METRICS_CONNS + METRICS_SLACK];
    unsigned long long refused, evicted, timed_out;
} http_state;

static void addr_key(const struct sockaddr *sa, uint8_t key[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(key, 0, 16);
    if (sa && sa->sa_family == AF_INET) {
        memcpy(key, mapped, 12);
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

#define CUT 1e300 /* hconn.since of a connection already shut down */

static bool live(const hconn *c)
{
    return c->conn && c->since < CUT;
}

/* Live connections from key (all of them: key NULL). */
static unsigned count_key(const http_state *h, const uint8_t *key)
{
    unsigned n = 0;
    for (unsigned i = 0; i < sizeof h->c / sizeof *h->c; i++)
        n += live(&h->c[i]) && (!key || !memcmp(h->c[i].key, key, 16));
    return n;
}

/* Close c: libmicrohttpd sees the end of the stream on its next run. */
static void hconn_cut(hconn *c)
{
    shutdown(c->fd, SHUT_RDWR);
    c->since = CUT; /* once */
}

static enum MHD_Result http_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    (void)len;
    http_state *h = cls;
    uint8_t key[16];
    addr_key(addr, key);
    unsigned mine = count_key(h, key);
    if (mine >= METRICS_CONNS_PER_IP) {
        h->refused++;
        return MHD_NO;
    }
    if (count_key(h, NULL) < METRICS_CONNS) return MHD_YES;
    /* At the cap: the heaviest address's connection idle longest goes. */
    hconn *v = NULL;
    unsigned most = mine;
    for (unsigned i = 0; i < sizeof h->c / sizeof *h->c; i++) {
        hconn *c = &h->c[i];
        if (!live(c)) continue;
        unsigned k = count_key(h, c->key);
        if (k > most || (v && k == most && !memcmp(c->key, v->key, 16) && c->since < v->since))
            most = k, v = c;
    }
    if (!v) {
        h->refused++;
        return MHD_NO;
    }
    hconn_cut(v);
    h->evicted++;
    return MHD_YES;
}

static void http_notify(void *cls, struct MHD_Connection *conn, void **sctx,
                        enum MHD_ConnectionNotificationCode toe)
{
    http_state *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        hconn *c = *sctx;
        if (c && c->conn == conn) c->conn = NULL;
        *sctx = NULL;
        return;
    }
    *sctx = NULL;
    const union MHD_ConnectionInfo *fi = MHD_get_connection_info(conn,
                                                                 MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    for (unsigned i = 0; fi && i < sizeof h->c / sizeof *h->c; i++) {
        hconn *c = &h->c[i];
        if (c->conn) continue;
        *c = (hconn){.conn = conn, .fd = fi->connect_fd, .since = mono_s()};
        addr_key(ai ? ai->client_addr : NULL, c->key);
        *sctx = c;
        return;
    }
    /* No slot (libmicrohttpd's cap is above ours, so not expected): close it. */
    if (fi) shutdown(fi->connect_fd, SHUT_RDWR);
}

/* Close the connections past METRICS_REQ_S (from the serve loop). */
static void http_sweep(http_state *h)
{
    double now = mono_s();
    for (unsigned i = 0; i < sizeof h->c / sizeof *h->c; i++) {
        hconn *c = &h->c[i];
        if (live(c) && now - c->since > METRICS_REQ_S) {
            hconn_cut(c);
            h->timed_out++;
        }
    }
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_len, void **req_cls)
{
    (void)version, (void)upload, (void)upload_len, (void)req_cls;
    http_state *h = cls;
    struct MHD_Response *r;
    unsigned status = MHD_HTTP_OK;
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hconn *hc = si ? si->socket_context : NULL;
    if (hc && hc->conn == conn && live(hc)) hc->since = mono_s(); /* answered */
    if (!strcmp(method, "GET") && !strcmp(url, "/healthz")) {
        /* Liveness: the serve loop is running (it answers this). */
        static const char okb[] = "ok\n";
        r = MHD_create_response_from_buffer(sizeof okb - 1, (void *)okb, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_OK;
    } else if (strcmp(method, "GET") || strcmp(url, "/metrics")) {
        static const char nf[] = "not found: try GET /metrics or /healthz\n";
        r = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_FOUND;
    } else {
        size_t len = 16383;
        enum { EXTRA = 1024 }; /* the HTTP server's own counters */
        char *buf = NULL;
        int rc = ECX_ERANGE;
        for (int tries = 0; rc == ECX_ERANGE && tries < 3; tries++) { /* grows between calls */
            free(buf);
            if (!(buf = malloc(len + 1 + EXTRA))) return MHD_NO;
            rc = ecx_metrics(h->ctx, buf, len + 1, &len);
        }
        if (rc) {
            free(buf);
            return MHD_NO;
        }
        int k = snprintf(
            buf + len, EXTRA + 1,
            "# HELP ecx_metrics_http_connections_refused_total /metrics connections refused: "
            "their address held its cap, or the cap was full and nobody held more.\n"
            "# TYPE ecx_metrics_http_connections_refused_total counter\n"
            "ecx_metrics_http_connections_refused_total %llu\n"
            "# HELP ecx_metrics_http_connections_evicted_total /metrics connections closed for "
            "a newcomer at the cap.\n"
            "# TYPE ecx_metrics_http_connections_evicted_total counter\n"
            "ecx_metrics_http_connections_evicted_total %llu\n"
            "# HELP ecx_metrics_http_connections_timed_out_total /metrics connections closed "
            "for no answered request in time.\n"
            "# TYPE ecx_metrics_http_connections_timed_out_total counter\n"
            "ecx_metrics_http_connections_timed_out_total %llu\n",
            h->refused, h->evicted, h->timed_out);
        if (k > 0 && k <= EXTRA) len += (size_t)k;
        buf[len] = 0;
        r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    }
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* libmicrohttpd's own messages ("Failed to bind ..."), with our prefix. */
static void mhd_log(void *arg, const char *fmt, va_list ap)
{
    (void)arg;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    fprintf(stderr, "ecx: --metrics: %s\n", line);
}

static struct MHD_Daemon *start_metrics(const char *addr, http_state *h)
{
    char host[256];
    int port;
    if (parse_host_port(addr, host, &port)) {
        fprintf(stderr, "ecx: --metrics takes HOST:PORT, not '%s'\n", addr);
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &ai)) {
        fprintf(stderr, "ecx: --metrics: cannot resolve '%s'\n", host);
        return NULL;
    }
    unsigned flags = MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    /* No internal thread: MHD_run() is called from the serve loop, so the
     * counters are read on the thread that writes them. Our caps are in
     * http_accept; libmicrohttpd's own are above them. */
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, http_accept, h, on_http, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, METRICS_CONNS + METRICS_SLACK,
        MHD_OPTION_CONNECTION_TIMEOUT, METRICS_IDLE_S, MHD_OPTION_NOTIFY_CONNECTION,
        http_notify, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) fprintf(stderr, "ecx: --metrics: cannot listen on %s\n", addr);
    return d;
}

/* ---------- main ---------- */

static int parse_synthetic(const char *s, items *it)
{
    const char *colon = strchr(s, ':');
    int64_t count;
    uint64_t bytes;
    char num[32];
    if (!colon || (size_t)(colon - s) >= sizeof num) goto bad;
    memcpy(num, s, (size_t)(colon - s));
    num[colon - s] = 0;
    if (parse_int("--synthetic COUNT", num, 1, 1000000, &count) ||
        parse_size("--synthetic BYTES", colon + 1, &bytes) || bytes == 0)
        goto bad;
    for (int64_t i = 0; i < count; i++) {
        item *x = items_add(it);
        if (!x) return -1;
        synthetic_hash((uint64_t)i, bytes, x->hash);
        x->size = x->stored = bytes;
    }
    return 0;
bad:
    fprintf(stderr, "ecx: --synthetic takes COUNT:BYTES (e.g. 8:4718592), not '%s'\n", s);
    return -1;
}

int cmd_serve(int argc, char **argv)
{
    enum { O_LISTEN = 2000, O_ADVERTISE, O_PRELOAD, O_SYNTH, O_DELAY, O_ANNOUNCE, O_METRICS, O_LEASE,
           O_CURVE_SECRET, O_CURVE_ALLOW, O_CONN_GRANTS, O_CONN_PIN, O_PIN, O_WIDTH, O_EVENTS, O_EVENTS_TOPIC };
    static const struct option opts[] = {
        {"listen", required_argument, 0, O_LISTEN},
        {"advertise-host", required_argument, 0, O_ADVERTISE},
        {"preload", required_argument, 0, O_PRELOAD},
        {"synthetic", required_argument, 0, O_SYNTH},
        {"ready-delay-ms", required_argument, 0, O_DELAY},
        {"width", required_argument, 0, O_WIDTH},
        {"announce-out", required_argument, 0, O_ANNOUNCE},
        {"metrics", required_argument, 0, O_METRICS},
        {"lease-ms", required_argument, 0, O_LEASE},
        {"conn-grants", required_argument, 0, O_CONN_GRANTS},
        {"conn-pin-pct", required_argument, 0, O_CONN_PIN},
        {"pin-pct", required_argument, 0, O_PIN},
        {"curve-secret", required_argument, 0, O_CURVE_SECRET},
        {"curve-allow", required_argument, 0, O_CURVE_ALLOW},
        {"events-endpoint", required_argument, 0, O_EVENTS},
        {"events-topic", required_argument, 0, O_EVENTS_TOPIC},
        {"help", no_argument, 0, 'h'},
        COMMON_LONG_OPTS,
        {0, 0, 0, 0}};
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_PRODUCER;
    /* serve's main loop is its progress loop (it does nothing else), and a
     * producer must not answer before its items are stored: with a progress
     * thread, a restarted serve answered NACK_MISSING for items it was
     * still loading (test_soak). */
    cfg.progress_thread = 0;
    bool region_given = false;
    const char *announce = NULL, *metrics = NULL;
    const char *curve_secret_path = NULL, *curve_allow_path = NULL;
    char curve_sec[KEY_Z85_LEN + 1] = "";
    key_list allow = {0};
    int64_t delay = 0, lease = 30000, conn_grants = 1024, conn_pin = 100, pin = 100, width = 0;
    items it = {0};
    int c, rc = EXIT_FAIL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = common_opt(c, optarg, &cfg, &region_given);
        if (r < 0) goto usage;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(HELP, stdout); free(it.v); return EXIT_OK;
        case O_LISTEN: cfg.listen = optarg; break;
        case O_ADVERTISE: cfg.advertise_host = optarg; break;
        case O_PRELOAD: if (scan_dir(optarg, &it)) goto fail; break;
        case O_SYNTH: if (parse_synthetic(optarg, &it)) goto usage; break;
        case O_DELAY: if (parse_int("--ready-delay-ms", optarg, 0, 86400000, &delay)) goto usage; break;
        case O_WIDTH: if (parse_int("--width", optarg, 1, 1ll << 40, &width)) goto usage; break;
        case O_ANNOUNCE: announce = optarg; break;
        case O_METRICS: metrics = optarg; break;
        case O_LEASE: if (parse_int("--lease-ms", optarg, 1, 86400000, &lease)) goto usage; break;
        case O_CONN_GRANTS: if (parse_int("--conn-grants", optarg, 1, 65536, &conn_grants)) goto usage; break;
        case O_CONN_PIN: if (parse_int("--conn-pin-pct", optarg, 1, 100, &conn_pin)) goto usage; break;
        case O_PIN: if (parse_int("--pin-pct", optarg, 1, 100, &pin)) goto usage; break;
        case O_CURVE_SECRET: curve_secret_path = optarg; break;
        case O_CURVE_ALLOW: curve_allow_path = optarg; break;
        case O_EVENTS: cfg.events_endpoint = optarg; break;
        case O_EVENTS_TOPIC: cfg.events_topic = optarg; break;
        default: goto usage;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ecx: serve takes no arguments ('%s'); try 'ecx serve --help'\n", argv[optind]);
        goto usage;
    }
    if (common_finish(&cfg)) goto usage;
    char lhost[256];
    int lport;
    if (parse_host_port(cfg.listen, lhost, &lport)) {
        fprintf(stderr, "ecx: --listen takes HOST:PORT (port 0..65535), not '%s'\n", cfg.listen);
        goto usage;
    }
    if (!cfg.advertise_host &&
        (!strcmp(lhost, "*") || !strcmp(lhost, "0.0.0.0") || !strcmp(lhost, "::"))) {
        fprintf(stderr, "ecx: --listen %s is a wildcard: give --advertise-host with the "
                "address consumers reach this host at (announcing 127.0.0.1 would make "
                "consumers on other hosts dial themselves)\n", cfg.listen);
        goto usage;
    }
    if (width && cfg.connector_version != 2) {
        fprintf(stderr, "ecx: --width needs --connector-version 2 (version 1 has no shape)\n");
        goto usage;
    }
    if (cfg.connector_version == 2) { /* items are whole rows: of --width, else of a block */
        int elem = ecx_dtype_size(cfg.dtype);
        uint64_t row = width ? (uint64_t)width
                       : elem && cfg.block_bytes % (uint64_t)elem == 0 ? cfg.block_bytes / (uint64_t)elem
                                                                       : 0;
        if (row) apply_width(&it, row, width != 0, elem, cfg.block_bytes);
        for (size_t i = 0; i < it.n; i++)
            if (!it.v[i].path && whole_blocks_check("--synthetic", it.v[i].size, &cfg)) goto usage;
    }
    if (curve_allow_path && !curve_secret_path) {
        fprintf(stderr, "ecx: --curve-allow needs --curve-secret\n");
        goto usage;
    }
    if (curve_secret_path) {
        if (key_file_read("--curve-secret", curve_secret_path, true, curve_sec)) goto fail;
        cfg.curve_secret_key = curve_sec;
    }
    if (curve_allow_path) {
        if (allow_file_read("--curve-allow", curve_allow_path, &allow)) goto fail;
        cfg.curve_allow = (const char *const *)allow.v;
        cfg.n_curve_allow = allow.n;
    }
    cfg.lease_ms = lease;
    cfg.max_conn_grants = (uint32_t)conn_grants;
    cfg.max_conn_pin_pct = (uint32_t)conn_pin;
    cfg.max_pin_pct = (uint32_t)pin;
    if (!region_given) {
        uint64_t need = 0;
        for (size_t i = 0; i < it.n; i++)
            need += (it.v[i].stored + cfg.block_bytes - 1) / cfg.block_bytes * cfg.block_bytes;
        cfg.region_bytes = need ? need : cfg.block_bytes * 64;
    }

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ecx_ctx *ctx;
    int e = ecx_new(&cfg, &ctx);
    sodium_memzero(curve_sec, sizeof curve_sec); /* the socket holds it now */
    if (e) {
        fprintf(stderr, "ecx: cannot start the producer: %s\n", ecx_strerror(e));
        goto fail;
    }
    print_factors("producer", &cfg);
    if (curve_secret_path)
        fprintf(stderr, "ecx: control plane encrypted (CURVE), %s\n",
                curve_allow_path ? "clients checked against the allow-list"
                                 : "any client with this producer's public key admitted");
    struct MHD_Daemon *http = NULL;
    static http_state hs; /* one per process; large */
    hs = (http_state){.ctx = ctx};
    if (metrics && !(http = start_metrics(metrics, &hs))) goto out;
    for (size_t i = 0; i < it.n; i++)
        if (save_item(ctx, &it.v[i], delay == 0)) goto out;
    if (announce && write_announcements(ctx, &it, announce)) goto out;
    fprintf(stderr, "ecx: serving %zu item(s) on port %d\n", it.n, ecx_listen_port(ctx));

    double ready_at = mono_s() + (double)delay / 1000;
    bool all_ready = delay == 0;
    while (!stop) {
        ecx_poll(ctx, 20);
        if (http) {
            MHD_run(http);
            http_sweep(&hs);
        }
        if (!all_ready && mono_s() >= ready_at) {
            for (size_t i = 0; i < it.n; i++) ecx_save_commit(ctx, it.v[i].hash);
            all_ready = true;
        }
    }
    fprintf(stderr, "ecx: shutting down\n");
    rc = EXIT_OK;
out:
    if (http) MHD_stop_daemon(http);
    ecx_free(ctx);
fail:
    for (size_t i = 0; i < it.n; i++) free(it.v[i].path);
    free(it.v);
    sodium_memzero(curve_sec, sizeof curve_sec);
    key_list_free(&allow);
    return rc;
usage:
    for (size_t i = 0; i < it.n; i++) free(it.v[i].path);
    free(it.v);
    return EXIT_USAGE;
}
