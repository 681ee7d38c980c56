/* SPDX-License-Identifier: Apache-2.0 */
/*
 * region — the shared-memory block file that holds encodings (docs/PROTOCOL.md §2).
 *
 * A region is one file `ecx_<instance>_<rank>.mmap` in a shared-memory
 * directory (default /dev/shm; the environment variable ECX_SHM_DIR
 * overrides it, and the *_in variants take it as a parameter), exactly
 * num_blocks × block_bytes long, mapped MAP_SHARED. There is no header: the
 * file is only blocks, so a peer on the same host can map it read-only and
 * copy block i from offset i × block_bytes.
 *
 * Lifetime. The creator publishes the file atomically: it creates a
 * temporary name (`<name>.tmp.<pid>.<random>`), takes a shared flock, sizes
 * it (refusing a size the directory's file system has no room for now),
 * maps it, asks for huge pages (MADV_HUGEPAGE: a tmpfs mounted
 * huge=advise uses them then; huge=always|within_size does anyway), and
 * links it to its final name (link(2) refuses to replace an existing
 * file). Creating costs no page faults: the file's memory is allocated
 * and faulted in afterwards, 2 MiB at a time, by a background thread of
 * the creator (from the start of the region; ECX_PREFAULT=0 turns it
 * off) and, before anything writes into them, for the blocks of every
 * reservation (ecxi_region_back(), which the cache calls): a directory
 * that has filled up meanwhile fails that reservation with
 * ECX_EREGION_NOSPC instead of a write with SIGBUS. Every process
 * that maps the region read-write (creator and joiners) holds a shared
 * flock on it for as long as it is mapped; the creator unlinks it in
 * ecxi_region_free(). A process killed with SIGKILL leaves its file behind
 * with nobody holding the lock: ecxi_region_reap() (run by every
 * ecxi_region_create()) takes an exclusive non-blocking flock on each
 * `ecx_*.mmap` (and leftover temporary) of ours, and unlinks only the ones
 * it gets. Files of live processes, other users' files, symlinks and
 * anything that is not a regular file are never touched.
 *
 * The block size is not stored in the file (there is no header and tmpfs
 * has no portable place for metadata), so whoever joins or opens a region
 * passes it; the file size must be a whole, non-zero number of such blocks.
 * Processes of one instance share their configuration, and a remote peer
 * learns it from the data plane's mem_descriptor.
 *
 * Files are mode 0600, owned by the creating user; the instance name is
 * restricted to [A-Za-z0-9._-] so it can never name a path outside the
 * directory. No function here aborts or raises a signal on bad input.
 * ecx's creator never resizes a published file; a consumer reading another
 * producer's region guards its copy against one that does (shm_copy.h).
 */
#ifndef ECXI_REGION_H
#define ECXI_REGION_H

#include <stdbool.h>
#include <stdint.h>

#include "ecx.h"

typedef struct ecxi_region ecxi_region;

/* Largest block count a region may have: block indices fit in uint32 with
 * UINT32_MAX left as a sentinel (the cache relies on this). */
#define ECXI_REGION_MAX_BLOCKS 0xfffffffeu
/* Longest instance name accepted. */
#define ECXI_REGION_INSTANCE_MAX 64
/* Length of an id made by ecxi_region_instance_id(), without the NUL. */
#define ECXI_REGION_INSTANCE_ID_LEN 24

/* The directory regions live in: $ECX_SHM_DIR if set and non-empty, else
 * "/dev/shm". */
const char *ecxi_region_default_dir(void);

/* Fill out with a fresh instance name, unique per process start:
 * 8 hex digits of the pid, '-', 15 random hex digits. */
int ecxi_region_instance_id(char out[ECXI_REGION_INSTANCE_ID_LEN + 1]);

