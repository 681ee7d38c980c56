/* SPDX-License-Identifier: Apache-2.0 */
/*
 * region — create, join, open read-only, reap and clean up the /dev/shm
 * block files (see region.h for the lifetime rules this file implements).
 *
 * Every file operation goes through a directory descriptor and *at()
 * calls with O_NOFOLLOW, so a name is resolved once and a symlink planted
 * in the directory is refused rather than followed. Whenever we act on a
 * name after having opened it (unlink, lock), we first check that the name
 * still refers to the inode we hold, so a concurrent reaper or creator can
 * never make us unlink someone else's file.
 */
#include "region.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

struct ecxi_region {
    uint8_t *base;
    uint64_t size, block_bytes, num_blocks;
    int fd;    /* holds the shared flock (read-write mappings) */
    int dirfd; /* directory of the file, for the creator's unlink; -1 otherwise */
    bool owner;
    dev_t dev;
    ino_t ino;
    char name[NAME_MAX + 1];
    char path[PATH_MAX];
    /* The creator's record of which FILL_CHUNK pieces of the file are
     * allocated and faulted in (1), and its background filler; NULL and
     * false in a joiner's or a helper's mapping. */
    _Atomic uint8_t *backed;
    uint64_t n_chunks;
    _Atomic uint64_t n_backed; /* of backed[], set */
    pthread_t filler;
    bool filling;
    pid_t filler_pid; /* the process the filler runs in (not a forked child) */
    atomic_bool stop;
    _Atomic int64_t quiet_from_ns; /* the filler waits until then (ecxi_region_busy) */
};

/* The unit of backing: a 2 MiB piece of the file (a huge page where the
 * file system has them; the mapping is placed at a 2 MiB boundary then). */
#define FILL_CHUNK ((uint64_t)2 << 20)

static const char TMP_INFIX[] = ".mmap.tmp.";

const char *ecxi_region_default_dir(void)
{
    const char *d = getenv("ECX_SHM_DIR");
    return d && *d ? d : "/dev/shm";
}

static int random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return ECX_ESYS;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

int ecxi_region_instance_id(char out[ECXI_REGION_INSTANCE_ID_LEN + 1])
{
    if (!out) return ECX_EINVAL;
    uint8_t rnd[8];
    int rc = random_bytes(rnd, sizeof rnd);
    if (rc) return rc;
    char hex[17];
    ecxi_hex_encode(rnd, sizeof rnd, hex);
    snprintf(out, ECXI_REGION_INSTANCE_ID_LEN + 1, "%08x-%.15s", (unsigned)getpid(), hex);
    return 0;
}

static bool instance_valid(const char *s)
{
    if (!s || !*s || *s == '.') return false;
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok || n >= ECXI_REGION_INSTANCE_MAX) return false;
    }
    return true;
}

/* "ecx_<instance>_<rank>.mmap" into out. */
static int region_name(const char *instance, int rank, char out[NAME_MAX + 1])
{
    if (!instance_valid(instance) || rank < 0) return ECX_EINVAL;
    int n = snprintf(out, NAME_MAX + 1, "ecx_%s_%d.mmap", instance, rank);
    return n > 0 && n <= NAME_MAX ? 0 : ECX_EINVAL;
}

/* Is name one of the files the reaper may consider: "ecx_*.mmap" or a
 * temporary "ecx_*.mmap.tmp.*"? */
static bool reapable_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 4 || memcmp(name, "ecx_", 4) != 0) return false;
    if (n >= 9 && strcmp(name + n - 5, ".mmap") == 0) return true;
    return strstr(name + 4, TMP_INFIX) != NULL;
}

static int open_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        ecxi_log(ECX_LOG_ERROR, "region: cannot open directory %s: %s", dir, strerror(errno));
    return fd;
}

/* Does name in dirfd still refer to the inode st describes? */
static bool name_is(int dirfd, const char *name, const struct stat *st)
{
    struct stat now;
    if (fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0) return false;
    return now.st_dev == st->st_dev && now.st_ino == st->st_ino;
}

static int flock_retry(int fd, int op)
{
    int rc;
    do
        rc = flock(fd, op);
    while (rc != 0 && errno == EINTR);
    return rc;
}

