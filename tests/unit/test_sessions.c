/* SPDX-License-Identifier: Apache-2.0 */
/* test_sessions — producer and consumer sessions driven through every
 * transition of docs/PROTOCOL.md §4–§5, in one process: real ZeroMQ sockets on
 * loopback, real regions in a private /dev/shm directory, the real
 * same-host data path, and a fake clock for the timeouts. Faults the real
 * data path cannot produce on demand (a READ that fails or never ends) come
 * from the fault backend (tests/support/data_fault.c); misbehaving producers are raw
 * ROUTER sockets scripted here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "announce.h"
#include "checksum.h"
#include "consumer.h"
#include "data_fault.h"
#include "data_impl.h"
#include "grant_stub.h"
#ifdef ECX_WITH_NIXL
#include "nixl_agent.h"
#endif
#include "producer.h"
#include "region.h"
#include "session_id.h"
#include "wire.h"

#define BLOCK 4096
#define BLOCKS 64

static int64_t fake_now = 1000000;
static int64_t fake_clock(void *arg)
{
    (void)arg;
    return fake_now;
}
static const ecxi_clock CLOCK = {fake_clock, NULL};

typedef struct side {
    ecxi_region *region;
    ecxi_cache *cache;
    ecxi_data *data;
} side;

typedef struct world {
    void *zctx;
    char dir[64];
    side P, C;
    ecxi_ctrl_server *srv;
    ecxi_producer *prod;
    ecxi_consumer *cons;
    char compat[ECX_COMPAT_HASH_HEX + 1];
    int port;
} world;

/* ecxi_consumer_fetch() with the announcement as ecx.h's struct; host NULL
 * and size 0: not announced at all. */
static int fetch_from(world *w, const char *hash, size_t hash_len, const char *host, int port,
                      uint64_t size, uint64_t expected, int *reason)
{
    ecx_announcement a = {host, port, size};
    return ecxi_consumer_fetch(w->cons, hash, hash_len, NULL, host || size ? &a : NULL, expected,
                               reason);
}

static double real_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The producer's data path for the next world_new() (0: shm). */
static int next_prod_backend;

static void side_init(world *w, side *s, const char *name, bool producer)
{
    assert_int_equal(ecxi_region_create_in(w->dir, name, 0, BLOCK * BLOCKS, BLOCK, &s->region), 0);
    ecxi_cache_opts co = {.num_blocks = BLOCKS};
    assert_int_equal(ecxi_cache_new(&co, &s->cache), 0);
    ecxi_data_opts d = {.backend = ECX_DATA_SHM};
    if (producer && next_prod_backend) d = (ecxi_data_opts){next_prod_backend, "127.0.0.1", false};
    if (producer) {
        assert_int_equal(ecxi_data_new_producer(s->region, &d, &s->data), 0);
    } else {
        ecxi_data *inner;
        assert_int_equal(ecxi_data_new_consumer(s->region, &d, &inner), 0);
        assert_int_equal(ecxi_data_fault_wrap(inner, &s->data), 0);
    }
}

static void side_fini(side *s)
{
    ecxi_data_free(s->data);
    ecxi_cache_free(s->cache);
    ecxi_region_free(s->region);
}

/* The producer's pin lease for the next world_new() (0: the default). */
static int64_t next_lease_ms;
/* The consumer's session cap and idle timeout for the next world_new()
 * (0: the defaults); world_new_sessions() sets them. */
static int next_max_sessions;
static int64_t next_session_idle_ms;
/* The producer's grant limits for the next world_new() (0: the defaults,
 * except the pin share: 100%, since these tests fetch items up to 3/4 of
 * the region one after another, and a completion may still be in flight
 * when the next request comes). */
static uint32_t next_max_grants, next_conn_grants, next_pin_pct, next_total_pin_pct;
/* Both sides' protocol version for the next world_new() (0: 1). */
static int next_version;

/* A producer and a consumer; the consumer's compat hash may differ. */
static world *world_new(const char *consumer_compat)
{
    world *w = calloc(1, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "/dev/shm/ecx-test-XXXXXX");
    assert_non_null(mkdtemp(w->dir));
    w->zctx = zmq_ctx_new();
    assert_int_equal(ecx_compat_hash("v", 1, "m", 1, "bf16", 4, BLOCK, w->compat), 0);
    side_init(w, &w->P, "prod", true);
    side_init(w, &w->C, "cons", false);
    assert_int_equal(ecxi_ctrl_server_new(w->zctx, "127.0.0.1", 0, NULL, &w->srv), 0);
    w->port = ecxi_ctrl_server_port(w->srv);
    ecxi_producer_opts po = {.compat_hash = w->compat,
                            .block_bytes = BLOCK,
                            .lease_ms = next_lease_ms,
                            .max_grants = next_max_grants,
                            .max_conn_grants = next_conn_grants,
                            .max_conn_pin_pct = next_pin_pct ? next_pin_pct : 100,
                            .max_pin_pct = next_total_pin_pct ? next_total_pin_pct : 100,
                            .clock = &CLOCK,
                            .connector_version = next_version};
    assert_int_equal(ecxi_producer_new(w->P.cache, w->P.data, w->srv, &po, &w->prod), 0);
    ecxi_consumer_opts co = {.zctx = w->zctx,
                            .compat_hash = consumer_compat ? consumer_compat : w->compat,
                            .block_bytes = BLOCK,
                            .max_sessions = next_max_sessions,
                            .session_idle_ms = next_session_idle_ms,
                            .clock = &CLOCK,
                            .connector_version = next_version,
                            .elem_size = next_version == 2 ? 2 : 0};
    assert_int_equal(ecxi_consumer_new(w->C.cache, w->C.data, &co, &w->cons), 0);
    return w;
}

/* A world whose consumer has the given session cap and idle timeout. */
static world *world_new_sessions(int max_sessions, int64_t idle_ms)
{
    next_max_sessions = max_sessions;
    next_session_idle_ms = idle_ms;
    world *w = world_new(NULL);
    next_max_sessions = 0;
    next_session_idle_ms = 0;
    return w;
}

static void world_free(world *w)
{
    ecxi_consumer_free(w->cons);
    ecxi_producer_free(w->prod);
    ecxi_ctrl_server_free(w->srv);
    side_fini(&w->C);
    side_fini(&w->P);
    zmq_ctx_term(w->zctx);
    rmdir(w->dir);
    free(w);
}

static void pump(world *w)
{
    if (w->prod) ecxi_producer_poll(w->prod);
    ecxi_consumer_poll(w->cons);
    usleep(500);
}

static uint8_t pattern(const char *hash, size_t i) { return (uint8_t)(hash[0] * 7 + i * 31 + i / 4096); }

/* Mark a saved item ready, with its checksum, as ecx_save_commit does. */
static void commit(world *w, const char *hash)
{
    size_t hl = strlen(hash), n;
    int64_t idx[BLOCKS];
    uint64_t blocks[BLOCKS];
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(w->P.cache, hash, hl, &info), 0);
    assert_int_equal(ecxi_cache_blocks(w->P.cache, hash, hl, idx, BLOCKS, &n), 0);
    for (size_t i = 0; i < n; i++) blocks[i] = (uint64_t)idx[i];
    uint64_t sum = ecxi_checksum_blocks(ecxi_region_base(w->P.region), BLOCK, blocks, n,
                                       info.size_bytes);
    assert_int_equal(ecxi_cache_set_checksum(w->P.cache, hash, hl, sum), 0);
    assert_int_equal(ecxi_cache_mark_ready(w->P.cache, hash, hl), 0);
}

/* Save an item on the producer: reserve, write, and (if ready) commit. */
static void save(world *w, const char *hash, size_t size, bool ready)
{
    size_t hl = strlen(hash), nb = (size + BLOCK - 1) / BLOCK, n;
    assert_int_equal(ecxi_cache_reserve(w->P.cache, hash, hl, nb), 0);
    assert_int_equal(ecxi_cache_set_size(w->P.cache, hash, hl, size), 0);
    int64_t idx[BLOCKS];
    assert_int_equal(ecxi_cache_blocks(w->P.cache, hash, hl, idx, BLOCKS, &n), 0);
    uint8_t *base = ecxi_region_base(w->P.region);
    for (size_t i = 0; i < size; i++) base[idx[i / BLOCK] * BLOCK + i % BLOCK] = pattern(hash, i);
    if (ready) commit(w, hash);
}

static bool consumer_has(world *w, const char *hash, size_t size)
{
    size_t hl = strlen(hash), n;
    int64_t idx[BLOCKS];
    if (ecxi_cache_blocks(w->C.cache, hash, hl, idx, BLOCKS, &n)) return false;
    const uint8_t *base = ecxi_region_base(w->C.region);
    for (size_t i = 0; i < size; i++)
        if (base[idx[i / BLOCK] * BLOCK + i % BLOCK] != pattern(hash, i)) return false;
    return true;
}

/* Fetch until the answer is not PENDING (bounded: 10 s of real time).
 * Fake time flows 1 ms per step, so backoffs and deadlines come due. */
static int fetch_wait(world *w, const char *hash, size_t size, int port, int *reason)
{
    double end = real_s() + 10;
    int st;
    while ((st = fetch_from(w, hash, strlen(hash), "127.0.0.1", port, size, 0, reason)) ==
               ECX_FETCH_PENDING &&
           real_s() < end) {
        pump(w);
        fake_now += 1;
    }
    return st;
}

