/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_data — libFuzzer target for the data plane's formats (data_format.c):
 * the agent_metadata and mem_descriptor a producer puts in every ack, which
 * a consumer parses from whatever a peer sent. The first input byte picks
 * which (even: metadata, odd: descriptor); the rest is the blob. A blob
 * that decodes is encoded again and must decode to the same fields.
 * ASan/UBSan catch any read outside the blob. */
#include <stdlib.h>
#include <string.h>

#include "data_format.h"

static void same(const void *a, const void *b, size_t n)
{
    if (n && memcmp(a, b, n)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    uint8_t out[ECXI_DATA_META_MAX + ECXI_DATA_DESC_MAX];
    if (data[0] % 2 == 0) {
        ecxi_data_meta m, m2;
        if (ecxi_data_meta_decode(b, n, &m)) return 0;
        long k = ecxi_data_meta_encode(&m, out, sizeof out);
        if (k < 0 || ecxi_data_meta_decode(out, (size_t)k, &m2)) abort();
        if (m.nonce != m2.nonce || m.has_shm != m2.has_shm || m.has_ucx != m2.has_ucx) abort();
        if (m.has_shm) {
            if (m.path_len != m2.path_len || m.sock_len != m2.sock_len) abort();
            same(m.path, m2.path, m.path_len);
            same(m.sock, m2.sock, m.sock_len);
        }
        if (m.has_ucx) {
            if (m.ucx_addr_len != m2.ucx_addr_len) abort();
            same(m.ucx_addr, m2.ucx_addr, m.ucx_addr_len);
        }
        if (m.has_tcp != m2.has_tcp) abort();
        if (m.has_tcp) {
            if (m.tcp_family != m2.tcp_family || m.tcp_port != m2.tcp_port) abort();
            same(m.tcp_addr, m2.tcp_addr, m.tcp_family == 4 ? 4 : 16);
        }
    } else {
        ecxi_data_desc d, d2;
        if (ecxi_data_desc_decode(b, n, &d)) return 0;
        long k = ecxi_data_desc_encode(&d, out, sizeof out);
        if (k < 0 || ecxi_data_desc_decode(out, (size_t)k, &d2)) abort();
        if (d.nonce != d2.nonce || d.block_bytes != d2.block_bytes ||
            d.num_blocks != d2.num_blocks || d.has_ticket != d2.has_ticket)
            abort();
        if (d.has_ticket) same(&d.ticket, &d2.ticket, sizeof d.ticket);
    }
    return 0;
}
