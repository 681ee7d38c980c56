/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx get — a consumer: fetch items from producers by their announcements
 * (or one item from a named peer) into files, all items in flight at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "ecx.h"
#include "file.h"
#include "keys.h"
#include "opts.h"

static const char HELP[] =
    "usage: ecx get --params FILE [--mm-hash H ...] --out DIR [options]\n"
    "       ecx get --peer HOST:PORT --mm-hash H --size BYTES --out FILE [options]\n"
    "\n"
    "Fetch encodings from producers. With --params, FILE holds announcements as\n"
    "`ecx serve --announce-out` writes them ({mm_hash: {\"peer_host\", \"peer_port\",\n"
    "\"size_bytes\", \"metadata\"}}); every item in it is fetched unless --mm-hash\n"
    "names some, and each lands in DIR/<mm_hash>. With --peer, one item is fetched\n"
    "into FILE. Output files hold exactly size_bytes bytes.\n"
    "\n"
    "options:\n"
    "  --params FILE          announcements file (a regular file, at most 256 MiB)\n"
    "  --mm-hash H            an item to fetch (repeatable)\n"
    "  --peer HOST:PORT       fetch from this producer (with --size); plaintext unless\n"
    "                         --curve-server-key (trusted network)\n"
    "  --size SIZE            announced size of the --peer item\n"
    "  --out DIR|FILE         where the bytes go (files created mode 0600)\n"
    "  --json                 print one JSON result object per item on stdout:\n"
    "                         mm_hash, outcome (ready|local), reason (if local),\n"
    "                         size_bytes, latency_ms (from the start until the fetch\n"
    "                         answered ready or local; files are written after all\n"
    "                         items have finished), written (the file holds it),\n"
    "                         verified (compared with --verify-synthetic's content;\n"
    "                         false without it: every fetch is checksum-checked anyway)\n"
    "  --verify-synthetic     check each item's bytes against `ecx serve --synthetic`\n"
    "  --rounds N             fetch the same items N times (default 1) over the same\n"
    "                         sessions, for benchmarks: between rounds every fetched\n"
    "                         item is evicted (ecx_evict) so the next round asks the\n"
    "                         producer again. Each round ends with a line on stderr\n"
    "                         (its median and longest latency); --json lines get a\n"
    "                         \"round\" field; files hold the last round's bytes\n"
    "  --ack-timeout-ms MS    wait this long for each ack (default 2000; 30000 with\n"
    "                         --connector-version 2, as vLLM >= 0.32 waits)\n"
    "  --region-bytes SIZE    local region (default: what the items need)\n"
    "  --curve-server-key FILE  talk to producers over ZeroMQ CURVE (encrypted); FILE\n"
    "                         holds their public key (`ecx keygen`'s .pub; key files\n"
    "                         are regular files of at most 64 KiB). A producer\n"
    "                         with another key looks dead: its items fall back\n"
    "  --curve-secret FILE    this consumer's secret key, for producers that keep an\n"
    "                         allow-list (default: a fresh key per connection)\n"
    COMMON_HELP
    "\n"
    "limits on producers (fixed): an ack frame of at most 16 MiB; at most 32 MiB\n"
    "of unfinished multipart messages per connection, else the connection is\n"
    "dropped and its items fall back. At most 256 producer sessions at once (an\n"
    "idle one is closed for a new one; with all busy, the item falls back\n"
    "SEND_FAILED); reconnects to an unreachable producer back off to 5 s.\n"
    "\n"
    "Exit status: 0 every item fetched; 3 some item fell back to local encoding\n"
    "(its reason, e.g. NACK_MISSING or ACK_TIMEOUT, on stderr); 1 other failure\n"
    "(including --verify-synthetic mismatches); 2 usage error.\n";

typedef struct want {
    const char *hash;
    char *announcement; /* --params: JSON text, NULL if the file has none */
    const ecx_announcement *from; /* --peer: where it is, no JSON */
    uint64_t size;
    int state, reason;
    double t0, ms;
    bool bad; /* verify failed or output not written */
    bool write_failed; /* output not written */
} want;

/* Write the item's segments to path atomically (temp file + rename) and,
 * if asked, compare them with the synthetic content. */