static int check_sizes(uint64_t total_bytes, uint64_t block_bytes, uint64_t *num_blocks,
                       uint64_t *size)
{
    if (block_bytes == 0) return ECX_EREGION_SIZE;
    uint64_t n = total_bytes / block_bytes;
    if (n == 0 || n > ECXI_REGION_MAX_BLOCKS) return ECX_EREGION_SIZE;
    uint64_t s = n * block_bytes; /* <= total_bytes: cannot overflow */
    if (s > (uint64_t)INT64_MAX || s > (uint64_t)SIZE_MAX) return ECX_EREGION_SIZE;
    *num_blocks = n;
    *size = s;
    return 0;
}

static int errno_to_ecx(int e)
{
    switch (e) {
    case ENOSPC:
    case EFBIG:
    case EDQUOT: return ECX_EREGION_NOSPC;
    case ENOMEM: return ECX_ENOMEM;
    case EEXIST: return ECX_EREGION_EXISTS;
    case ENOENT: return ECX_EREGION_NOTFOUND;
    case ELOOP: return ECX_EREGION_BADFILE;
    default: return ECX_ESYS;
    }
}

static ecxi_region *region_alloc(void)
{
    ecxi_region *r = calloc(1, sizeof *r);
    if (r) r->fd = r->dirfd = -1;
    return r;
}

static void set_path(ecxi_region *r, const char *dir, const char *name)
{
    snprintf(r->name, sizeof r->name, "%s", name);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    snprintf(r->path, sizeof r->path, "%.*s/%s", (int)dl, dir, name);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Ask for huge pages on a mapping of a region file: a hint that matters on
 * a tmpfs mounted huge=advise, and does nothing (EINVAL without THP, or a
 * mount that never uses them) elsewhere. */
static void want_huge(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    if (madvise(p, len, MADV_HUGEPAGE) != 0 && errno != EINVAL)
        ecxi_log(ECX_LOG_DEBUG, "region: MADV_HUGEPAGE: %s", strerror(errno));
#else
    (void)p, (void)len;
#endif
}

/* Back bytes [off, off + len) of the creator's mapping: allocate them in
 * the file and fault them in for writing, so that neither the producer's
 * first writes into a block nor a local consumer's copy into it pay page
 * faults (zeroing, and a page-table entry per 4 KiB page where there are
 * no huge pages: writes into fresh blocks then run 3-8x slower), and so
 * that no write into them can ever raise SIGBUS for want of room.
 * MADV_POPULATE_WRITE does both in one call, through the mapping (so a
 * huge=advise tmpfs allocates huge pages: the mapping has MADV_HUGEPAGE).
 * Where it fails (EINVAL: Linux < 5.14; EFAULT / ENOMEM: no room),
 * fallocate says whether the room is there (ENOSPC if not) and the pages
 * are then written one by one, as MAP_POPULATE would have. 0 or an errno. */
static int back_range(ecxi_region *r, uint64_t off, uint64_t len)
{
    uint8_t *p = r->base + off;
    if (madvise(p, (size_t)len, MADV_POPULATE_WRITE) == 0) return 0;
    if (fallocate(r->fd, 0, (off_t)off, (off_t)len) != 0) {
        if (errno != EOPNOTSUPP && errno != ENOSYS) return errno;
        /* Neither call there: nothing can tell whether the room is; write
         * as ever, as a file system without both always did. */
    }
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    for (uint64_t o = 0; o < len; o += (uint64_t)pg)
        /* An atomic add of 0: a write fault that cannot undo a concurrent
         * writer's byte (the filler runs beside the writers). */
        __atomic_fetch_add((volatile uint8_t *)p + o, 0, __ATOMIC_RELAXED);
    return 0;
}

static int back_chunk(ecxi_region *r, uint64_t i)
{
    if (atomic_load_explicit(&r->backed[i], memory_order_acquire)) return 0;
    uint64_t off = i * FILL_CHUNK, len = r->size - off < FILL_CHUNK ? r->size - off : FILL_CHUNK;
    int e = back_range(r, off, len);
    if (!e && !atomic_exchange_explicit(&r->backed[i], 1, memory_order_acq_rel))
        atomic_fetch_add_explicit(&r->n_backed, 1, memory_order_relaxed);
    return e;
}

int ecxi_region_back(ecxi_region *r, uint64_t first_block, uint64_t n_blocks)
{
    if (!r || !n_blocks) return 0;
    if (first_block > r->num_blocks || n_blocks > r->num_blocks - first_block) return ECX_ERANGE;
    if (!r->backed) return 0; /* a joiner's mapping: its creator backs the blocks */
    uint64_t lo = first_block * r->block_bytes, hi = (first_block + n_blocks) * r->block_bytes;
    for (uint64_t i = lo / FILL_CHUNK; i <= (hi - 1) / FILL_CHUNK; i++) {
        int e = back_chunk(r, i);
        if (e) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN,
                                "region: cannot back blocks %llu..%llu of %s: %s; the save or "
                                "fetch that needs them fails",
                                (unsigned long long)first_block,
                                (unsigned long long)(first_block + n_blocks - 1), r->path,
                                strerror(e));
            return errno_to_ecx(e);
        }
    }
    return 0;
}

