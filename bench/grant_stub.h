/* SPDX-License-Identifier: Apache-2.0 */
/*
 * grant_stub — grants for data-plane tests and benchmarks that run the data
 * plane without a producer session (test_data, data_peer, bench_data).
 *
 * In ecx the producer session answers the data plane's grant check
 * (data.h). Here a grant is spelled out in its own key instead:
 * "stub:NBYTES:A-B,C,..." names the producer blocks (runs A..B inclusive,
 * or single blocks) and the size (anything after a '#' is ignored: padding
 * for tests of long keys), and every
 * grant has the token STUB_TOKEN. stub_grant_check() serves any key of that
 * form with that token, any number of times, and refuses (and counts)
 * everything else. A consumer builds the matching mem_descriptor from the
 * producer's layout with stub_desc(). Header-only: each program takes the
 * static functions it uses.
 */
#ifndef ECX_GRANT_STUB_H
#define ECX_GRANT_STUB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "data_impl.h"

#define STUB_MAX_BLOCKS 65536

#define STUB_TOKEN_BYTES                                                                           \
    {0x5e, 0xc7, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e}
static const uint8_t STUB_TOKEN[ECXI_DATA_TOKEN_LEN] = STUB_TOKEN_BYTES;

typedef struct stub_grants {
    uint64_t blocks[STUB_MAX_BLOCKS]; /* of the last grant served */
    unsigned served, refused;
} stub_grants;

/* The key of a grant of the runs runs[0..n) holding nbytes; its length,
 * or -1 if it does not fit cap. */
static __attribute__((unused)) int stub_key(char *buf, size_t cap, uint64_t nbytes,
                                            const ecxi_block_run *runs, size_t n)
{
    int k = snprintf(buf, cap, "stub:%llu:", (unsigned long long)nbytes);
    for (size_t i = 0; i < n && k > 0 && (size_t)k < cap; i++)
        k += snprintf(buf + k, cap - (size_t)k, "%s%llu-%llu", i ? "," : "",
                      (unsigned long long)runs[i].first,
                      (unsigned long long)(runs[i].first + runs[i].count - 1));
    return k > 0 && (size_t)k < cap ? k : -1;
}

/* ecxi_data_grant_fn: arg is a stub_grants. */
static __attribute__((unused)) int stub_grant_check(void *arg, const char *key, size_t key_len,
                                                    const uint8_t token[ECXI_DATA_TOKEN_LEN],
                                                    int flags, ecxi_data_grant *g)
{
    (void)flags;
    stub_grants *s = arg;
    char k[ECXI_DATA_NOTIF_MAX + 1];
    memcpy(k, key, key_len);
    k[key_len] = 0;
    char *p = k + 5, *end;
    size_t n = 0;
    if (strncmp(k, "stub:", 5) != 0 || memcmp(token, STUB_TOKEN, ECXI_DATA_TOKEN_LEN) != 0)
        goto refuse;
    g->nbytes = strtoull(p, &end, 10);
    if (end == p || *end != ':') goto refuse;
    for (p = end + 1; *p; p = *end ? end + 1 : end) {
        uint64_t a = strtoull(p, &end, 10), b = a;
        if (end == p) goto refuse;
        if (*end == '-') {
            p = end + 1;
            b = strtoull(p, &end, 10);
            if (end == p || b < a) goto refuse;
        }
        if (*end == '#') *end = 0;
        if (*end && *end != ',') goto refuse;
        for (uint64_t i = a; i <= b; i++) {
            if (n == STUB_MAX_BLOCKS) goto refuse;
            s->blocks[n++] = i;
        }
    }
    if (n == 0 || *p) goto refuse;
    g->blocks = s->blocks;
    g->n = n;
    s->served++;
    return 0;
refuse:
    s->refused++;
    return ECX_EDATA_GRANT;
}

/* The mem_descriptor of a stub grant: the producer's layout (a descriptor
 * it published, with or without a ticket) plus a ticket for nbytes bytes
 * whose checksum is sum. Its length, or a negative error. */
static __attribute__((unused)) long stub_desc(const uint8_t *layout, size_t layout_len,
                                              uint64_t nbytes, uint64_t sum, uint8_t *buf,
                                              size_t cap)
{
    ecxi_data_desc dd;
    int rc = ecxi_data_desc_decode(layout, layout_len, &dd);
    if (rc) return rc;
    dd.has_ticket = true;
    memcpy(dd.ticket.token, STUB_TOKEN, ECXI_DATA_TOKEN_LEN);
    dd.ticket.checksum = sum;
    dd.ticket.nbytes = nbytes;
    dd.ticket.lease_ms = 30000;
    return ecxi_data_desc_encode(&dd, buf, cap);
}

/* A stub ticket for one byte, and a producer's layout descriptor with it. */
static __attribute__((unused)) const ecxi_data_ticket stub_ticket = {
    .token = STUB_TOKEN_BYTES, .nbytes = 1, .lease_ms = 30000};

static __attribute__((unused)) long stub_layout(const ecxi_data *prod, uint8_t *buf, size_t cap)
{
    return ecxi_data_grant_descriptor(prod, &stub_ticket, buf, cap);
}

#endif