static int store(ecx_ctx *ctx, want *w, const char *path, bool verify)
{
    const ecx_segment *segs; /* the library's, valid until ecx_release */
    size_t n;
    uint64_t size;
    int rc = ecx_load(ctx, w->hash, &segs, &n, &size);
    if (rc) {
        fprintf(stderr, "ecx: %s: cannot load: %s\n", w->hash, ecx_strerror(rc));
        w->bad = true;
        return -1;
    }
    /* The temporary file sits beside the output under a short name of its
     * own, so an output name of NAME_MAX bytes still has one. */
    static unsigned long seq;
    char tmp[4300];
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    if (snprintf(tmp, sizeof tmp, "%.*s.ecx-get.%d.%lu.tmp", dir_len, path, (int)getpid(),
                 ++seq) >= (int)sizeof tmp) {
        fprintf(stderr, "ecx: output path too long\n");
        ecx_release(ctx, w->hash);
        w->bad = true;
        return -1;
    }
    /* Embeddings are private: 0600, which the umask can only tighten. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    uint64_t off = 0;
    uint8_t *check = NULL;
    rc = fd < 0 ? -1 : 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (verify) {
            if (!(check = realloc(check, segs[i].len ? segs[i].len : 1))) rc = -1;
            if (!rc) synthetic_fill(w->hash, check, off, segs[i].len);
            if (!rc && memcmp(check, segs[i].ptr, segs[i].len)) {
                fprintf(stderr, "ecx: %s: bytes differ from the synthetic content near offset %llu\n",
                        w->hash, (unsigned long long)off);
                w->bad = true;
            }
        }
        for (size_t done = 0; !rc && done < segs[i].len;) {
            ssize_t k = write(fd, segs[i].ptr + done, segs[i].len - done);
            if (k <= 0) rc = -1;
            else done += (size_t)k;
        }
        off += segs[i].len;
    }
    free(check);
    ecx_release(ctx, w->hash);
    if (fd >= 0 && close(fd)) rc = -1;
    if (!rc && rename(tmp, path)) rc = -1;
    if (rc) {
        fprintf(stderr, "ecx: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        w->bad = w->write_failed = true;
    }
    return rc;
}

/* 0 if out can take the output: a writable directory (dir) or a path in one. */
static int out_ok(const char *out, bool file)
{
    char parent[4200];
    const char *dir = out;
    if (file) {
        const char *slash = strrchr(out, '/');
        if (!slash) dir = ".";
        else if (snprintf(parent, sizeof parent, "%.*s", (int)(slash - out), out) >=
                 (int)sizeof parent) {
            fprintf(stderr, "ecx: --out %s: path too long\n", out);
            return -1;
        } else dir = slash == out ? "/" : parent;
        struct stat st;
        if (!stat(out, &st) && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "ecx: --out %s is a directory; with --peer it names the file\n", out);
            return -1;
        }
    }
    struct stat st;
    errno = 0;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK)) {
        fprintf(stderr, "ecx: --out %s: %s%s is not a directory this process can write to "
                "(%s); nothing was fetched\n", out, file ? "its directory " : "", dir,
                errno ? strerror(errno) : "not a directory");
        return -1;
    }
    return 0;
}

static void progress(size_t done, size_t total, uint64_t bytes)
{
    int width = 30, fill = total ? (int)(done * (size_t)width / total) : width;
    fprintf(stderr, "\r[%.*s%*s] %zu/%zu items  %.1f MB", fill,
            "##############################", width - fill, "", done, total, bytes / 1e6);
    if (done == total) fputc('\n', stderr);
}

/* Load --params FILE: every announcement, keyed by mm_hash. */
static json_t *load_params(const char *path)
{
    json_error_t err;
    size_t len;
    char *text = file_read("--params", path, FILE_MAX_PARAMS, &len);
    if (!text) return NULL;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!j) {
        fprintf(stderr, "ecx: --params %s: %s (line %d)\n", path, err.text, err.line);
        return NULL;
    }
    if (!json_is_object(j)) {
        fprintf(stderr, "ecx: --params %s: must be a JSON object {mm_hash: announcement}\n", path);
        json_decref(j);
        return NULL;
    }
    return j;
}

/* --rounds: before round `round`, evict every item the last round fetched,
 * so that its fetch asks the producer again. -1 (said why) if one cannot
 * be evicted. */
