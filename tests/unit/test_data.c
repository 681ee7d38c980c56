/* SPDX-License-Identifier: Apache-2.0 */
/* test_data — the data plane in one process: the metadata / descriptor
 * codec (round trip, every truncation, malformed fields, random
 * mutations), READs of every shape through the shm, tcp and UCX paths (one
 * block, many, non-contiguous, the whole region, a partial last block)
 * byte for byte with their notifications, the auto choice, argument
 * validation, and the fault wrapper. Two processes and two network
 * namespaces are covered by test_data_procs.sh / test_data_netns.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "checksum.h"
#include "data.h"
#include "data_fault.h"
#include "data_impl.h"
#include "grant_stub.h"
#include "region.h"
#include "util.h"

#define BS 65536u
#define NB 64u

static char dir[64];

/* ---- fixtures ---------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    strcpy(dir, "/dev/shm/ecx-test-data-XXXXXX");
    if (!mkdtemp(dir)) {
        strcpy(dir, "/tmp/ecx-test-data-XXXXXX");
        if (!mkdtemp(dir)) return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static ecxi_region *mkregion(uint64_t blocks, uint64_t bs)
{
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    assert_int_equal(ecxi_region_instance_id(id), 0);
    static int rank;
    ecxi_region *r = NULL;
    assert_int_equal(ecxi_region_create_in(dir, id, rank++, blocks * bs, bs, &r), 0);
    return r;
}

static uint8_t pat(uint64_t seed, uint64_t off)
{
    uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (off * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17));
}

static void fill(ecxi_region *r, uint64_t seed)
{
    uint8_t *b = ecxi_region_base(r);
    for (uint64_t i = 0; i < ecxi_region_size(r); i++)
        b[i] = pat(seed, i);
}

typedef struct notes {
    int n;
    char last[ECXI_DATA_NOTIF_MAX + 1];
    char all[16][64];
} notes;

static void on_notif(void *arg, const char *msg, size_t len, const uint8_t *token, int status)
{
    notes *ns = arg;
    assert_int_equal(strlen(msg), len);
    assert_memory_equal(token, STUB_TOKEN, ECXI_DATA_TOKEN_LEN);
    assert_int_equal(status, 0);
    if (ns->n < 16) snprintf(ns->all[ns->n], sizeof ns->all[0], "%s", msg);
    snprintf(ns->last, sizeof ns->last, "%s", msg);
    ns->n++;
}

/* Drive both sides until the xfer ends and `want` notifications arrived
 * (bounded: 10 s). Returns the xfer's end state. */
