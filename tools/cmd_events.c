/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx events — print a producer's encoder-cache events as they come
 * (docs/EVENTS.md), starting from a snapshot of what it holds, filling gaps
 * by replay and resynchronising (a new snapshot) when replay cannot.
 */
#include <getopt.h>
#include <jansson.h>
#include <msgpack.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "cli.h"
#include "keys.h"

static const char HELP[] =
    "usage: ecx events HOST:PORT [options]\n"
    "\n"
    "Print the encoder-cache events a producer publishes on HOST:PORT (`ecx serve\n"
    "--events-endpoint`, ecx_config.events_endpoint; docs/EVENTS.md), one line per\n"
    "event: first a snapshot of what it holds (a \"cleared\" event, reason snapshot,\n"
    "then one \"stored\" per item), then every change. A gap in the sequence numbers\n"
    "is filled from the replay socket (PORT + 1), or by a new snapshot when the\n"
    "producer no longer keeps the missed batches or restarted; the lines printed\n"
    "therefore always add up to what the producer holds.\n"
    "\n"
    "options:\n"
    "  --topic T              the producer's --events-topic (default empty)\n"
    "  --json                 one JSON object per line: {\"seq\", \"type\", \"ts\", ...}\n"
    "  --no-snapshot          print only what happens from now on\n"
    "  --count N              exit after N events\n"
    "  --for-ms MS            exit after MS milliseconds\n"
    "  --curve-server-key FILE  the producer's CURVE public key (when it runs CURVE)\n"
    "  --curve-secret FILE    this client's secret key, for a producer with an\n"
    "                         allow-list (default: a fresh key per connection)\n"
    "\n"
    "Text lines: SEQ stored MM_HASH SIZE_BYTES N_BLOCKS | SEQ removed MM_HASH REASON |\n"
    "SEQ cleared REASON PEER_HOST:PEER_PORT ITEMS.\n"
    "Exit status: 0 done (--count or --for-ms), 1 the producer's replay socket does\n"
    "not answer (5 tries of 2 s) or sends what is not docs/EVENTS.md, 2 usage error.\n";

#define SEQ_END UINT64_MAX
#define SEQ_RESYNC (UINT64_MAX - 1)
#define SEQ_ERROR (UINT64_MAX - 2)
#define REPLY_TIMEOUT_MS 2000

typedef struct state {
    void *zctx, *sub, *replay;
    char replay_ep[300];
    const char *curve, *secret; /* Z85; secret NULL: a fresh keypair */
    bool json, have_last, stopped; /* stopped: the last batch said "stop" */
    uint64_t last;
    int64_t left; /* events still to print; -1: no limit */
} state;

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static uint64_t get_be64(const void *p)
{
    const unsigned char *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return v;
}

static bool is_str(const msgpack_object *o) { return o->type == MSGPACK_OBJECT_STR; }
static bool is_uint(const msgpack_object *o) { return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER; }
static bool is_float(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32;
}

static bool tag_is(const msgpack_object *o, const char *t)
{
    return is_str(o) && o->via.str.size == strlen(t) && !memcmp(o->via.str.ptr, t, o->via.str.size);
}

static void set_str(json_t *j, const char *k, const msgpack_object *o)
{
    json_t *v = json_stringn(o->via.str.ptr, o->via.str.size); /* NULL if not UTF-8 */
    json_object_set_new(j, k, v ? v : json_null());
}

static void set_int(json_t *j, const char *k, uint64_t v)
{
    json_object_set_new(j, k, json_integer((json_int_t)v));
}