static uint64_t free_blocks(ecxi_cache *c)
{
    ecxi_cache_stats st;
    ecxi_cache_get_stats(c, &st);
    return st.free_blocks;
}

/* ---------- happy paths ---------- */

static void test_fetch_sizes(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    static char longest[ECX_MM_HASH_MAX + 1]; /* the longest mm_hash */
    memset(longest, 'z', ECX_MM_HASH_MAX);
    const char *names[] = {"one-byte", "one-block", "many-blocks", "largest", longest};
    size_t sizes[] = {1, BLOCK, 10 * BLOCK + 17, (BLOCKS - 16) * BLOCK, 3 * BLOCK + 1};
    for (int i = 0; i < 5; i++) {
        save(w, names[i], sizes[i], true);
        int reason;
        assert_int_equal(fetch_wait(w, names[i], sizes[i], w->port, &reason), ECX_FETCH_READY);
        assert_true(consumer_has(w, names[i], sizes[i]));
        /* A second ask is answered from the local cache. */
        assert_int_equal(fetch_from(w, names[i], strlen(names[i]), NULL, 0, 0, 0, &reason),
                         ECX_FETCH_READY);
    }
    for (int i = 0; i < 50 && ecxi_producer_get_stats(w->prod).active_grants; i++) pump(w);
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.grants, 5);
    assert_int_equal(ps.completions, 5);
    assert_int_equal(ps.active_grants, 0);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "largest", 7, &info), 0);
    assert_int_equal(info.pins, 0); /* the notification unpinned it */
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.ready, 5);
    assert_int_equal(cs.in_flight, 0);
    world_free(w);
}

/* Non-contiguous source blocks: fragment the producer's free space first. */
static void test_fetch_fragmented(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    char name[16];
    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof name, "fill%d", i);
        save(w, name, 8 * BLOCK, true);
    }
    for (int i = 0; i < 8; i += 2) { /* pin the odd ones, evict the even ones */
        snprintf(name, sizeof name, "fill%d", i + 1);
        assert_int_equal(ecxi_cache_pin(w->P.cache, name, strlen(name)), 0);
    }
    save(w, "scattered", 20 * BLOCK, true); /* evicts fill0, 2, 4: three runs */
    ecxi_cache_run runs[8];
    size_t n_runs;
    assert_int_equal(ecxi_cache_runs(w->P.cache, "scattered", 9, runs, 8, &n_runs), 0);
    assert_true(n_runs >= 3);
    int reason;
    assert_int_equal(fetch_wait(w, "scattered", 20 * BLOCK, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "scattered", 20 * BLOCK));
    world_free(w);
}

/* ---------- NACKs ---------- */

static void test_nack_missing(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    int reason;
    assert_int_equal(fetch_wait(w, "absent", 100, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NACK_MISSING);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS); /* blocks came back */
    assert_int_equal(ecxi_producer_get_stats(w->prod).nacks[ECX_STATUS_NACK_MISSING], 1);
    /* The tombstone was consumed: asking again sends a new request. */
    assert_int_equal(fetch_wait(w, "absent", 100, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).requests, 2);
    world_free(w);
}

static void test_nack_incompat(void **state)
{
    (void)state;
    world *w = world_new("0000000000000000000000000000000000000000000000000000000000000000");
    save(w, "item", 100, true);
    int reason;
    assert_int_equal(fetch_wait(w, "item", 100, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NACK_INCOMPAT);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    world_free(w);
}

static void test_not_ready_then_ready(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "slow", 3 * BLOCK, false);
    int reason;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(fetch_from(w, "slow", 4, "127.0.0.1", w->port, 3 * BLOCK, 0,
                                    &reason),
                         ECX_FETCH_PENDING);
        pump(w);
        fake_now += 5;
    }
    assert_true(ecxi_consumer_get_stats(w->cons).retries >= 2);
    assert_true(ecxi_producer_get_stats(w->prod).nacks[ECX_STATUS_NACK_NOT_READY] >= 2);
    commit(w, "slow");
    assert_int_equal(fetch_wait(w, "slow", 3 * BLOCK, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "slow", 3 * BLOCK));
    world_free(w);
}

static void test_not_ready_timeout(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "never", 100, false);
    int reason, st = ECX_FETCH_PENDING;
    for (int i = 0; i < 2000 && st == ECX_FETCH_PENDING; i++) {
        st = fetch_from(w, "never", 5, "127.0.0.1", w->port, 100, 0, &reason);
        pump(w);
        fake_now += 100; /* 60 s pass in 600 steps */
    }
    assert_int_equal(st, ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NOT_READY_TIMEOUT);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    world_free(w);
}

/* ---------- the producer against raw requests ---------- */

typedef struct raw {
    void *sock;
} raw;

static raw raw_dealer(world *w)
{
    raw r = {zmq_socket(w->zctx, ZMQ_DEALER)};
    int zero = 0;
    zmq_setsockopt(r.sock, ZMQ_LINGER, &zero, sizeof zero);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", w->port);
    assert_int_equal(zmq_connect(r.sock, ep), 0);
    return r;
}

/* A request as a peer of protocol version enc encodes it. */
static void raw_send_req_v(raw *r, const char *hash, const char *compat, const char *sid,
                           int64_t version, int enc)
{
    ecx_req q;
    ecx_req_init(&q);
    q.mm_hash = (ecx_span){hash, strlen(hash)};
    q.compatibility_hash = (ecx_span){compat, strlen(compat)};
    q.session_id = (ecx_span){sid, strlen(sid)};
    q.connector_version = version;
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    assert_int_equal(ecxi_wire_encode_req(&q, enc, &b), 0);
    zmq_send(r->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(r->sock, b.data, b.size, 0);
    msgpack_sbuffer_destroy(&b);
}

static void raw_send_req(raw *r, const char *hash, const char *compat, const char *sid,
                         int64_t version)
{
    raw_send_req_v(r, hash, compat, sid, version, ECX_CONNECTOR_VERSION);
}

/* Wait for one reply; returns its payload length (0 if none in 2 s). */
static size_t raw_recv(world *w, raw *r, uint8_t *buf, size_t cap)
{
    double end = real_s() + 2;
    while (real_s() < end) {
        ecxi_producer_poll(w->prod);
        char empty[8];
        if (zmq_recv(r->sock, empty, sizeof empty, ZMQ_DONTWAIT) >= 0) {
            int n = zmq_recv(r->sock, buf, cap, 0);
            return n > 0 ? (size_t)n : 0;
        }
        usleep(1000);
    }
    return 0;
}

static void test_producer_checks_in_order(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 100, true);
    save(w, "pending", 100, false);
    /* The longest mm_hash is held and served; one byte more is not held
     * (NACK_MISSING), even where its first ECX_MM_HASH_MAX bytes are. */
    static char longest[ECX_MM_HASH_MAX + 1], too_long[ECX_MM_HASH_MAX + 2];
    memset(longest, 'l', ECX_MM_HASH_MAX);
    memset(too_long, 'l', ECX_MM_HASH_MAX + 1);
    save(w, longest, 100, true);
    ecxi_cache_stats cst;
    ecxi_cache_get_stats(w->P.cache, &cst);
    assert_int_equal(cst.not_ready_blocks, 1);
    raw r = raw_dealer(w);
    uint8_t buf[4096];
    ecx_ack a;
    struct {
        const char *hash, *compat, *sid;
        int64_t version;
        int status;
    } cases[] = {
        /* version is checked first, even with a wrong hash and no session */
        {"item", "bad", "", 2, ECX_STATUS_NACK_VERSION},
        {"item", "bad", "", 1, ECX_STATUS_NACK_INCOMPAT},
        {"item", w->compat, "", 1, ECX_STATUS_NACK_INTERNAL},
        {"nothing", w->compat, "s1", 1, ECX_STATUS_NACK_MISSING},
        {"pending", w->compat, "s1", 1, ECX_STATUS_NACK_NOT_READY},
        {"item", w->compat, "s1", 1, ECX_STATUS_OK},
        {too_long, w->compat, "s1", 1, ECX_STATUS_NACK_MISSING},
        {longest, w->compat, "s1", 1, ECX_STATUS_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        raw_send_req(&r, cases[i].hash, cases[i].compat, cases[i].sid, cases[i].version);
        size_t n = raw_recv(w, &r, buf, sizeof buf);
        assert_true(n > 0);
        assert_int_equal(ecx_wire_decode_ack(buf, n, &a), 0);
        if (a.status != cases[i].status) fail_msg("case %zu: status %d want %d", i, a.status, cases[i].status);
        assert_int_equal(a.mm_hash.n, strlen(cases[i].hash));
        if (a.status == ECX_STATUS_OK) {
            assert_int_equal(a.session_id.n, 2); /* echoed */
            assert_int_equal(a.n_indices, 1);
            assert_memory_equal(a.mm_hash.p, cases[i].hash, a.mm_hash.n);
            assert_true(a.agent_metadata.n > 0 && a.agent_metadata.n <= 512);
            assert_true(a.mem_descriptor.n > 0 && a.mem_descriptor.n <= 512);
        } else {
            /* A NACK carries mm_hash and status only. */
            assert_int_equal(a.session_id.n, 0);
            assert_int_equal(a.n_indices, 0);
            assert_int_equal(a.agent_metadata.n, 0);
        }
    }
    zmq_close(r.sock);
    world_free(w);
}

/* A version-2 producer (docs/PROTOCOL.md §3.7): a request that leaves the
 * version out is its own version, whoever encoded it; one that spells out
 * another is NACK_VERSION. */
static void test_producer_versions(void **state)
{
    (void)state;
    next_version = 2;
    world *w = world_new(NULL);
    next_version = 0;
    save(w, "item", 100, true);
    raw r = raw_dealer(w);
    uint8_t buf[4096];
    ecx_ack a;
    struct {
        int64_t version;
        int enc, status;
    } cases[] = {
        {2, 2, ECX_STATUS_OK},           /* vLLM 0.34: omitted */
        {1, 1, ECX_STATUS_OK},           /* a v1 peer: omitted too, so read as 2 */
        {1, 2, ECX_STATUS_NACK_VERSION}, /* spelled out */
        {2, 1, ECX_STATUS_OK},           /* spelled out by a v1 encoder */
        {3, 2, ECX_STATUS_NACK_VERSION},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        raw_send_req_v(&r, "item", w->compat, "s1", cases[i].version, cases[i].enc);
        size_t n = raw_recv(w, &r, buf, sizeof buf);
        assert_true(n > 0);
        assert_int_equal(ecx_wire_decode_ack(buf, n, &a), 0);
        if (a.status != cases[i].status)
            fail_msg("case %zu: status %d want %d", i, a.status, cases[i].status);
    }
    zmq_close(r.sock);
    world_free(w);
}

/* A repeated request for a held grant releases the old pin first; a lease
 * that is never completed expires and unpins. */
static void test_regrant_and_lease_expiry(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 100, true);
    raw r = raw_dealer(w);
    uint8_t buf[4096];
    ecxi_cache_info info;
    for (int i = 0; i < 3; i++) {
        raw_send_req(&r, "item", w->compat, "sess", 1);
        assert_true(raw_recv(w, &r, buf, sizeof buf) > 0);
        assert_int_equal(ecxi_cache_lookup(w->P.cache, "item", 4, &info), 0);
        assert_int_equal(info.pins, 1);
    }
    raw_send_req(&r, "item", w->compat, "other", 1); /* another session: a second pin */
    assert_true(raw_recv(w, &r, buf, sizeof buf) > 0);
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "item", 4, &info), 0);
    assert_int_equal(info.pins, 2);
    ecxi_cache_stats cst;
    ecxi_cache_get_stats(w->P.cache, &cst); /* the granted block is pinned, not evictable */
    assert_int_equal(cst.not_ready_blocks, 0);
    assert_int_equal(cst.evictable_blocks, 0);
    assert_int_equal(cst.owned_blocks, 1);
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.regrants, 2);
    assert_int_equal(ps.active_grants, 2);
    fake_now += 29999;
    ecxi_producer_poll(w->prod);
    assert_int_equal(ecxi_producer_get_stats(w->prod).expired_leases, 0);
    fake_now += 1;
    ecxi_producer_poll(w->prod);
    ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.expired_leases, 2);
    assert_int_equal(ps.active_grants, 0);
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "item", 4, &info), 0);
    assert_int_equal(info.pins, 0);
    ecxi_cache_get_stats(w->P.cache, &cst);
    assert_int_equal(cst.evictable_blocks, 1);
    zmq_close(r.sock);
    world_free(w);
}

