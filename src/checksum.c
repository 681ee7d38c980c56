/* SPDX-License-Identifier: Apache-2.0 */
/* checksum — XXH3-64 of an item, whole or streamed; see checksum.h. */
#include "checksum.h"

void ecxi_sum_reset(ecxi_sum *s)
{
    XXH3_INITSTATE(&s->st);
    XXH3_64bits_reset(&s->st);
}

void ecxi_sum_update(ecxi_sum *s, const void *p, size_t n)
{
    XXH3_64bits_update(&s->st, p, n);
}

uint64_t ecxi_sum_digest(const ecxi_sum *s)
{
    return XXH3_64bits_digest(&s->st);
}

uint64_t ecxi_checksum(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

uint64_t ecxi_checksum_blocks(const uint8_t *base, uint64_t block_bytes, const uint64_t *blocks,
                             size_t n, uint64_t nbytes)
{
    ecxi_sum s;
    ecxi_sum_reset(&s);
    for (size_t i = 0; i < n && nbytes; i++) {
        /* Consecutive blocks hash as one span (fewer calls, same result). */
        size_t k = 1;
        while (i + k < n && blocks[i + k] == blocks[i] + k)
            k++;
        uint64_t len = k * block_bytes < nbytes ? k * block_bytes : nbytes;
        ecxi_sum_update(&s, base + blocks[i] * block_bytes, (size_t)len);
        nbytes -= len;
        i += k - 1;
    }
    return ecxi_sum_digest(&s);
}
