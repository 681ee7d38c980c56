/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx proto — decode and encode single XferReq / XferAck frames, for
 * debugging peers and for scripts. The JSON shape is the same both ways:
 * every field, defaults filled in, "type" included, bytes fields as
 * lowercase hex, status as an int.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ecx.h"
#include "opts.h"

/* Largest frame read from stdin or an argument. */
#define MAX_FRAME (64u << 20)

static const char HELP[] =
    "usage: ecx proto decode [--as req|ack] [HEX]\n"
    "       ecx proto encode\n"
    "\n"
    "decode  Decode one frame, given as a HEX argument or as raw bytes on stdin,\n"
    "        and print one JSON line with every field (defaults filled in,\n"
    "        \"type\" included, bytes as lowercase hex, status as an int).\n"
    "        --as req|ack  decode as this message type; without it, a frame\n"
    "                      that is a valid XferReq is one, else an XferAck.\n"
    "        An invalid frame prints 'error: <why>' on stderr and exits 1.\n"
    "encode  Read one JSON object of that shape on stdin and print the frame\n"
    "        as hex. \"type\" (\"req\" or \"ack\") is required, as are the\n"
    "        message's required fields; unknown keys and wrong types are errors.\n"
    "\n"
    "Exit status: 0 success, 1 invalid frame or JSON, 2 usage error.\n";

static int fail(const char *fmt, const char *detail)
{
    fputs("error: ", stderr);
    fprintf(stderr, fmt, detail);
    fputs("\n", stderr);
    return EXIT_FAIL;
}

/* ---------- decode ---------- */

static json_t *jstr(ecx_span s) { return json_stringn(s.p ? s.p : "", s.n); }

static json_t *jhex(ecx_span s)
{
    char *h = malloc(2 * s.n + 1);
    if (!h) return NULL;
    hex_encode(s.p, s.n, h);
    json_t *j = json_string(h);
    free(h);
    return j;
}

static json_t *req_json(const ecx_req *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("req"));
    json_object_set_new(o, "mm_hash", jstr(r->mm_hash));
    json_object_set_new(o, "compatibility_hash", jstr(r->compatibility_hash));
    json_object_set_new(o, "session_id", jstr(r->session_id));
    json_object_set_new(o, "connector_version", json_integer(r->connector_version));
    return o;
}

static json_t *ack_json(const ecx_ack *a)
{
    json_t *o = json_object(), *idx = json_array();
    json_object_set_new(o, "type", json_string("ack"));
    json_object_set_new(o, "mm_hash", jstr(a->mm_hash));
    json_object_set_new(o, "status", json_integer(a->status));
    json_object_set_new(o, "session_id", jstr(a->session_id));
    int64_t *v = malloc((a->n_indices + 1) * sizeof *v);
    size_t n = v ? ecx_wire_ack_indices(a, v, a->n_indices) : 0;
    for (size_t i = 0; i < n; i++) json_array_append_new(idx, json_integer(v[i]));
    free(v);
    json_object_set_new(o, "src_block_indices", idx);
    json_object_set_new(o, "agent_metadata", jhex(a->agent_metadata));
    json_object_set_new(o, "mem_descriptor", jhex(a->mem_descriptor));
    return o;
}

/* Read all of stdin, refusing more than MAX_FRAME bytes. */
static int read_stdin(uint8_t **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_FRAME) {
                free(buf);
                return fail("%s", "input larger than 64 MiB");
            }
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb, cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, stdin);
        n += k;
        if (k == 0) {
            if (ferror(stdin)) {
                free(buf);
                return fail("%s", "cannot read stdin");
            }
            *out = buf, *len = n;
            return 0;
        }
    }
    free(buf);
    return fail("%s", "out of memory");
}

static int print_json(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (!text) return fail("%s", "out of memory");
    puts(text);
    free(text);
    return EXIT_OK;
}