uint64_t ecxi_region_backed_bytes(const ecxi_region *r)
{
    if (!r) return 0;
    if (!r->backed) return r->size;
    uint64_t n = atomic_load_explicit(&r->n_backed, memory_order_relaxed);
    return n >= r->n_chunks ? r->size : n * FILL_CHUNK;
}

void ecxi_region_busy(ecxi_region *r)
{
    if (r && r->filling)
        atomic_store_explicit(&r->quiet_from_ns, ecxi_now_ns() + ECXI_REGION_QUIET_NS,
                              memory_order_relaxed);
}

/* Wait while work on the region wants the CPU (ecxi_region_busy), in
 * sleeps of at most the quiet time, so that a stop is seen. */
static void fill_wait_quiet(ecxi_region *r)
{
    for (;;) {
        int64_t left = atomic_load_explicit(&r->quiet_from_ns, memory_order_relaxed) - ecxi_now_ns();
        if (left <= 0 || atomic_load(&r->stop)) return;
        struct timespec ts = {0, left < ECXI_REGION_QUIET_NS ? left : ECXI_REGION_QUIET_NS};
        nanosleep(&ts, NULL);
    }
}

/* The creator's background filler: backs the region piece by piece, from
 * its start (where the cache's first reservations land), until done, told
 * to stop, or out of room (then the rest is backed as blocks are reserved,
 * and a reservation that finds no room fails: ecxi_region_back()). It
 * steps aside while a copy into the region runs (ecxi_region_busy): on a
 * host with no core to spare it took the copy's (a fresh consumer's first
 * 256 MB fetch lost 100-400 ms, in scheduler ticks, to it). */
static void *fill_main(void *arg)
{
    ecxi_region *r = arg;
    for (uint64_t i = 0; i < r->n_chunks && !atomic_load(&r->stop); i++) {
        fill_wait_quiet(r);
        int e = back_chunk(r, i);
        if (e) {
            ecxi_log(ECX_LOG_INFO,
                     "region: background fault-in of %s stopped at byte %llu: %s; the rest is "
                     "backed as blocks are reserved",
                     r->path, (unsigned long long)(i * FILL_CHUNK), strerror(e));
            break;
        }
    }
    return NULL;
}

/* Start the filler, unless ECX_PREFAULT=0. Its signals are blocked, so
 * the process's handlers run on its own threads. A filler that cannot
 * start only leaves the backing to the reservations. */
static void start_filler(ecxi_region *r)
{
    const char *env = getenv("ECX_PREFAULT");
    if (env && !strcmp(env, "0")) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r->filling = pthread_create(&r->filler, NULL, fill_main, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r->filling) {
        r->filler_pid = getpid();
        pthread_setname_np(r->filler, "ecx-prefault");
    }
}

/* Create the temporary file under a shared lock. Returns the fd, or a
 * negative ECX code. A reaper may unlink a temporary between our create
 * and our lock; then the name no longer refers to our inode and we retry. */
