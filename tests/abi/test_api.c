/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_api — the public API as an engine sees it: only <ecx.h>, real
 * contexts, real sockets on loopback. Covers what issue 11 sealed: config
 * growth, names from one list, the logger, region layout, library-owned
 * segment lists, lengths on ERANGE, the JSON-free fetch, ecx_fd /
 * ecx_next_timeout in a foreign loop, and the threading rule (one thread
 * waits in ecx_poll while others fetch and save).
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecx.h"
#include "../support/speak_v1.h"
#include "bench_ctx.h"

#define BLOCK (64u << 10)
#define REGION (16u << 20)

/* Contexts made by make() run the progress thread or not (tests run both). */
static int g_thread = 1;

/* Protocol version 1 (vLLM 0.31.0) with 64 KiB blocks: the API's items of
 * any byte count (a last block part full, segments that end inside one) are
 * version 1's; make_v(role, 2) speaks 2 with the same factors (and so the
 * same compat hash), test_factors checks the defaults. */
static void base_config(ecx_config *c, int role)
{
    ecxt_config_v1(c);
    c->progress_thread = g_thread;
    c->role = role;
    c->listen = "127.0.0.1:0";
    c->region_bytes = REGION;
    c->block_bytes = BLOCK;
    c->ack_timeout_ms = 3000;
}

static ecx_ctx *make(int role)
{
    ecx_config c;
    base_config(&c, role);
    ecx_ctx *ctx = NULL;
    assert_int_equal(ecx_new(&c, &ctx), 0);
    return ctx;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 9));
}

/* ---------- names and versions ---------- */

static void test_version_and_names(void **state)
{
    (void)state;
    assert_string_equal(ecx_version(), ECX_VERSION_STRING);
    /* Every code in the list has its own name and a message. */
    static const int codes[] = {
#define CODE_(name, code, msg) code,
        ECX_ERRORS(CODE_)
#undef CODE_
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(strncmp(ecx_errname(codes[i]), "ECX_", 4), 0);
        assert_string_not_equal(ecx_errname(codes[i]), "ECX_EUNKNOWN");
        assert_string_not_equal(ecx_strerror(codes[i]), "unknown error");
        for (size_t k = 0; k < i; k++)
            assert_string_not_equal(ecx_errname(codes[i]), ecx_errname(codes[k]));
    }
    assert_string_equal(ecx_errname(ECX_ECACHE_FULL), "ECX_ECACHE_FULL");
    assert_string_equal(ecx_errname(-9999), "ECX_EUNKNOWN");
    assert_string_equal(ecx_strerror(-9999), "unknown error");
    assert_string_equal(ecx_status_name(ECX_STATUS_NACK_NOT_READY), "NACK_NOT_READY");
    assert_string_equal(ecx_status_name(6), "UNKNOWN");
    assert_string_equal(ecx_reason_name(ECX_REASON_LEASE_EXPIRED), "LEASE_EXPIRED");
    assert_string_equal(ecx_reason_name(ECX_REASON_COUNT), "UNKNOWN");
    for (int r = 0; r < ECX_REASON_COUNT; r++)
        assert_string_not_equal(ecx_reason_name(r), "UNKNOWN");
}

/* ---------- config ---------- */

static int try_new(const ecx_config *c)
{
    ecx_ctx *ctx = NULL;
    int rc = ecx_new(c, &ctx);
    ecx_free(ctx);
    return rc;
}