/* One event; false if it is not docs/EVENTS.md. */
static bool print_event(state *s, uint64_t seq, const msgpack_object *e)
{
    if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size < 1) return false;
    const msgpack_object *f = e->via.array.ptr;
    uint32_t n = e->via.array.size;
    const char *type;
    if (tag_is(&f[0], "EncoderCacheStored") && n >= 5 && is_str(&f[1]) && is_uint(&f[2]) &&
        is_uint(&f[3]) && is_float(&f[4]))
        type = "stored";
    else if (tag_is(&f[0], "EncoderCacheRemoved") && n >= 4 && is_str(&f[1]) && is_str(&f[2]) &&
             is_float(&f[3]))
        type = "removed";
    else if (tag_is(&f[0], "EncoderCacheCleared") && n >= 7 && is_str(&f[1]) && is_uint(&f[2]) &&
             is_str(&f[3]) && is_uint(&f[4]) && is_uint(&f[5]) && is_uint(&f[6]))
        type = "cleared";
    else
        return false;
    if (s->left > 0) s->left--;
    if (type[0] == 'c') s->stopped = f[1].via.str.size == 4 && !memcmp(f[1].via.str.ptr, "stop", 4);
    if (!s->json) {
        printf("%llu %s %.*s", (unsigned long long)seq, type, (int)f[1].via.str.size,
               f[1].via.str.ptr);
        if (type[0] == 's')
            printf(" %llu %llu\n", (unsigned long long)f[2].via.u64,
                   (unsigned long long)f[3].via.u64);
        else if (type[0] == 'r')
            printf(" %.*s\n", (int)f[2].via.str.size, f[2].via.str.ptr);
        else
            printf(" %.*s:%llu %llu\n", (int)f[3].via.str.size, f[3].via.str.ptr,
                   (unsigned long long)f[4].via.u64, (unsigned long long)f[6].via.u64);
        return true;
    }
    json_t *j = json_object();
    set_int(j, "seq", seq);
    json_object_set_new(j, "type", json_string(type));
    if (type[0] == 's') {
        set_str(j, "mm_hash", &f[1]);
        set_int(j, "size_bytes", f[2].via.u64);
        set_int(j, "n_blocks", f[3].via.u64);
        json_object_set_new(j, "ts", json_real(f[4].via.f64));
    } else if (type[0] == 'r') {
        set_str(j, "mm_hash", &f[1]);
        set_str(j, "reason", &f[2]);
        json_object_set_new(j, "ts", json_real(f[3].via.f64));
    } else {
        set_str(j, "reason", &f[1]);
        set_int(j, "version", f[2].via.u64);
        set_str(j, "peer_host", &f[3]);
        set_int(j, "peer_port", f[4].via.u64);
        set_int(j, "block_bytes", f[5].via.u64);
        set_int(j, "items", f[6].via.u64);
    }
    char *txt = json_dumps(j, JSON_COMPACT);
    if (txt) puts(txt);
    free(txt);
    json_decref(j);
    return true;
}