static void test_producer_drops_garbage(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 100, true);
    raw r = raw_dealer(w);
    uint8_t buf[4096];
    const char *junk[] = {"", "\xc1", "\x93\x01\x02\x03", "\xdf\xff\xff\xff\xff", "\x81\xa1z"};
    for (int i = 0; i < 5; i++) {
        zmq_send(r.sock, "", 0, ZMQ_SNDMORE);
        zmq_send(r.sock, junk[i], strlen(junk[i]) + (i == 1), 0);
    }
    assert_int_equal(raw_recv(w, &r, buf, sizeof buf), 0); /* no reply to any */
    assert_int_equal(ecxi_producer_get_stats(w->prod).malformed, 5);
    raw_send_req(&r, "item", w->compat, "s", 1); /* still serving */
    size_t n = raw_recv(w, &r, buf, sizeof buf);
    ecx_ack a;
    assert_int_equal(ecx_wire_decode_ack(buf, n, &a), 0);
    assert_int_equal(a.status, ECX_STATUS_OK);
    zmq_close(r.sock);
    world_free(w);
}

/* ---------- the consumer against a scripted producer ---------- */

typedef struct fakep {
    void *sock;
    int port;
} fakep;

static fakep fake_producer(world *w)
{
    fakep f = {zmq_socket(w->zctx, ZMQ_ROUTER), 0};
    int zero = 0;
    zmq_setsockopt(f.sock, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_bind(f.sock, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t n = sizeof ep;
    zmq_getsockopt(f.sock, ZMQ_LAST_ENDPOINT, ep, &n);
    f.port = atoi(strrchr(ep, ':') + 1);
    return f;
}

/* Receive the consumer's request (pumping it), returning identity + req. */
static bool fake_recv(world *w, fakep *f, uint8_t *id, size_t *idl, ecx_req *q, uint8_t *buf)
{
    double end = real_s() + 5;
    while (real_s() < end) {
        ecxi_consumer_poll(w->cons);
        int n = zmq_recv(f->sock, id, 256, ZMQ_DONTWAIT);
        if (n >= 0) {
            *idl = (size_t)n;
            char empty[8];
            zmq_recv(f->sock, empty, sizeof empty, 0);
            int m = zmq_recv(f->sock, buf, 1024, 0);
            return m > 0 && ecx_wire_decode_req(buf, (size_t)m, q) == 0;
        }
        usleep(1000);
    }
    return false;
}

static void fake_reply(fakep *f, const uint8_t *id, size_t idl, const ecx_ack *a)
{
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    assert_int_equal(ecxi_wire_encode_ack(a, &b), 0);
    zmq_send(f->sock, id, idl, ZMQ_SNDMORE);
    zmq_send(f->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(f->sock, b.data, b.size, 0);
    msgpack_sbuffer_destroy(&b);
}

/* Ask for an item from the fake producer and answer with *a (session and
 * hash filled in from the request unless set); return the outcome. */
static int scripted(world *w, fakep *f, const char *hash, size_t size, ecx_ack *a, bool echo,
                    int *reason)
{
    assert_int_equal(fetch_from(w, hash, strlen(hash), "127.0.0.1", f->port, size,
                                0, reason),
                     ECX_FETCH_PENDING);
    uint8_t id[256], buf[1024];
    size_t idl;
    ecx_req q;
    assert_true(fake_recv(w, f, id, &idl, &q, buf));
    a->mm_hash = q.mm_hash;
    if (echo) a->session_id = q.session_id;
    fake_reply(f, id, idl, a);
    return fetch_wait(w, hash, size, f->port, reason);
}

static void test_consumer_validates_acks(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    fakep f = fake_producer(w);
    size_t ml, dl;
    const uint8_t *meta = ecxi_data_agent_metadata(w->P.data, &ml);
    uint8_t layout[ECXI_DATA_DESC_MAX], desc[ECXI_DATA_DESC_MAX];
    long ll = stub_layout(w->P.data, layout, sizeof layout);
    assert_true(ll > 0);
    /* A grant of the size asked for, so each case fails its own check. */
    dl = (size_t)stub_desc(layout, (size_t)ll, 2 * BLOCK, 0, desc, sizeof desc);
    int64_t two[2] = {0, 1}, oob[2] = {0, BLOCKS}, neg[2] = {0, -1};
    struct {
        const char *what;
        const int64_t *idx;
        size_t n;
        const char *meta;
        size_t meta_len;
        int want;
    } cases[] = {
        {"count differs from the reservation", two, 1, NULL, 0, ECX_REASON_BAD_ACK},
        {"index beyond the producer's region", oob, 2, NULL, 0, ECX_REASON_BAD_ACK},
        {"negative index", neg, 2, NULL, 0, ECX_REASON_BAD_ACK},
        {"garbage metadata", two, 2, "\x00garbage", 8, ECX_REASON_BAD_ACK},
        {"empty metadata", two, 2, "", 0, ECX_REASON_BAD_ACK},
        {"the producer's item has another size", two, 2, NULL, 0, ECX_REASON_SIZE_MISMATCH},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ecx_ack a;
        ecx_ack_init(&a);
        a.status = ECX_STATUS_OK;
        a.indices = cases[i].idx;
        a.n_indices = cases[i].n;
        a.agent_metadata = cases[i].meta ? (ecx_span){cases[i].meta, cases[i].meta_len}
                                         : (ecx_span){(const char *)meta, ml};
        a.mem_descriptor = (ecx_span){(const char *)desc, dl};
        if (cases[i].want == ECX_REASON_SIZE_MISMATCH) /* a grant of one byte */
            a.mem_descriptor = (ecx_span){(const char *)layout, (size_t)ll};
        char hash[32];
        snprintf(hash, sizeof hash, "bad%zu", i);
        int reason;
        int st = scripted(w, &f, hash, 2 * BLOCK, &a, true, &reason);
        if (st != ECX_FETCH_LOCAL || reason != cases[i].want)
            fail_msg("%s: state %d reason %s", cases[i].what, st, ecx_reason_name(reason));
        assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    }
    /* An OK ack that does not echo our session id is ignored: the request
     * then times out. */
    ecx_ack a;
    ecx_ack_init(&a);
    a.status = ECX_STATUS_OK;
    a.indices = two;
    a.n_indices = 2;
    a.agent_metadata = (ecx_span){(const char *)meta, ml};
    a.mem_descriptor = (ecx_span){(const char *)desc, dl};
    a.session_id = (ecx_span){"someone-else", 12};
    assert_int_equal(fetch_from(w, "noecho", 6, "127.0.0.1", f.port, 100, 0,
                                &(int){0}),
                     ECX_FETCH_PENDING);
    uint8_t id[256], buf[1024];
    size_t idl;
    ecx_req q;
    assert_true(fake_recv(w, &f, id, &idl, &q, buf));
    a.mm_hash = q.mm_hash;
    fake_reply(&f, id, idl, &a);
    for (int i = 0; i < 100; i++) pump(w);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).stale_acks, 1);
    fake_now += 2000; /* the ack timeout */
    int reason;
    assert_int_equal(fetch_wait(w, "noecho", 100, f.port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_ACK_TIMEOUT);
    /* Garbage acks are dropped and counted. */
    zmq_send(f.sock, id, idl, ZMQ_SNDMORE);
    zmq_send(f.sock, "", 0, ZMQ_SNDMORE);
    zmq_send(f.sock, "\xc1\xc1", 2, 0);
    for (int i = 0; i < 100 && !ecxi_consumer_get_stats(w->cons).malformed_acks; i++) pump(w);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).malformed_acks, 1);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    zmq_close(f.sock);
    world_free(w);
}

