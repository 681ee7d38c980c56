/* SPDX-License-Identifier: Apache-2.0 */
/* data_peer — one side of a data-plane transfer in its own process, for
 * test_data_procs.sh and test_data_netns.sh (producer and consumer in two
 * processes, possibly two network namespaces). The two exchange
 * agent_metadata / mem_descriptor through a file, as hex, the way an ack
 * would carry them. Both sides sleep on ecxi_data_fd() between progress
 * calls (after ecxi_data_arm()), so the wake-up path is exercised too.
 *
 *   data_peer produce DIR BACKEND BLOCKS BLOCK_BYTES FILE NOTIFS TIMEOUT_MS
 *     create a region in DIR, fill it with a known pattern, publish, and
 *     serve until NOTIFS notifications arrived (exit 0) or time runs out.
 *   data_peer consume DIR BACKEND BLOCKS BLOCK_BYTES FILE PATH TIMEOUT_MS
 *     register the producer (its path must be PATH: shm / tcp / ucx), fetch one
 *     block, many, scattered blocks with a partial last one, and the whole
 *     region, checking every byte; exit 0 if all match.
 * Every wait is bounded by TIMEOUT_MS.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checksum.h"
#include "data.h"
#include "grant_stub.h"
#include "region.h"
#include "util.h"

static uint8_t pat(uint64_t off)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (off * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17));
}

static int64_t deadline;

static void wait_fd(ecxi_data *d, int ms)
{
    int fd = ecxi_data_fd(d);
    if (fd < 0 || ecxi_data_arm(d) != 0) return;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    (void)poll(&p, 1, ms);
}

static void on_notif(void *arg, const char *msg, size_t len, const uint8_t *token, int status)
{
    (void)token, (void)status;
    int *n = arg;
    printf("notif %.*s\n", (int)len, msg);
    (*n)++;
}

static int produce(ecxi_region *r, ecxi_data_opts *o, const char *file, int want)
{
    uint8_t *b = ecxi_region_base(r);
    for (uint64_t i = 0; i < ecxi_region_size(r); i++)
        b[i] = pat(i);
    ecxi_data *d;
    int rc = ecxi_data_new_producer(r, o, &d);
    if (rc) {
        fprintf(stderr, "producer: %s\n", ecx_strerror(rc));
        return 1;
    }
    static stub_grants grants;
    ecxi_data_set_grant_fn(d, stub_grant_check, &grants);
    uint8_t ds[ECXI_DATA_DESC_MAX];
    /* what an ecx consumer is sent (a nixl producer: its auto paths) */
    ecxi_data_ack a;
    if (ecxi_data_grant_ack(d, true, &stub_ticket, ds, sizeof ds, &a)) return 1;
    const uint8_t *m = a.meta;
    size_t ml = a.meta_len, dl = a.desc_len;
    char *mh = malloc(2 * ml + 1), *dh = malloc(2 * dl + 1);
    ecxi_hex_encode(m, ml, mh);
    ecxi_hex_encode(ds, dl, dh);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s\n%s\n", mh, dh) < 0 || fclose(f) != 0 || rename(tmp, file) != 0) {
        perror("producer: write");
        return 1;
    }
    free(mh), free(dh);
    printf("producer %s: meta %zu bytes, desc %zu bytes\n", ecxi_data_name(d), ml, dl);
    fflush(stdout);
    int got = 0;
    while (got < want && ecxi_now_ms(NULL) < deadline) {
        if (ecxi_data_poll_notifs(d, on_notif, &got) < 0) break;
        wait_fd(d, 5);
    }
    /* Serve a little longer so the consumer's closes complete cleanly. */
    int64_t end = ecxi_now_ms(NULL) + 200;
    while (ecxi_now_ms(NULL) < end) {
        ecxi_data_poll_notifs(d, on_notif, &got);
        wait_fd(d, 5);
    }
    ecxi_data_free(d);
    printf("producer: %d notifications, %u grants served, %u refused\n", got, grants.served,
           grants.refused);
    return got >= want ? 0 : 1;
}