/* Every event of a batch; false if it is not docs/EVENTS.md. */
static bool print_batch(state *s, uint64_t seq, const void *p, size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    bool ok = msgpack_unpack_next(&u, p, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len;
    const msgpack_object *b = &u.data;
    ok = ok && b->type == MSGPACK_OBJECT_ARRAY && b->via.array.size >= 2 &&
         b->via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY;
    for (uint32_t i = 0; ok && i < b->via.array.ptr[1].via.array.size; i++)
        ok = print_event(s, seq, &b->via.array.ptr[1].via.array.ptr[i]);
    msgpack_unpacked_destroy(&u);
    fflush(stdout);
    if (!ok) fprintf(stderr, "ecx: events: batch %llu is not docs/EVENTS.md\n",
                     (unsigned long long)seq);
    return ok;
}

static void *socket_to(state *s, int type, const char *ep)
{
    void *k = zmq_socket(s->zctx, type);
    int zero = 0, one = 1;
    zmq_setsockopt(k, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(k, ZMQ_IPV6, &one, sizeof one);
    int64_t max = 64 << 20; /* a batch is ~16 KiB, a snapshot message 256 events */
    zmq_setsockopt(k, ZMQ_MAXMSGSIZE, &max, sizeof max);
    if (s->curve) {
        char pub[41], sec[41];
        if (s->secret) {
            memcpy(sec, s->secret, sizeof sec);
            zmq_curve_public(pub, sec);
        } else {
            zmq_curve_keypair(pub, sec);
        }
        zmq_setsockopt(k, ZMQ_CURVE_SERVERKEY, s->curve, 40);
        zmq_setsockopt(k, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(k, ZMQ_CURVE_SECRETKEY, sec, 40);
        sodium_memzero(sec, sizeof sec);
    }
    zmq_connect(k, ep);
    return k;
}

/* Ask the replay socket for `since` and print the batches numbered below
 * `below` that continue s->last (a snapshot: all of them, from its first).
 * 0: done; 1: the producer says resync; -1: no answer or refused. */
static int ask(state *s, uint64_t since, uint64_t below)
{
    bool snapshot = since == UINT64_MAX;
    for (int attempt = 0; attempt < 5; attempt++) {
        if (!s->replay) s->replay = socket_to(s, ZMQ_DEALER, s->replay_ep);
        unsigned char req[8];
        for (int i = 7, v = 0; i >= 0; i--, v++) req[i] = (unsigned char)(since >> (8 * v));
        zmq_send(s->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(s->replay, req, 8, 0);
        int64_t end = now_ms() + REPLY_TIMEOUT_MS;
        bool first = true, resync = false;
        for (;;) {
            zmq_pollitem_t it = {s->replay, 0, ZMQ_POLLIN, 0};
            int64_t left = end - now_ms();
            if (left <= 0 || zmq_poll(&it, 1, (long)left) <= 0) break;
            zmq_msg_t m[3];
            int n = 0, more = 1;
            size_t ml = sizeof more;
            while (more && n < 3) {
                zmq_msg_init(&m[n]);
                if (zmq_msg_recv(&m[n++], s->replay, 0) < 0) break;
                zmq_getsockopt(s->replay, ZMQ_RCVMORE, &more, &ml);
            }
            bool shape = n == 3 && !more && zmq_msg_size(&m[1]) == 8;
            uint64_t seq = shape ? get_be64(zmq_msg_data(&m[1])) : 0;
            int rc = 2; /* keep reading */
            if (!shape || seq == SEQ_ERROR) {
                fprintf(stderr, "ecx: events: the replay socket refused or sent garbage\n");
                rc = -1;
            } else if (seq == SEQ_END) {
                rc = resync ? 1 : 0;
            } else if (seq == SEQ_RESYNC) {
                resync = true; /* the end marker follows */
            } else if (snapshot || (seq == s->last + 1 && seq < below)) {
                if (!print_batch(s, seq, zmq_msg_data(&m[2]), zmq_msg_size(&m[2]))) rc = -1;
                if (snapshot && first) s->last = seq, s->have_last = true;
                else if (!snapshot) s->last = seq;
                first = false;
            }
            for (int i = 0; i < n; i++) zmq_msg_close(&m[i]);
            if (rc != 2) return rc;
        }
        zmq_close(s->replay); /* cut or lost: ask again on a fresh socket */
        s->replay = NULL;
        if (!snapshot) since = s->last + 1;
    }
    fprintf(stderr, "ecx: events: no answer from %s\n", s->replay_ep);
    return -1;
}

static int snapshot(state *s)
{
    int rc = ask(s, UINT64_MAX, 0);
    return rc == 1 ? -1 : rc;
}

/* One live batch, gaps filled first. */
static int on_batch(state *s, uint64_t seq, const void *p, size_t len)
{
    if (s->stopped) { /* a new life, whose numbers may be lower: start over */
        s->stopped = false;
        if (snapshot(s)) return -1;
    }
    if (!s->have_last) s->last = seq - 1, s->have_last = true;
    if (seq <= s->last) return 0; /* had it: from a replay, a snapshot, or a repeat */
    for (int depth = 0; seq > s->last + 1; depth++) {
        int rc = depth > 3 ? -1 : ask(s, s->last + 1, seq);
        if (rc == 1 || (rc == 0 && seq > s->last + 1)) rc = snapshot(s);
        if (rc < 0) return -1;
        if (seq <= s->last) return 0;
    }
    if (!print_batch(s, seq, p, len)) return -1;
    s->last = seq;
    return 0;
}

int cmd_events(int argc, char **argv)
{
    enum { O_TOPIC = 3000, O_JSON, O_NOSNAP, O_COUNT, O_FOR, O_CURVE, O_SECRET };
    static const struct option opts[] = {{"topic", required_argument, 0, O_TOPIC},
                                         {"json", no_argument, 0, O_JSON},
                                         {"no-snapshot", no_argument, 0, O_NOSNAP},
                                         {"count", required_argument, 0, O_COUNT},
                                         {"for-ms", required_argument, 0, O_FOR},
                                         {"curve-server-key", required_argument, 0, O_CURVE},
                                         {"curve-secret", required_argument, 0, O_SECRET},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    state s = {.left = -1};
    const char *topic = "";
    bool snap = true;
    int64_t for_ms = -1;
    char key[KEY_Z85_LEN + 1], secret[KEY_Z85_LEN + 1];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'h': fputs(HELP, stdout); return EXIT_OK;
        case O_TOPIC: topic = optarg; break;
        case O_JSON: s.json = true; break;
        case O_NOSNAP: snap = false; break;
        case O_COUNT:
            s.left = strtoll(optarg, &end, 10);
            if (*end || s.left < 1) return usage_error("--count takes a number >= 1");
            break;
        case O_FOR:
            for_ms = strtoll(optarg, &end, 10);
            if (*end || for_ms < 0) return usage_error("--for-ms takes milliseconds");
            break;
        case O_CURVE:
            if (key_file_read("--curve-server-key", optarg, false, key)) return EXIT_FAIL;
            s.curve = key;
            break;
        case O_SECRET:
            if (key_file_read("--curve-secret", optarg, true, secret)) return EXIT_FAIL;
            s.secret = secret;
            break;
        default: return usage_error("try 'ecx events --help'");
        }
    }
    if (s.secret && !s.curve) return usage_error("--curve-secret needs --curve-server-key");
    if (optind != argc - 1) return usage_error("events takes HOST:PORT; try 'ecx events --help'");
    const char *addr = argv[optind], *colon = strrchr(addr, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == addr || *end || port < 1 || port > 65534 || colon - addr > 255)
        return usage_error("'%s' is not HOST:PORT (PORT 1..65534)", addr);
    char host[256], ep[300];
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    const char *fmt = strchr(host, ':') ? "tcp://[%s]:%ld" : "tcp://%s:%ld";
    snprintf(ep, sizeof ep, fmt, host, port);
    snprintf(s.replay_ep, sizeof s.replay_ep, fmt, host, port + 1);
    s.zctx = zmq_ctx_new();
    s.sub = socket_to(&s, ZMQ_SUB, ep);
    zmq_setsockopt(s.sub, ZMQ_SUBSCRIBE, topic, strlen(topic));
    int rc = snap ? snapshot(&s) : 0;
    int64_t stop = for_ms >= 0 ? now_ms() + for_ms : -1;
    while (rc == 0 && s.left != 0) {
        int64_t wait = stop < 0 ? 1000 : stop - now_ms();
        if (stop >= 0 && wait <= 0) break;
        zmq_pollitem_t it = {s.sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, (long)(wait > 1000 ? 1000 : wait)) <= 0) continue;
        zmq_msg_t m[3];
        int n = 0, more = 1;
        size_t ml = sizeof more;
        while (more && n < 3) {
            zmq_msg_init(&m[n]);
            if (zmq_msg_recv(&m[n++], s.sub, 0) < 0) break;
            zmq_getsockopt(s.sub, ZMQ_RCVMORE, &more, &ml);
        }
        if (n == 3 && !more && zmq_msg_size(&m[1]) == 8)
            rc = on_batch(&s, get_be64(zmq_msg_data(&m[1])), zmq_msg_data(&m[2]),
                          zmq_msg_size(&m[2]));
        else
            fprintf(stderr, "ecx: events: a message that is not [topic, seq, batch] skipped\n");
        for (int i = 0; i < n; i++) zmq_msg_close(&m[i]);
        if (more) { /* more frames than a message has: drop the rest */
            zmq_msg_t junk;
            zmq_msg_init(&junk);
            while (more && zmq_msg_recv(&junk, s.sub, 0) >= 0)
                zmq_getsockopt(s.sub, ZMQ_RCVMORE, &more, &ml);
            zmq_msg_close(&junk);
        }
    }
    zmq_close(s.sub);
    if (s.replay) zmq_close(s.replay);
    zmq_ctx_term(s.zctx);
    sodium_memzero(secret, sizeof secret);
    return rc ? EXIT_FAIL : EXIT_OK;
}