static int pump(ecxi_data *prod, ecxi_data *cons, ecxi_data_xfer *x, notes *ns, int want)
{
    int64_t end = ecxi_now_ms(NULL) + 10000;
    int st = ECXI_XFER_RUNNING;
    while (ecxi_now_ms(NULL) < end) {
        assert_true(ecxi_data_progress(cons, ECXI_DATA_SLICE_NS, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(prod, on_notif, ns) >= 0);
        st = ecxi_data_read_poll(x);
        if (st != ECXI_XFER_RUNNING && ns->n >= want) break;
    }
    return st;
}

typedef struct pair {
    ecxi_region *pr, *cr;
    ecxi_data *prod, *cons;
    ecxi_data_peer *peer;
    stub_grants grants; /* what the producer serves */
    char key[ECXI_DATA_NOTIF_MAX + 1]; /* of the last post() */
} pair;

static void pair_open(pair *p, int pb, int cb, uint64_t cons_bs)
{
    memset(p, 0, sizeof *p);
    p->pr = mkregion(NB, BS);
    p->cr = mkregion(NB, cons_bs);
    fill(p->pr, 7);
    ecxi_data_opts po = {.backend = pb}, co = {.backend = cb};
    assert_int_equal(ecxi_data_new_producer(p->pr, &po, &p->prod), 0);
    ecxi_data_set_grant_fn(p->prod, stub_grant_check, &p->grants);
    assert_int_equal(ecxi_data_new_consumer(p->cr, &co, &p->cons), 0);
}

/* The producer's layout descriptor (its bytes, with a throwaway ticket). */
static size_t layout(ecxi_data *prod, uint8_t *buf)
{
    long n = stub_layout(prod, buf, ECXI_DATA_DESC_MAX);
    assert_true(n > 0);
    return (size_t)n;
}

static int pair_peer(pair *p)
{
    size_t ml;
    uint8_t d[ECXI_DATA_DESC_MAX];
    const uint8_t *m = ecxi_data_agent_metadata(p->prod, &ml);
    ecxi_data_desc dd;
    assert_int_equal(ecxi_data_desc_decode(d, layout(p->prod, d), &dd), 0);
    return ecxi_data_peer_add(p->cons, m, ml, &dd, &p->peer);
}

/* Post a READ of the producer's blocks remote[] into local[] (index lists,
 * as an ack carries them: made runs here, as the consumer does) under a
 * stub grant for exactly those blocks, whose ticket carries the checksum of
 * the producer's bytes (so the READ verifies), unless `sum` overrides it.
 * pad > 0 pads the key to that length. The key goes to p->key. */
static int post_sum(pair *p, const uint64_t *remote, const uint64_t *local, size_t n,
                    uint64_t nbytes, size_t pad, const uint64_t *sum, ecxi_data_xfer **x)
{
    uint64_t bs = ecxi_region_block_bytes(p->pr);
    if (nbytes == 0) nbytes = n * bs;
    uint8_t d[ECXI_DATA_DESC_MAX], g[ECXI_DATA_DESC_MAX];
    size_t gl = layout(p->prod, g);
    uint64_t want = ecxi_checksum_blocks(ecxi_region_base(p->pr), bs, remote, n, nbytes);
    long dl = stub_desc(g, gl, nbytes, sum ? *sum : want, d, sizeof d);
    assert_true(dl > 0);
    ecxi_block_run *rr = malloc((n + 1) * sizeof *rr), *lr = malloc((n + 1) * sizeof *lr);
    assert_non_null(rr);
    assert_non_null(lr);
    size_t nr = ecxi_block_runs_of(remote, n, rr), nl = ecxi_block_runs_of(local, n, lr);
    int kl = stub_key(p->key, sizeof p->key, nbytes, rr, nr);
    assert_true(kl > 0);
    if (pad) {
        assert_true(pad >= (size_t)kl + 1 && pad <= ECXI_DATA_NOTIF_MAX);
        memset(p->key + kl, '#', pad - (size_t)kl);
        kl = (int)pad;
        p->key[kl] = 0;
    }
    ecxi_data_desc dd;
    assert_int_equal(ecxi_data_desc_decode(d, (size_t)dl, &dd), 0);
    int rc = ecxi_data_read_post(p->peer, &dd, rr, nr, lr, nl, nbytes, p->key, (size_t)kl, x);
    free(rr), free(lr);
    return rc;
}

static int post(pair *p, const uint64_t *remote, const uint64_t *local, size_t n,
                uint64_t nbytes, ecxi_data_xfer **x)
{
    return post_sum(p, remote, local, n, nbytes, 0, NULL, x);
}

static void pair_close(pair *p)
{
    ecxi_data_peer_drop(p->peer);
    ecxi_data_free(p->cons);
    ecxi_data_free(p->prod);
    ecxi_region_free(p->cr);
    ecxi_region_free(p->pr);
}

/* ---- codec ------------------------------------------------------------- */

static const uint8_t fake_addr[40] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

static void sample(ecxi_data_meta *m, ecxi_data_desc *d)
{
    memset(m, 0, sizeof *m);
    memset(d, 0, sizeof *d);
    m->nonce = d->nonce = 0x1122334455667788ull;
    m->has_shm = true;
    memset(m->boot_id, 0xab, 16);
    m->dev = 42, m->ino = 4242;
    m->path = "/dev/shm/ecx_x_0.mmap", m->path_len = strlen(m->path);
    m->sock = "ecx-ntf-1", m->sock_len = 9;
    m->has_ucx = true;
    m->ucx_addr = fake_addr, m->ucx_addr_len = sizeof fake_addr;
    m->has_tcp = true; /* encoded last: 11 bytes */
    m->tcp_family = 4, m->tcp_port = 40123;
    memcpy(m->tcp_addr, (const uint8_t[]){10, 1, 2, 3}, 4);
    d->block_bytes = BS, d->num_blocks = NB;
    d->has_ticket = true;
    memset(d->ticket.token, 0x77, ECXI_DATA_TOKEN_LEN);
    d->ticket.checksum = 0xfeedfacecafebeefull;
    d->ticket.nbytes = 3 * BS + 5;
    d->ticket.lease_ms = 30000;
}

static void test_codec_roundtrip(void **state)
{
    (void)state;
    ecxi_data_meta m, m2;
    ecxi_data_desc d, d2;
    sample(&m, &d);
    uint8_t mb[512], db[512];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
    long dl = ecxi_data_desc_encode(&d, db, sizeof db);
    assert_true(ml > 0 && ml < 200);
    assert_true(dl > 0 && dl < 140);
    assert_int_equal(ecxi_data_meta_decode(mb, (size_t)ml, &m2), 0);
    assert_int_equal(ecxi_data_desc_decode(db, (size_t)dl, &d2), 0);
    assert_true(m2.has_shm && m2.has_ucx && m2.has_tcp);
    assert_int_equal(m2.tcp_family, 4);
    assert_int_equal(m2.tcp_port, 40123);
    assert_memory_equal(m2.tcp_addr, m.tcp_addr, 4);
    assert_int_equal(m2.nonce, m.nonce);
    assert_int_equal(m2.dev, 42);
    assert_int_equal(m2.ino, 4242);
    assert_memory_equal(m2.boot_id, m.boot_id, 16);
    assert_int_equal(m2.path_len, m.path_len);
    assert_memory_equal(m2.path, m.path, m.path_len);
    assert_memory_equal(m2.sock, m.sock, m.sock_len);
    assert_int_equal(m2.ucx_addr_len, sizeof fake_addr);
    assert_memory_equal(m2.ucx_addr, fake_addr, sizeof fake_addr);
    assert_int_equal(d2.block_bytes, BS);
    assert_int_equal(d2.num_blocks, NB);
    assert_true(d2.has_ticket);
    assert_memory_equal(&d2.ticket, &d.ticket, sizeof d.ticket);
    /* IPv6, alone. */
    ecxi_data_meta m6 = {.nonce = 1, .has_tcp = true, .tcp_family = 6, .tcp_port = 1};
    m6.tcp_addr[15] = 1; /* ::1 */
    uint8_t b6[64];
    long l6 = ecxi_data_meta_encode(&m6, b6, sizeof b6);
    assert_int_equal(l6, 24 + 4 + 19);
    assert_int_equal(ecxi_data_meta_decode(b6, (size_t)l6, &m2), 0);
    assert_true(m2.has_tcp && !m2.has_shm && !m2.has_ucx);
    assert_int_equal(m2.tcp_family, 6);
    assert_int_equal(m2.tcp_port, 1);
    assert_memory_equal(m2.tcp_addr, m6.tcp_addr, 16);
    /* Nothing is encoded that the decoder would refuse. */
    m6.tcp_port = 0;
    assert_int_equal(ecxi_data_meta_encode(&m6, b6, sizeof b6), ECX_EINVAL);
    m6.tcp_port = 1, m6.tcp_family = 5;
    assert_int_equal(ecxi_data_meta_encode(&m6, b6, sizeof b6), ECX_EINVAL);
    /* Too small a buffer is ECX_ERANGE, not an overrun. */
    assert_int_equal(ecxi_data_meta_encode(&m, mb, 30), ECX_ERANGE);
    assert_int_equal(ecxi_data_desc_encode(&d, db, 30), ECX_ERANGE);
}

static void test_codec_truncated_and_flipped(void **state)
{
    (void)state;
    ecxi_data_meta m, m2;
    ecxi_data_desc d, d2;
    sample(&m, &d);
    uint8_t mb[512], db[512], tmp[512];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
    long dl = ecxi_data_desc_encode(&d, db, sizeof db);
    for (long n = 0; n < ml; n++) {
        uint8_t *h = malloc((size_t)n + 1);
        memcpy(h, mb, (size_t)n);
        assert_int_equal(ecxi_data_meta_decode(h, (size_t)n, &m2), ECX_EDATA_META);
        free(h);
    }
    for (long n = 0; n < dl; n++) {
        uint8_t *h = malloc((size_t)n + 1);
        memcpy(h, db, (size_t)n);
        assert_int_equal(ecxi_data_desc_decode(h, (size_t)n, &d2), ECX_EDATA_DESC);
        free(h);
    }
    /* Every single-bit flip either fails cleanly or leaves a well-formed
     * value (a flipped nonce, dev, path byte...), never crashes; flips in
     * the UCX blobs are always caught by their digest. */
    int refused = 0;
    for (long i = 0; i < ml; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(tmp, mb, (size_t)ml);
            tmp[i] ^= (uint8_t)(1u << bit);
            int rc = ecxi_data_meta_decode(tmp, (size_t)ml, &m2);
            if (rc) refused++;
            if (i >= ml - 11 - (long)sizeof fake_addr && i < ml - 11)
                assert_int_equal(rc, ECX_EDATA_META);
        }
    assert_true(refused > ml * 2);
    for (long i = 0; i < dl; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(tmp, db, (size_t)dl);
            tmp[i] ^= (uint8_t)(1u << bit);
            int rc = ecxi_data_desc_decode(tmp, (size_t)dl, &d2);
            /* A flipped section length never passes; a flipped token,
             * checksum or size is a well-formed (wrong) ticket, caught by
             * the grant check or the checksum, not here. */
            if (i == 42 || i == 43) assert_int_equal(rc, ECX_EDATA_DESC);
        }
}

static void test_codec_malformed(void **state)
{
    (void)state;
    ecxi_data_meta m, m2;
    ecxi_data_desc d, d2;
    sample(&m, &d);
    uint8_t mb[512], db[512], t[600];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
    long dl = ecxi_data_desc_encode(&d, db, sizeof db);

    memcpy(t, mb, (size_t)ml);
    t[4] = 1; /* the previous version (rkey-era descriptors) */
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_VERSION);
    memcpy(t, db, (size_t)dl);
    t[4] = 9;
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)dl, &d2), ECX_EDATA_VERSION);
    /* A ticket for no bytes, more bytes than the region, or no lease. */
    ecxi_data_desc bt = d;
    bt.ticket.nbytes = 0;
    long tl = ecxi_data_desc_encode(&bt, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)tl, &d2), ECX_EDATA_DESC);
    bt.ticket.nbytes = NB * BS + 1;
    tl = ecxi_data_desc_encode(&bt, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)tl, &d2), ECX_EDATA_DESC);
    bt = d;
    bt.ticket.lease_ms = 0;
    tl = ecxi_data_desc_encode(&bt, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)tl, &d2), ECX_EDATA_DESC);
    memcpy(t, mb, (size_t)ml);
    t[0] = 'X'; /* magic */
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_META);
    /* A descriptor is not metadata and vice versa. */
    assert_int_equal(ecxi_data_meta_decode(db, (size_t)dl, &m2), ECX_EDATA_META);
    assert_int_equal(ecxi_data_desc_decode(mb, (size_t)ml, &d2), ECX_EDATA_DESC);
    /* Trailing byte: total length no longer matches. */
    memcpy(t, mb, (size_t)ml);
    t[ml] = 0;
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml + 1, &m2), ECX_EDATA_META);
    /* More sections claimed than present. */
    memcpy(t, mb, (size_t)ml);
    t[6] = 4;
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_META);
    /* Fewer sections claimed than present: leftover bytes. */
    t[6] = 1;
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_META);
    /* Section length overrunning the buffer. */
    memcpy(t, mb, (size_t)ml);
    t[24 + 2] = 0xff, t[24 + 3] = 0x7f;
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_META);
    /* Reserved field set. */
    memcpy(t, mb, (size_t)ml);
    t[12] = 1;
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml, &m2), ECX_EDATA_META);
    /* An unknown section is skipped (forward compatible). */
    memcpy(t, mb, (size_t)ml);
    memcpy(t + ml, "\x09\x00\x03\x00xyz", 7);
    t[6] = 4;
    t[8] = (uint8_t)(ml + 7);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)ml + 7, &m2), 0);
    assert_true(m2.has_shm && m2.has_ucx && m2.has_tcp);
    /* A known section twice is refused. */
    ecxi_data_meta one = m;
    one.has_shm = false, one.has_tcp = false;
    long ol = ecxi_data_meta_encode(&one, t, sizeof t);
    memcpy(t + ol, t + 24, (size_t)(ol - 24));
    t[6] = 2;
    t[8] = (uint8_t)(ol + ol - 24);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)(ol + ol - 24), &m2), ECX_EDATA_META);
    /* Path must be absolute, without NUL. */
    ecxi_data_meta bad = m;
    bad.path = "rel/path", bad.path_len = 8;
    long bl = ecxi_data_meta_encode(&bad, t, sizeof t);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)bl, &m2), ECX_EDATA_META);
    bad.path = "/a\0b", bad.path_len = 4;
    bl = ecxi_data_meta_encode(&bad, t, sizeof t);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)bl, &m2), ECX_EDATA_META);
    /* Descriptor layouts that cannot be. */
    ecxi_data_desc bd = d;
    bd.block_bytes = 0;
    bl = ecxi_data_desc_encode(&bd, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)bl, &d2), ECX_EDATA_DESC);
    bd = d, bd.num_blocks = 0;
    bl = ecxi_data_desc_encode(&bd, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)bl, &d2), ECX_EDATA_DESC);
    bd = d, bd.num_blocks = 1ull << 40;
    bl = ecxi_data_desc_encode(&bd, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)bl, &d2), ECX_EDATA_DESC);
    bd = d, bd.block_bytes = 1ull << 62, bd.num_blocks = 8;
    bl = ecxi_data_desc_encode(&bd, t, sizeof t);
    assert_int_equal(ecxi_data_desc_decode(t, (size_t)bl, &d2), ECX_EDATA_DESC);
    /* tcp sections that cannot be: an unknown family or one whose length
     * does not fit it, port 0, an address that is not unicast, the
     * section one byte short or long, twice. */
    ecxi_data_meta tm = {.nonce = 9, .has_tcp = true, .tcp_family = 4, .tcp_port = 80};
    memcpy(tm.tcp_addr, (const uint8_t[]){192, 168, 1, 2}, 4);
    long tl4 = ecxi_data_meta_encode(&tm, t, sizeof t);
    assert_int_equal(tl4, 24 + 4 + 7); /* section body at 28: family, port, address */
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)tl4, &m2), 0);
    static const uint8_t bad_body[][7] = {
        {6, 80, 0, 192, 168, 1, 2},   {0, 80, 0, 192, 168, 1, 2}, {5, 80, 0, 192, 168, 1, 2},
        {4, 0, 0, 192, 168, 1, 2},    {4, 80, 0, 0, 0, 0, 0},     {4, 80, 0, 224, 0, 0, 1},
        {4, 80, 0, 255, 255, 255, 255}};
    for (size_t i = 0; i < sizeof bad_body / sizeof bad_body[0]; i++) {
        uint8_t u[64];
        memcpy(u, t, (size_t)tl4);
        memcpy(u + 28, bad_body[i], 7);
        assert_int_equal(ecxi_data_meta_decode(u, (size_t)tl4, &m2), ECX_EDATA_META);
    }
    for (int delta = -1; delta <= 1; delta += 2) {
        uint8_t u[64] = {0};
        memcpy(u, t, (size_t)tl4);
        size_t nl = (size_t)(tl4 + delta);
        u[26] = (uint8_t)(7 + delta);
        u[8] = (uint8_t)nl;
        assert_int_equal(ecxi_data_meta_decode(u, nl, &m2), ECX_EDATA_META);
    }
    {
        uint8_t u[96];
        memcpy(u, t, (size_t)tl4);
        memcpy(u + tl4, t + 24, 11);
        u[6] = 2;
        u[8] = (uint8_t)(tl4 + 11);
        assert_int_equal(ecxi_data_meta_decode(u, (size_t)tl4 + 11, &m2), ECX_EDATA_META);
    }
    tm.tcp_family = 6; /* :: and ff02::1 */
    memset(tm.tcp_addr, 0, 16);
    tl4 = ecxi_data_meta_encode(&tm, t, sizeof t);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)tl4, &m2), ECX_EDATA_META);
    tm.tcp_addr[0] = 0xff, tm.tcp_addr[1] = 2, tm.tcp_addr[15] = 1;
    tl4 = ecxi_data_meta_encode(&tm, t, sizeof t);
    assert_int_equal(ecxi_data_meta_decode(t, (size_t)tl4, &m2), ECX_EDATA_META);
    /* NULL and empty input. */
    assert_int_equal(ecxi_data_meta_decode(NULL, 0, &m2), ECX_EDATA_META);
    assert_int_equal(ecxi_data_desc_decode(NULL, 0, &d2), ECX_EDATA_DESC);
}

