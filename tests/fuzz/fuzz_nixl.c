/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_nixl — libFuzzer target for NIXL's formats (src/data/nixl/nixl_format.c): the
 * agent metadata and vLLM's descriptor list a NIXL peer puts in its acks,
 * and the notification it sends, all parsed from whatever a peer sent. The
 * first input byte picks which (0: metadata, 1: descriptor list, 2:
 * notification); the rest is the blob. A blob that decodes is encoded
 * again and must decode to the same fields. Seeded (tests/fuzz/fuzz_nixl.seeds)
 * with blobs a real nixl_cu12 1.5.1 agent wrote. ASan/UBSan catch any read
 * outside the blob. */
#include <stdlib.h>
#include <string.h>

#include "nixl_format.h"

static void same(const void *a, const void *b, size_t n)
{
    if (n && memcmp(a, b, n)) abort();
}

static uint8_t out[ECXI_NIXL_META_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    if (data[0] % 3 == 0) {
        ecxi_nixl_meta m, m2;
        if (ecxi_nixl_meta_decode(b, n, &m)) return 0;
        long k = ecxi_nixl_meta_encode(&m, out, sizeof out);
        if (k < 0 || ecxi_nixl_meta_decode(out, (size_t)k, &m2)) abort();
        if (m.name_len != m2.name_len || m.ucx_addr_len != m2.ucx_addr_len || m.nregs != m2.nregs)
            abort();
        same(m.name, m2.name, m.name_len);
        same(m.ucx_addr, m2.ucx_addr, m.ucx_addr_len);
        for (size_t i = 0; i < m.nregs; i++) {
            const ecxi_nixl_reg *x = &m.regs[i], *y = &m2.regs[i];
            if (x->addr != y->addr || x->len != y->len || x->dev_id != y->dev_id ||
                x->rkey_len != y->rkey_len || !ecxi_nixl_meta_covers(&m, x->addr, x->len))
                abort();
            same(x->rkey, y->rkey, x->rkey_len);
        }
    } else if (data[0] % 3 == 1) {
        size_t cnt, got;
        if (ecxi_nixl_desc_count(b, n, 1u << 16, &cnt)) return 0;
        ecxi_nixl_block *blk = malloc(cnt * sizeof *blk), *blk2 = malloc(cnt * sizeof *blk);
        if (ecxi_nixl_desc_decode(b, n, blk, cnt, &got) || got != cnt) abort();
        size_t cap = ecxi_nixl_desc_size(cnt);
        uint8_t *enc = malloc(cap);
        long k = ecxi_nixl_desc_encode(blk, cnt, enc, cap);
        /* shortest forms: never longer than what was parsed */
        if (k < 0 || (size_t)k > n || ecxi_nixl_desc_decode(enc, (size_t)k, blk2, cnt, &got) ||
            got != cnt)
            abort();
        same(blk, blk2, cnt * sizeof *blk);
        free(enc);
        free(blk);
        free(blk2);
    } else {
        const char *nm, *msg, *nm2, *msg2;
        size_t nl, ml, nl2, ml2;
        if (ecxi_nixl_notif_decode(b, n, &nm, &nl, &msg, &ml)) return 0;
        long k = ecxi_nixl_notif_encode(nm, nl, msg, ml, out, sizeof out);
        if (k != (long)n || ecxi_nixl_notif_decode(out, (size_t)k, &nm2, &nl2, &msg2, &ml2)) abort();
        same(b, out, n);
    }
    return 0;
}