static void test_every_nack_status(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    fakep f = fake_producer(w);
    int statuses[] = {ECX_STATUS_NACK_MISSING, ECX_STATUS_NACK_INCOMPAT, ECX_STATUS_NACK_VERSION,
                      ECX_STATUS_NACK_INTERNAL};
    int reasons[] = {ECX_REASON_NACK_MISSING, ECX_REASON_NACK_INCOMPAT, ECX_REASON_NACK_VERSION,
                     ECX_REASON_NACK_INTERNAL};
    for (int i = 0; i < 4; i++) {
        ecx_ack a;
        ecx_ack_init(&a);
        a.status = statuses[i];
        char hash[16];
        snprintf(hash, sizeof hash, "n%d", i);
        int reason;
        assert_int_equal(scripted(w, &f, hash, 100, &a, false, &reason), ECX_FETCH_LOCAL);
        assert_int_equal(reason, reasons[i]);
    }
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    zmq_close(f.sock);
    world_free(w);
}

static void test_ack_timeout(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    fakep f = fake_producer(w); /* receives, never answers */
    int reason;
    assert_int_equal(fetch_from(w, "x", 1, "127.0.0.1", f.port, 100, 0, &reason),
                     ECX_FETCH_PENDING);
    fake_now += 1999;
    pump(w);
    assert_int_equal(fetch_from(w, "x", 1, "127.0.0.1", f.port, 100, 0, &reason),
                     ECX_FETCH_PENDING);
    fake_now += 1;
    pump(w);
    assert_int_equal(fetch_from(w, "x", 1, "127.0.0.1", f.port, 100, 0, &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_ACK_TIMEOUT);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    zmq_close(f.sock);
    world_free(w);
}

/* Version 2 re-requests after an ack timeout (vLLM >= 0.34), within the
 * item's wait; version 1 (test_ack_timeout) tombstones at once. A late ack
 * to the first try, arriving while the second waits, is taken. */
static int fetch_v2(world *w, const char *hash, int port, int *reason)
{
    char json[256]; /* two blocks: two rows of BLOCK / 2 two-byte elements */
    snprintf(json, sizeof json,
             "{\"peer_host\": \"127.0.0.1\", \"peer_port\": %d, \"size_bytes\": %d, "
             "\"shape\": [2, %d]}", port, 2 * BLOCK, BLOCK / 2);
    return ecxi_consumer_fetch(w->cons, hash, strlen(hash), json, NULL, 0, reason);
}

static void test_ack_timeout_v2_retries(void **state)
{
    (void)state;
    next_version = 2;
    world *w = world_new(NULL);
    next_version = 0;
    fakep f = fake_producer(w);
    uint8_t id[256], buf[1024];
    size_t idl;
    ecx_req q;
    int reason;
    /* "late": asked, unanswered for the ack timeout, asked again; the
     * answer to the first try then completes the fetch. */
    assert_int_equal(fetch_v2(w, "late", f.port, &reason),
                     ECX_FETCH_PENDING);
    assert_true(fake_recv(w, &f, id, &idl, &q, buf));
    fake_now += 2000; /* the ack timeout */
    pump(w);
    assert_int_equal(fetch_v2(w, "late", f.port, &reason),
                     ECX_FETCH_PENDING);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS); /* freed while it waits to retry */
    fake_now += 20; /* the first backoff */
    uint8_t id2[256], buf2[1024];
    size_t idl2;
    ecx_req q2;
    assert_true(fake_recv(w, &f, id2, &idl2, &q2, buf2));
    assert_true(q2.mm_hash.n == 4 && !memcmp(q2.mm_hash.p, "late", 4));
    assert_true(q.session_id.n == q2.session_id.n &&
                !memcmp(q.session_id.p, q2.session_id.p, q.session_id.n));
    ecx_ack a;
    ecx_ack_init(&a);
    a.status = ECX_STATUS_NACK_MISSING;
    a.mm_hash = q.mm_hash;
    a.session_id = q.session_id;
    fake_reply(&f, id, idl, &a);
    int st = ECX_FETCH_PENDING;
    for (int i = 0; i < 200 && (st = fetch_v2(w, "late", f.port, &reason)) == ECX_FETCH_PENDING; i++)
        pump(w);
    assert_int_equal(st, ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NACK_MISSING);
    /* "silent": never answered; asked again and again until the item's
     * wait (60 s) is over, then ACK_TIMEOUT. */
    assert_int_equal(st = fetch_v2(w, "silent", f.port, &reason), ECX_FETCH_PENDING);
    int asks = 0;
    for (int i = 0; i < 200 && st == ECX_FETCH_PENDING; i++) {
        while (zmq_recv(f.sock, buf, sizeof buf, ZMQ_DONTWAIT) >= 0) {
            int more = 0;
            size_t ml = sizeof more;
            zmq_getsockopt(f.sock, ZMQ_RCVMORE, &more, &ml);
            if (!more) asks++;
        }
        fake_now += 1000;
        pump(w);
        st = fetch_v2(w, "silent", f.port, &reason);
    }
    assert_int_equal(st, ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_ACK_TIMEOUT);
    if (asks < 20) fail_msg("a silent producer was asked %d times in 60 s (ack timeout 2 s)", asks);
    assert_true(ecxi_consumer_get_stats(w->cons).retries >= 20);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    zmq_close(f.sock);
    world_free(w);
}

/* ---------- READ faults ---------- */

static void test_read_failed(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 5 * BLOCK, true);
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_READ_FAIL, 0, 1), 0);
    int reason;
    assert_int_equal(fetch_wait(w, "item", 5 * BLOCK, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_READ_FAILED);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_POST_FAIL, 0, 1), 0);
    assert_int_equal(fetch_wait(w, "item", 5 * BLOCK, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_READ_FAILED);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    /* The fault is spent: the next fetch works. */
    assert_int_equal(fetch_wait(w, "item", 5 * BLOCK, w->port, &reason), ECX_FETCH_READY);
    world_free(w);
}

/* A READ that never ends: quarantined at the read deadline (blocks kept),
 * settled at the quarantine limit (blocks back). */
static void test_quarantine(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "stuck", 7 * BLOCK, true);
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_HANG, 0, 1), 0);
    int reason;
    assert_int_equal(fetch_from(w, "stuck", 5, "127.0.0.1", w->port, 7 * BLOCK, 0,
                                &reason),
                     ECX_FETCH_PENDING);
    for (int i = 0; i < 200 && ecxi_data_fault_hits(w->C.data) == 0; i++) pump(w);
    assert_int_equal(ecxi_data_fault_hits(w->C.data), 1);
    fake_now += 20000; /* read deadline */
    pump(w);
    assert_int_equal(fetch_from(w, "stuck", 5, "127.0.0.1", w->port, 7 * BLOCK, 0,
                                &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_QUARANTINED);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS - 7); /* held: the DMA may still write */
    assert_int_equal(ecxi_consumer_get_stats(w->cons).quarantines, 1);
    fake_now += 59999;
    pump(w);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS - 7);
    fake_now += 1;
    pump(w);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.settled, 1);
    assert_int_equal(cs.in_flight, 0);
    world_free(w);
}

/* A byte changed between the producer's bytes and the item: the checksum
 * catches it, the item falls back as CORRUPT and its blocks come back. */
static void test_corrupt(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 5 * BLOCK + 3, true);
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_CORRUPT, 0, 1), 0);
    int reason;
    assert_int_equal(fetch_wait(w, "item", 5 * BLOCK + 3, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_CORRUPT);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).fallbacks[ECX_REASON_CORRUPT], 1);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    /* The producer's bytes themselves are fine: the next fetch is ready. */
    assert_int_equal(fetch_wait(w, "item", 5 * BLOCK + 3, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "item", 5 * BLOCK + 3));
    world_free(w);
}

/* The consumer does not run while its ack arrives and its deadline
 * passes (a stopped process): on its next poll the timer fires first and
 * the ack is stale. No READ happens, no block is lost. */