/* ---- fetches ----------------------------------------------------------- */

typedef struct fcase {
    const char *name;
    size_t n;
    uint64_t remote[NB], local[NB];
    uint64_t nbytes; /* 0 = whole blocks */
} fcase;

static void check_case(pair *p, const fcase *c)
{
    const uint8_t *src = ecxi_region_base(p->pr), *dst = ecxi_region_base(p->cr);
    uint64_t left = c->nbytes ? c->nbytes : c->n * BS;
    for (size_t i = 0; i < c->n; i++) {
        uint64_t len = left < BS ? left : BS;
        assert_memory_equal(dst + c->local[i] * BS, src + c->remote[i] * BS, len);
        /* Past the encoding's end the local block is untouched. */
        for (uint64_t j = len; j < BS; j++)
            assert_int_equal(dst[c->local[i] * BS + j], 0xee);
        left -= len;
    }
}

static void run_cases(int pb, int cb, const char *want_path)
{
    pair p;
    pair_open(&p, pb, cb, BS);
    assert_int_equal(pair_peer(&p), 0);
    assert_string_equal(ecxi_data_peer_backend(p.peer), want_path);

    static fcase cs[5];
    memset(cs, 0, sizeof cs);
    cs[0] = (fcase){.name = "one", .n = 1, .remote = {5}, .local = {9}, .nbytes = 1000};
    cs[1].name = "many", cs[1].n = 20;
    for (int i = 0; i < 20; i++)
        cs[1].remote[i] = 10 + i, cs[1].local[i] = i;
    cs[2] = (fcase){.name = "scattered",
                    .n = 6,
                    .remote = {3, 40, 41, 42, 7, 63},
                    .local = {50, 1, 2, 3, 60, 10},
                    .nbytes = 5 * BS + 123};
    cs[3].name = "largest", cs[3].n = NB;
    for (unsigned i = 0; i < NB; i++)
        cs[3].remote[i] = i, cs[3].local[i] = i;
    cs[4].name = "reversed", cs[4].n = NB, cs[4].nbytes = NB * BS - 1;
    for (unsigned i = 0; i < NB; i++)
        cs[4].remote[i] = i, cs[4].local[i] = NB - 1 - i;

    notes ns = {0};
    for (int k = 0; k < 5; k++) {
        memset(ecxi_region_base(p.cr), 0xee, ecxi_region_size(p.cr));
        ecxi_data_xfer *x = NULL;
        assert_int_equal(post(&p, cs[k].remote, cs[k].local, cs[k].n, cs[k].nbytes, &x), 0);
        assert_int_equal(pump(p.prod, p.cons, x, &ns, k + 1), ECXI_XFER_DONE);
        check_case(&p, &cs[k]);
        assert_int_equal(ns.n, k + 1);
        assert_string_equal(ns.last, p.key);
        ecxi_data_read_release(x);
    }
    pair_close(&p);
}

static void test_fetch_shm(void **state)
{
    (void)state;
    run_cases(ECX_DATA_SHM, ECX_DATA_SHM, "shm");
}

#ifdef ECX_WITH_UCX
static void test_fetch_ucx(void **state)
{
    (void)state;
    run_cases(ECX_DATA_UCX, ECX_DATA_UCX, "ucx");
}

static void test_fetch_ucx_tcp(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1);
    run_cases(ECX_DATA_UCX, ECX_DATA_UCX, "ucx");
    unsetenv("UCX_TLS");
}
#endif

static void test_fetch_tcp(void **state)
{
    (void)state;
    run_cases(ECX_DATA_TCP, ECX_DATA_TCP, "tcp");
}