static void test_config_growth(void **state)
{
    (void)state;
    ecx_config c;
    base_config(&c, ECX_ROLE_CONSUMER);
    assert_int_equal(c.size, sizeof c);
    assert_int_equal(try_new(&c), 0);

    /* Not made by ecx_config_init: size 0. */
    ecx_config z;
    memset(&z, 0, sizeof z);
    assert_int_equal(try_new(&z), ECX_EINVAL);

    /* A newer caller's larger config: fine while the unknown tail is zero. */
    struct {
        ecx_config c;
        uint64_t future[4];
    } big;
    memset(&big, 0, sizeof big);
    base_config(&big.c, ECX_ROLE_CONSUMER);
    big.c.size = sizeof big;
    assert_int_equal(try_new(&big.c), 0);
    big.future[2] = 7; /* a field this library does not know, set */
    assert_int_equal(try_new(&big.c), ECX_EINVAL);

    /* Each limit is checked. */
    struct {
        size_t off, len;
        int64_t v;
    } bad[] = {
        {offsetof(ecx_config, role), sizeof c.role, 0},
        {offsetof(ecx_config, ack_timeout_ms), sizeof c.ack_timeout_ms, 0},
        {offsetof(ecx_config, read_timeout_ms), sizeof c.read_timeout_ms, -5},
        {offsetof(ecx_config, session_idle_ms), sizeof c.session_idle_ms, 0},
        {offsetof(ecx_config, max_sessions), sizeof c.max_sessions, 0},
        {offsetof(ecx_config, max_conn_pin_pct), sizeof c.max_conn_pin_pct, 101},
        {offsetof(ecx_config, max_conn_grants), sizeof c.max_conn_grants, 70000},
        {offsetof(ecx_config, block_bytes), sizeof c.block_bytes, 0},
        {offsetof(ecx_config, connector_version), sizeof c.connector_version, -1},
        {offsetof(ecx_config, connector_version), sizeof c.connector_version, 3},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        base_config(&c, ECX_ROLE_CONSUMER);
        if (bad[i].len == 4) {
            uint32_t v = (uint32_t)bad[i].v;
            memcpy((char *)&c + bad[i].off, &v, 4);
        } else {
            memcpy((char *)&c + bad[i].off, &bad[i].v, 8);
        }
        assert_int_equal(try_new(&c), ECX_EINVAL);
    }
    base_config(&c, ECX_ROLE_CONSUMER);
    c.data = "carrier-pigeon";
    assert_int_equal(try_new(&c), ECX_EINVAL);
    /* Version 2 needs an element size: a torch dtype name, and blocks of whole elements. */
    base_config(&c, ECX_ROLE_CONSUMER);
    c.connector_version = 2;
    assert_int_equal(try_new(&c), 0);
    c.dtype = "torch.float32";
    assert_int_equal(try_new(&c), 0);
    c.dtype = "mystery";
    assert_int_equal(try_new(&c), ECX_EINVAL);
    c.dtype = "float32";
    c.block_bytes = BLOCK + 2;
    assert_int_equal(try_new(&c), ECX_EINVAL);
    /* Events (docs/EVENTS.md): a producer's; HOST:PORT with room for the replay port. */
    base_config(&c, ECX_ROLE_CONSUMER);
    c.events_endpoint = "127.0.0.1:47990";
    assert_int_equal(try_new(&c), ECX_EINVAL);
    const char *bad_ep[] = {"127.0.0.1:65535", "127.0.0.1:0", "127.0.0.1", "nonsense:port"};
    for (size_t i = 0; i < sizeof bad_ep / sizeof bad_ep[0]; i++) {
        base_config(&c, ECX_ROLE_PRODUCER);
        c.events_endpoint = bad_ep[i];
        assert_int_equal(try_new(&c), ECX_EINVAL);
    }
    char long_topic[300];
    memset(long_topic, 't', sizeof long_topic - 1);
    long_topic[sizeof long_topic - 1] = '\0';
    base_config(&c, ECX_ROLE_PRODUCER);
    c.events_endpoint = "127.0.0.1:47990";
    c.events_topic = long_topic;
    assert_int_equal(try_new(&c), ECX_EINVAL);
    /* A caller built before the events fields: off. */
    base_config(&c, ECX_ROLE_PRODUCER);
    c.size = offsetof(ecx_config, events_endpoint);
    c.events_endpoint = "garbage past the caller's size";
    assert_int_equal(try_new(&c), 0);
    /* A caller built before connector_version existed: the version its vllm_version
     * speaks. */
    base_config(&c, ECX_ROLE_CONSUMER);
    assert_int_equal(c.connector_version, ECX_DEFAULT_CONNECTOR_VERSION);
    c.size = offsetof(ecx_config, connector_version);
    c.connector_version = 2;
    assert_int_equal(try_new(&c), 0);
}

/* ---------- the compatibility factors as vLLM gives them (issue 23 §1) ---------- */

/* The ecx_info metric line of a producer made from c; "" if ecx_new failed. */
static void info_line(const ecx_config *c, char *line, size_t cap)
{
    ecx_ctx *ctx = NULL;
    line[0] = '\0';
    if (ecx_new(c, &ctx)) return;
    static char text[1 << 16];
    size_t len;
    assert_int_equal(ecx_metrics(ctx, text, sizeof text, &len), 0);
    const char *at = strstr(text, "\necx_info{");
    assert_non_null(at);
    const char *end = strchr(at + 1, '\n');
    snprintf(line, cap, "%.*s", (int)(end - at - 1), at + 1);
    ecx_free(ctx);
}

static void test_factors(void **state)
{
    (void)state;
    assert_string_equal(ecx_dtype_name("bfloat16"), "torch.bfloat16");
    assert_string_equal(ecx_dtype_name("bf16"), "torch.bfloat16");
    assert_string_equal(ecx_dtype_name("torch.bfloat16"), "torch.bfloat16");
    assert_string_equal(ecx_dtype_name("half"), "torch.float16");
    assert_string_equal(ecx_dtype_name("torch.float"), "torch.float32");
    assert_null(ecx_dtype_name("mystery"));
    assert_null(ecx_dtype_name("torch."));
    assert_int_equal(ecx_dtype_size("bf16"), 2);
    assert_int_equal(ecx_protocol_version_of("0.31.0"), 1);
    assert_int_equal(ecx_protocol_version_of("0.32.0"), 2);
    assert_int_equal(ecx_protocol_version_of("0.34.0"), 2);
    assert_int_equal(ecx_protocol_version_of("0.35.1rc2"), 2);
    assert_int_equal(ecx_protocol_version_of("1.0"), 2);
    assert_int_equal(ecx_protocol_version_of("0.4.0"), 1);
    assert_int_equal(ecx_protocol_version_of("custom"), 1);
    assert_int_equal(ecx_protocol_version_of(""), 1);

    /* Every spelling of bfloat16 hashes what vLLM hashes: str(torch.bfloat16). */
    char want[ECX_COMPAT_HASH_HEX + 1], a[1024], b[1024];
    assert_int_equal(ecx_compat_hash("0.34.0", 6, "m", 1, "torch.bfloat16", 14, BLOCK, want), 0);
    ecx_config c;
    const char *spellings[] = {"bfloat16", "bf16", "torch.bfloat16"};
    for (size_t i = 0; i < 3; i++) {
        base_config(&c, ECX_ROLE_PRODUCER);
        c.vllm_version = "0.34.0", c.model = "m", c.dtype = spellings[i];
        info_line(&c, a, sizeof a);
        assert_non_null(strstr(a, want));
        assert_non_null(strstr(a, "dtype=\"torch.bfloat16\""));
        /* 0.34 speaks version 2 unless told */
        assert_non_null(strstr(a, "protocol_version=\"2\""));
    }
    /* The defaults: a vLLM that exists (0.34.0), dtype in vLLM's spelling, the
     * version it speaks (2), one row of llava-1.5 per block (4096 x bf16). */
    ecx_config_init(&c);
    c.role = ECX_ROLE_PRODUCER, c.listen = "127.0.0.1:0", c.region_bytes = REGION;
    info_line(&c, b, sizeof b);
    assert_non_null(strstr(b, "vllm_version=\"0.34.0\""));
    assert_non_null(strstr(b, "dtype=\"torch.bfloat16\""));
    assert_non_null(strstr(b, "block_bytes=\"8192\""));
    assert_non_null(strstr(b, "protocol_version=\"2\""));
    /* A model name is escaped as a Prometheus label value. */
    c.model = "a\"b\\c\nd";
    info_line(&c, b, sizeof b);
    assert_non_null(strstr(b, "model=\"a\\\"b\\\\c\\nd\""));
    /* A contradictory explicit pair, and a dtype ecx does not know: refused. */
    base_config(&c, ECX_ROLE_CONSUMER);
    c.vllm_version = "0.34.0", c.connector_version = 1;
    assert_int_equal(try_new(&c), ECX_EINVAL);
    c.connector_version = 2;
    assert_int_equal(try_new(&c), 0);
    base_config(&c, ECX_ROLE_CONSUMER);
    c.dtype = "bfloat17";
    assert_int_equal(try_new(&c), ECX_EINVAL);
}