static void test_stale_ack_dropped(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 3 * BLOCK, true);
    int reason;
    assert_int_equal(fetch_from(w, "item", 4, "127.0.0.1", w->port, 3 * BLOCK, 0,
                                &reason),
                     ECX_FETCH_PENDING);
    /* Only the producer runs: it answers OK. */
    double end = real_s() + 5;
    while (ecxi_producer_get_stats(w->prod).grants == 0 && real_s() < end) {
        ecxi_producer_poll(w->prod);
        usleep(1000);
    }
    assert_int_equal(ecxi_producer_get_stats(w->prod).grants, 1);
    usleep(20000); /* the ack is in the consumer's socket now */
    fake_now += 2001;
    for (int i = 0; i < 20; i++) pump(w);
    assert_int_equal(fetch_from(w, "item", 4, "127.0.0.1", w->port, 3 * BLOCK, 0,
                                &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_ACK_TIMEOUT);
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.stale_acks, 1);
    assert_int_equal(cs.ready, 0);
    assert_int_equal(ecxi_data_fault_hits(w->C.data), 0);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    world_free(w);
}

/* A READ that ends after the producer's lease could have expired (here a
 * 1 s lease, so 900 ms after the ack) is not used, even though its bytes
 * arrived: the producer may have reused the blocks. */
static void test_read_after_lease(void **state)
{
    (void)state;
    next_lease_ms = 1000;
    world *w = world_new(NULL);
    next_lease_ms = 0;
    save(w, "item", 2 * BLOCK, true);
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_DELAY, 0, 1), 0);
    int reason;
    assert_int_equal(fetch_from(w, "item", 4, "127.0.0.1", w->port, 2 * BLOCK, 0,
                                &reason),
                     ECX_FETCH_PENDING);
    for (int i = 0; i < 2000 && ecxi_data_fault_hits(w->C.data) == 0; i++) pump(w);
    assert_int_equal(ecxi_data_fault_hits(w->C.data), 1);
    fake_now += 899;
    pump(w);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).reading, 1);
    fake_now += 2; /* past receipt + lease - margin */
    assert_int_equal(ecxi_data_fault_set(w->C.data, ECXI_FAULT_NONE, 0, 0), 0); /* READ ends */
    assert_int_equal(fetch_wait(w, "item", 2 * BLOCK, w->port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_LEASE_EXPIRED);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).ready, 0);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    world_free(w);
}

/* A grant belongs to the connection that asked: another connection with
 * the same session id can neither replace it nor, without its token, get
 * its bytes or release it. */
static void test_grant_belongs_to_connection(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "item", 100, true);
    raw a = raw_dealer(w), b = raw_dealer(w);
    uint8_t buf[4096];
    raw_send_req(&a, "item", w->compat, "sess", 1);
    size_t n = raw_recv(w, &a, buf, sizeof buf);
    ecx_ack ack;
    assert_int_equal(ecx_wire_decode_ack(buf, n, &ack), 0);
    assert_int_equal(ack.status, ECX_STATUS_OK);
    ecxi_data_desc dd;
    assert_int_equal(ecxi_data_desc_decode((const uint8_t *)ack.mem_descriptor.p,
                                           ack.mem_descriptor.n, &dd),
                     0);
    assert_true(dd.has_ticket);
    ecxi_data_ticket t = dd.ticket;
    assert_int_equal(t.nbytes, 100);
    assert_int_equal(t.lease_ms, 30000);
    /* Another connection asks with the same session id: refused. */
    raw_send_req(&b, "item", w->compat, "sess", 1);
    n = raw_recv(w, &b, buf, sizeof buf);
    ecx_ack nack;
    assert_int_equal(ecx_wire_decode_ack(buf, n, &nack), 0);
    assert_int_equal(nack.status, ECX_STATUS_NACK_INTERNAL);
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.foreign_requests, 1);
    assert_int_equal(ps.active_grants, 1);
    /* The data plane's check: wrong token, unknown key, then the right
     * token (served once), then a replay. */
    ecxi_data_grant g;
    uint8_t wrong[ECXI_DATA_TOKEN_LEN];
    memcpy(wrong, t.token, sizeof wrong);
    wrong[0] ^= 1;
    assert_int_equal(ecxi_data_grant_check(w->P.data, "sess:item", 9, wrong, ECXI_DATA_GRANT_CLAIM,
                                          &g),
                     ECX_EDATA_GRANT);
    assert_int_equal(ecxi_data_grant_check(w->P.data, "sess:other", 10, t.token,
                                          ECXI_DATA_GRANT_CLAIM, &g),
                     ECX_EDATA_GRANT);
    assert_int_equal(ecxi_data_grant_check(w->P.data, "sess:item", 9, t.token, 0, &g), 0);
    assert_int_equal(ecxi_data_grant_check(w->P.data, "sess:item", 9, t.token,
                                          ECXI_DATA_GRANT_CLAIM, &g),
                     0);
    assert_int_equal(g.nbytes, 100);
    assert_int_equal(g.n, 1);
    assert_int_equal(ecxi_data_grant_check(w->P.data, "sess:item", 9, t.token,
                                          ECXI_DATA_GRANT_CLAIM, &g),
                     ECX_EDATA_GRANT);
    assert_int_equal(ecxi_producer_get_stats(w->prod).refused_reads, 3);
    /* The holder may still ask again (a regrant), from its own connection. */
    raw_send_req(&a, "item", w->compat, "sess", 1);
    n = raw_recv(w, &a, buf, sizeof buf);
    assert_int_equal(ecx_wire_decode_ack(buf, n, &ack), 0);
    assert_int_equal(ack.status, ECX_STATUS_OK);
    assert_int_equal(ecxi_producer_get_stats(w->prod).regrants, 1);
    assert_int_equal(ecxi_data_desc_decode((const uint8_t *)ack.mem_descriptor.p,
                                           ack.mem_descriptor.n, &dd),
                     0);
    assert_true(dd.has_ticket);
    assert_memory_not_equal(t.token, dd.ticket.token, ECXI_DATA_TOKEN_LEN); /* a fresh token */
    zmq_close(a.sock);
    zmq_close(b.sock);
    world_free(w);
}

/* Session ids: UUID4 text with ecx's marker (session_id.h). */
static void test_session_id_marker(void **state)
{
    (void)state;
    char a[ECXI_SESSION_ID_LEN + 1], b[ECXI_SESSION_ID_LEN + 1];
    ecxi_session_id_new(a);
    ecxi_session_id_new(b);
    assert_int_equal(strlen(a), 36);
    assert_string_not_equal(a, b);
    assert_true(ecxi_session_id_is_ecx(a, 36));
    assert_int_equal(a[14], '4');
    assert_non_null(strchr("89ab", a[19]));
    assert_false(ecxi_session_id_is_ecx(a, 35));
    /* a plain uuid4 (vLLM's), another version, a non-hex digit */
    assert_false(ecxi_session_id_is_ecx("0b6f3c52-7d1e-4a9b-8c2d-5e6f7a8b9c0d", 36));
    char c[ECXI_SESSION_ID_LEN + 1];
    memcpy(c, a, sizeof c);
    c[14] = '1';
    assert_false(ecxi_session_id_is_ecx(c, 36));
    memcpy(c, a, sizeof c);
    c[0] = 'g';
    assert_false(ecxi_session_id_is_ecx(c, 36));
    memcpy(c, a, sizeof c);
    c[8] = 'a';
    assert_false(ecxi_session_id_is_ecx(c, 36));
    memcpy(c, a, sizeof c);
    c[19] = 'c'; /* not the RFC variant */
    assert_false(ecxi_session_id_is_ecx(c, 36));
    /* every random digit is checked: an uppercase or non-hex one anywhere */
    for (int i = 0; i < 24; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) continue;
        for (const char *bad = "AF:g\x80"; *bad; bad++) {
            memcpy(c, a, sizeof c);
            c[i] = *bad;
            assert_false(ecxi_session_id_is_ecx(c, 36));
        }
    }
}

#ifdef ECX_WITH_NIXL
/* Ask for item on a fresh connection with session sid; the OK ack's
 * metadata and descriptor into meta / desc (returns the metadata length). */
static size_t nixl_ask(world *w, const char *sid, uint8_t *buf, size_t cap, ecx_ack *ack)
{
    raw r = raw_dealer(w);
    raw_send_req(&r, "item", w->compat, sid, 1);
    size_t n = raw_recv(w, &r, buf, cap);
    zmq_close(r.sock);
    assert_int_equal(ecx_wire_decode_ack(buf, n, ack), 0);
    assert_int_equal(ack->status, ECX_STATUS_OK);
    return ack->agent_metadata.n;
}

/* A NIXL peer reads block 0 of the producer's region and notifies key. */
static void nixl_notify(world *w, const ecx_ack *nixl_ack, const char *key)
{
    ecxi_nixl_agent *a;
    ecxi_nixl_remote *r;
    ecxi_nixl_read *x;
    static uint8_t local[BLOCK];
    assert_int_equal(ecxi_nixl_agent_new("test-forger", NULL, 0, false, &a), 0);
    assert_int_equal(ecxi_nixl_remote_add(a, (const uint8_t *)nixl_ack->agent_metadata.p,
                                          nixl_ack->agent_metadata.n, &r),
                     0);
    ecxi_nixl_block b[BLOCKS];
    size_t nb;
    assert_int_equal(ecxi_nixl_desc_decode((const uint8_t *)nixl_ack->mem_descriptor.p,
                                           nixl_ack->mem_descriptor.n, b, BLOCKS, &nb),
                     0);
    uint64_t addr = b[0].addr, len = BLOCK;
    void *lp = local;
    assert_int_equal(ecxi_nixl_read_post(r, &addr, &lp, &len, 1, key, strlen(key), &x), 0);
    double end = real_s() + 10;
    int st = 0;
    while (st == 0 && real_s() < end) {
        ecxi_nixl_agent_progress(a);
        ecxi_producer_poll(w->prod);
        st = ecxi_nixl_read_poll(x);
    }
    assert_int_equal(st, 1);
    for (int i = 0; i < 200; i++) { /* the notification's way to the producer */
        ecxi_nixl_agent_progress(a);
        ecxi_producer_poll(w->prod);
        usleep(1000);
    }
    ecxi_nixl_read_release(x);
    ecxi_nixl_remote_drop(r);
    ecxi_nixl_agent_free(a);
}