static void test_auto_choice(void **state)
{
    (void)state;
    run_cases(ECX_DATA_AUTO, ECX_DATA_AUTO, "shm"); /* same host: memcpy path */
    run_cases(ECX_DATA_AUTO, ECX_DATA_TCP, "tcp");  /* forced */
    run_cases(ECX_DATA_TCP, ECX_DATA_AUTO, "tcp");  /* producer offers only tcp */
#ifdef ECX_WITH_UCX
    run_cases(ECX_DATA_UCX, ECX_DATA_AUTO, "ucx");  /* producer offers only ucx */
#endif
    /* An auto producer publishes shm and tcp, never UCX. */
    pair p;
    pair_open(&p, ECX_DATA_AUTO, ECX_DATA_AUTO, BS);
    size_t ml;
    ecxi_data_meta m;
    const uint8_t *mb = ecxi_data_agent_metadata(p.prod, &ml);
    assert_int_equal(ecxi_data_meta_decode(mb, ml, &m), 0);
    assert_true(m.has_shm && m.has_tcp && !m.has_ucx);
    pair_close(&p);
    /* Nothing in common: no path. */
    static const int none[][2] = {
#ifdef ECX_WITH_UCX
                                  {ECX_DATA_SHM, ECX_DATA_UCX},
                                  {ECX_DATA_AUTO, ECX_DATA_UCX},
                                  {ECX_DATA_UCX, ECX_DATA_TCP},
#endif
                                  {ECX_DATA_TCP, ECX_DATA_SHM}};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        pair_open(&p, none[i][0], none[i][1], BS);
        assert_int_equal(pair_peer(&p), ECX_EDATA_NOPATH);
        assert_null(p.peer);
        pair_close(&p);
    }
}

/* ---- validation -------------------------------------------------------- */

static void test_validation(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, ECX_DATA_AUTO, ECX_DATA_AUTO, BS);
    assert_int_equal(pair_peer(&p), 0);
    ecxi_data_xfer *x = (ecxi_data_xfer *)1;
    uint8_t g[ECXI_DATA_DESC_MAX], d[ECXI_DATA_DESC_MAX];
    size_t gl = layout(p.prod, g);
    long dl2 = stub_desc(g, gl, 2 * BS, 0, d, sizeof d); /* a ticket for 2 blocks */
    assert_true(dl2 > 0);
    ecxi_data_desc dd, gd, junk;
    assert_int_equal(ecxi_data_desc_decode(d, (size_t)dl2, &dd), 0);
    assert_int_equal(ecxi_data_desc_decode(g, gl, &gd), 0);
    const ecxi_block_run r1 = {NB, 1}, l1 = {0, 1}, r2 = {0, 2}, l2[2] = {{0, 1}, {NB, 1}};
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &r1, 1, &l1, 1, BS, "a:b", 3, &x),
                     ECX_EDATA_MISMATCH); /* the ticket says 2 blocks' worth */
    assert_null(x);
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &r2, 1, l2, 2, 0, "a:b", 3, &x),
                     ECX_EDATA_INDEX);
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &r2, 0, &l1, 0, 0, "a:b", 3, &x),
                     ECX_EDATA_COUNT);
    /* An ack's indices as runs: consecutive ones merged, in order. */
    const uint64_t wire[6] = {3, 4, 5, 9, 2, 3};
    ecxi_block_run runs[6];
    assert_int_equal(ecxi_block_runs_of(wire, 6, runs), 3);
    assert_true(runs[0].first == 3 && runs[0].count == 3 && runs[1].first == 9 &&
                runs[1].count == 1 && runs[2].first == 2 && runs[2].count == 2);
    assert_int_equal(ecxi_block_runs_of(wire, 0, runs), 0);
    const ecxi_block_run ok = {0, 2}, one = {0, 1}, empty[2] = {{0, 0}, {0, 2}};
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &one, 1, &one, 1, 0, "a:b", 3, &x),
                     ECX_EDATA_COUNT);
    /* The two sides name as many blocks, or the READ is no READ; no run is empty. */
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &ok, 1, &one, 1, 0, "a:b", 3, &x),
                     ECX_EDATA_COUNT);
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &ok, 1, empty, 2, 0, "a:b", 3, &x),
                     ECX_EDATA_INDEX);
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &ok, 1, &ok, 1, 0, "", 0, &x),
                     ECX_EDATA_NOTIF);
    static char big[ECXI_DATA_NOTIF_MAX + 1];
    memset(big, 'x', sizeof big);
    assert_int_equal(ecxi_data_read_post(p.peer, &dd, &ok, 1, &ok, 1, 0, big, sizeof big, &x),
                     ECX_EDATA_NOTIF);
    /* A descriptor without a ticket, none, or garbage, is no grant. */
    ecxi_data_desc nt = gd;
    nt.has_ticket = false;
    assert_int_equal(ecxi_data_read_post(p.peer, &nt, &ok, 1, &ok, 1, 0, "a:b", 3, &x),
                     ECX_EDATA_DESC);
    assert_int_equal(ecxi_data_desc_decode(g, 40, &junk), ECX_EDATA_DESC); /* cut short */
    assert_int_equal(ecxi_data_read_post(p.peer, NULL, &ok, 1, &ok, 1, 0, "a:b", 3, &x),
                     ECX_EDATA_DESC);
    assert_int_equal(ecxi_data_desc_decode((const uint8_t *)"junk", 4, &junk), ECX_EDATA_DESC);
    /* The longest key is fine. */
    notes ns = {0};
    const uint64_t blocks[2] = {0, 1};
    assert_int_equal(post_sum(&p, blocks, blocks, 2, 0, ECXI_DATA_NOTIF_MAX, NULL, &x), 0);
    assert_int_equal(pump(p.prod, p.cons, x, &ns, 1), ECXI_XFER_DONE);
    assert_int_equal(strlen(ns.last), ECXI_DATA_NOTIF_MAX);
    ecxi_data_read_release(x);

    /* Roles. */
    assert_int_equal(ecxi_data_poll_notifs(p.cons, on_notif, &ns), ECX_EROLE);
    size_t ml;
    const uint8_t *m = ecxi_data_agent_metadata(p.prod, &ml);
    ecxi_data_peer *q = NULL;
    assert_int_equal(ecxi_data_peer_add(p.prod, m, ml, &gd, &q), ECX_EROLE);
    assert_int_equal(ecxi_data_peer_add(p.cons, m, ml, NULL, &q), ECX_EDATA_DESC);
    assert_true(ml < 512 && gl < 256); /* a few hundred bytes, whatever the region */

    /* Same bytes: same producer; another producer's metadata is not. */
    assert_true(ecxi_data_peer_same(p.peer, m, ml));
    pair o;
    pair_open(&o, ECX_DATA_AUTO, ECX_DATA_AUTO, BS);
    size_t oml;
    uint8_t od[ECXI_DATA_DESC_MAX];
    size_t odl = layout(o.prod, od);
    const uint8_t *om = ecxi_data_agent_metadata(o.prod, &oml);
    assert_false(ecxi_data_peer_same(p.peer, om, oml));
    /* A descriptor from another producer does not go with this metadata,
     * neither to register nor to read. */
    ecxi_data_desc odd;
    assert_int_equal(ecxi_data_desc_decode(od, odl, &odd), 0);
    assert_int_equal(ecxi_data_peer_add(p.cons, m, ml, &odd, &q), ECX_EDATA_MISMATCH);
    assert_null(q);
    long odl2 = stub_desc(od, odl, 2 * BS, 0, d, sizeof d);
    assert_true(odl2 > 0);
    assert_int_equal(ecxi_data_desc_decode(d, (size_t)odl2, &odd), 0);
    assert_int_equal(ecxi_data_read_post(p.peer, &odd, &ok, 1, &ok, 1, 0, "a:b", 3, &x),
                     ECX_EDATA_MISMATCH);
    pair_close(&o);
    pair_close(&p);

    /* Block sizes must agree. */
    pair_open(&p, ECX_DATA_AUTO, ECX_DATA_AUTO, BS / 2);
    assert_int_equal(pair_peer(&p), ECX_EDATA_MISMATCH);
    pair_close(&p);

    int b;
    assert_int_equal(ecxi_data_backend_parse("shm", &b), 0);
    assert_int_equal(b, ECX_DATA_SHM);
    assert_int_equal(ecxi_data_backend_parse("ucx", &b), 0);
    assert_int_equal(b, ECX_DATA_UCX);
    assert_int_equal(ecxi_data_backend_parse("tcp", &b), 0);
    assert_int_equal(b, ECX_DATA_TCP);
    assert_string_equal(ecxi_data_backend_name(ECX_DATA_TCP), "tcp");
    assert_int_equal(ecxi_data_backend_parse("rdma", &b), ECX_EINVAL);
    /* ecx.h's printed list is data.h's, in its order; every value has a
     * name that parses back to it. */
    char list[64] = "";
    for (int k = 0; k < ECXI_DATA_BACKEND_COUNT; k++) {
        assert_int_equal(ecxi_data_backend_parse(ecxi_data_backend_name(k), &b), 0);
        assert_int_equal(b, k);
    }