static int create_tmp(int dirfd, const char *name, char tmp[NAME_MAX + 1], struct stat *st)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        uint8_t rnd[6];
        char hex[13];
        int rc = random_bytes(rnd, sizeof rnd);
        if (rc) return rc;
        ecxi_hex_encode(rnd, sizeof rnd, hex);
        /* name ends in ".mmap"; keep it and add ".tmp.<pid>.<rand>". */
        int n = snprintf(tmp, NAME_MAX + 1, "%s.tmp.%d.%s", name, (int)getpid(), hex);
        if (n <= 0 || n > NAME_MAX) return ECX_EINVAL;
        int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            if (errno == EEXIST) continue;
            int e = errno;
            ecxi_log(ECX_LOG_ERROR, "region: cannot create %s: %s", tmp, strerror(e));
            return errno_to_ecx(e);
        }
        if (flock_retry(fd, LOCK_SH) != 0 || fstat(fd, st) != 0) {
            int e = errno;
            close(fd);
            unlinkat(dirfd, tmp, 0);
            ecxi_log(ECX_LOG_ERROR, "region: cannot lock %s: %s", tmp, strerror(e));
            return ECX_ESYS;
        }
        if (name_is(dirfd, tmp, st)) return fd;
        close(fd); /* reaped under us: try a fresh name */
    }
    return ECX_ESYS;
}

int ecxi_region_create_in(const char *dir, const char *instance, int rank, uint64_t total_bytes,
                         uint64_t block_bytes, ecxi_region **out)
{
    if (!out) return ECX_EINVAL;
    *out = NULL;
    if (!dir) dir = ecxi_region_default_dir();
    char name[NAME_MAX + 1], tmp[NAME_MAX + 1];
    int rc = region_name(instance, rank, name);
    if (rc) return rc;
    uint64_t num_blocks, size;
    if ((rc = check_sizes(total_bytes, block_bytes, &num_blocks, &size))) return rc;

    int reaped = ecxi_region_reap(dir);
    if (reaped > 0)
        ecxi_log(ECX_LOG_INFO, "region: reclaimed %d orphaned file(s) in %s", reaped, dir);

    ecxi_region *r = region_alloc();
    if (!r) return ECX_ENOMEM;
    r->block_bytes = block_bytes;
    r->num_blocks = num_blocks;
    r->size = size;
    r->owner = true;
    set_path(r, dir, name);
    if ((r->dirfd = open_dir(dir)) < 0) {
        free(r);
        return ECX_ESYS;
    }
    struct stat st;
    if (fstatat(r->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        ecxi_log(ECX_LOG_ERROR, "region: %s already exists", r->path);
        rc = ECX_EREGION_EXISTS;
        goto fail_dir;
    }
    int fd = create_tmp(r->dirfd, name, tmp, &st);
    if (fd < 0) {
        rc = fd;
        goto fail_dir;
    }
    r->fd = fd;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    const char *step = "fchmod";
    if (fchmod(fd, 0600) != 0) goto fail_sys;
    step = "ftruncate";
    if (ftruncate(fd, (off_t)size) != 0) goto fail_sys;
    /* Refuse a region the file system cannot hold now. Its room is taken
     * later, piece by piece (the filler, and ecxi_region_back() for each
     * reservation), so a directory that fills up in between fails a save
     * or a fetch with ECX_EREGION_NOSPC, never a write with SIGBUS. */
    step = "fstatvfs";
    struct statvfs sv;
    if (fstatvfs(fd, &sv) != 0) goto fail_sys;
    if (sv.f_blocks && sv.f_frsize && (size - 1) / sv.f_frsize + 1 > sv.f_bavail) {
        step = "fallocate"; /* what would have refused it */
        errno = ENOSPC;
        goto fail_sys;
    }
    step = "mmap";
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) goto fail_sys;
    r->base = p;
    /* Huge pages where the directory's file system has them (a tmpfs
     * mounted huge=always|within_size; huge=advise needs this hint, given
     * before the pages are allocated, through the mapping: back_range).
     * The kernel already places a shmem mapping at a 2 MiB boundary when
     * its mount can use huge pages, so no alignment here. */
    want_huge(p, (size_t)size);
    step = "calloc";
    r->n_chunks = (size - 1) / FILL_CHUNK + 1;
    if (!(r->backed = calloc((size_t)r->n_chunks, sizeof *r->backed))) {
        errno = ENOMEM;
        goto fail_sys;
    }
    step = "link";
    if (linkat(r->dirfd, tmp, r->dirfd, name, 0) != 0) goto fail_sys;
    if (name_is(r->dirfd, tmp, &st)) unlinkat(r->dirfd, tmp, 0);
    start_filler(r);
    *out = r;
    ecxi_log(ECX_LOG_INFO, "region: created %s (%llu blocks of %llu bytes)", r->path,
            (unsigned long long)num_blocks, (unsigned long long)block_bytes);
    return 0;

fail_sys : {
    int e = errno;
    rc = errno_to_ecx(e);
    ecxi_log(ECX_LOG_ERROR, "region: %s of %s (%llu bytes) failed: %s", step, r->path,
            (unsigned long long)size, strerror(e));
    if (r->base) munmap(r->base, (size_t)size);
    if (name_is(r->dirfd, tmp, &st)) unlinkat(r->dirfd, tmp, 0);
    close(r->fd);
    free((void *)r->backed);
}
fail_dir:
    close(r->dirfd);
    free(r);
    return rc;
}