/* nixl mode between ecx ends (docs/NIXL.md §8): a producer with
 * data = "nixl" answers a marked (ecx) session in ecx's checked form and any
 * other in NIXL's; an ecx consumer fetches over shm; a NIXL notification
 * (no token) releases a NIXL-form grant but not an ecx-form one, and the ecx
 * paths refuse a NIXL-form grant. */
static void test_nixl_mode_forms(void **state)
{
    (void)state;
    next_prod_backend = ECX_DATA_NIXL;
    world *w = world_new(NULL);
    next_prod_backend = 0;
    save(w, "item", 3 * BLOCK + 100, true);
    int reason = -1;
    assert_int_equal(fetch_wait(w, "item", 3 * BLOCK + 100, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "item", 3 * BLOCK + 100));
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.grants, 1);
    assert_int_equal(ps.nixl_grants, 0);

    static uint8_t b1[16384], b2[16384];
    ecx_ack nack, eack;
    char sid[ECXI_SESSION_ID_LEN + 1];
    ecxi_session_id_new(sid);
    size_t ml = nixl_ask(w, "0b6f3c52-7d1e-4a9b-8c2d-5e6f7a8b9c0d", b1, sizeof b1, &nack);
    assert_true(ml > 11 && !memcmp(nack.agent_metadata.p, "nixlSerDes|", 11));
    assert_false(ecxi_data_desc_is_ecx((const uint8_t *)nack.mem_descriptor.p,
                                       nack.mem_descriptor.n));
    ml = nixl_ask(w, sid, b2, sizeof b2, &eack);
    assert_true(ecxi_data_meta_is_ecx((const uint8_t *)eack.agent_metadata.p, ml));
    ecxi_data_desc dd;
    assert_int_equal(ecxi_data_desc_decode((const uint8_t *)eack.mem_descriptor.p,
                                           eack.mem_descriptor.n, &dd),
                     0);
    assert_true(dd.has_ticket);
    assert_int_equal(dd.ticket.nbytes, 3 * BLOCK + 100);
    ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.nixl_grants, 1);
    assert_int_equal(ps.active_grants, 2);
    /* The ecx paths serve the ecx-form grant with its token, never the
     * NIXL-form one (it has none to present). */
    ecxi_data_grant g;
    char key[64];
    snprintf(key, sizeof key, "%s:item", sid);
    assert_int_equal(ecxi_data_grant_check(w->P.data, key, strlen(key), dd.ticket.token, 0, &g),
                     0);
    assert_int_equal(ecxi_data_grant_check(w->P.data, "0b6f3c52-7d1e-4a9b-8c2d-5e6f7a8b9c0d:item",
                                          41, dd.ticket.token, 0, &g),
                     ECX_EDATA_GRANT);
    /* A NIXL notification for the ecx-form grant is forged; for the
     * NIXL-form one it is the release. */
    nixl_notify(w, &nack, key);
    ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.forged_notifs, 1);
    assert_int_equal(ps.active_grants, 2);
    nixl_notify(w, &nack, "0b6f3c52-7d1e-4a9b-8c2d-5e6f7a8b9c0d:item");
    ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.active_grants, 1);
    assert_int_equal(ps.completions, 2);
    world_free(w);
}
#endif /* ECX_WITH_NIXL */

/* ---------- liveness ---------- */

/* The producer goes away while a request waits for its ack: the transfer
 * is retried on a fresh session, whose connect its closed port refuses
 * (REFUSED, not a timeout), and every block comes back. */
static void test_producer_lost(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    fakep f = fake_producer(w);
    int reason;
    assert_int_equal(fetch_from(w, "x", 1, "127.0.0.1", f.port, 100, 0, &reason),
                     ECX_FETCH_PENDING);
    uint8_t id[256], buf[1024];
    size_t idl;
    ecx_req q;
    assert_true(fake_recv(w, &f, id, &idl, &q, buf));
    zmq_close(f.sock); /* the producer dies */
    double end = real_s() + 10;
    while (!ecxi_consumer_get_stats(w->cons).peers_lost && real_s() < end) pump(w);
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.peers_lost, 1);
    assert_true(cs.retries >= 1);
    fake_now += 10000;
    assert_int_equal(fetch_wait(w, "x", 100, f.port, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_REFUSED);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    world_free(w);
}

/* An OK ack with new metadata from the same address: the producer
 * restarted; the consumer re-registers and reads from the new one. */
static void test_producer_restart(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    save(w, "a", 100, true);
    int reason;
    assert_int_equal(fetch_wait(w, "a", 100, w->port, &reason), ECX_FETCH_READY);
    /* Restart the producer's data plane and cache on the same port. */
    ecxi_producer_free(w->prod);
    side_fini(&w->P);
    side_init(w, &w->P, "prod2", true);
    ecxi_producer_opts po = {.compat_hash = w->compat,
                            .block_bytes = BLOCK,
                            .lease_ms = next_lease_ms,
                            .max_grants = next_max_grants,
                            .max_conn_grants = next_conn_grants,
                            .clock = &CLOCK};
    assert_int_equal(ecxi_producer_new(w->P.cache, w->P.data, w->srv, &po, &w->prod), 0);
    save(w, "b", 2 * BLOCK, true);
    assert_int_equal(fetch_wait(w, "b", 2 * BLOCK, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "b", 2 * BLOCK));
    assert_int_equal(ecxi_consumer_get_stats(w->cons).peer_restarts, 1);
    world_free(w);
}