#define JOIN_(name, v, str) strcat(strcat(list, *list ? ", " : ""), str);
    ECXI_DATA_BACKENDS(JOIN_)
#undef JOIN_
    assert_string_equal(list, ECX_DATA_PATHS);
    assert_string_equal(ecxi_data_backend_name(ECXI_DATA_BACKEND_COUNT), "unknown");
    ecxi_data_opts bad = {.backend = 9};
    ecxi_data *bd = NULL;
    ecxi_region *r = mkregion(2, BS);
    assert_int_equal(ecxi_data_new_producer(r, &bad, &bd), ECX_EINVAL);
    ecxi_region_free(r);
}

/* Random damage to real metadata and descriptors through the public
 * call: always a clean error or a usable peer, never a crash. */
static void test_peer_add_mutations(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, ECX_DATA_AUTO, ECX_DATA_SHM, BS);
    size_t ml, dl;
    uint8_t d[ECXI_DATA_DESC_MAX];
    const uint8_t *m = ecxi_data_agent_metadata(p.prod, &ml);
    dl = layout(p.prod, d);
    uint8_t *tm = malloc(ml), *td = malloc(dl);
    srand(1234);
    int refused = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(tm, m, ml);
        memcpy(td, d, dl);
        int flips = 1 + rand() % 3;
        for (int f = 0; f < flips; f++) {
            if (rand() % 2)
                tm[(size_t)rand() % ml] ^= (uint8_t)(1 + rand() % 255);
            else
                td[(size_t)rand() % dl] ^= (uint8_t)(1 + rand() % 255);
        }
        size_t cut_m = rand() % 8 == 0 ? (size_t)rand() % ml : ml;
        ecxi_data_peer *q = NULL;
        ecxi_data_desc tdd;
        int rc = ecxi_data_desc_decode(td, dl, &tdd);
        if (rc == 0) rc = ecxi_data_peer_add(p.cons, tm, cut_m, &tdd, &q);
        assert_true(rc <= 0);
        if (rc == 0)
            ecxi_data_peer_drop(q);
        else
            refused++;
    }
    assert_true(refused > 2000);
    free(tm);
    free(td);
    pair_close(&p);
}

/* ---- bounded slices (data.h) ------------------------------------------ */

#define BIG_NB 1024u /* 64 MiB of 64 KiB blocks: 256 chunks */

static void big_open_bg(pair *p, int backend, bool background)
{
    memset(p, 0, sizeof *p);
    p->pr = mkregion(BIG_NB, BS);
    p->cr = mkregion(BIG_NB, BS);
    uint64_t *w = (uint64_t *)ecxi_region_base(p->pr);
    for (uint64_t i = 0; i < ecxi_region_size(p->pr) / 8; i++)
        w[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
    memset(ecxi_region_base(p->cr), 0xab, ecxi_region_size(p->cr));
    ecxi_data_opts o = {.backend = backend}, co = {.backend = backend, .background = background};
    assert_int_equal(ecxi_data_new_producer(p->pr, &o, &p->prod), 0);
    ecxi_data_set_grant_fn(p->prod, stub_grant_check, &p->grants);
    assert_int_equal(ecxi_data_new_consumer(p->cr, &co, &p->cons), 0);
    assert_int_equal(pair_peer(p), 0);
}

static void big_open(pair *p, int backend)
{
    big_open_bg(p, backend, false);
}

static ecxi_data_stats stats_of(ecxi_data *d)
{
    ecxi_data_stats st;
    memset(&st, 0, sizeof st);
    ecxi_data_get_stats(d, &st);
    return st;
}

/* Is dst[from, to) still the fill byte? */
static bool untouched(const uint8_t *dst, uint64_t from, uint64_t to)
{
    for (uint64_t i = from; i < to; i++)
        if (dst[i] != 0xab) return false;
    return true;
}

/* A 64 MiB item in two runs (the second one wrapping to the start of the
 * consumer's region), a partial last block: it completes only over many
 * progress calls, none of which moves more than one chunk with a budget of
 * 0; the bytes and the checksum are right. */
static void sliced_fetch(int backend)
{
    pair p;
    big_open(&p, backend);
    static uint64_t r[BIG_NB], l[BIG_NB];
    for (unsigned i = 0; i < BIG_NB; i++)
        r[i] = i, l[i] = (i + 17) % BIG_NB;
    const uint64_t nbytes = (uint64_t)BIG_NB * BS - 1000;
    ecxi_data_xfer *x = NULL;
    notes ns = {0};
    assert_int_equal(post(&p, r, l, BIG_NB, nbytes, &x), 0);
    /* The post moved nothing. */
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_RUNNING);
    assert_true(untouched(ecxi_region_base(p.cr), 0, ecxi_region_size(p.cr)));
    uint64_t calls = 0, moving = 0;
    int64_t end = ecxi_now_ms(NULL) + 60000;
    int st;
    while ((st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < end) {
        uint64_t before = stats_of(p.cons).slice_bytes;
        bool more = false;
        assert_true(ecxi_data_progress(p.cons, 0, &more) >= 0);
        uint64_t moved = stats_of(p.cons).slice_bytes - before;
        assert_true(moved <= ECXI_DATA_CHUNK);
        calls++;
        moving += moved > 0;
        /* shm: once the region is here (one handshake), every call
         * copies, and says more (arm too) until the last chunk. */
        if (backend == ECX_DATA_SHM && moving > 1) assert_true(moved > 0);
        if (backend == ECX_DATA_SHM && moved && ecxi_data_read_poll(x) == ECXI_XFER_RUNNING) {
            assert_true(more);
            assert_int_equal(ecxi_data_arm(p.cons), 1);
        }
        assert_true(ecxi_data_poll_notifs(p.prod, on_notif, &ns) >= 0);
    }
    assert_int_equal(st, ECXI_XFER_DONE);
    ecxi_data_stats cs = stats_of(p.cons);
    assert_int_equal(cs.slice_bytes, nbytes);
    assert_true(cs.slice_max_bytes <= ECXI_DATA_CHUNK);
    assert_true(moving >= nbytes / ECXI_DATA_CHUNK);
    assert_true(calls >= nbytes / ECXI_DATA_CHUNK);
    if (backend == ECX_DATA_SHM) {
        assert_int_equal(cs.slices, (nbytes + ECXI_DATA_CHUNK - 1) / ECXI_DATA_CHUNK);
        assert_int_equal(ecxi_data_arm(p.cons), 0); /* nothing left: safe to sleep */
    } else {
        /* The producer sent it over many calls too, a chunk per send. */
        ecxi_data_stats ps = stats_of(p.prod);
        assert_int_equal(ps.slice_bytes, nbytes);
        assert_true(ps.slices >= 2);
    }
    const uint8_t *src = ecxi_region_base(p.pr), *dst = ecxi_region_base(p.cr);
    uint64_t head = (uint64_t)(BIG_NB - 17) * BS; /* first run: r 0.. -> l 17.. */
    assert_memory_equal(dst + 17 * BS, src, head);
    assert_memory_equal(dst, src + head, nbytes - head);
    assert_true(untouched(dst, nbytes - head, 17 * BS));
    ecxi_data_read_release(x);
    /* Its completion reaches the producer. */
    for (int i = 0; i < 1000 && ns.n < 1; i++) {
        ecxi_data_poll_notifs(p.prod, on_notif, &ns);
        ecxi_data_progress(p.cons, ECXI_DATA_SLICE_NS, NULL);
    }
    assert_int_equal(ns.n, 1);
    pair_close(&p);
}

static void test_sliced_shm(void **state)
{
    (void)state;
    sliced_fetch(ECX_DATA_SHM);
}

static void test_sliced_tcp(void **state)
{
    (void)state;
    sliced_fetch(ECX_DATA_TCP);
}

/* Progress with a budget of 0 (one chunk of copy or of pre-fault per call)
 * until x is done and its completion has reached the producer. */
static void finish(pair *p, ecxi_data_xfer *x, notes *ns)
{
    int want = ns->n + 1;
    for (int i = 0; i < 100000 && (ecxi_data_read_poll(x) == ECXI_XFER_RUNNING || ns->n < want);
         i++) {
        assert_true(ecxi_data_progress(p->cons, 0, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p->prod, on_notif, ns) >= 0);
    }
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_DONE);
    assert_int_equal(ns->n, want);
    ecxi_data_read_release(x);
}

