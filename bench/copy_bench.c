/* SPDX-License-Identifier: Apache-2.0 */
/* copy_bench — the same-host copy kernel alone against glibc's memcpy, on
 * the same buffers: a read-only mapping of a region file (already faulted
 * in: a warm fetch) and a destination mapping of another, both under
 * $ECX_SHM_DIR (else /dev/shm, 4 KiB pages). Per size and iteration, in
 * turn: memcpy(dst, src), the library's verified copy (ecxi_shm_copy: copy
 * + XXH3-64 in one pass), and, where this tree has fsum.h, the same copy
 * pinned to each kernel the CPU has, the hash alone (fsum over bytes in
 * place, what tcp's receive pays) and libxxhash's XXH3_64bits over the
 * same bytes. Every copy's checksum is checked. Prints, per size, medians
 * and their ratios to the memcpy of the same run:
 *   size=B memcpy_ms=X copy_ratio=X [copy_ratio_avx512=X copy_ratio_avx2=X
 *   copy_ratio_c=X hash_ratio=X xxh3_ratio=X]
 * (a ratio is time / memcpy time: 1.0 is memcpy's speed, lower is faster).
 * With --cold, three ways to copy out of pages this process has not mapped
 * yet (a consumer's first fetch from a producer), the same iteration:
 *   cold_map_ratio     a fresh mapping (mmap timed), the library's copy:
 *                      each 4 KiB page faulted in as the copy reaches it
 *   cold_pread_ratio   the library's pread way (page cache -> destination,
 *                      each chunk hashed while in cache): no mapping at all
 *   cold_ahead_ratio   a fresh mapping, copied 256 KiB a step with
 *                      ECXI_SHM_COPY_AHEAD (a second thread faults it in
 *                      from the end down to where the copy has got), as
 *                      data_shm.c copies a large first READ
 *   bench_copy [--size BYTES]... [--iters N] [--cold]   (default 4.7 MB,
 *   28.8 MB, 256 MB; 9 iterations)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "checksum.h"
#include "shm_copy.h"
#if __has_include("fsum.h")
#include "fsum.h"
#define HAVE_FSUM 1
#else
#define HAVE_FSUM 0
#endif

#define MAX_SIZES 8
#define NV 10 /* memcpy, library copy, avx512, avx2, c, fsum hash, xxh3, 3 cold ways */

static double now_s(void)
{
    return (double)bench_now_ns() * 1e-9;
}

/* A file of len bytes under dir, mapped (read-only unless rw); -1 fd on error. */
static int map_file(const char *dir, uint64_t len, bool rw, uint8_t **out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/ecx-copybench-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    unlink(path);
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return -1;
    }
    uint8_t *w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w == MAP_FAILED) {
        close(fd);
        return -1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(w + i, &x, 8);
    }
    if (!rw) {
        munmap(w, len);
        w = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        if (w == MAP_FAILED) {
            close(fd);
            return -1;
        }
        volatile uint8_t s = 0;
        for (uint64_t i = 0; i < len; i += 4096)
            s ^= w[i]; /* every page of the mapping in: a warm fetch */
        (void)s;
    }
    *out = w;
    return fd;
}

/* One cold copy of size bytes (v: 7 fresh mapping, 8 pread, 9 fresh
 * mapping + fault-ahead thread); the time, or < 0. */
static double cold_once(int v, const ecxi_shm_src *s, uint8_t *dst, uint64_t size, uint64_t *sum)
{
    const ecxi_block_run blk = {0, 1}; /* one block of size bytes */
    double t0 = now_s();
    if (v == 8) {
        if (ecxi_shm_copy(s, dst, size, &blk, 1, &blk, 1, size, ECXI_SHM_COPY_PREAD, sum)) return -1;
        return now_s() - t0;
    }
    void *map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, s->fd, 0);
    if (map == MAP_FAILED) return -1;
    ecxi_shm_src fresh = {.fd = s->fd, .map = map, .map_len = s->map_len};
    int rc = 0;
    if (v == 7) {
        rc = ecxi_shm_copy(&fresh, dst, size, &blk, 1, &blk, 1, size, 0, sum);
    } else { /* as data_shm.c copies: 256 KiB a step */
        ecxi_shm_job *j = NULL;
        rc = ecxi_shm_job_new(&fresh, size, &blk, 1, &blk, 1, size, ECXI_SHM_COPY_AHEAD, &j);
        uint64_t moved;
        while (rc == 0 && (rc = ecxi_shm_job_step(j, &fresh, dst, 256u << 10, &moved, sum)) == 0)
            ;
        if (j) ecxi_shm_job_free(j);
        rc = rc == 1 ? 0 : -1;
    }
    double t = now_s() - t0;
    ecxi_shm_ahead_drain(map);
    munmap(map, s->map_len);
    return rc ? -1 : t;
}