static void test_fetch_refusals(void **state)
{
    (void)state;
    world *w = world_new(NULL);
    int reason;
    assert_int_equal(fetch_from(w, "h", 1, NULL, 0, 100, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NO_PEER);
    assert_int_equal(fetch_from(w, "h", 1, "127.0.0.1", w->port, 100, 99, &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_SIZE_MISMATCH);
    assert_int_equal(fetch_from(w, "h", 1, "127.0.0.1", w->port, 0, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    assert_int_equal(fetch_from(w, "", 0, "127.0.0.1", w->port, 10, 0, &reason), ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    assert_int_equal(fetch_from(w, "big", 3, "127.0.0.1", w->port, (BLOCKS + 1) * BLOCK, 0,
                                &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NO_ROOM);
    /* The announcement as JSON text goes through the same checks. */
    reason = -1;
    assert_int_equal(ecxi_consumer_fetch(w->cons, "h", 1, "{\"metadata\":{}}", NULL, 0, &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_NO_PEER);
    assert_int_equal(ecxi_consumer_fetch(w->cons, "h", 1, "{\"peer_host\":\"127.0.0.1\"}", NULL,
                                         0, &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    /* Text and struct together is a caller's error, not a fallback. */
    ecx_announcement a = {"127.0.0.1", w->port, 100};
    assert_int_equal(ecxi_consumer_fetch(w->cons, "h", 1, "{}", &a, 0, &reason), ECX_EINVAL);
    /* mm_hash longer than ECX_MM_HASH_MAX: INVALID, before anything else. */
    static char too_long[ECX_MM_HASH_MAX + 2];
    memset(too_long, 'h', ECX_MM_HASH_MAX + 1);
    assert_int_equal(fetch_from(w, too_long, ECX_MM_HASH_MAX + 1, "127.0.0.1", w->port, 100, 0,
                                &reason),
                     ECX_FETCH_LOCAL);
    assert_int_equal(reason, ECX_REASON_INVALID);
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.fallbacks[ECX_REASON_INVALID], 4);
    assert_int_equal(cs.fallbacks[ECX_REASON_NO_PEER], 2);
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).requests, 0);
    world_free(w);
}

/* ---------- session bounds ---------- */

/* A TCP port on 127.0.0.1 that is bound but not listening: connecting to
 * it is refused for as long as fd stays open, and nobody else can take it. */
static int dead_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(*fd, (struct sockaddr *)&a, &al), 0);
    /* Listening, never accepting: the kernel completes the connect and nothing
     * answers (a port with no listener refuses, and falls back REFUSED at once). */
    assert_int_equal(listen(*fd, 4), 0);
    return ntohs(a.sin_port);
}

/* Issue 10 item 5 and issue 20 item 6: 300 producers that never answer.
 * Sessions never exceed the cap (idle ones are evicted for new ones, then
 * ones with no handshake for ECXI_CONSUMER_UNREACHED_MS; while all are busy
 * items wait for a session, up to the cap wait, then fall back, counted),
 * idle sessions close after the idle timeout, and afterwards a live
 * producer is reached. */
#define DEAD 300
#define CAP 32
static void test_dead_producers_bounded(void **state)
{
    (void)state;
    world *w = world_new_sessions(CAP, 30000);
    static int fds[DEAD], ports[DEAD];
    int reason, max_open = 0;
    char h[16];
    for (int i = 0; i < DEAD; i++) ports[i] = dead_port(&fds[i]);
    for (int i = 0; i < DEAD; i++) {
        snprintf(h, sizeof h, "dead%03d", i);
        /* Never refused at once: at the cap an item waits for a session. */
        int st = fetch_from(w, h, strlen(h), "127.0.0.1", ports[i], 100, 0, &reason);
        assert_int_equal(st, ECX_FETCH_PENDING);
        ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
        assert_true(cs.sessions_open <= CAP);
        if ((int)cs.sessions_open > max_open) max_open = (int)cs.sessions_open;
        if (i % 16 == 15) { /* 16 new producers every 250 ms: twice what the cap takes */
            fake_now += 250;
            pump(w);
        }
    }
    ecxi_consumer_stats cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(max_open, CAP);
    assert_true(cs.session_cap_waits > 0);
    assert_true(cs.sessions_unreached > 0); /* no handshake in 1.5 s: closed at the cap */
    assert_int_equal(cs.sessions_idle_closed, 0);
    /* Past every ack timeout and cap wait: each item fell back, either on
     * its ack (ACK_TIMEOUT, also when its unreached session was closed) or
     * for want of a session (SEND_FAILED, a cap refusal). One that found
     * a session in the last round (others' ends freed it) waits for its
     * ack one more ack timeout. */
    for (int round = 0; round < 2; round++) {
        fake_now += 2000;
        pump(w);
    }
    int refused = 0;
    for (int i = 0; i < DEAD; i++) {
        snprintf(h, sizeof h, "dead%03d", i);
        assert_int_equal(
            fetch_from(w, h, strlen(h), "127.0.0.1", ports[i], 100, 0, &reason),
            ECX_FETCH_LOCAL);
        assert_true(reason == ECX_REASON_ACK_TIMEOUT || reason == ECX_REASON_SEND_FAILED);
        refused += reason == ECX_REASON_SEND_FAILED;
    }
    cs = ecxi_consumer_get_stats(w->cons);
    assert_true(refused < DEAD - CAP); /* some at most, never all */
    assert_int_equal(cs.session_cap_refusals, (uint64_t)refused);
    assert_int_equal(cs.fallbacks[ECX_REASON_SEND_FAILED], (uint64_t)refused);
    assert_int_equal(cs.fallbacks[ECX_REASON_ACK_TIMEOUT], (uint64_t)(DEAD - refused));
    assert_int_equal(free_blocks(w->C.cache), BLOCKS);
    /* Nothing is busy now: the open sessions close after the idle timeout
     * (counted from when each was last busy), and the poll is woken for it. */
    cs = ecxi_consumer_get_stats(w->cons);
    uint64_t open = cs.sessions_open;
    assert_true(open > 0 && open <= CAP);
    int64_t t = ecxi_consumer_next_timeout(w->cons);
    assert_true(t > 0 && t <= 30000);
    fake_now += t - 1;
    pump(w);
    assert_int_equal(ecxi_consumer_get_stats(w->cons).sessions_open, open); /* not yet */
    fake_now += 30001;
    pump(w);
    cs = ecxi_consumer_get_stats(w->cons);
    assert_int_equal(cs.sessions_open, 0);
    assert_int_equal(cs.sessions_idle_closed, open);
    assert_int_equal(ecxi_consumer_next_timeout(w->cons), -1);
    /* The live producer is reached at once. */
    save(w, "live", 3 * BLOCK, true);
    assert_int_equal(fetch_wait(w, "live", 3 * BLOCK, w->port, &reason), ECX_FETCH_READY);
    assert_true(consumer_has(w, "live", 3 * BLOCK));
    assert_int_equal(ecxi_consumer_get_stats(w->cons).sessions_open, 1);
    for (int i = 0; i < DEAD; i++) close(fds[i]);
    world_free(w);
}

/* Ask once on r; the ack's status. */
static int raw_ask(world *w, raw *r, const char *hash, const char *sid)
{
    uint8_t buf[4096];
    ecx_ack a;
    raw_send_req(r, hash, w->compat, sid, 1);
    size_t n = raw_recv(w, r, buf, sizeof buf);
    assert_true(n > 0);
    assert_int_equal(ecx_wire_decode_ack(buf, n, &a), 0);
    return a.status;
}

/* Issue 10: one connection flooding with distinct session ids hits its own
 * cap; a second connection is still granted, even once the shared table is
 * full (the heaviest connection's oldest grant makes room). */
static void test_grant_flood_costs_the_flooder(void **state)
{
    (void)state;
    next_max_grants = 16, next_conn_grants = 8;
    world *w = world_new(NULL);
    next_max_grants = next_conn_grants = 0;
    save(w, "item", 100, true);
    raw a = raw_dealer(w), a2 = raw_dealer(w), b = raw_dealer(w);
    char sid[32];
    int ok = 0, refused = 0;
    for (int i = 0; i < 12; i++) {
        snprintf(sid, sizeof sid, "a%d", i);
        int st = raw_ask(w, &a, "item", sid);
        ok += st == ECX_STATUS_OK;
        refused += st == ECX_STATUS_NACK_INTERNAL;
    }
    assert_int_equal(ok, 8);
    assert_int_equal(refused, 4);
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.refused_conn_grants, 4);
    assert_int_equal(ps.active_grants, 8);
    assert_int_equal(raw_ask(w, &b, "item", "b0"), ECX_STATUS_OK); /* the other consumer */
    for (int i = 0; i < 7; i++) { /* a second flooding connection fills the table */
        snprintf(sid, sizeof sid, "c%d", i);
        assert_int_equal(raw_ask(w, &a2, "item", sid), ECX_STATUS_OK);
    }
    assert_int_equal(ecxi_producer_get_stats(w->prod).active_grants, 16);
    /* Full: the floods (8 and 7, share 16/3 = 5) are refused... */
    assert_int_equal(raw_ask(w, &a2, "item", "c7"), ECX_STATUS_NACK_INTERNAL);
    assert_int_equal(raw_ask(w, &a, "item", "a99"), ECX_STATUS_NACK_INTERNAL);
    /* ...the light consumer is served, at the cost of the heaviest. */
    assert_int_equal(raw_ask(w, &b, "item", "b1"), ECX_STATUS_OK);
    ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.evicted_grants, 1);
    assert_int_equal(ps.refused_conn_grants, 6);
    assert_int_equal(ps.active_grants, 16);
    assert_int_equal(ps.grants, 8 + 1 + 7 + 1);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "item", 4, &info), 0);
    assert_int_equal(info.pins, 16);
    /* a lost its oldest grant (a0) and is below its cap, but the table is
     * full and a holds 7 >= its share of 5: still refused */
    assert_int_equal(raw_ask(w, &a, "item", "a0"), ECX_STATUS_NACK_INTERNAL);
    /* Leases expire: everyone is back to nothing, and a is served again. */
    fake_now += 30000;
    ecxi_producer_poll(w->prod);
    assert_int_equal(ecxi_producer_get_stats(w->prod).active_grants, 0);
    assert_int_equal(raw_ask(w, &a, "item", "a0"), ECX_STATUS_OK);
    zmq_close(a.sock), zmq_close(a2.sock), zmq_close(b.sock);
    world_free(w);
}

/* A connection's pins cover at most half the region (default): past that it
 * is refused, others are not; a connection holding nothing always gets one
 * item. */
static void test_pin_share(void **state)
{
    (void)state;
    next_pin_pct = 50; /* the library's default */
    world *w = world_new(NULL);
    next_pin_pct = 0;
    save(w, "big", 20 * BLOCK, true);  /* 20 of 64 blocks */
    save(w, "big2", 20 * BLOCK, true);
    save(w, "item", 100, true);
    raw a = raw_dealer(w), b = raw_dealer(w);
    assert_int_equal(raw_ask(w, &a, "big", "s1"), ECX_STATUS_OK);
    assert_int_equal(raw_ask(w, &a, "big2", "s2"), ECX_STATUS_NACK_INTERNAL); /* 40 > 32 */
    assert_int_equal(raw_ask(w, &a, "item", "s3"), ECX_STATUS_OK);            /* 21 */
    assert_int_equal(raw_ask(w, &b, "big2", "t1"), ECX_STATUS_OK);
    assert_int_equal(raw_ask(w, &b, "big", "t2"), ECX_STATUS_NACK_INTERNAL);
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.refused_conn_pins, 2);
    assert_int_equal(ps.refused_conn_grants, 0);
    assert_int_equal(ps.active_grants, 3);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "big2", 4, &info), 0);
    assert_int_equal(info.pins, 1); /* the refused request left no pin */
    /* a regrant of what a holds is not counted twice */
    assert_int_equal(raw_ask(w, &a, "big", "s1"), ECX_STATUS_OK);
    fake_now += 30000;
    ecxi_producer_poll(w->prod);
    assert_int_equal(raw_ask(w, &a, "big2", "s2"), ECX_STATUS_OK); /* nothing held: served */
    zmq_close(a.sock), zmq_close(b.sock);
    world_free(w);
}

/* Pins of all connections together cover at most max_pin_pct (75 % by
 * default) of the region, so the encoder's saves find room (issue 20, item
 * 4): past it NOT_READY (retryable), an entry already pinned costs nothing,
 * one item is granted when nothing else is pinned, and the producer's save
 * succeeds where two connections at their 50 % share left it none. */