static int consume(ecxi_region *r, ecxi_data_opts *o, const char *file, const char *want_path)
{
    char *line = NULL, *line2 = NULL;
    size_t cap = 0, cap2 = 0;
    FILE *f = NULL;
    while (!(f = fopen(file, "r")) && ecxi_now_ms(NULL) < deadline)
        usleep(10000);
    if (!f || getline(&line, &cap, f) < 2 || getline(&line2, &cap2, f) < 2) {
        fprintf(stderr, "consumer: no metadata in %s\n", file);
        return 1;
    }
    fclose(f);
    size_t mlen = strcspn(line, "\n"), dlen = strcspn(line2, "\n");
    uint8_t *m = malloc(mlen / 2 + 1), *ds = malloc(dlen / 2 + 1);
    long ml = ecxi_hex_decode(line, mlen, m), dsl = ecxi_hex_decode(line2, dlen, ds);
    free(line), free(line2);
    ecxi_data *d;
    int rc = ecxi_data_new_consumer(r, o, &d);
    if (rc || ml < 0 || dsl < 0) {
        fprintf(stderr, "consumer: %s\n", ecx_strerror(rc));
        return 1;
    }
    ecxi_data_peer *p;
    ecxi_data_desc layout;
    if ((rc = ecxi_data_desc_decode(ds, (size_t)dsl, &layout)) ||
        (rc = ecxi_data_peer_add(d, m, (size_t)ml, &layout, &p))) {
        fprintf(stderr, "consumer: peer_add: %s\n", ecx_strerror(rc));
        return 1;
    }
    free(m);
    if (strcmp(ecxi_data_peer_backend(p), want_path) != 0) {
        fprintf(stderr, "consumer: path %s, want %s\n", ecxi_data_peer_backend(p), want_path);
        return 1;
    }
    const uint64_t bs = ecxi_region_block_bytes(r), nb = ecxi_region_num_blocks(r);
    uint64_t *rem = calloc(nb, 8), *loc = calloc(nb, 8);
    ecxi_block_run *rr = calloc(nb, sizeof *rr), *lr = calloc(nb, sizeof *lr);
    if (!rem || !loc || !rr || !lr) return 2;
    int failures = 0;
    for (int c = 0; c < 4; c++) {
        size_t n;
        uint64_t nbytes = 0;
        const char *name;
        if (c == 0) { /* one block, partial */
            name = "one", n = 1, rem[0] = nb / 2, loc[0] = 1, nbytes = bs / 3 + 1;
        } else if (c == 1) { /* many, one run */
            name = "many", n = nb / 2;
            for (size_t i = 0; i < n; i++)
                rem[i] = 1 + i, loc[i] = nb - n + i;
        } else if (c == 2) { /* scattered, partial last */
            name = "scattered", n = nb / 4;
            for (size_t i = 0; i < n; i++)
                rem[i] = (i * 7 + 3) % nb, loc[i] = (nb - 1 - i * 3) % nb;
            nbytes = (n - 1) * bs + 17;
        } else { /* the whole region */
            name = "largest", n = nb;
            for (size_t i = 0; i < n; i++)
                rem[i] = i, loc[i] = i;
        }
        memset(ecxi_region_base(r), 0, ecxi_region_size(r));
        if (!nbytes) nbytes = n * bs;
        /* The grant's ticket: the checksum of what the producer holds there. */
        ecxi_sum sum;
        ecxi_sum_reset(&sum);
        for (uint64_t i = 0, left = nbytes; i < n; i++) {
            uint8_t blk[65536];
            uint64_t l = left < bs ? left : bs;
            for (uint64_t j = 0; j < l && j < sizeof blk; j++)
                blk[j] = pat(rem[i] * bs + j);
            if (l > sizeof blk) return 2; /* blocks above 64 KiB: not used by the tests */
            ecxi_sum_update(&sum, blk, l);
            left -= l;
        }
        char key[ECXI_DATA_NOTIF_MAX];
        uint8_t desc[ECXI_DATA_DESC_MAX];
        size_t nr = ecxi_block_runs_of(rem, n, rr), nl = ecxi_block_runs_of(loc, n, lr);
        int kl = stub_key(key, sizeof key, nbytes, rr, nr);
        long dl = stub_desc(ds, (size_t)dsl, nbytes, ecxi_sum_digest(&sum), desc, sizeof desc);
        ecxi_data_xfer *x;
        if (kl < 0 || dl < 0) return 2;
        ecxi_data_desc dd;
        if ((rc = ecxi_data_desc_decode(desc, (size_t)dl, &dd)) ||
            (rc = ecxi_data_read_post(p, &dd, rr, nr, lr, nl, nbytes, key, (size_t)kl, &x))) {
            fprintf(stderr, "consumer: post %s: %s\n", name, ecx_strerror(rc));
            return 1;
        }
        int st;
        while ((st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING && ecxi_now_ms(NULL) < deadline) {
            ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
            if (ecxi_data_read_poll(x) == ECXI_XFER_RUNNING) wait_fd(d, 5);
        }
        ecxi_data_read_release(x);
        uint64_t left = nbytes, bad = 0;
        const uint8_t *lb = ecxi_region_base(r);
        for (size_t i = 0; i < n; i++) {
            uint64_t l = left < bs ? left : bs;
            for (uint64_t j = 0; j < l; j++)
                if (lb[loc[i] * bs + j] != pat(rem[i] * bs + j)) bad++;
            left -= l;
        }
        printf("consumer %s: %s, %zu blocks, %llu bad bytes\n", name,
               st == ECXI_XFER_DONE ? "done" : "NOT DONE", n, (unsigned long long)bad);
        if (st != ECXI_XFER_DONE || bad) failures++;
    }
    free(rem), free(loc), free(rr), free(lr), free(ds);
    /* Let the last notification leave before the endpoint closes. */
    int64_t end = ecxi_now_ms(NULL) + 100;
    while (ecxi_now_ms(NULL) < end) {
        ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
        wait_fd(d, 5);
    }
    ecxi_data_peer_drop(p);
    ecxi_data_free(d);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: data_peer produce|consume DIR BACKEND BLOCKS BLOCK_BYTES FILE "
                        "NOTIFS|PATH TIMEOUT_MS\n");
        return 2;
    }
    ecxi_data_opts o = {0};
    if (ecxi_data_backend_parse(argv[3], &o.backend)) return 2;
    uint64_t blocks = strtoull(argv[4], NULL, 10), bs = strtoull(argv[5], NULL, 10);
    deadline = ecxi_now_ms(NULL) + atoi(argv[8]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    ecxi_region *r;
    int rc = ecxi_region_instance_id(id);
    if (!rc) rc = ecxi_region_create_in(argv[2], id, 0, blocks * bs, bs, &r);
    if (rc) {
        fprintf(stderr, "region: %s\n", ecx_strerror(rc));
        return 1;
    }
    int ret = strcmp(argv[1], "produce") == 0   ? produce(r, &o, argv[6], atoi(argv[7]))
              : strcmp(argv[1], "consume") == 0 ? consume(r, &o, argv[6], argv[7])
                                                : 2;
    ecxi_region_free(r);
    return ret;
}