/* Pre-faulting a producer's mapping (data_shm.c). In a background context
 * arm says 1 after the first READ until the whole mapping is in, each call
 * (budget 0) faulting in a chunk and moving no bytes; a READ posted
 * meanwhile goes first and is right; a dropped peer leaves nothing to do.
 * Without background arm says 0 once the READ is done: an engine's poll
 * is not kept busy for it. */
static void prefault(bool background, bool drop)
{
    pair p;
    big_open_bg(&p, ECX_DATA_SHM, background);
    notes ns = {0};
    static uint64_t r[64], l[64];
    for (unsigned i = 0; i < 64; i++)
        r[i] = 100 + i, l[i] = 1 + i;
    ecxi_data_xfer *x = NULL;
    assert_int_equal(post(&p, r, l, 1, 0, &x), 0);
    finish(&p, x, &ns);
    if (!background) {
        assert_int_equal(ecxi_data_arm(p.cons), 0);
        pair_close(&p);
        return;
    }
    const uint64_t chunks = (uint64_t)BIG_NB * BS / ECXI_DATA_CHUNK;
    uint64_t calls = 0;
    bool posted = false;
    while (ecxi_data_arm(p.cons) == 1 && calls < 4 * chunks) {
        if (calls == chunks / 4 && drop) {
            ecxi_data_peer_drop(p.peer);
            p.peer = NULL;
            assert_int_equal(ecxi_data_arm(p.cons), 0);
            break;
        }
        if (calls == chunks / 4 && !posted) { /* goes first, and is right */
            posted = true;
            uint64_t before = stats_of(p.cons).slice_bytes;
            assert_int_equal(post(&p, r, l, 64, 0, &x), 0);
            assert_true(ecxi_data_progress(p.cons, 0, NULL) >= 0);
            assert_int_equal(stats_of(p.cons).slice_bytes, before + ECXI_DATA_CHUNK);
            finish(&p, x, &ns);
            assert_memory_equal(ecxi_region_base(p.cr) + BS, ecxi_region_base(p.pr) + 100 * BS,
                                64 * BS);
            continue;
        }
        uint64_t before = stats_of(p.cons).slice_bytes;
        assert_true(ecxi_data_progress(p.cons, 0, NULL) >= 0);
        assert_int_equal(stats_of(p.cons).slice_bytes, before);
        calls++;
    }
    assert_int_equal(ecxi_data_arm(p.cons), 0);
    if (!drop) {
        assert_true(posted);
        assert_true(calls >= chunks / 2 && calls <= chunks);
    }
    pair_close(&p);
}

static void test_prefault_background(void **state)
{
    (void)state;
    prefault(true, false);
}

static void test_prefault_background_drop(void **state)
{
    (void)state;
    prefault(true, true);
}

static void test_prefault_foreground(void **state)
{
    (void)state;
    prefault(false, false);
}

/* Released, or its peer dropped, in the middle of the copy: nothing is
 * written after that (the destination past what was moved is untouched),
 * and the next READ on the peer works. */
/* A completion of any status (a dropped tcp connection fails its send). */
static void on_any_notif(void *arg, const char *msg, size_t len, const uint8_t *token, int status)
{
    (void)msg, (void)len, (void)token, (void)status;
    ((notes *)arg)->n++;
}

/* issue 20: the session lets a grant go while its 64 MiB send runs (its
 * consumer reads slowly): ecxi_data_cut finds the send, the failed end is
 * reported, and once it is, nothing reads the producer's blocks: bytes
 * written there afterwards never reach the consumer, whose READ fails. */
static void cut_send(int backend)
{
    pair p;
    big_open(&p, backend);
    static uint64_t all[BIG_NB];
    for (unsigned i = 0; i < BIG_NB; i++)
        all[i] = i;
    ecxi_data_xfer *x = NULL;
    assert_int_equal(post(&p, all, all, BIG_NB, 0, &x), 0);
    notes ns = {0};
    int cut = 0;
    for (int64_t end = ecxi_now_ms(NULL) + 5000; !cut && ecxi_now_ms(NULL) < end;) {
        assert_true(ecxi_data_progress(p.cons, 0, NULL) >= 0); /* one chunk: slow */
        assert_true(ecxi_data_poll_notifs(p.prod, on_any_notif, &ns) >= 0);
        cut = ecxi_data_cut(p.prod, p.key, strlen(p.key), STUB_TOKEN);
    }
    assert_int_equal(cut, 1);
    assert_int_equal(ns.n, 0);
    /* cut again: tcp has closed it (nothing runs); UCX's send runs until it ends */
    assert_int_equal(ecxi_data_cut(p.prod, p.key, strlen(p.key), STUB_TOKEN),
                     backend == ECX_DATA_TCP ? 0 : 1);
    for (int64_t end = ecxi_now_ms(NULL) + 5000; !ns.n && ecxi_now_ms(NULL) < end;)
        assert_true(ecxi_data_poll_notifs(p.prod, on_any_notif, &ns) >= 0);
    assert_int_equal(ns.n, 1); /* the end, reported: now the session may unpin */
    memset(ecxi_region_base(p.pr), 0x5a, ecxi_region_size(p.pr)); /* a new save */
    int st = ECXI_XFER_RUNNING;
    for (int64_t end = ecxi_now_ms(NULL) + 10000;
         st == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < end;) {
        assert_true(ecxi_data_progress(p.cons, ECXI_DATA_SLICE_NS, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p.prod, on_any_notif, &ns) >= 0);
        st = ecxi_data_read_poll(x);
    }
    assert_int_equal(st, ECXI_XFER_FAILED);
    const uint8_t *dst = ecxi_region_base(p.cr);
    for (uint64_t i = 0; i < ecxi_region_size(p.cr); i += 4096)
        assert_int_not_equal(dst[i], 0x5a); /* nothing of the new save arrived */
    ecxi_data_read_release(x);
    pair_close(&p);
}

static void test_cut_tcp(void **state)
{
    (void)state;
    cut_send(ECX_DATA_TCP);
}

#ifdef ECX_WITH_UCX
static void test_cut_ucx(void **state)
{
    (void)state;
    cut_send(ECX_DATA_UCX);
}
#endif

static void sliced_stop(int backend, bool drop)
{
    pair p;
    big_open(&p, backend);
    static uint64_t all[BIG_NB];
    for (unsigned i = 0; i < BIG_NB; i++)
        all[i] = i;
    const uint64_t nbytes = (uint64_t)BIG_NB * BS;
    ecxi_data_xfer *x = NULL;
    notes ns = {0};
    assert_int_equal(post(&p, all, all, BIG_NB, nbytes, &x), 0);
    for (int i = 0; i < 2000 && stats_of(p.cons).slice_bytes < 10 * ECXI_DATA_CHUNK; i++) {
        ecxi_data_progress(p.cons, 0, NULL);
        ecxi_data_poll_notifs(p.prod, on_any_notif, &ns);
    }
    uint64_t got = stats_of(p.cons).slice_bytes;
    assert_true(got >= 10 * ECXI_DATA_CHUNK && got < nbytes / 2);
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_RUNNING);
    if (drop) {
        ecxi_data_peer_drop(p.peer);
        p.peer = NULL;
        assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_FAILED);
    }
    ecxi_data_read_release(x);
    const uint8_t *src = ecxi_region_base(p.pr), *dst = ecxi_region_base(p.cr);
    for (int i = 0; i < 3000; i++) {
        ecxi_data_progress(p.cons, ECXI_DATA_SLICE_NS, NULL);
        ecxi_data_poll_notifs(p.prod, on_any_notif, &ns);
    }
    if (backend == ECX_DATA_SHM) assert_int_equal(ecxi_data_arm(p.cons), 0);
    /* What was moved is the item's prefix; nothing past it was written. */
    uint64_t after = stats_of(p.cons).slice_bytes;
    assert_memory_equal(dst, src, got);
    if (backend == ECX_DATA_SHM) assert_int_equal(after, got); /* the copy stopped */
    assert_true(untouched(dst, got, nbytes));
    /* The same peer (or a new one) serves the next READ. */
    if (drop) assert_int_equal(pair_peer(&p), 0);
    uint64_t r2[2] = {5, 6}, l2[2] = {900, 901};
    assert_int_equal(post(&p, r2, l2, 2, 0, &x), 0);
    assert_int_equal(pump(p.prod, p.cons, x, &ns, ns.n + 1), ECXI_XFER_DONE);
    assert_memory_equal(dst + 900 * BS, src + 5 * BS, 2 * BS);
    ecxi_data_read_release(x);
    pair_close(&p);
}

