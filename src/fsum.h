/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsum — XXH3-64 of a stream whose length is known up front, computed as
 * the bytes pass: either while copying them (each 64-byte stripe is loaded
 * once, stored to the destination and folded into the accumulators from
 * the same register) or over bytes just received (hashed while they are
 * still in cache). The result equals ecxi_checksum() (libxxhash's
 * XXH3_64bits) of the whole stream, however it is split into calls.
 *
 * The long-input loop runs on the widest vectors the CPU has, chosen at run
 * time: AVX-512 (one stripe per register; a block of 16 stripes unrolled
 * with its secrets in registers), AVX2, or portable C. Copies of at least
 * ECXI_FSUM_NT_MIN bytes in all store with non-temporal stores where the
 * destination is 64-byte aligned (fenced before each call returns), as
 * memcpy does for copies past the cache; such a copy reads ahead the way
 * memcpy does too: on AVX-512 two 4 KiB streams at once, each prefetched a
 * few lines ahead, hashed in order through a scratch copy in L1; on AVX2
 * one stream, prefetched 4 KiB ahead on AMD CPUs only (BENCHMARKS.md has
 * what each choice measured). Streams of at most 240 bytes (XXH3's short
 * forms) are gathered and hashed at the end.
 */
#ifndef ECXI_FSUM_H
#define ECXI_FSUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ECXI_FSUM_NT_MIN (16u << 20)

typedef struct ecxi_fsum {
    uint64_t acc[8];
    uint64_t total, done, k, K; /* K: full stripes before the last 64 bytes */
    uint8_t buf[256];           /* a stripe split between calls, or a short stream whole */
    uint8_t last[64];           /* the stream's last 64 bytes */
    size_t buffered;
    bool nt;
} ecxi_fsum;

/* Start a stream of `total` bytes. */
void ecxi_fsum_init(ecxi_fsum *f, uint64_t total);

/* The next len bytes of the stream: copied src -> dst and hashed. The
 * calls' lengths must add up to total. */
void ecxi_fsum_copy(ecxi_fsum *f, void *dst, const void *src, uint64_t len);

/* The next len bytes of the stream, hashed where they are. */
void ecxi_fsum_update(ecxi_fsum *f, const void *p, uint64_t len);

/* The XXH3-64 of the stream, once all of it has passed. */
uint64_t ecxi_fsum_digest(const ecxi_fsum *f);

/* Which kernel runs: tests pin each one in turn. */
enum ecxi_fsum_isa { ECXI_FSUM_C = 0, ECXI_FSUM_AVX2 = 1, ECXI_FSUM_AVX512 = 2 };

/* The best the CPU supports (the default). */
int ecxi_fsum_best_isa(void);

/* Use `isa` for this process from now on, if the CPU supports it: 0, or
 * -1 (nothing changed). */
int ecxi_fsum_set_isa(int isa);

#endif