/* ---------- protocol versions ---------- */

static ecx_ctx *make_v(int role, int version)
{
    ecx_config c;
    base_config(&c, role);
    c.connector_version = version; /* explicit 2 with vLLM 0.31.0: the same hash */
    ecx_ctx *ctx = NULL;
    assert_int_equal(ecx_new(&c, &ctx), 0);
    return ctx;
}

/* Fetch h from json until it is no longer pending (10 s at most). */
static int fetch_json(ecx_ctx *c, const char *h, const char *json, int *reason)
{
    int st = ECX_FETCH_PENDING;
    double end = now_s() + 10;
    while (st == ECX_FETCH_PENDING && now_s() < end) {
        st = ecx_fetch(c, h, json, 0, reason);
        if (st == ECX_FETCH_PENDING) ecx_poll(c, 10);
    }
    return st;
}

/* A `both` context asked (by a stale announcement) for an item it does not
 * hold, from itself: its producer sees its own consumer's reservation as
 * absent and answers NACK_MISSING at once, instead of NOT_READY until the
 * item's wait (60 s) runs out. An item it holds is READY without asking. */
static void test_both_fetch_from_itself(void **state)
{
    (void)state;
    ecx_ctx *c = make(ECX_ROLE_BOTH);
    ecx_announcement an = {"127.0.0.1", ecx_listen_port(c), 1000};
    int reason = -1, st = ECX_FETCH_PENDING;
    double t0 = now_s();
    while (st == ECX_FETCH_PENDING && now_s() < t0 + 10) {
        st = ecx_fetch_from(c, "gone", &an, 0, &reason);
        if (st == ECX_FETCH_PENDING) ecx_poll(c, 10);
    }
    assert_int_equal(st, ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NACK_MISSING);
    uint8_t buf[1000];
    fill(buf, sizeof buf, 3);
    assert_int_equal(ecx_save(c, "here", buf, sizeof buf), 0);
    assert_int_equal(ecx_fetch_from(c, "here", &an, 0, &reason), ECX_FETCH_READY);
    ecx_free(c);
}

/* Version 2 (vLLM >= 0.32): the announcement's shape and whole blocks, the
 * consumer's checks of them, and what a peer of the other version sees. */
