/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checksum — the end-to-end integrity check of an item (issue 9): a fast
 * 64-bit XXH3 of the item's bytes, computed by the producer when the item
 * is committed, carried in the grant's ticket, and recomputed by the
 * consumer over the bytes it received before the item may become ready.
 *
 * XXH3 is not a MAC: it catches corruption, reused blocks and transport
 * bugs, not a producer that lies (a producer can always send wrong bytes
 * for an mm_hash; README's threat model says so). The streaming form lets
 * a copy loop hash each chunk while it is still in cache.
 */
#ifndef ECXI_CHECKSUM_H
#define ECXI_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* Streaming state; lives on the stack or in a struct (about 600 bytes). */
typedef struct ecxi_sum {
    XXH3_state_t st;
} ecxi_sum;

void ecxi_sum_reset(ecxi_sum *s);
void ecxi_sum_update(ecxi_sum *s, const void *p, size_t n);
uint64_t ecxi_sum_digest(const ecxi_sum *s);

/* One shot: equal to reset + update + digest over the same bytes. */
uint64_t ecxi_checksum(const void *p, size_t n);

/* The checksum of an item stored in blocks[0..n) of a region at base
 * (block_bytes each), nbytes long (the last block holds the rest). */
uint64_t ecxi_checksum_blocks(const uint8_t *base, uint64_t block_bytes, const uint64_t *blocks,
                             size_t n, uint64_t nbytes);

#endif