static int proto_decode(int argc, char **argv)
{
    static const struct option opts[] = {{"as", required_argument, 0, 'a'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *as = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+a:h", opts, NULL)) != -1) {
        if (c == 'h') return fputs(HELP, stdout), EXIT_OK;
        if (c != 'a') return usage_error("try 'ecx proto --help'");
        if (strcmp(optarg, "req") && strcmp(optarg, "ack"))
            return usage_error("--as takes req or ack, not '%s'", optarg);
        as = optarg;
    }
    if (argc - optind > 1) return usage_error("proto decode takes at most one HEX argument");

    uint8_t *frame = NULL;
    size_t len = 0;
    if (optind < argc) {
        const char *hex = argv[optind];
        size_t hl = strlen(hex);
        if (hl / 2 > MAX_FRAME) return fail("%s", "frame larger than 64 MiB");
        frame = malloc(hl / 2 + 1);
        if (!frame) return fail("%s", "out of memory");
        long k = hex_decode(hex, hl, frame);
        if (k < 0) {
            free(frame);
            return fail("%s", "HEX is not an even number of hex digits");
        }
        len = (size_t)k;
    } else {
        int rc = read_stdin(&frame, &len);
        if (rc) return rc;
    }

    ecx_req r;
    ecx_ack a;
    int rc = EXIT_OK;
    if (as && !strcmp(as, "req")) {
        int e = ecx_wire_decode_req(frame, len, &r);
        rc = e ? fail("%s", ecx_strerror(e)) : print_json(req_json(&r));
    } else if (as) {
        int e = ecx_wire_decode_ack(frame, len, &a);
        rc = e ? fail("%s", ecx_strerror(e)) : print_json(ack_json(&a));
    } else {
        int er = ecx_wire_decode_req(frame, len, &r);
        int ea = er ? ecx_wire_decode_ack(frame, len, &a) : -1;
        if (!er)
            rc = print_json(req_json(&r));
        else if (!ea)
            rc = print_json(ack_json(&a));
        else {
            fprintf(stderr, "error: not an XferReq (%s) nor an XferAck (%s)\n",
                    ecx_strerror(er), ecx_strerror(ea));
            rc = EXIT_FAIL;
        }
    }
    free(frame);
    return rc;
}

/* ---------- encode ---------- */

/* Keys each message accepts in JSON (besides "type"). */
static const char *const REQ_KEYS[] = {"mm_hash", "compatibility_hash", "session_id",
                                       "connector_version", NULL};
static const char *const ACK_KEYS[] = {"mm_hash",        "status",         "session_id",
                                       "src_block_indices", "agent_metadata", "mem_descriptor",
                                       NULL};

static int check_keys(json_t *o, const char *const *keys)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        int ok = !strcmp(k, "type");
        for (int i = 0; !ok && keys[i]; i++) ok = !strcmp(k, keys[i]);
        if (!ok) return fail("unknown key \"%s\" for this message", k);
    }
    return 0;
}

/* A string field: absent leaves the default; present must be a JSON string. */
static int get_str(json_t *o, const char *key, bool required, ecx_span *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) return required ? fail("missing required field \"%s\"", key) : 0;
    if (!json_is_string(v)) return fail("\"%s\" must be a string", key);
    out->p = json_string_value(v);
    out->n = json_string_length(v);
    return 0;
}

/* A bytes field given as hex; the decoded bytes go to a buffer the caller frees. */
static int get_hex(json_t *o, const char *key, ecx_span *out, uint8_t **mem)
{
    ecx_span h = {0};
    if (get_str(o, key, false, &h)) return EXIT_FAIL;
    if (!h.n) return 0;
    *mem = malloc(h.n / 2 + 1);
    if (!*mem) return fail("%s", "out of memory");
    long k = hex_decode(h.p, h.n, *mem);
    if (k < 0) return fail("\"%s\" must be an even number of hex digits", key);
    out->p = (const char *)*mem;
    out->n = (size_t)k;
    return 0;
}

static int get_int(json_t *o, const char *key, bool required, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) return required ? fail("missing required field \"%s\"", key) : 0;
    if (!json_is_integer(v)) return fail("\"%s\" must be an integer", key);
    *out = json_integer_value(v);
    return 0;
}

/* A frame encoded by the public codec: first into a small buffer, then, if
 * the codec says it needs more, once more into one of the size it names. */
typedef struct frame_buf {
    uint8_t *data;
    size_t size;
} frame_buf;

static int encode_frame(int (*enc)(const void *, void *, size_t, size_t *), const void *msg,
                        frame_buf *out)
{
    size_t cap = 256, len = 0;
    for (int tries = 0; tries < 2; tries++) {
        uint8_t *b = malloc(cap ? cap : 1);
        if (!b) return ECX_ENOMEM;
        int e = enc(msg, b, cap, &len);
        if (e == 0) {
            out->data = b, out->size = len;
            return 0;
        }
        free(b);
        if (e != ECX_ERANGE) return e;
        cap = len;
    }
    return ECX_ERANGE;
}