static void test_total_pin_share(void **state)
{
    (void)state;
    next_pin_pct = 50, next_total_pin_pct = 75; /* the library's defaults */
    world *w = world_new(NULL);
    next_pin_pct = next_total_pin_pct = 0;
    char name[8];
    for (int i = 0; i < 8; i++) { /* 8 x 8 of 64 blocks: the whole region */
        snprintf(name, sizeof name, "q%d", i);
        save(w, name, 8 * BLOCK, true);
    }
    raw a = raw_dealer(w), b = raw_dealer(w), c = raw_dealer(w);
    for (int i = 0; i < 4; i++) { /* a: 32 blocks, its share */
        snprintf(name, sizeof name, "q%d", i);
        assert_int_equal(raw_ask(w, &a, name, "a"), ECX_STATUS_OK);
    }
    assert_int_equal(raw_ask(w, &b, "q4", "b"), ECX_STATUS_OK);
    assert_int_equal(raw_ask(w, &b, "q5", "b"), ECX_STATUS_OK); /* 48 = 75 % */
    assert_int_equal(raw_ask(w, &b, "q6", "b"), ECX_STATUS_NACK_NOT_READY);
    assert_int_equal(raw_ask(w, &c, "q7", "c"), ECX_STATUS_NACK_NOT_READY);
    assert_int_equal(raw_ask(w, &c, "q0", "c"), ECX_STATUS_OK); /* pinned already */
    ecxi_producer_stats ps = ecxi_producer_get_stats(w->prod);
    assert_int_equal(ps.refused_pins, 2);
    assert_int_equal(ps.nacks[ECX_STATUS_NACK_NOT_READY], 2);
    ecxi_cache_info info;
    assert_int_equal(ecxi_cache_lookup(w->P.cache, "q7", 2, &info), 0);
    assert_int_equal(info.pins, 0); /* the refused request left no pin */
    /* The encoder's own saves still find room (q6, q7 are evictable). */
    save(w, "new0", 8 * BLOCK, true);
    save(w, "new1", 8 * BLOCK, true);
    save(w, "new2", 8 * BLOCK, true);
    /* Leases end: pins drain, and the retried request is served. */
    fake_now += 30000;
    ecxi_producer_poll(w->prod);
    assert_int_equal(raw_ask(w, &c, "new2", "c"), ECX_STATUS_OK);
    zmq_close(a.sock), zmq_close(b.sock), zmq_close(c.sock);
    world_free(w);

    /* Alone, one item bigger than the share is granted. */
    next_total_pin_pct = 10;
    w = world_new(NULL);
    next_total_pin_pct = 0;
    save(w, "huge", 20 * BLOCK, true);
    save(w, "small", 1 * BLOCK, true);
    a = raw_dealer(w);
    assert_int_equal(raw_ask(w, &a, "huge", "a"), ECX_STATUS_OK);
    assert_int_equal(raw_ask(w, &a, "small", "a"), ECX_STATUS_NACK_NOT_READY);
    zmq_close(a.sock);
    world_free(w);
}

/* ---------- announcements ---------- */

static void test_announce_json(void **state)
{
    (void)state;
    char buf[160];
    size_t len = 99;
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, NULL, NULL), 0);
    assert_string_equal(buf, "{\"metadata\":{}}");
    assert_int_equal(len, 15);
    ecx_announcement a = {"10.0.0.7", 5601, 1234567};
    const char *want = "{\"peer_host\":\"10.0.0.7\",\"peer_port\":5601,\"size_bytes\":1234567,"
                       "\"metadata\":{}}";
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, &a, NULL), 0);
    assert_string_equal(buf, want);
    assert_int_equal(len, strlen(want));
    /* snprintf's contract: the full length always; without room for the
     * NUL, nothing is written. */
    memset(buf, '#', sizeof buf);
    assert_int_equal(ecxi_announce_json(buf, strlen(want), &len, &a, NULL), ECX_ERANGE);
    assert_int_equal(len, strlen(want));
    assert_int_equal(buf[0], '#');
    assert_int_equal(ecxi_announce_json(NULL, 0, &len, NULL, NULL), ECX_ERANGE);
    assert_int_equal(len, 15);
    assert_int_equal(ecxi_announce_json(buf, strlen(want) + 1, &len, &a, NULL), 0);
    assert_string_equal(buf, want);
    /* A host that is not one is refused, never escaped; so is a bad port. */
    ecx_announcement bad = {"a\"b", 1, 1};
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, &bad, NULL), ECX_EINVAL);
    bad = (ecx_announcement){"h", 0, 1};
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, &bad, NULL), ECX_EINVAL);

    /* What is written reads back the same, as text or as the struct. */
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, &a, NULL), 0);
    ecxi_announce_peer ap;
    assert_int_equal(ecxi_announce_parse(buf, NULL, 0, 0, NULL, &ap), ECX_REASON_NONE);
    assert_string_equal(ap.host, "10.0.0.7");
    assert_int_equal(ap.port, 5601);
    assert_int_equal(ap.size_bytes, 1234567);
    assert_int_equal(ecxi_announce_parse(NULL, &a, 1234567, 1234567, NULL, &ap), ECX_REASON_NONE);
    assert_int_equal(ecxi_announce_parse(NULL, &a, 1234568, 0, NULL, &ap), ECX_REASON_SIZE_MISMATCH);
    assert_int_equal(ap.size_bytes, 1234567); /* for the log */
    assert_int_equal(ecxi_announce_parse(NULL, &a, 0, 1234566, NULL, &ap), ECX_REASON_INVALID);
    assert_int_equal(ecxi_announce_parse(buf, &a, 0, 0, NULL, &ap), ECX_REASON_INVALID); /* both */

    struct {
        const char *json;
        int why;
    } cases[] = {
        {NULL, ECX_REASON_NO_PEER},
        {"{\"metadata\":{}}", ECX_REASON_NO_PEER},
        {"not json", ECX_REASON_INVALID},
        {"[1]", ECX_REASON_INVALID},
        {"{\"peer_host\":5,\"peer_port\":1,\"size_bytes\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"\",\"peer_port\":1,\"size_bytes\":1}", ECX_REASON_NO_PEER},
        {"{\"peer_host\":\"h\",\"peer_port\":1,\"peer_port\":1,\"size_bytes\":1}",
         ECX_REASON_INVALID}, /* duplicate keys: not JSON we take */
        {"{\"peer_host\":\"h\"}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":0,\"size_bytes\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":65536,\"size_bytes\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":\"1\",\"size_bytes\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":1,\"size_bytes\":0}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":1,\"size_bytes\":-5}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":1,\"size_bytes\":1.5}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"a b\",\"peer_port\":1,\"size_bytes\":1}", ECX_REASON_INVALID},
        {"{\"peer_host\":\"h\",\"peer_port\":65535,\"size_bytes\":9,\"metadata\":{}}",
         ECX_REASON_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int why = ecxi_announce_parse(cases[i].json, NULL, 0, 0, NULL, &ap);
        if (why != cases[i].why)
            fail_msg("case %zu (%s): %s, want %s", i, cases[i].json ? cases[i].json : "NULL",
                     ecx_reason_name(why), ecx_reason_name(cases[i].why));
    }
    /* The longest host is a host; one byte more is not. */
    static char host[ECXI_HOST_MAX + 2];
    memset(host, 'h', ECXI_HOST_MAX);
    ecx_announcement h = {host, 1, 1};
    assert_int_equal(ecxi_announce_parse(NULL, &h, 0, 0, NULL, &ap), ECX_REASON_NONE);
    assert_string_equal(ap.host, host);
    host[ECXI_HOST_MAX] = 'h';
    assert_int_equal(ecxi_announce_parse(NULL, &h, 0, 0, NULL, &ap), ECX_REASON_INVALID);
    assert_int_equal(ecxi_announce_json(buf, sizeof buf, &len, &h, NULL), ECX_EINVAL);
    h.peer_host = NULL;
    assert_int_equal(ecxi_announce_parse(NULL, &h, 0, 0, NULL, &ap), ECX_REASON_NO_PEER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_sizes),
        cmocka_unit_test(test_fetch_fragmented),
        cmocka_unit_test(test_total_pin_share),
        cmocka_unit_test(test_nack_missing),
        cmocka_unit_test(test_nack_incompat),
        cmocka_unit_test(test_not_ready_then_ready),
        cmocka_unit_test(test_not_ready_timeout),
        cmocka_unit_test(test_producer_checks_in_order),
        cmocka_unit_test(test_regrant_and_lease_expiry),
        cmocka_unit_test(test_producer_drops_garbage),
        cmocka_unit_test(test_consumer_validates_acks),
        cmocka_unit_test(test_every_nack_status),
        cmocka_unit_test(test_ack_timeout),
        cmocka_unit_test(test_ack_timeout_v2_retries),
        cmocka_unit_test(test_read_failed),
        cmocka_unit_test(test_quarantine),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_stale_ack_dropped),
        cmocka_unit_test(test_read_after_lease),
        cmocka_unit_test(test_grant_belongs_to_connection),
        cmocka_unit_test(test_session_id_marker),
#ifdef ECX_WITH_NIXL
        cmocka_unit_test(test_nixl_mode_forms),
#endif
        cmocka_unit_test(test_producer_lost),
        cmocka_unit_test(test_producer_restart),
        cmocka_unit_test(test_fetch_refusals),
        cmocka_unit_test(test_dead_producers_bounded),
        cmocka_unit_test(test_grant_flood_costs_the_flooder),
        cmocka_unit_test(test_pin_share),
        cmocka_unit_test(test_announce_json),
        cmocka_unit_test(test_producer_versions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
