/* SPDX-License-Identifier: Apache-2.0 */
/* install_smoke — a program built as a user of an installed libecx would
 * build it: only <ecx.h> and `pkg-config ecx`. One process holds a producer
 * and a consumer context; an item of ~300 KB is saved, announced, fetched
 * over the data plane, loaded and compared byte for byte. Exit 0 on success.
 * Run by tests/abi/test_install.sh. */
#define _POSIX_C_SOURCE 200809L
#include <ecx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITEM_BYTES (5 * 65536) /* whole blocks: the default protocol version 2 saves no other */
#define ITEM_HASH "install-smoke-item"

static int failures;

static void fail(const char *what, int rc)
{
    fprintf(stderr, "install_smoke: FAIL %s: %d %s\n", what, rc, ecx_errname(rc));
    failures++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int make_ctx(int role, ecx_ctx **out)
{
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = role;
    cfg.listen = "127.0.0.1:0";
    cfg.region_bytes = 8u << 20;
    cfg.block_bytes = 64u << 10;
    return ecx_new(&cfg, out);
}

int main(void)
{
    /* The library loaded at run time is the one the header describes. */
    printf("install_smoke: ecx_version() = %s\n", ecx_version());
    if (strcmp(ecx_version(), ECX_VERSION_STRING) != 0) fail("ecx_version != ECX_VERSION_STRING", 0);
    if (strcmp(ecx_errname(ECX_ECACHE_FULL), "ECX_ECACHE_FULL") != 0)
        fail("ecx_errname(ECX_ECACHE_FULL)", ECX_ECACHE_FULL);

    ecx_ctx *prod = NULL, *cons = NULL;
    int rc = make_ctx(ECX_ROLE_PRODUCER, &prod);
    if (rc != 0) {
        fail("ecx_new(producer)", rc);
        return 1;
    }
    rc = make_ctx(ECX_ROLE_CONSUMER, &cons);
    if (rc != 0) {
        fail("ecx_new(consumer)", rc);
        ecx_free(prod);
        return 1;
    }

    unsigned char *item = malloc(ITEM_BYTES);
    if (!item) return 1;
    for (size_t i = 0; i < ITEM_BYTES; i++) item[i] = (unsigned char)(i * 131u + (i >> 9));

    char ann[1024];
    size_t ann_len = 0;
    if ((rc = ecx_save(prod, ITEM_HASH, item, ITEM_BYTES)) != 0) fail("ecx_save", rc);
    if ((rc = ecx_announce(prod, ITEM_HASH, ann, sizeof ann, &ann_len)) != 0) fail("ecx_announce", rc);
    printf("install_smoke: announcement %s\n", ann);

    /* Drive both sides until the consumer has the bytes (10 s at most). */
    int state = -1, reason = 0;
    double deadline = now_s() + 10.0;
    while (failures == 0 && now_s() < deadline) {
        state = ecx_fetch(cons, ITEM_HASH, ann, ITEM_BYTES, &reason);
        if (state != ECX_FETCH_PENDING) break;
        if ((rc = ecx_poll(cons, 10)) < 0) fail("ecx_poll(consumer)", rc);
        if ((rc = ecx_poll(prod, 0)) < 0) fail("ecx_poll(producer)", rc);
    }
    if (failures == 0 && state != ECX_FETCH_READY) {
        fprintf(stderr, "install_smoke: FAIL fetch ended in state %d (reason %s)\n", state,
                state == ECX_FETCH_LOCAL ? ecx_reason_name(reason) : "-");
        failures++;
    }

    if (failures == 0) {
        const ecx_segment *segs = NULL;
        size_t n = 0, off = 0;
        uint64_t size = 0;
        if ((rc = ecx_load(cons, ITEM_HASH, &segs, &n, &size)) != 0) {
            fail("ecx_load", rc);
        } else {
            for (size_t i = 0; i < n && off + segs[i].len <= ITEM_BYTES; i++) {
                if (memcmp(segs[i].ptr, item + off, segs[i].len) != 0) fail("bytes differ", 0);
                off += segs[i].len;
            }
            if (size != ITEM_BYTES || off != ITEM_BYTES) {
                fprintf(stderr, "install_smoke: FAIL size %llu, segments cover %zu, want %d\n",
                        (unsigned long long)size, off, ITEM_BYTES);
                failures++;
            }
            if ((rc = ecx_release(cons, ITEM_HASH)) != 0) fail("ecx_release", rc);
        }
    }

    ecx_free(cons);
    ecx_free(prod);
    free(item);
    if (failures == 0) printf("install_smoke: ok (%d bytes fetched and compared)\n", ITEM_BYTES);
    return failures == 0 ? 0 : 1;
}
