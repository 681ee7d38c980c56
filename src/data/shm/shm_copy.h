/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm_copy — the same-host copy of one item out of a producer's region
 * file into the consumer's blocks, with the item's XXH3-64 computed over
 * the bytes written, and no way for the file's owner to raise a signal in
 * the consumer (issue 9).
 *
 * Two ways, same result (the checksum equals ecxi_checksum() of the bytes
 * written, whatever the split into runs):
 *
 *   guarded  (default) one pass over a read-only mapping of the file: each
 *            64-byte stripe is loaded once, stored to the destination and
 *            folded into the XXH3 accumulators from the same register
 *            (fsum.h: AVX-512, AVX2 or portable C, whichever the CPU has),
 *            so the hash costs next to nothing over the copy.
 *            A mapping raises SIGBUS where the owner truncated the file;
 *            ecxi_shm_copy_init() installs, once per process, a SIGBUS
 *            handler that turns such a fault *inside a guarded copy, at an
 *            address of the source mapping* into a failed copy
 *            (siglongjmp), and hands every other SIGBUS to the handler
 *            that was there before (or the default action). Before each
 *            copy it checks that the handler is still ours.
 *   pread    from the descriptor, a chunk at a time, hashing each chunk
 *            while it is in cache (fsum.h). A truncated file is a short
 *            read. Used when the guard is not in place (someone replaced
 *            the handler after us), or when asked.
 *
 * Why both: on tmpfs, pread costs a page-cache lookup and a kernel copy
 * per 4 KiB page; measured here (2-core AMD EPYC VM, 28.8 MB) pread+hash
 * reaches about 0.3x memcpy, memcpy from a mapping then a separate hash
 * pass about 0.6x, and the guarded one-pass copy 1.0-1.2x, so only the
 * last meets the 0.85x budget (`build/bench_data` prints all three ratios).
 * Nor is pread the cheaper first read (issue 12): a fresh mapping pays a
 * page-table entry per 4 KiB page on first touch, but pread pays more per
 * page than that (copy time / memcpy time, same run: pread+hash 2.6-3.6,
 * fresh mapping 1.9-2.1 on /dev/shm; 1.9-2.1 vs 0.73-0.81 on a huge-page
 * tmpfs, where a first touch maps 2 MiB; BENCHMARKS.md, "Cold fetch").
 */
#ifndef ECXI_SHM_COPY_H
#define ECXI_SHM_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data.h"

/* Where the bytes come from. */
typedef struct ecxi_shm_src {
    int fd;               /* read-only descriptor of the region file */
    const uint8_t *map;   /* read-only mapping of its first map_len bytes */
    uint64_t map_len;     /* (NULL / 0: pread only) */
} ecxi_shm_src;

/* Mode bits: AUTO (guarded when possible), PREAD (force pread); POPULATE:
 * before each piece is copied, MADV_POPULATE_READ its source pages and
 * MADV_POPULATE_WRITE its destination pages (silently skipped where the
 * kernel lacks them, < 5.14); AHEAD (guarded copies): a thread of the
 * job's own, started at its first step, faults the source pages in
 * (MADV_POPULATE_READ, 1 MiB at a time) from the item's end down to
 * where the copy has got, so that on a mapping not yet faulted in (a
 * consumer's first READ from a producer) the page-table work runs beside
 * the copy on another core instead of in it. The thread is told to stop
 * when the copy ends or the job is freed; neither waits for it, so a
 * source mapping with AHEAD copies may be unmapped only after
 * ecxi_shm_ahead_drain(). */
enum ecxi_shm_copy_mode {
    ECXI_SHM_COPY_AUTO = 0,
    ECXI_SHM_COPY_PREAD = 1,
    ECXI_SHM_COPY_POPULATE = 2,
    ECXI_SHM_COPY_AHEAD = 4,
};

/* Install the SIGBUS guard (idempotent, thread-safe). 0 or ECX_ESYS. */
int ecxi_shm_copy_init(void);

/* True if a copy of a large item would take the guarded path now. */
bool ecxi_shm_copy_guarded(void);

/* Copy an item: the source's blocks of the runs remote[0..nremote) into
 * dst_base's blocks of the runs local[0..nlocal), block for block in run
 * order (block_bytes each), nbytes in total, the last block partial;
 * *sum gets the XXH3-64 of the bytes written. Runs and sizes must already
 * be checked against the source (its map_len / file size as seen at
 * fstat) and the destination.
 * 0, or ECX_ESYS: a short or failed read, or a fault on the source (the
 * destination then holds part of the item). */
int ecxi_shm_copy(const ecxi_shm_src *src, uint8_t *dst_base, uint64_t block_bytes,
                 const ecxi_block_run *remote, size_t nremote, const ecxi_block_run *local,
                 size_t nlocal, uint64_t nbytes, int mode, uint64_t *sum);


/* ---- the same copy, a slice at a time ----------------------------------
 * A job copies one item in as many steps as its caller likes: each step
 * moves at most max_bytes (any split: the XXH3 state, guarded or pread,
 * is carried from one step to the next, a stripe cut by a step boundary
 * is completed by the next), each step runs under the SIGBUS guard on its
 * own, and the checksum is the same as ecxi_shm_copy()'s. The job holds
 * no pointer to the source or destination: between steps the caller may
 * free it (a cancelled READ) and nothing is written afterwards. If the
 * guard is replaced between steps the job starts again with pread. */
typedef struct ecxi_shm_job ecxi_shm_job;

/* A job for the runs remote -> local (as ecxi_shm_copy); the runs are
 * copied. 0 or ECX_ENOMEM. */
int ecxi_shm_job_new(const ecxi_shm_src *src, uint64_t block_bytes, const ecxi_block_run *remote,
                    size_t nremote, const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                    int mode, ecxi_shm_job **out);

/* Copy at most max_bytes more (*moved: how many): 0 more to do, 1 the
 * item is complete (*sum set), ECX_ESYS failed (as ecxi_shm_copy). */
int ecxi_shm_job_step(ecxi_shm_job *j, const ecxi_shm_src *src, uint8_t *dst_base,
                     uint64_t max_bytes, uint64_t *moved, uint64_t *sum);

/* Bytes still to copy. */
uint64_t ecxi_shm_job_left(const ecxi_shm_job *j);

void ecxi_shm_job_free(ecxi_shm_job *j);

/* Stop the fault-ahead threads working on the mapping at map and wait
 * until they have (each within one piece): call before unmapping a source
 * that AHEAD copies used. */
void ecxi_shm_ahead_drain(const void *map);

/* madvise(MADV_POPULATE_READ / _WRITE) over the pages holding [p, p+len);
 * errors ignored (EINVAL: the kernel has none; never asked again). */
void ecxi_shm_populate(const void *p, uint64_t len, bool write);

#endif