int ecxi_region_create(const char *instance, int rank, uint64_t total_bytes, uint64_t block_bytes,
                      ecxi_region **out)
{
    return ecxi_region_create_in(NULL, instance, rank, total_bytes, block_bytes, out);
}

/* What join requires of an opened region file. */
static int check_file(const struct stat *st, uint64_t block_bytes, uint64_t *num_blocks)
{
    if (!S_ISREG(st->st_mode)) return ECX_EREGION_BADFILE;
    if (st->st_uid != geteuid() || (st->st_mode & 0777) != 0600)
        return ECX_EREGION_BADFILE;
    if (block_bytes == 0 || st->st_size <= 0) return ECX_EREGION_SIZE;
    uint64_t size = (uint64_t)st->st_size;
    if (size % block_bytes != 0 || size / block_bytes > ECXI_REGION_MAX_BLOCKS ||
        size > (uint64_t)SIZE_MAX)
        return ECX_EREGION_SIZE;
    *num_blocks = size / block_bytes;
    return 0;
}

int ecxi_region_join_in(const char *dir, const char *instance, int rank, uint64_t block_bytes,
                       ecxi_region **out)
{
    if (!out) return ECX_EINVAL;
    *out = NULL;
    if (!dir) dir = ecxi_region_default_dir();
    char name[NAME_MAX + 1];
    int rc = region_name(instance, rank, name);
    if (rc) return rc;
    if (block_bytes == 0) return ECX_EREGION_SIZE;
    int dirfd = open_dir(dir);
    if (dirfd < 0) return ECX_ESYS;
    ecxi_region *r = region_alloc();
    if (!r) {
        close(dirfd);
        return ECX_ENOMEM;
    }
    set_path(r, dir, name);
    r->block_bytes = block_bytes;
    struct stat st;
    int fd = openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        rc = errno_to_ecx(errno);
        goto fail;
    }
    r->fd = fd;
    if (fstat(fd, &st) != 0) {
        rc = ECX_ESYS;
        goto fail;
    }
    if ((rc = check_file(&st, block_bytes, &r->num_blocks))) goto fail;
    /* A reaper holds LOCK_EX only for a moment; wait up to ~1 s for it. */
    for (int i = 0;; i++) {
        if (flock_retry(fd, LOCK_SH | LOCK_NB) == 0) break;
        if (errno != EWOULDBLOCK || i == 100) {
            rc = errno == EWOULDBLOCK ? ECX_EREGION_BUSY : ECX_ESYS;
            goto fail;
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    if (!name_is(dirfd, name, &st)) { /* reclaimed while we opened it */
        rc = ECX_EREGION_NOTFOUND;
        goto fail;
    }
    r->size = (uint64_t)st.st_size;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    void *p = mmap(NULL, (size_t)r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = errno_to_ecx(errno);
        goto fail;
    }
    r->base = p;
    want_huge(p, (size_t)r->size); /* PMD entries for the creator's huge pages */
    close(dirfd);
    *out = r;
    return 0;
fail:
    if (rc == ECX_ESYS) ecxi_log(ECX_LOG_ERROR, "region: join %s: %s", r->path, strerror(errno));
    if (r->fd >= 0) close(r->fd);
    close(dirfd);
    free(r);
    return rc;
}

int ecxi_region_join(const char *instance, int rank, uint64_t block_bytes, ecxi_region **out)
{
    return ecxi_region_join_in(NULL, instance, rank, block_bytes, out);
}

int ecxi_region_map_fd(int fd, uint64_t block_bytes, bool writable, ecxi_region **out)
{
    struct stat st;
    if (!out || fd < 0 || block_bytes == 0) return ECX_EINVAL;
    *out = NULL;
    if (fstat(fd, &st) != 0) return ECX_ESYS;
    if (!S_ISREG(st.st_mode) || st.st_size <= 0 || (uint64_t)st.st_size % block_bytes ||
        (uint64_t)st.st_size / block_bytes > ECXI_REGION_MAX_BLOCKS ||
        (uint64_t)st.st_size > SIZE_MAX)
        return ECX_EREGION_SIZE;
    ecxi_region *r = calloc(1, sizeof *r);
    if (!r) return ECX_ENOMEM;
    r->fd = r->dirfd = -1;
    r->size = (uint64_t)st.st_size;
    r->block_bytes = block_bytes;
    r->num_blocks = r->size / block_bytes;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    void *p = mmap(NULL, (size_t)r->size, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                   MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        free(r);
        return ECX_ENOMEM;
    }
    r->base = p;
    *out = r;
    return 0;
}

void ecxi_region_free(ecxi_region *r)
{
    if (!r) return;
    if (r->filling && r->filler_pid == getpid()) { /* a forked child has no filler */
        atomic_store(&r->stop, true);
        pthread_join(r->filler, NULL);
    }
    free((void *)r->backed);
    if (r->base) munmap(r->base, (size_t)r->size);
    if (r->owner && r->dirfd >= 0) {
        /* Unlink while we still hold our lock, and only our own file. */
        struct stat st = {.st_dev = r->dev, .st_ino = r->ino};
        if (name_is(r->dirfd, r->name, &st) && unlinkat(r->dirfd, r->name, 0) != 0)
            ecxi_log(ECX_LOG_WARN, "region: cannot unlink %s: %s", r->path, strerror(errno));
    }
    if (r->fd >= 0) close(r->fd);
    if (r->dirfd >= 0) close(r->dirfd);
    free(r);
}

uint8_t *ecxi_region_base(const ecxi_region *r)
{
    return r ? r->base : NULL;
}
uint64_t ecxi_region_block_bytes(const ecxi_region *r)
{
    return r ? r->block_bytes : 0;
}
uint64_t ecxi_region_num_blocks(const ecxi_region *r)
{
    return r ? r->num_blocks : 0;
}
uint64_t ecxi_region_size(const ecxi_region *r)
{
    return r ? r->size : 0;
}
const char *ecxi_region_path(const ecxi_region *r)
{
    return r ? r->path : "";
}
bool ecxi_region_is_owner(const ecxi_region *r)
{
    return r && r->owner;
}
/* Try to reclaim one candidate; true if it was unlinked. */
static bool reap_one(int dirfd, const char *name, uid_t uid)
{
    struct stat st, st2;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    if (!S_ISREG(st.st_mode) || st.st_uid != uid) return false;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    bool done = false;
    if (fstat(fd, &st2) == 0 && st2.st_dev == st.st_dev && st2.st_ino == st.st_ino &&
        flock_retry(fd, LOCK_EX | LOCK_NB) == 0) {
        /* Nobody holds it: its creator and joiners are gone. While we hold
         * LOCK_EX no one can start using it; make sure the name is still
         * this inode, then remove it. */
        if (name_is(dirfd, name, &st2) && unlinkat(dirfd, name, 0) == 0) {
            done = true;
            ecxi_log(ECX_LOG_INFO, "region: reclaimed orphan %s (%lld bytes)", name,
                    (long long)st2.st_size);
        }
    }
    close(fd);
    return done;
}

int ecxi_region_reap(const char *dir)
{
    if (!dir) dir = ecxi_region_default_dir();
    int dirfd = open_dir(dir);
    if (dirfd < 0) return ECX_ESYS;
    int listfd = dup(dirfd);
    DIR *d = listfd >= 0 ? fdopendir(listfd) : NULL;
    if (!d) {
        if (listfd >= 0) close(listfd);
        close(dirfd);
        return ECX_ESYS;
    }
    uid_t uid = geteuid();
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) continue;
        if (reapable_name(de->d_name) && reap_one(dirfd, de->d_name, uid)) count++;
    }
    closedir(d);
    close(dirfd);
    return count;
}

int ecx_reap_regions(const char *dir) { return ecxi_region_reap(dir); }