int main(int argc, char **argv)
{
    uint64_t sizes[MAX_SIZES];
    int nsizes = 0, iters = 9;
    bool cold = false;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (!strcmp(argv[i], "--cold")) {
            cold = true;
            continue;
        }
        if (i + 1 >= argc) goto usage;
        errno = 0;
        unsigned long long v = strtoull(argv[i + 1], &end, 10);
        if (*end || errno || argv[i + 1][0] < '0' || argv[i + 1][0] > '9') goto usage;
        if (!strcmp(argv[i], "--size") && nsizes < MAX_SIZES && v > 0 && v <= (4ull << 30))
            sizes[nsizes++] = v;
        else if (!strcmp(argv[i], "--iters") && v >= 1 && v <= 1000)
            iters = (int)v;
        else
            goto usage;
        i++;
    }
    if (!nsizes) sizes[0] = 4700000, sizes[1] = 28800000, sizes[2] = 256000000, nsizes = 3;
    uint64_t max = 0;
    for (int i = 0; i < nsizes; i++)
        max = sizes[i] > max ? sizes[i] : max;
    const char *dir = getenv("ECX_SHM_DIR") ? getenv("ECX_SHM_DIR") : "/dev/shm";
    uint8_t *src, *dst;
    int sfd = map_file(dir, max, false, &src), dfd = map_file(dir, max, true, &dst);
    double *t = malloc((size_t)NV * (size_t)iters * sizeof *t);
    if (sfd < 0 || dfd < 0 || !t || ecxi_shm_copy_init() != 0) {
        fprintf(stderr, "bench_copy: cannot set up under %s: %s\n", dir, strerror(errno));
        return 1;
    }
    ecxi_shm_src s = {.fd = sfd, .map = src, .map_len = max};
    const ecxi_block_run blk = {0, 1}; /* one block of size bytes */
    volatile uint64_t sink = 0;
    for (int z = 0; z < nsizes; z++) {
        uint64_t size = sizes[z], want = ecxi_checksum(src, size);
        for (int it = -1; it < iters; it++) { /* it -1: warm-up */
            for (int v = 0; v < NV; v++) {
                uint64_t sum = want;
                double t0 = now_s();
                if (v == 0) {
                    memcpy(dst, src, size);
                    __asm__ __volatile__("" ::"r"(dst) : "memory");
                } else if (v >= 7) {
                    if (!cold) continue;
                    double c = cold_once(v, &s, dst, size, &sum);
                    if (c < 0) return 1;
                    t0 = now_s() - c;
                } else if (v == 1) {
                    if (ecxi_shm_copy(&s, dst, size, &blk, 1, &blk, 1, size, 0, &sum)) return 1;
#if HAVE_FSUM
                } else if (v <= 4) {
                    if (ecxi_fsum_set_isa(ECXI_FSUM_AVX512 + 2 - v) != 0) continue;
                    int rc = ecxi_shm_copy(&s, dst, size, &blk, 1, &blk, 1, size, 0, &sum);
                    ecxi_fsum_set_isa(ecxi_fsum_best_isa());
                    if (rc) return 1;
                } else if (v == 5) {
                    ecxi_fsum f;
                    ecxi_fsum_init(&f, size);
                    ecxi_fsum_update(&f, dst, size);
                    sum = ecxi_fsum_digest(&f);
                } else if (v == 6) {
                    sum = ecxi_checksum(dst, size);
#endif
                } else {
                    continue;
                }
                double t1 = now_s();
                if (sum != want || ((v <= 4 || v >= 7) && memcmp(dst + size / 2, src + size / 2, 4096))) {
                    fprintf(stderr, "bench_copy: variant %d of %llu bytes: wrong result\n", v,
                            (unsigned long long)size);
                    return 1;
                }
                sink += sum;
                if (it >= 0) t[v * iters + it] = t1 - t0;
            }
        }
        double m = bench_median(t, iters);
        printf("size=%llu memcpy_ms=%.3f copy_ratio=%.3f", (unsigned long long)size, m * 1e3,
               bench_median(t + iters, iters) / m);
#if HAVE_FSUM
        static const char *const names[] = {"avx512", "avx2", "c"};
        for (int v = 2; v <= 4; v++)
            if (ECXI_FSUM_AVX512 + 2 - v <= ecxi_fsum_best_isa())
                printf(" copy_ratio_%s=%.3f", names[v - 2], bench_median(t + v * iters, iters) / m);
        printf(" hash_ratio=%.3f xxh3_ratio=%.3f", bench_median(t + 5 * iters, iters) / m,
               bench_median(t + 6 * iters, iters) / m);
#endif
        if (cold)
            printf(" cold_map_ratio=%.3f cold_pread_ratio=%.3f cold_ahead_ratio=%.3f",
                   bench_median(t + 7 * iters, iters) / m, bench_median(t + 8 * iters, iters) / m,
                   bench_median(t + 9 * iters, iters) / m);
        printf("\n");
        fflush(stdout);
    }
    free(t);
    return 0;
usage:
    fprintf(stderr, "usage: bench_copy [--size BYTES]... [--iters N] [--cold]\n");
    return 2;
}