/* Create and publish the region of (instance, rank): floor(total_bytes /
 * block_bytes) blocks. Reaps orphans in the directory first. Errors:
 * ECX_EINVAL (bad instance, rank < 0, NULL), ECX_EREGION_SIZE (zero block
 * size, fewer than one block, more than ECXI_REGION_MAX_BLOCKS, or a size
 * that does not fit off_t / size_t), ECX_EREGION_EXISTS (the name is
 * taken), ECX_EREGION_NOSPC (shared memory too small), ECX_ENOMEM (the
 * mapping failed), ECX_ESYS (other system errors, logged). */
int ecxi_region_create(const char *instance, int rank, uint64_t total_bytes, uint64_t block_bytes,
                      ecxi_region **out);
int ecxi_region_create_in(const char *dir, const char *instance, int rank, uint64_t total_bytes,
                         uint64_t block_bytes, ecxi_region **out);

/* Map the region of (instance, rank) that another local process of the
 * same instance created, read-write, and hold a shared lock on it until
 * ecxi_region_free(). block_bytes must be the creator's block size.
 * Errors: ECX_EREGION_NOTFOUND, ECX_EREGION_BADFILE (symlink, not a
 * regular file, other owner, mode not 0600), ECX_EREGION_SIZE (size not a
 * whole non-zero number of blocks), ECX_EREGION_BUSY (being reclaimed). */
int ecxi_region_join(const char *instance, int rank, uint64_t block_bytes, ecxi_region **out);
int ecxi_region_join_in(const char *dir, const char *instance, int rank, uint64_t block_bytes,
                       ecxi_region **out);

/* Map the region file open on fd (a helper process's: helper_proc.h),
 * read-only or read-write, without a lock or a name: its size must be a
 * whole non-zero number of block_bytes blocks (ECX_EREGION_SIZE). The
 * caller may close fd after. */
int ecxi_region_map_fd(int fd, uint64_t block_bytes, bool writable, ecxi_region **out);

/* Unmap and release the lock; the creator also unlinks the file (only if
 * the name still refers to its file). NULL is a no-op. */
void ecxi_region_free(ecxi_region *r);

/* Accessors; the base stays valid until ecxi_region_free(). */
uint8_t *ecxi_region_base(const ecxi_region *r);
uint64_t ecxi_region_block_bytes(const ecxi_region *r);
uint64_t ecxi_region_num_blocks(const ecxi_region *r);
uint64_t ecxi_region_size(const ecxi_region *r); /* num_blocks × block_bytes */
const char *ecxi_region_path(const ecxi_region *r);
bool ecxi_region_is_owner(const ecxi_region *r);    /* true for the creator */

/* Make blocks [first_block, first_block + n_blocks) of the creator's
 * region safe and fast to write: allocated in the file and faulted in
 * (see Lifetime), unless that is done already (then it costs a load per
 * 2 MiB). Safe beside the background filler and beside writers of other
 * blocks. 0; ECX_ERANGE (not blocks of the region); ECX_EREGION_NOSPC (the
 * directory's file system has no room: logged, nothing may write there);
 * ECX_ENOMEM; ECX_ESYS. A joiner's or helper's mapping: 0, nothing done
 * (its creator backs what it reserves). */
int ecxi_region_back(ecxi_region *r, uint64_t first_block, uint64_t n_blocks);

/* Bytes of the region backed so far (the filler's and the reservations'
 * pieces): its size once all are, and always in a joiner's mapping. */
uint64_t ecxi_region_backed_bytes(const ecxi_region *r);

/* A copy into the region is running and wants the CPU: the background
 * filler pauses until ECXI_REGION_QUIET_NS after the last such call (the
 * blocks a copy writes are backed already, by their reservation). Cheap:
 * one atomic store; call it per chunk. */
#define ECXI_REGION_QUIET_NS 2000000
void ecxi_region_busy(ecxi_region *r);

/* Reclaim orphaned region files (and leftover temporaries) of this user in
 * dir (NULL: ecxi_region_default_dir()). Returns how many were removed, or
 * a negative error if dir cannot be read. */
int ecxi_region_reap(const char *dir);

#endif