static int enc_req(const void *m, void *b, size_t cap, size_t *len)
{
    return ecx_wire_encode_req(m, b, cap, len);
}

static int enc_ack(const void *m, void *b, size_t cap, size_t *len)
{
    return ecx_wire_encode_ack(m, b, cap, len);
}

static int encode_ack(json_t *o, frame_buf *buf)
{
    ecx_ack a;
    ecx_ack_init(&a);
    int64_t status = -1, *idx = NULL;
    uint8_t *meta = NULL, *desc = NULL;
    int rc = EXIT_FAIL;
    if (check_keys(o, ACK_KEYS) || get_str(o, "mm_hash", true, &a.mm_hash) ||
        get_int(o, "status", true, &status) || get_str(o, "session_id", false, &a.session_id) ||
        get_hex(o, "agent_metadata", &a.agent_metadata, &meta) ||
        get_hex(o, "mem_descriptor", &a.mem_descriptor, &desc))
        goto out;
    if (status < 0 || status > ECX_STATUS_MAX) {
        fail("%s", "\"status\" must be 0..5");
        goto out;
    }
    a.status = (int)status;
    json_t *list = json_object_get(o, "src_block_indices");
    if (list) {
        if (!json_is_array(list)) {
            fail("%s", "\"src_block_indices\" must be a list of integers");
            goto out;
        }
        a.n_indices = json_array_size(list);
        idx = malloc((a.n_indices + 1) * sizeof *idx);
        if (!idx) {
            fail("%s", "out of memory");
            goto out;
        }
        for (size_t i = 0; i < a.n_indices; i++) {
            json_t *e = json_array_get(list, i);
            if (!json_is_integer(e)) {
                fail("%s", "\"src_block_indices\" must be a list of integers");
                goto out;
            }
            idx[i] = json_integer_value(e);
        }
        a.indices = idx;
    }
    int e = encode_frame(enc_ack, &a, buf);
    rc = e ? fail("%s", ecx_strerror(e)) : EXIT_OK;
out:
    free(idx);
    free(meta);
    free(desc);
    return rc;
}

static int encode_req(json_t *o, frame_buf *buf)
{
    ecx_req r;
    ecx_req_init(&r);
    if (check_keys(o, REQ_KEYS) || get_str(o, "mm_hash", true, &r.mm_hash) ||
        get_str(o, "compatibility_hash", true, &r.compatibility_hash) ||
        get_str(o, "session_id", false, &r.session_id) ||
        get_int(o, "connector_version", false, &r.connector_version))
        return EXIT_FAIL;
    int e = encode_frame(enc_req, &r, buf);
    return e ? fail("%s", ecx_strerror(e)) : EXIT_OK;
}

static int proto_encode(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return fputs(HELP, stdout), EXIT_OK;
    if (argc != 1) return usage_error("proto encode takes no arguments (JSON comes on stdin)");
    uint8_t *text;
    size_t len;
    int rc = read_stdin(&text, &len);
    if (rc) return rc;
    json_error_t err;
    json_t *o = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    free(text);
    if (!o) return fail("invalid JSON: %s", err.text);
    frame_buf buf = {0};
    json_t *type = json_object_get(o, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (!json_is_object(o))
        rc = fail("%s", "input must be one JSON object");
    else if (!strcmp(t, "req"))
        rc = encode_req(o, &buf);
    else if (!strcmp(t, "ack"))
        rc = encode_ack(o, &buf);
    else
        rc = fail("%s", "\"type\" must be \"req\" or \"ack\"");
    if (rc == EXIT_OK) {
        char *hex = malloc(2 * buf.size + 1);
        if (!hex) {
            rc = fail("%s", "out of memory");
        } else {
            hex_encode(buf.data, buf.size, hex);
            puts(hex);
            free(hex);
        }
    }
    free(buf.data);
    json_decref(o);
    return rc;
}

int cmd_proto(int argc, char **argv)
{
    if (argc < 2) return usage_error("proto needs decode or encode (try 'ecx proto --help')");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return fputs(HELP, stdout), EXIT_OK;
    if (!strcmp(argv[1], "decode")) return proto_decode(argc - 1, argv + 1);
    if (!strcmp(argv[1], "encode")) return proto_encode(argc - 1, argv + 1);
    return usage_error("unknown proto command '%s' (try 'ecx proto --help')", argv[1]);
}