static void test_sliced_release_shm(void **state)
{
    (void)state;
    sliced_stop(ECX_DATA_SHM, false);
}

static void test_sliced_release_tcp(void **state)
{
    (void)state;
    sliced_stop(ECX_DATA_TCP, false);
}

static void test_sliced_drop_shm(void **state)
{
    (void)state;
    sliced_stop(ECX_DATA_SHM, true);
}

static void test_sliced_drop_tcp(void **state)
{
    (void)state;
    sliced_stop(ECX_DATA_TCP, true);
}

/* A byte of the producer's region changes while the item is on its way
 * (after the first slices, before its part is moved): CORRUPT, never
 * DONE, although every slice on its own went well. */
static void sliced_corrupt(int backend)
{
    pair p;
    big_open(&p, backend);
    static uint64_t all[BIG_NB];
    for (unsigned i = 0; i < BIG_NB; i++)
        all[i] = i;
    const uint64_t nbytes = (uint64_t)BIG_NB * BS;
    ecxi_data_xfer *x = NULL;
    notes ns = {0};
    assert_int_equal(post(&p, all, all, BIG_NB, nbytes, &x), 0);
    for (int i = 0; i < 2000 && stats_of(p.cons).slice_bytes < 4 * ECXI_DATA_CHUNK; i++) {
        ecxi_data_progress(p.cons, 0, NULL);
        ecxi_data_poll_notifs(p.prod, on_notif, &ns);
    }
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_RUNNING);
    ecxi_region_base(p.pr)[nbytes - 12345] ^= 0x40; /* far past any socket buffer */
    assert_int_equal(pump(p.prod, p.cons, x, &ns, 1), ECXI_XFER_CORRUPT);
    ecxi_data_read_release(x);
    pair_close(&p);
}

static void test_sliced_corrupt_shm(void **state)
{
    (void)state;
    sliced_corrupt(ECX_DATA_SHM);
}

static void test_sliced_corrupt_tcp(void **state)
{
    (void)state;
    sliced_corrupt(ECX_DATA_TCP);
}

/* ---- UCX lifetimes ------------------------------------------------------ */
#ifdef ECX_WITH_UCX

static void test_ucx_drop_and_release_in_flight(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, ECX_DATA_UCX, ECX_DATA_UCX, BS);
    assert_int_equal(pair_peer(&p), 0);
    uint64_t all[NB];
    for (unsigned i = 0; i < NB; i++)
        all[i] = i;
    /* Released while running (the producer never progressed): the xfer is
     * reclaimed once UCX lets go of it; nothing leaks (ASan checks). */
    ecxi_data_xfer *x = NULL;
    assert_int_equal(post(&p, all, all, NB, 0, &x), 0);
    ecxi_data_read_release(x);
    /* Dropped while running: the READ ends (failed or done), never hangs. */
    assert_int_equal(post(&p, all, all, NB, 0, &x), 0);
    ecxi_data_peer_drop(p.peer);
    p.peer = NULL;
    int64_t end = ecxi_now_ms(NULL) + 10000;
    int st;
    while ((st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < end)
        ecxi_data_progress(p.cons, ECXI_DATA_SLICE_NS, NULL);
    assert_int_not_equal(st, ECXI_XFER_RUNNING);
    ecxi_data_read_release(x);
    /* A fresh registration works after that. */
    notes ns = {0};
    assert_int_equal(pair_peer(&p), 0);
    assert_int_equal(post(&p, all, all, 4, 0, &x), 0);
    assert_int_equal(pump(p.prod, p.cons, x, &ns, 1), ECXI_XFER_DONE);
    assert_string_equal(ns.last, p.key);
    ecxi_data_read_release(x);
    /* The fd and arm protocol. */
    assert_true(ecxi_data_fd(p.cons) >= 0);
    assert_true(ecxi_data_fd(p.prod) >= 0);
    assert_true(ecxi_data_arm(p.cons) >= 0);
    pair_close(&p);
}

/* ---- the UCX process (ucx_proc.h, issue 20 #5) ------------------------- */

typedef struct ends {
    int n, status;
} ends;

static void on_end(void *arg, const char *msg, size_t len, const uint8_t *token, int status)
{
    (void)msg, (void)len, (void)token;
    ((ends *)arg)->n++;
    ((ends *)arg)->status = status;
}

/* Drive both sides until x ends and *e has want ends (10 s at most). */
static int pump_ends(pair *p, ecxi_data_xfer *x, ends *e, int want)
{
    int st = ECXI_XFER_RUNNING;
    for (int64_t end = ecxi_now_ms(NULL) + 10000; ecxi_now_ms(NULL) < end;) {
        assert_true(ecxi_data_progress(p->cons, ECXI_DATA_SLICE_NS, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p->prod, on_end, e) >= 0);
        st = ecxi_data_read_poll(x);
        if (st != ECXI_XFER_RUNNING && e->n >= want) break;
    }
    return st;
}

/* A whole-region READ, then the consumer's UCX process killed under it:
 * the READ fails. */
static void kill_cons_mid_read(pair *p, const uint64_t *all)
{
    ecxi_data_xfer *x = NULL;
    ends e = {0};
    assert_int_equal(post(p, all, all, BIG_NB, 0, &x), 0);
    for (int i = 0; i < 20; i++) {
        assert_true(ecxi_data_progress(p->cons, 0, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p->prod, on_end, &e) >= 0);
    }
    int pid = ecxi_ucx_proc_pid(p->cons);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st = ECXI_XFER_RUNNING;
    for (int64_t end = ecxi_now_ms(NULL) + 5000;
         st == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < end;) {
        assert_true(ecxi_data_progress(p->cons, ECXI_DATA_SLICE_NS, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p->prod, on_end, &e) >= 0);
        st = ecxi_data_read_poll(x);
    }
    assert_int_equal(st, ECXI_XFER_FAILED);
    ecxi_data_read_release(x);
}

/* UCX runs in a process of its own: killed (what a UCX crash does) in the
 * middle of a 64 MiB send, the producer's fails the READ and reports the
 * claim's end as failed (only then may the session unpin), and a new one
 * starts, on the same address (the metadata is the same bytes), and
 * serves the same registration; the consumer's, killed in the middle of a
 * READ, fails it, and the next READ on the same peer is exact; killed so
 * a second time, its producer is refused. Neither death touches this
 * process. */
static void test_ucx_process_killed(void **state)
{
    (void)state;
    pair p;
    big_open(&p, ECX_DATA_UCX);
    static uint64_t all[BIG_NB];
    for (unsigned i = 0; i < BIG_NB; i++)
        all[i] = i;
    size_t ml;
    const uint8_t *m = ecxi_data_agent_metadata(p.prod, &ml);
    uint8_t meta[ECXI_DATA_META_MAX];
    memcpy(meta, m, ml);
    /* the producer's, mid-send */
    ecxi_data_xfer *x = NULL;
    assert_int_equal(post(&p, all, all, BIG_NB, 0, &x), 0);
    ends e = {0};
    for (int64_t end = ecxi_now_ms(NULL) + 5000; !p.grants.served && ecxi_now_ms(NULL) < end;) {
        assert_true(ecxi_data_progress(p.cons, 0, NULL) >= 0);
        assert_true(ecxi_data_poll_notifs(p.prod, on_end, &e) >= 0);
    }
    assert_int_equal(p.grants.served, 1); /* claimed: the send runs */
    int pid = ecxi_ucx_proc_pid(p.prod);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(pump_ends(&p, x, &e, 1), ECXI_XFER_FAILED);
    assert_int_equal(e.n, 1);
    assert_true(e.status < 0);
    ecxi_data_read_release(x);
    for (int64_t end = ecxi_now_ms(NULL) + 5000;
         !ecxi_ucx_proc_pid(p.prod) && ecxi_now_ms(NULL) < end;)
        assert_true(ecxi_data_poll_notifs(p.prod, on_end, &e) >= 0);
    assert_true(ecxi_ucx_proc_pid(p.prod) > 0 && ecxi_ucx_proc_pid(p.prod) != pid);
    assert_int_equal(stats_of(p.prod).ucx_agent_restarts, 1);
    m = ecxi_data_agent_metadata(p.prod, &ml);
    assert_memory_equal(m, meta, ml);
    /* the registration serves on: at most one READ fails on its dead
     * connection, the next is exact */
    int st = ECXI_XFER_FAILED;
    for (int i = 0; i < 2 && st != ECXI_XFER_DONE; i++) {
        e = (ends){0};
        assert_int_equal(post(&p, all, all, 16, 0, &x), 0);
        st = pump_ends(&p, x, &e, 1);
        ecxi_data_read_release(x);
    }
    assert_int_equal(st, ECXI_XFER_DONE);
    /* the consumer's, mid-READ */
    kill_cons_mid_read(&p, all);
    e = (ends){0};
    assert_int_equal(post(&p, all, all, BIG_NB, 0, &x), 0);
    assert_int_equal(pump_ends(&p, x, &e, 1), ECXI_XFER_DONE);
    assert_int_equal(e.status, 0);
    ecxi_data_read_release(x);
    assert_memory_equal(ecxi_region_base(p.cr), ecxi_region_base(p.pr), ecxi_region_size(p.pr));
    assert_int_equal(stats_of(p.cons).ucx_agent_restarts, 1);
    /* killed again under READs of this producer alone: it is the suspect
     * (ucx_proc.h), refused at once, no READ reaching the new process */
    kill_cons_mid_read(&p, all);
    assert_int_equal(post(&p, all, all, 4, 0, &x), ECX_EDATA_PEER);
    assert_int_equal(stats_of(p.cons).ucx_agent_restarts, 1); /* none started for it */
    pair_close(&p);
}