static void test_connector_versions(void **state)
{
    (void)state;
    g_thread = 1;
    ecx_ctx *p = make_v(ECX_ROLE_PRODUCER, 2), *c2 = make_v(ECX_ROLE_CONSUMER, 2);
    ecx_ctx *c1 = make_v(ECX_ROLE_CONSUMER, 1), *p1 = make_v(ECX_ROLE_PRODUCER, 1);
    size_t size = 3 * BLOCK;
    uint8_t *bytes = malloc(size), *back = malloc(size);
    fill(bytes, size, 7);
    assert_int_equal(ecx_save(p, "v2item", bytes, size), 0);
    assert_int_equal(ecx_save(p, "v2part", bytes, size - 1), ECX_EINVAL); /* whole rows only */
    assert_int_equal(ecx_save(p1, "v1item", bytes, size - 1), 0);
    char json[256], want[256], v1json[256];
    size_t len;
    assert_int_equal(ecx_announce(p, "v2item", json, sizeof json, &len), 0);
    snprintf(want, sizeof want,
             "{\"peer_host\":\"127.0.0.1\",\"peer_port\":%d,\"size_bytes\":%zu,"
             "\"shape\":[3,%u],\"metadata\":{}}",
             ecx_listen_port(p), size, BLOCK / 2); /* bfloat16: 2 bytes per element */
    assert_string_equal(json, want);
    int reason = -1;
    assert_int_equal(fetch_json(c2, "v2item", json, &reason), ECX_FETCH_READY);
    assert_int_equal(ecx_read(c2, "v2item", back, size), (int64_t)size);
    assert_memory_equal(back, bytes, size);
    /* A version-1 consumer asks the same bytes (the version is never on the
     * wire), so the version-2 producer serves it; it ignores the shape. */
    assert_int_equal(fetch_json(c1, "v2item", json, &reason), ECX_FETCH_READY);
    /* A version-1 announcement has no shape: a version-2 consumer refuses
     * it as vLLM 0.34 does (its size was unusable). */
    assert_int_equal(ecx_announce(p1, "v1item", v1json, sizeof v1json, &len), 0);
    assert_int_equal(fetch_json(c2, "v1item", v1json, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    /* The struct has no shape: whole blocks only. */
    ecx_announcement an = {"127.0.0.1", ecx_listen_port(p), size - 1};
    assert_int_equal(ecx_fetch_from(c2, "partial", &an, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_SIZE_MISMATCH);
    assert_int_equal(ecx_announce_info(p, "v2item", &an), 0);
    assert_int_equal(ecx_fetch_from(c2, "v2item", &an, 0, &reason), ECX_FETCH_READY);
    /* Shapes that do not fit size_bytes, or are not two integers. */
    struct {
        const char *shape;
        int why;
    } cases[] = {
        {"[4,32768]", ECX_REASON_SIZE_MISMATCH}, {"[3,32767]", ECX_REASON_NONE},
        {"[3,32769]", ECX_REASON_SIZE_MISMATCH}, {"[3]", ECX_REASON_INVALID},
        {"[3,\"32768\"]", ECX_REASON_INVALID},    {"[-3,32768]", ECX_REASON_INVALID},
        {"[3,32768,1]", ECX_REASON_INVALID},     {"null", ECX_REASON_INVALID},
        {"[9223372036854775807,9223372036854775807]", ECX_REASON_INVALID},
        {"[0,32768]", ECX_REASON_SIZE_MISMATCH}, {"[3,0]", ECX_REASON_SIZE_MISMATCH},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "shape%zu", i);
        snprintf(json, sizeof json,
                 "{\"peer_host\":\"127.0.0.1\",\"peer_port\":%d,\"size_bytes\":%zu,"
                 "\"shape\":%s,\"metadata\":{}}",
                 ecx_listen_port(p), size, cases[i].shape);
        reason = ECX_REASON_NONE;
        int st = ecx_fetch(c2, name, json, 0, &reason);
        if (cases[i].why == ECX_REASON_NONE)
            assert_int_equal(st, ECX_FETCH_PENDING); /* asked (the producer lacks it) */
        else if (st != ECX_FETCH_LOCAL || reason != cases[i].why)
            fail_msg("shape %s: state %d reason %s", cases[i].shape, st, ecx_reason_name(reason));
    }
    free(bytes);
    free(back);
    ecx_free(c1);
    ecx_free(c2);
    ecx_free(p1);
    ecx_free(p);
}

/* ---------- logger ---------- */

typedef struct captured {
    int lines, level;
    char last[1024];
} captured;

static void capture(void *arg, int level, const char *line)
{
    captured *c = arg;
    c->lines++;
    c->level = level;
    snprintf(c->last, sizeof c->last, "%s", line);
}

static void test_logger(void **state)
{
    (void)state;
    captured got = {0};
    ecx_set_logger(capture, &got);
    ecx_config c;
    base_config(&c, ECX_ROLE_CONSUMER);
    c.max_conn_pin_pct = 0;
    assert_int_equal(try_new(&c), ECX_EINVAL);
    assert_true(got.lines >= 1);
    assert_int_equal(got.level, ECX_LOG_ERROR);
    assert_non_null(strstr(got.last, "max_conn_pin_pct"));

    /* Above the level: not delivered. */
    int before = got.lines;
    ecx_set_log_level(ECX_LOG_ERROR - 1); /* clamps to ERROR */
    base_config(&c, ECX_ROLE_PRODUCER);
    c.advertise_host = "bad host!"; /* an ERROR line */
    assert_int_equal(try_new(&c), ECX_EINVAL);
    assert_true(got.lines > before);
    ecx_set_log_level(ECX_LOG_WARN);
    ecx_set_logger(NULL, NULL);
}

/* ecx_save_shape: a version-2 item announced with its own shape, wider than
 * a block (two blocks a row) or not whole blocks of elements (padding), checked
 * against the item's whole blocks; what is refused says so in the log. */
static void test_save_shape(void **state)
{
    (void)state;
    g_thread = 1;
    ecx_ctx *p = make_v(ECX_ROLE_PRODUCER, 2), *c2 = make_v(ECX_ROLE_CONSUMER, 2);
    ecx_ctx *p1 = make_v(ECX_ROLE_PRODUCER, 1);
    const uint64_t rows = 10, width = BLOCK; /* bfloat16: a row is two blocks */
    size_t size = rows * width * 2;
    uint8_t *bytes = malloc(size), *back = malloc(size);
    fill(bytes, size, 11);
    const ecx_segment *segs;
    size_t n;
    assert_int_equal(ecx_save_begin(p, "wide", size, &segs, &n), 0);
    assert_int_equal(ecx_save_shape(p, "wide", rows, width), 0); /* before the commit */
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(segs[i].ptr, bytes + off, segs[i].len);
        off += segs[i].len;
    }
    assert_int_equal(ecx_save_commit(p, "wide"), 0);
    char json[256], want[256];
    size_t len;
    assert_int_equal(ecx_announce(p, "wide", json, sizeof json, &len), 0);
    snprintf(want, sizeof want,
             "{\"peer_host\":\"127.0.0.1\",\"peer_port\":%d,\"size_bytes\":%zu,"
             "\"shape\":[10,%u],\"metadata\":{}}",
             ecx_listen_port(p), size, BLOCK);
    assert_string_equal(json, want);
    int reason = -1;
    assert_int_equal(fetch_json(c2, "wide", json, &reason), ECX_FETCH_READY);
    assert_int_equal(ecx_read(c2, "wide", back, size), (int64_t)size);
    assert_memory_equal(back, bytes, size);

    /* After the commit, and rows that end inside a block (zero padding). */
    memset(bytes, 0, BLOCK);
    fill(bytes, 3 * 1000 * 2, 5);
    assert_int_equal(ecx_save(p, "pad", bytes, BLOCK), 0);
    assert_int_equal(ecx_save_shape(p, "pad", 3, 1000), 0);
    assert_int_equal(ecx_announce(p, "pad", json, sizeof json, &len), 0);
    assert_non_null(strstr(json, "\"size_bytes\":65536,\"shape\":[3,1000],"));
    assert_int_equal(fetch_json(c2, "pad", json, &reason), ECX_FETCH_READY);
    assert_int_equal(ecx_read(c2, "pad", back, BLOCK), (int64_t)BLOCK);
    assert_memory_equal(back, bytes, BLOCK);

    /* Refused, with the numbers in the log; the shape recorded stays. */
    captured got = {0};
    ecx_set_logger(capture, &got);
    assert_int_equal(ecx_save_shape(p, "pad", 3, 20000), ECX_EINVAL); /* 2 blocks, not 1 */
    assert_non_null(strstr(got.last, "[3, 20000]"));
    assert_non_null(strstr(got.last, "131072"));
    assert_non_null(strstr(got.last, "65536"));
    got.lines = 0;
    assert_int_equal(ecx_save_shape(p, "pad", 0, 1000), ECX_EINVAL);
    assert_int_equal(ecx_save_shape(p, "pad", 3, 0), ECX_EINVAL);
    assert_int_equal(ecx_save_shape(p, "pad", UINT64_MAX, 2), ECX_EINVAL);
    assert_non_null(strstr(got.last, "overflows"));
    assert_int_equal(got.lines, 3);
    assert_int_equal(ecx_save_shape(p, "never", 3, 1000), ECX_ECACHE_MISSING);
    assert_int_equal(ecx_save_shape(c2, "pad", 3, 1000), ECX_EROLE);
    assert_int_equal(ecx_save_shape(p, NULL, 3, 1000), ECX_EINVAL);
    assert_int_equal(ecx_announce(p, "pad", json, sizeof json, &len), 0);
    assert_non_null(strstr(json, "\"shape\":[3,1000],"));
    /* Version 1 announces no shape. */
    assert_int_equal(ecx_save(p1, "v1", bytes, 1000), 0);
    got.lines = 0;
    assert_int_equal(ecx_save_shape(p1, "v1", 1, 500), ECX_EINVAL);
    assert_int_equal(got.lines, 1);
    assert_non_null(strstr(got.last, "connector_version 1"));
    ecx_set_logger(NULL, NULL);

    /* A new save of the key starts from the derived shape. */
    assert_int_equal(ecx_save_begin(p, "again", BLOCK, &segs, &n), 0);
    assert_int_equal(ecx_save_shape(p, "again", 1, 100), 0);
    assert_int_equal(ecx_save_abort(p, "again"), 0);
    assert_int_equal(ecx_save(p, "again", bytes, BLOCK), 0);
    assert_int_equal(ecx_announce(p, "again", json, sizeof json, &len), 0);
    snprintf(want, sizeof want, "\"shape\":[1,%u],", BLOCK / 2);
    assert_non_null(strstr(json, want));
    free(bytes);
    free(back);
    ecx_free(p1);
    ecx_free(c2);
    ecx_free(p);
}

/* ---------- region layout, segments, lengths ---------- */

static void test_region_and_segments(void **state)
{
    (void)state;
    ecx_ctx *p = make(ECX_ROLE_PRODUCER);
    ecx_region_layout r;
    assert_int_equal(ecx_region_info(p, &r), 0);
    assert_non_null(r.base);
    assert_int_equal(r.block_bytes, BLOCK);
    assert_int_equal(r.num_blocks, REGION / BLOCK);
    assert_int_equal(r.size_bytes, r.num_blocks * r.block_bytes);
    struct stat st;
    assert_int_equal(stat(r.path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, r.size_bytes);

    /* Fragment the free space: holes of one block between held items. */
    char h[32];
    for (int i = 0; i < 8; i++) {
        snprintf(h, sizeof h, "frag-%d", i);
        uint8_t b[100];
        fill(b, sizeof b, (unsigned)i);
        assert_int_equal(ecx_save(p, h, b, sizeof b), 0);
    }
    const ecx_segment *segs;
    size_t n;
    for (int i = 0; i < 8; i += 2) { /* begun and aborted: their blocks are free again */
        snprintf(h, sizeof h, "hole-%d", i);
        assert_int_equal(ecx_save_begin(p, h, 3 * BLOCK + 5, &segs, &n), 0);
        assert_int_equal(ecx_save_abort(p, h), 0);
        assert_int_equal(ecx_save_abort(p, h), ECX_ECACHE_MISSING);
    }
    /* A save's list: in order, inside the region, summing to the size. */
    uint64_t size = 5 * BLOCK + 1234;
    assert_int_equal(ecx_save_begin(p, "item", size, &segs, &n), 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(segs[i].ptr >= r.base);
        assert_true(segs[i].ptr + segs[i].len <= r.base + r.size_bytes);
        fill(segs[i].ptr, segs[i].len, (unsigned)(1000 + sum));
        sum += segs[i].len;
    }
    assert_int_equal(sum, size);
    assert_int_equal(ecx_save_begin(p, "item", size, &segs, &n), ECX_ECACHE_EXISTS);
    assert_int_equal(ecx_save_commit(p, "item"), 0);
    assert_int_equal(ecx_save_commit(p, "item"), ECX_ECACHE_STATE);
    assert_int_equal(ecx_save_abort(p, "item"), ECX_ECACHE_STATE);

    /* Nested loads share one list, valid until the last release. */
    const ecx_segment *a, *b;
    size_t na, nb;
    uint64_t sa, sb;
    assert_int_equal(ecx_load(p, "item", &a, &na, &sa), 0);
    assert_int_equal(ecx_load(p, "item", &b, &nb, &sb), 0);
    assert_int_equal(sa, size);
    assert_int_equal(na, nb);
    assert_int_equal(ecx_release(p, "item"), 0);
    uint64_t off = 0; /* still readable after the first release */
    for (size_t i = 0; i < nb; i++) {
        uint8_t *want = malloc(b[i].len);
        fill(want, b[i].len, (unsigned)(1000 + off));
        assert_memory_equal(b[i].ptr, want, b[i].len);
        free(want);
        off += b[i].len;
    }
    assert_int_equal(ecx_release(p, "item"), 0);
    assert_int_not_equal(ecx_release(p, "item"), 0); /* not pinned any more */

    /* ecx_read: ERANGE leaves nothing held. */
    uint8_t small[10];
    assert_int_equal(ecx_read(p, "item", small, sizeof small), ECX_ERANGE);
    assert_int_equal(ecx_release(p, "item"), ECX_ECACHE_STATE);

    /* Lengths on ERANGE. */
    char buf[8];
    size_t len = 0;
    assert_int_equal(ecx_announce(p, "item", buf, sizeof buf, &len), ECX_ERANGE);
    assert_true(len > sizeof buf);
    char *big = malloc(len + 1);
    size_t len2 = 0;
    assert_int_equal(ecx_announce(p, "item", big, len + 1, &len2), 0);
    assert_int_equal(len2, len);
    assert_int_equal(strlen(big), len);
    assert_non_null(strstr(big, "\"size_bytes\":"));
    free(big);
    assert_int_equal(ecx_announce(p, "absent", buf, sizeof buf, &len), ECX_ERANGE);
    assert_int_equal(len, strlen("{\"metadata\":{}}"));

    /* The length ERANGE reports is enough for the next call while nothing
     * changes: first let the region's background fault-in end (its
     * ecx_region_backed_bytes grows, and with it the text; under ASan that
     * took longer than the calls above). */
    bench_wait_backed(p, 60);
    len = 0;
    assert_int_equal(ecx_metrics(p, buf, sizeof buf, &len), ECX_ERANGE);
    assert_string_equal(buf, "");
    assert_true(len > 1000);
    char *m = malloc(len + 1);
    assert_int_equal(ecx_metrics(p, m, len + 1, &len2), 0);
    assert_int_equal(len2, len);
    assert_non_null(strstr(m, "ecx_producer_requests_total"));
    free(m);

    /* One mm_hash limit. */
    char longest[ECX_MM_HASH_MAX + 2];
    memset(longest, 'h', sizeof longest);
    longest[ECX_MM_HASH_MAX] = '\0';
    assert_int_equal(ecx_save(p, longest, "x", 1), 0);
    longest[ECX_MM_HASH_MAX] = 'h', longest[ECX_MM_HASH_MAX + 1] = '\0';
    assert_int_equal(ecx_save(p, longest, "x", 1), ECX_EINVAL);
    assert_int_equal(ecx_save(p, "caf\xc3", "x", 1), ECX_EUTF8); /* cut inside a code point */

    /* Role errors. */
    int reason;
    assert_int_equal(ecx_fetch(p, "item", NULL, 0, &reason), ECX_EROLE);
    ecx_ctx *c = make(ECX_ROLE_CONSUMER);
    assert_int_equal(ecx_listen_port(c), ECX_EROLE);
    assert_int_equal(ecx_save(c, "x", "x", 1), ECX_EROLE);
    ecx_announcement an;
    assert_int_equal(ecx_announce_info(c, "x", &an), ECX_EROLE);
    ecx_free(c);
    ecx_free(p);
}

/* ---------- the JSON-free fetch, driven from a foreign event loop ---------- */

static void test_foreign_loop(void **state)
{
    g_thread = *state ? 1 : 0;
    ecx_ctx *p = make(ECX_ROLE_PRODUCER), *c = make(ECX_ROLE_CONSUMER);
    assert_int_equal(ecx_next_timeout(c), ECX_NO_TIMEOUT); /* nothing pending */
    size_t size = 700000;
    uint8_t *bytes = malloc(size), *back = malloc(size);
    fill(bytes, size, 42);
    assert_int_equal(ecx_save(p, "foreign", bytes, size), 0);
    ecx_announcement an;
    assert_int_equal(ecx_announce_info(p, "foreign", &an), 0);
    assert_int_equal(an.peer_port, ecx_listen_port(p));
    assert_int_equal(an.size_bytes, size);
    assert_int_equal(ecx_announce_info(p, "absent", &an), ECX_ECACHE_MISSING);
    assert_int_equal(ecx_announce_info(p, "foreign", &an), 0);

    int reason = -1;
    assert_int_equal(ecx_fetch_from(c, "foreign", &an, size, &reason), ECX_FETCH_PENDING);
    /* The engine's own loop: poll() on both fds for the shorter timeout,
     * then ecx_poll(ctx, 0) on each. Bounded: 10 s. */
    int st = ECX_FETCH_PENDING, wakes = 0;
    double end = now_s() + 10;
    while (st == ECX_FETCH_PENDING && now_s() < end) {
        int tp = ecx_next_timeout(p), tc = ecx_next_timeout(c);
        int t = tp < tc ? tp : tc;
        if (t < 0 || t > 100) t = 100;
        struct pollfd fds[2] = {{ecx_fd(p), POLLIN, 0}, {ecx_fd(c), POLLIN, 0}};
        if (poll(fds, 2, t) > 0) wakes++;
        ecx_poll(p, 0);
        ecx_poll(c, 0);
        st = ecx_fetch_from(c, "foreign", &an, size, &reason);
    }
    assert_int_equal(st, ECX_FETCH_READY);
    assert_true(wakes > 0); /* the fds did signal */
    assert_int_equal(ecx_read(c, "foreign", back, size), (int64_t)size);
    assert_memory_equal(back, bytes, size);

    /* Not announced, and an unusable port: local, with reasons. */
    assert_int_equal(ecx_fetch_from(c, "nobody", NULL, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NO_PEER);
    ecx_announcement bad = {"127.0.0.1", 70000, 10};
    assert_int_equal(ecx_fetch_from(c, "badport", &bad, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    free(bytes);
    free(back);
    ecx_free(c);
    ecx_free(p);
}

/* ---------- threads: one waits in ecx_poll, others fetch and save ---------- */

typedef struct poller {
    ecx_ctx *ctx;
    atomic_int stop;
    atomic_long polls;
} poller;

static void *poll_loop(void *arg)
{
    poller *pl = arg;
    while (!atomic_load(&pl->stop)) {
        ecx_poll(pl->ctx, 50);
        atomic_fetch_add(&pl->polls, 1);
    }
    return NULL;
}

#define N_THREADED 24

static void test_threads(void **state)
{
    g_thread = *state ? 1 : 0;
    ecx_ctx *p = make(ECX_ROLE_PRODUCER), *c = make(ECX_ROLE_CONSUMER);
    poller pp = {p, 0, 0}, pc = {c, 0, 0};
    pthread_t tp, tc;
    assert_int_equal(pthread_create(&tp, NULL, poll_loop, &pp), 0);
    assert_int_equal(pthread_create(&tc, NULL, poll_loop, &pc), 0);
    /* Saves race the producer's poller; fetches race the consumer's. */
    size_t size = 200000;
    uint8_t *bytes = malloc(size), *back = malloc(size);
    char h[32];
    for (int i = 0; i < N_THREADED; i++) {
        snprintf(h, sizeof h, "thr-%d", i);
        fill(bytes, size, (unsigned)i);
        assert_int_equal(ecx_save(p, h, bytes, size), 0);
    }
    ecx_announcement an;
    assert_int_equal(ecx_announce_info(p, "thr-0", &an), 0);
    int ready = 0, reason;
    double end = now_s() + 20;
    int state_of[N_THREADED];
    for (int i = 0; i < N_THREADED; i++) state_of[i] = ECX_FETCH_PENDING;
    while (ready < N_THREADED && now_s() < end) {
        for (int i = 0; i < N_THREADED; i++) {
            if (state_of[i] != ECX_FETCH_PENDING) continue;
            snprintf(h, sizeof h, "thr-%d", i);
            state_of[i] = ecx_fetch_from(c, h, &an, size, &reason);
            if (state_of[i] == ECX_FETCH_LOCAL) fail_msg("%s: %s", h, ecx_reason_name(reason));
            if (state_of[i] == ECX_FETCH_READY) ready++;
        }
        usleep(1000); /* the engine's step; no ecx_poll on this thread */
    }
    assert_int_equal(ready, N_THREADED);
    for (int i = 0; i < N_THREADED; i++) {
        snprintf(h, sizeof h, "thr-%d", i);
        fill(bytes, size, (unsigned)i);
        assert_int_equal(ecx_read(c, h, back, size), (int64_t)size);
        assert_memory_equal(back, bytes, size);
    }
    atomic_store(&pp.stop, 1);
    atomic_store(&pc.stop, 1);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    assert_true(atomic_load(&pc.polls) > 0);
    free(bytes);
    free(back);
    ecx_free(c);
    ecx_free(p);
}

/* ---------- the progress thread ---------- */

/* The engine never calls ecx_poll on either side: the threads do it all. */
static void test_engine_never_polls(void **state)
{
    (void)state;
    g_thread = 1;
    ecx_ctx *p = make(ECX_ROLE_PRODUCER), *c = make(ECX_ROLE_CONSUMER);
    size_t size = 3u << 20;
    uint8_t *bytes = malloc(size), *back = malloc(size);
    fill(bytes, size, 7);
    assert_int_equal(ecx_save(p, "idle-engine", bytes, size), 0);
    ecx_announcement an;
    assert_int_equal(ecx_announce_info(p, "idle-engine", &an), 0);
    int reason, st = ecx_fetch_from(c, "idle-engine", &an, size, &reason);
    double end = now_s() + 10;
    while (st == ECX_FETCH_PENDING && now_s() < end) {
        usleep(20000); /* a slow engine step: 20 ms, no ecx_poll */
        st = ecx_fetch_from(c, "idle-engine", &an, size, &reason);
    }
    assert_int_equal(st, ECX_FETCH_READY);
    assert_int_equal(ecx_read(c, "idle-engine", back, size), (int64_t)size);
    assert_memory_equal(back, bytes, size);
    /* What the thread did is reported to the engine's poll. */
    assert_true(ecx_poll(c, 0) > 0);
    assert_int_equal(ecx_poll(c, 0), 0);
    assert_int_equal(ecx_next_timeout(c), ECX_NO_TIMEOUT);
    free(bytes);
    free(back);
    ecx_free(c);
    ecx_free(p);
}

/* Contexts freed with transfers in flight, over and over: the thread stops,
 * nothing leaks (ASan), nothing hangs. */
static void test_thread_start_stop(void **state)
{
    (void)state;
    g_thread = 1;
    ecx_ctx *p = make(ECX_ROLE_PRODUCER);
    size_t size = 1u << 20;
    uint8_t *bytes = malloc(size);
    fill(bytes, size, 9);
    char h[32];
    for (int i = 0; i < 12; i++) {
        snprintf(h, sizeof h, "inflight-%d", i);
        assert_int_equal(ecx_save(p, h, bytes, size), 0);
    }
    ecx_announcement an;
    assert_int_equal(ecx_announce_info(p, "inflight-0", &an), 0);
    for (int round = 0; round < 12; round++) {
        g_thread = round % 2; /* both modes free cleanly */
        ecx_ctx *c = make(ECX_ROLE_CONSUMER);
        int reason;
        for (int i = 0; i <= round; i++) {
            snprintf(h, sizeof h, "inflight-%d", i);
            int st = ecx_fetch_from(c, h, &an, size, &reason);
            assert_true(st == ECX_FETCH_PENDING || st == ECX_FETCH_READY);
        }
        usleep((useconds_t)(round * 300));
        ecx_free(c);
    }
    g_thread = 1;
    free(bytes);
    ecx_free(p);
}

/* Sessions closed when idle and replaced by sessions to new producers, in
 * both modes: every fetch still completes, well before the ack deadline.
 * (A new socket may reuse a closed one's descriptor number; loop.c
 * re-registers them all when sessions change. A missed registration would
 * not show here as a failure: the inflow guard's 20 ms timer wakes the
 * waiter anyway, so it would cost latency, not the fetch.) */
static void test_session_replaced(void **state)
{
    g_thread = *state ? 1 : 0;
    ecx_config cc;
    base_config(&cc, ECX_ROLE_CONSUMER);
    cc.session_idle_ms = 50;
    ecx_ctx *c;
    assert_int_equal(ecx_new(&cc, &c), 0);
    poller pc = {c, 0, 0};
    pthread_t tc;
    if (!g_thread) assert_int_equal(pthread_create(&tc, NULL, poll_loop, &pc), 0);
    uint8_t bytes[4096], back[4096];
    char h[32];
    for (int round = 0; round < 6; round++) {
        ecx_ctx *p = make(ECX_ROLE_PRODUCER); /* a new producer each round */
        snprintf(h, sizeof h, "replaced-%d", round);
        fill(bytes, sizeof bytes, (unsigned)round);
        assert_int_equal(ecx_save(p, h, bytes, sizeof bytes), 0);
        poller pp = {p, 0, 0};
        pthread_t tp;
        assert_int_equal(pthread_create(&tp, NULL, poll_loop, &pp), 0);
        ecx_announcement an;
        assert_int_equal(ecx_announce_info(p, h, &an), 0);
        int reason, st = ecx_fetch_from(c, h, &an, sizeof bytes, &reason);
        double t0 = now_s();
        while (st == ECX_FETCH_PENDING && now_s() < t0 + 10) {
            usleep(1000);
            st = ecx_fetch_from(c, h, &an, sizeof bytes, &reason);
        }
        if (st == ECX_FETCH_LOCAL) fail_msg("round %d: %s", round, ecx_reason_name(reason));
        assert_int_equal(st, ECX_FETCH_READY);
        assert_true(now_s() - t0 < 1.5); /* not at the 3 s ack deadline */
        assert_int_equal(ecx_read(c, h, back, sizeof back), (int64_t)sizeof back);
        assert_memory_equal(back, bytes, sizeof bytes);
        atomic_store(&pp.stop, 1);
        pthread_join(tp, NULL);
        ecx_free(p);
        usleep(200000); /* the session goes idle and is closed */
    }
    if (!g_thread) {
        atomic_store(&pc.stop, 1);
        pthread_join(tc, NULL);
    }
    ecx_free(c);
}

/* ---------- the public wire codec ---------- */

static void test_wire_codec(void **state)
{
    (void)state;
    ecx_req r;
    ecx_req_init(&r);
    r.mm_hash = (ecx_span){"abc", 3};
    r.compatibility_hash = (ecx_span){"0123", 4};
    r.session_id = (ecx_span){"s-1", 3};
    uint8_t buf[256];
    size_t len = 0;
    assert_int_equal(ecx_wire_encode_req(&r, buf, 4, &len), ECX_ERANGE);
    assert_true(len > 4);
    size_t need = len;
    assert_int_equal(ecx_wire_encode_req(&r, buf, sizeof buf, &len), 0);
    assert_int_equal(len, need);
    ecx_req d;
    assert_int_equal(ecx_wire_decode_req(buf, len, &d), 0);
    assert_int_equal(d.mm_hash.n, 3);
    assert_memory_equal(d.mm_hash.p, "abc", 3);
    assert_int_equal(d.connector_version, ECX_CONNECTOR_VERSION);

    ecx_ack a;
    ecx_ack_init(&a);
    int64_t idx[] = {3, 1, 200};
    a.mm_hash = (ecx_span){"abc", 3};
    a.status = ECX_STATUS_OK;
    a.n_indices = 3, a.indices = idx;
    assert_int_equal(ecx_wire_encode_ack(&a, buf, sizeof buf, &len), 0);
    ecx_ack da;
    assert_int_equal(ecx_wire_decode_ack(buf, len, &da), 0);
    int64_t got[3];
    assert_int_equal(ecx_wire_ack_indices(&da, got, 3), 3);
    assert_memory_equal(got, idx, sizeof idx);
    a.status = 9;
    assert_int_equal(ecx_wire_encode_ack(&a, buf, sizeof buf, &len), ECX_EINVAL);
    assert_int_equal(ecx_wire_decode_ack(buf, 0, &da), ECX_EWIRE_EMPTY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_and_names),
        cmocka_unit_test(test_config_growth),
        cmocka_unit_test(test_factors),
        cmocka_unit_test(test_both_fetch_from_itself),
        cmocka_unit_test(test_connector_versions),
        cmocka_unit_test(test_logger),
        cmocka_unit_test(test_save_shape),
        cmocka_unit_test(test_region_and_segments),
        cmocka_unit_test_prestate(test_foreign_loop, NULL),
        cmocka_unit_test_prestate(test_foreign_loop, (void *)1),
        cmocka_unit_test_prestate(test_threads, NULL),
        cmocka_unit_test_prestate(test_threads, (void *)1),
        cmocka_unit_test(test_engine_never_polls),
        cmocka_unit_test_prestate(test_session_replaced, NULL),
        cmocka_unit_test_prestate(test_session_replaced, (void *)1),
        cmocka_unit_test(test_thread_start_stop),
        cmocka_unit_test(test_wire_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