static int evict_fetched(ecx_ctx *ctx, const want *ws, size_t n, int64_t round)
{
    for (size_t i = 0; i < n; i++) {
        if (ws[i].state != ECX_FETCH_READY) continue;
        int rc = ecx_evict(ctx, ws[i].hash);
        if (rc) {
            fprintf(stderr, "ecx: round %lld: cannot evict %s to fetch it again: %s\n",
                    (long long)round, ws[i].hash, ecx_strerror(rc));
            return -1;
        }
    }
    return 0;
}

int cmd_get(int argc, char **argv)
{
    enum { O_PARAMS = 2000, O_HASH, O_PEER, O_SIZE, O_OUT, O_JSON, O_VERIFY, O_ACK,
           O_CURVE_SERVER, O_CURVE_SECRET, O_ROUNDS };
    static const struct option opts[] = {
        {"params", required_argument, 0, O_PARAMS},
        {"mm-hash", required_argument, 0, O_HASH},
        {"peer", required_argument, 0, O_PEER},
        {"size", required_argument, 0, O_SIZE},
        {"out", required_argument, 0, O_OUT},
        {"json", no_argument, 0, O_JSON},
        {"verify-synthetic", no_argument, 0, O_VERIFY},
        {"rounds", required_argument, 0, O_ROUNDS},
        {"ack-timeout-ms", required_argument, 0, O_ACK},
        {"curve-server-key", required_argument, 0, O_CURVE_SERVER},
        {"curve-secret", required_argument, 0, O_CURVE_SECRET},
        {"help", no_argument, 0, 'h'},
        COMMON_LONG_OPTS,
        {0, 0, 0, 0}};
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_CONSUMER;
    const char *params = NULL, *peer = NULL, *out = NULL;
    const char **hashes = calloc((size_t)argc + 1, sizeof *hashes);
    size_t n_hashes = 0;
    uint64_t peer_size = 0;
    bool json = false, verify = false, region_given = false, have_size = false;
    int64_t ack = 0; /* 0: the version's default */
    int64_t rounds = 1;
    const char *curve_server_path = NULL, *curve_secret_path = NULL;
    char curve_pub[KEY_Z85_LEN + 1], curve_sec[KEY_Z85_LEN + 1];
    int c;
    if (!hashes) return EXIT_FAIL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int r = common_opt(c, optarg, &cfg, &region_given);
        if (r < 0) goto usage;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(HELP, stdout); free(hashes); return EXIT_OK;
        case O_PARAMS: params = optarg; break;
        case O_HASH: hashes[n_hashes++] = optarg; break;
        case O_PEER: peer = optarg; break;
        case O_SIZE:
            if (parse_size("--size", optarg, &peer_size)) goto usage;
            if (!peer_size) {
                usage_error("--size must be at least 1 byte");
                goto usage;
            }
            have_size = true;
            break;
        case O_OUT: out = optarg; break;
        case O_JSON: json = true; break;
        case O_VERIFY: verify = true; break;
        case O_ROUNDS: if (parse_int("--rounds", optarg, 1, 1000000, &rounds)) goto usage; break;
        case O_ACK: if (parse_int("--ack-timeout-ms", optarg, 1, 3600000, &ack)) goto usage; break;
        case O_CURVE_SERVER: curve_server_path = optarg; break;
        case O_CURVE_SECRET: curve_secret_path = optarg; break;
        default: goto usage;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ecx: get takes no arguments ('%s'); try 'ecx get --help'\n", argv[optind]);
        goto usage;
    }
    if (!out || (!params == !peer)) {
        fprintf(stderr, "ecx: get needs --out and exactly one of --params or --peer\n");
        goto usage;
    }
    if (peer && (n_hashes != 1 || !have_size)) {
        fprintf(stderr, "ecx: --peer needs exactly one --mm-hash and --size\n");
        goto usage;
    }
    if (common_finish(&cfg) || (peer && whole_blocks_check("--size", peer_size, &cfg))) goto usage;
    cfg.ack_timeout_ms = ack ? ack
                         : cfg.connector_version == 2 ? ECX_DEFAULT_ACK_TIMEOUT_V2_MS
                                                      : ECX_DEFAULT_ACK_TIMEOUT_MS;
    if (curve_secret_path && !curve_server_path) {
        fprintf(stderr, "ecx: --curve-secret needs --curve-server-key\n");
        goto usage;
    }
    if (curve_server_path) {
        if (key_file_read("--curve-server-key", curve_server_path, false, curve_pub) ||
            (curve_secret_path && key_file_read("--curve-secret", curve_secret_path, true, curve_sec))) {
            free(hashes);
            return EXIT_FAIL;
        }
        cfg.curve_server_key = curve_pub;
        if (curve_secret_path) cfg.curve_secret_key = curve_sec;
    }

    /* The output, before any network work: a directory for --params, a file
     * in an existing directory for --peer. */
    if (out_ok(out, peer != NULL)) {
        free(hashes);
        return EXIT_FAIL;
    }

    /* The items and their announcements. */
    json_t *ann = NULL;
    char host[256];
    int port;
    ecx_announcement from = {0};
    if (peer) {
        if (parse_host_port(peer, host, &port) || port == 0) {
            fprintf(stderr, "ecx: --peer takes HOST:PORT, not '%s'\n", peer);
            goto usage;
        }
        from = (ecx_announcement){.peer_host = host, .peer_port = port, .size_bytes = peer_size};
    } else if (!(ann = load_params(params))) {
        free(hashes);
        return EXIT_FAIL;
    }
    if (n_hashes == 0) {
        const char *k;
        json_t *v;
        hashes = realloc(hashes, (json_object_size(ann) + 1) * sizeof *hashes);
        json_object_foreach(ann, k, v) hashes[n_hashes++] = k;
    }
    want *ws = calloc(n_hashes + 1, sizeof *ws);
    uint64_t need = 0;
    int rc = EXIT_FAIL;
    for (size_t i = 0; i < n_hashes; i++) {
        ws[i].hash = hashes[i];
        if (!peer && !item_name_ok(hashes[i])) {
            fprintf(stderr, "ecx: mm_hash '%s' cannot be a file name ([A-Za-z0-9._-], <= %d)\n",
                    hashes[i], ECX_MM_HASH_MAX);
            goto done;
        }
        if (peer) {
            ws[i].from = &from;
            ws[i].size = peer_size;
            need += (peer_size + cfg.block_bytes - 1) / cfg.block_bytes * cfg.block_bytes;
            continue;
        }
        json_t *a = json_object_get(ann, hashes[i]);
        if (!a) {
            fprintf(stderr, "ecx: --mm-hash %s is not in --params %s\n", hashes[i], params);
            rc = EXIT_USAGE;
            goto done;
        }
        json_t *s = json_object_get(a, "size_bytes");
        ws[i].announcement = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
        if (json_is_integer(s) && json_integer_value(s) > 0) {
            ws[i].size = (uint64_t)json_integer_value(s);
            need += (ws[i].size + cfg.block_bytes - 1) / cfg.block_bytes * cfg.block_bytes;
        }
    }
    if (!region_given) cfg.region_bytes = need > cfg.block_bytes ? need : cfg.block_bytes;

    ecx_ctx *ctx;
    int e = ecx_new(&cfg, &ctx);
    if (curve_secret_path) sodium_memzero(curve_sec, sizeof curve_sec); /* ctx holds a copy */
    if (e) {
        fprintf(stderr, "ecx: cannot start the consumer: %s\n", ecx_strerror(e));
        goto done;
    }
    bool tty = isatty(2) && !json;
    size_t fetched = 0, fell_back = 0, unwritten = 0, incompat = 0, timeouts = 0;
    bool any_bad = false;
    double *lat = calloc(n_hashes + 1, sizeof *lat);
    for (int64_t round = 1; lat && round <= rounds; round++) {
        if (round > 1 && evict_fetched(ctx, ws, n_hashes, round)) {
            any_bad = true;
            break;
        }
        size_t finished = 0, r_fetched = 0, r_fell_back = 0;
        uint64_t bytes = 0;
        double start = mono_s();
        for (size_t i = 0; i < n_hashes; i++) {
            ws[i].state = -1, ws[i].t0 = start;
            ws[i].bad = ws[i].write_failed = false;
        }
        /* Every item in flight at once; each one's latency ends when its
         * fetch answers. The files are written after the last, so that a
         * write does not delay seeing the next item's answer. */
        while (finished < n_hashes) {
            for (size_t i = 0; i < n_hashes; i++) {
                want *w = &ws[i];
                if (w->state == ECX_FETCH_READY || w->state == ECX_FETCH_LOCAL) continue;
                w->state = w->from ? ecx_fetch_from(ctx, w->hash, w->from, 0, &w->reason)
                                   : ecx_fetch(ctx, w->hash, w->announcement, 0, &w->reason);
                if (w->state == ECX_FETCH_PENDING) continue;
                if (w->state < 0) w->state = ECX_FETCH_LOCAL, w->reason = ECX_REASON_INVALID;
                w->ms = (mono_s() - w->t0) * 1000;
                lat[finished++] = w->ms;
                if (w->state == ECX_FETCH_READY) {
                    r_fetched++;
                    bytes += w->size;
                } else {
                    fprintf(stderr, "%s%s: %s\n", tty ? "\n" : "", w->hash,
                            ecx_reason_name(w->reason));
                    r_fell_back++;
                    if (w->reason == ECX_REASON_ACK_TIMEOUT && !timeouts++)
                        fprintf(stderr, "ecx: no ack in time: `ecx ping HOST:PORT` with these "
                                "options tells whether the producer is a ZeroMQ peer, its CURVE, "
                                "protocol version and compatibility\n");
                    if (w->reason == ECX_REASON_NACK_INCOMPAT && !incompat++) {
                        print_factors("this consumer", &cfg);
                        fprintf(stderr, "ecx: the producer's factors: its start-up line, the "
                                "ecx_info metric on its /metrics, or `ecx ping HOST:PORT`\n");
                    }
                }
                if (tty) progress(finished, n_hashes, bytes);
            }
            if (finished < n_hashes) ecx_poll(ctx, 10);
        }
        double secs = mono_s() - start;
        for (size_t i = 0; i < n_hashes; i++) {
            want *w = &ws[i];
            bool ready = w->state == ECX_FETCH_READY;
            if (ready) {
                char path[4200];
                int pl = peer ? snprintf(path, sizeof path, "%s", out)
                              : snprintf(path, sizeof path, "%s/%s", out, w->hash);
                if (pl >= (int)sizeof path) {
                    fprintf(stderr, "ecx: output path too long\n");
                    w->bad = w->write_failed = true;
                } else {
                    store(ctx, w, path, verify);
                }
            }
            any_bad |= w->bad;
            unwritten += w->write_failed;
            if (json) {
                /* "written": the file holds the bytes; "verified": they were compared
                 * with --verify-synthetic's content (checksums are checked always). */
                json_t *o = json_pack("{s:s,s:s,s:s?,s:I,s:f,s:b,s:b}", "mm_hash", w->hash,
                                      "outcome", ready ? "ready" : "local", "reason",
                                      ready ? NULL : ecx_reason_name(w->reason), "size_bytes",
                                      (json_int_t)w->size, "latency_ms", w->ms, "written",
                                      ready && !w->write_failed, "verified",
                                      verify && !w->bad && ready);
                if (o && rounds > 1) json_object_set_new(o, "round", json_integer(round));
                char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
                if (t) puts(t);
                free(t);
                json_decref(o);
            }
        }
        fflush(stdout);
        fetched += r_fetched;
        fell_back += r_fell_back;
        if (rounds > 1) {
            double median = finished ? bench_median(lat, (int)finished) : 0; /* sorts lat */
            fprintf(stderr, "ecx: round %lld: %zu fetched, %zu fell back, %.1f MB in %.3f s; "
                    "latency median %.1f ms, longest %.1f ms\n", (long long)round, r_fetched,
                    r_fell_back, bytes / 1e6, secs, median, finished ? lat[finished - 1] : 0);
        } else if (!json) {
            fprintf(stderr, "ecx: %zu fetched, %zu fell back, %.1f MB in %.3f s\n", fetched,
                    fell_back, bytes / 1e6, secs);
        }
    }
    if (!lat) {
        fprintf(stderr, "ecx: out of memory\n");
        any_bad = true;
    }
    free(lat);
    if (unwritten) fprintf(stderr, "ecx: %zu fetched item(s) NOT written (above)\n", unwritten);
    rc = any_bad ? EXIT_FAIL : fell_back ? 3 : EXIT_OK;
    ecx_free(ctx);
done:
    for (size_t i = 0; i < n_hashes; i++) free(ws[i].announcement);
    free(ws);
    json_decref(ann);
    free(hashes);
    return rc;
usage:
    free(hashes);
    return EXIT_USAGE;
}