#endif /* ECX_WITH_UCX */

/* ---- paths not built in ------------------------------------------------ */

/* A libecx built without UCX (or NIXL) still knows the paths' names, and
 * starting one of them fails with ECX_EDATA_NOPATH (logged: "ucx is not
 * built in"); a built one starts. */
static void test_paths_built(void **state)
{
    (void)state;
    static const struct { int backend; bool built; } paths[] = {
        {ECX_DATA_AUTO, true}, {ECX_DATA_SHM, true}, {ECX_DATA_TCP, true},
#ifdef ECX_WITH_UCX
        {ECX_DATA_UCX, true},
#else
        {ECX_DATA_UCX, false},
#endif
#ifdef ECX_WITH_NIXL
        {ECX_DATA_NIXL, true},
#else
        {ECX_DATA_NIXL, false},
#endif
    };
    ecxi_region *r = mkregion(NB, BS);
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        int b = -1;
        assert_int_equal(ecxi_data_backend_parse(ecxi_data_backend_name(paths[i].backend), &b), 0);
        assert_int_equal(b, paths[i].backend);
        assert_int_equal(ecxi_data_backend_built(b), paths[i].built);
        for (int role = 0; role < 2; role++) {
            ecxi_data_opts o = {.backend = b};
            ecxi_data *d = NULL;
            int rc = role ? ecxi_data_new_consumer(r, &o, &d) : ecxi_data_new_producer(r, &o, &d);
            assert_int_equal(rc, paths[i].built ? 0 : ECX_EDATA_NOPATH);
            assert_true(paths[i].built ? d != NULL : d == NULL);
            ecxi_data_free(d);
        }
    }
    ecxi_region_free(r);
}

/* ---- faults ------------------------------------------------------------ */

static void test_fault(void **state)
{
    (void)state;
    pair p;
    pair_open(&p, ECX_DATA_AUTO, ECX_DATA_AUTO, BS);
    ecxi_data *f = NULL;
    assert_int_equal(ecxi_data_fault_wrap(p.cons, &f), 0);
    p.cons = f;
    assert_string_equal(ecxi_data_name(f), "fault");
    assert_int_equal(pair_peer(&p), 0);
    uint64_t r[3] = {4, 5, 6}, l[3] = {7, 8, 9};
    notes ns = {0};
    ecxi_data_xfer *x = NULL;

    assert_int_equal(ecxi_data_fault_set(f, ECXI_FAULT_POST_FAIL, 0, 1), 0);
    assert_int_equal(post(&p, r, l, 3, 0, &x), ECX_EDATA_FAULT);
    /* count = 1: the next post is clean. */
    assert_int_equal(post(&p, r, l, 3, 0, &x), 0);
    assert_int_equal(pump(p.prod, p.cons, x, &ns, 1), ECXI_XFER_DONE);
    ecxi_data_read_release(x);

    assert_int_equal(ecxi_data_fault_set(f, ECXI_FAULT_READ_FAIL, 0, -1), 0);
    assert_int_equal(post(&p, r, l, 3, 0, &x), 0);
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_FAILED);
    ecxi_data_read_release(x);

    assert_int_equal(ecxi_data_fault_set(f, ECXI_FAULT_HANG, 0, -1), 0);
    assert_int_equal(post(&p, r, l, 3, 0, &x), 0);
    for (int i = 0; i < 100; i++)
        ecxi_data_progress(p.cons, ECXI_DATA_SLICE_NS, NULL);
    assert_int_equal(ecxi_data_read_poll(x), ECXI_XFER_RUNNING);
    ecxi_data_read_release(x);
    /* A hung or failed READ sends no notification. */
    assert_int_equal(ecxi_data_poll_notifs(p.prod, on_notif, &ns), 0);
    assert_int_equal(ns.n, 1);

    /* skip 1, count 1: clean, corrupt (the byte flipped after the copy is
     * caught by the checksum), clean. */
    assert_int_equal(ecxi_data_fault_set(f, ECXI_FAULT_CORRUPT, 1, 1), 0);
    const uint8_t *src = ecxi_region_base(p.pr), *dst = ecxi_region_base(p.cr);
    for (int k = 0; k < 3; k++) {
        memset(ecxi_region_base(p.cr), 0, ecxi_region_size(p.cr));
        assert_int_equal(post(&p, r, l, 3, 0, &x), 0);
        assert_int_equal(pump(p.prod, p.cons, x, &ns, 2 + k),
                         k == 1 ? ECXI_XFER_CORRUPT : ECXI_XFER_DONE);
        if (k == 1) {
            assert_int_equal(dst[7 * BS], (uint8_t)(src[4 * BS] ^ 0xff));
            assert_memory_equal(dst + 7 * BS + 1, src + 4 * BS + 1, 3 * BS - 1);
        } else {
            assert_memory_equal(dst + 7 * BS, src + 4 * BS, 3 * BS);
        }
        ecxi_data_read_release(x);
    }
    assert_int_equal(ecxi_data_fault_hits(f), 4); /* one per fault armed above */
    assert_int_equal(ecxi_data_fault_set(p.prod, ECXI_FAULT_HANG, 0, 1), ECX_EINVAL);
    assert_int_equal(ecxi_data_fault_set(f, 99, 0, 1), ECX_EINVAL);
    pair_close(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_roundtrip),
        cmocka_unit_test(test_codec_truncated_and_flipped),
        cmocka_unit_test(test_codec_malformed),
        cmocka_unit_test(test_fetch_shm),
#ifdef ECX_WITH_UCX
        cmocka_unit_test(test_fetch_ucx),
        cmocka_unit_test(test_fetch_ucx_tcp),
#endif
        cmocka_unit_test(test_fetch_tcp),
        cmocka_unit_test(test_auto_choice),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_peer_add_mutations),
#ifdef ECX_WITH_UCX
        cmocka_unit_test(test_ucx_drop_and_release_in_flight),
#endif
        cmocka_unit_test(test_sliced_shm),
        cmocka_unit_test(test_sliced_tcp),
        cmocka_unit_test(test_cut_tcp),
#ifdef ECX_WITH_UCX
        cmocka_unit_test(test_cut_ucx),
        cmocka_unit_test(test_ucx_process_killed),
#endif
        cmocka_unit_test(test_sliced_release_shm),
        cmocka_unit_test(test_sliced_release_tcp),
        cmocka_unit_test(test_sliced_drop_shm),
        cmocka_unit_test(test_sliced_drop_tcp),
        cmocka_unit_test(test_sliced_corrupt_shm),
        cmocka_unit_test(test_sliced_corrupt_tcp),
        cmocka_unit_test(test_prefault_background),
        cmocka_unit_test(test_prefault_background_drop),
        cmocka_unit_test(test_prefault_foreground),
        cmocka_unit_test(test_paths_built),
        cmocka_unit_test(test_fault),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
