/* SPDX-License-Identifier: Apache-2.0 */
/* test_shm_copy — the same-host copy (shm_copy.h) on its own: the one-pass
 * copy+hash gives XXH3-64 exactly (ecxi_checksum of the bytes written) for
 * every length and split into runs, as pread does; a source truncated
 * under the copy is a failed copy, never a signal, on both ways; the
 * SIGBUS guard hands faults that are not its own to whoever was there
 * before (the default action still kills, a prior handler still runs); a
 * handler installed after ours makes copies take pread. Every kernel the
 * CPU has (AVX-512, AVX2, portable C) is pinned in turn: fsum on its own
 * (copy and hash-only, any alignment of either side, any split into calls,
 * lengths around the non-temporal threshold) and the shm copies.
 * Plain C, not cmocka: cmocka installs its own SIGBUS handler around each
 * test, which is exactly what this must control. */
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checksum.h"
#include "ecx.h"
#include "fsum.h"
#include "shm_copy.h"

#define MAXLEN (3u << 20)

/* The ways a copy is asked for: guarded, pread, guarded with a thread
 * faulting the source in ahead of it. */
static const int modes[] = {ECXI_SHM_COPY_AUTO, ECXI_SHM_COPY_PREAD, ECXI_SHM_COPY_AHEAD};
#define NMODES 3

static char path[64];
static int failures;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                           \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
#define REQUIRE(c)                                                                                 \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A source file of len bytes of pseudo-random content, mapped read-only. */
static ecxi_shm_src make_src(uint64_t len)
{
    strcpy(path, "/dev/shm/ecx-test-shm-copy-XXXXXX");
    int wfd = mkstemp(path);
    REQUIRE(wfd >= 0);
    uint8_t *b = malloc(len);
    REQUIRE(b);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    CHECK(write(wfd, b, len) == (ssize_t)len);
    free(b);
    close(wfd);
    int fd = open(path, O_RDONLY);
    REQUIRE(fd >= 0);
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    return (ecxi_shm_src){.fd = fd, .map = m, .map_len = len};
}

static void drop_src(ecxi_shm_src *s)
{
    ecxi_shm_ahead_drain(s->map); /* no fault-ahead thread is left on it */
    munmap((void *)s->map, s->map_len);
    close(s->fd);
    unlink(path);
}

/* The expected bytes of an item: src blocks remote[i], nbytes in all. */
static uint64_t expect_sum(const ecxi_shm_src *s, uint64_t bs, const uint64_t *remote, size_t n,
                           uint64_t nbytes, uint8_t *flat)
{
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = nbytes - off < bs ? nbytes - off : bs;
        memcpy(flat + off, s->map + remote[i] * bs, k);
        off += k;
    }
    return ecxi_checksum(flat, nbytes);
}

static void check_item(const uint8_t *dst, uint64_t bs, const uint64_t *local, size_t n,
                       uint64_t nbytes, const uint8_t *flat)
{
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = nbytes - off < bs ? nbytes - off : bs;
        CHECK(memcmp(dst + local[i] * bs, flat + off, k) == 0);
        off += k;
    }
}

static void sums_match_xxh3(void)
{
    CHECK(ecxi_shm_copy_init() == 0);
    /* The guarded way, where the CPU allows it; pread is checked too. */
    REQUIRE(ecxi_shm_copy_guarded());
    ecxi_shm_src s = make_src(MAXLEN);
    uint8_t *dst = malloc(MAXLEN), *flat = malloc(MAXLEN);
    uint64_t *remote = malloc(MAXLEN * sizeof *remote), *local = malloc(MAXLEN * sizeof *local);
    ecxi_block_run *rr = malloc(MAXLEN * sizeof *rr), *lr = malloc(MAXLEN * sizeof *lr);
    REQUIRE(dst && flat && remote && local && rr && lr);
    srand(7);
    static const uint64_t sizes[] = {1, 2, 3, 7, 31, 33, 64, 100, 1000, 4096, 65536, 1 << 20};
    for (int t = 0; t < 400; t++) {
        uint64_t bs = sizes[rand() % 12];
        uint64_t nblk = MAXLEN / bs;
        if (nblk > 4096) nblk = 4096;
        uint64_t maxb = nblk * bs;
        /* Lengths around XXH3's thresholds, stripe and block edges, and
         * anything up to the whole source. */
        static const uint64_t edge[] = {1, 16, 17, 128, 129, 240, 241, 255, 256, 1023, 1024,
                                        1025, 1087, 1088, 1089, 16384, 16385};
        uint64_t nbytes = t % 3 == 0 ? edge[rand() % 17] : 1 + (uint64_t)rand() % maxb;
        if (nbytes > maxb) nbytes = maxb;
        size_t n = (size_t)((nbytes + bs - 1) / bs);
        /* Runs of random length: consecutive on both sides, then a jump. */
        uint64_t r = (uint64_t)rand() % (nblk - n + 1), l = (uint64_t)rand() % (nblk - n + 1);
        for (size_t i = 0; i < n; i++) {
            remote[i] = r + i, local[i] = l + i;
            if (rand() % 4 == 0 && i + 1 < n) { /* swap two: breaks the run */
                remote[i] = r + i + 1;
                remote[i + 1] = r + i;
                local[i + 1] = l + i + 1;
                i++;
            }
        }
        uint64_t want = expect_sum(&s, bs, remote, n, nbytes, flat);
        size_t nr = ecxi_block_runs_of(remote, n, rr), nl = ecxi_block_runs_of(local, n, lr);
        for (int mi = 0; mi < NMODES; mi++) {
            const int mode = modes[mi];
            uint64_t got = 0;
            memset(dst, 0x5a, (size_t)maxb);
            CHECK(ecxi_shm_copy(&s, dst, bs, rr, nr, lr, nl, nbytes, mode, &got) == 0);
            if (got != want) {
                fprintf(stderr, "FAIL mode %d bs %llu nbytes %llu: %016llx != %016llx\n", mode,
                        (unsigned long long)bs, (unsigned long long)nbytes,
                        (unsigned long long)got, (unsigned long long)want);
                failures++;
            }
            check_item(dst, bs, local, n, nbytes, flat);
            /* The same copy as a job, in steps of a random size (1 byte
             * up to 1 MiB, cutting stripes and runs anywhere), with and
             * without populating: the same bytes, the same checksum. */
            static const uint64_t steps[] = {1, 63, 64, 65, 4096, 4097, 65536, 1 << 20};
            int m = mode | (t % 2 ? ECXI_SHM_COPY_POPULATE : 0);
            ecxi_shm_job *j;
            REQUIRE(ecxi_shm_job_new(&s, bs, rr, nr, lr, nl, nbytes, m, &j) == 0);
            memset(dst, 0x5a, (size_t)maxb);
            uint64_t step = steps[rand() % 8], moved, calls = 0, total = 0;
            int rc;
            got = 0;
            while ((rc = ecxi_shm_job_step(j, &s, dst, step, &moved, &got)) == 0 && calls < 1u << 24) {
                CHECK(moved == step);
                total += moved, calls++;
                if (step < 64 && calls > 4096) step = 65536; /* keep tiny steps cheap */
            }
            CHECK(rc == 1);
            CHECK(moved <= step);
            total += moved;
            CHECK(total == nbytes);
            CHECK(ecxi_shm_job_left(j) == 0);
            ecxi_shm_job_free(j);
            if (got != want) {
                fprintf(stderr, "FAIL sliced mode %d bs %llu nbytes %llu step %llu\n", m,
                        (unsigned long long)bs, (unsigned long long)nbytes,
                        (unsigned long long)step);
                failures++;
            }
            check_item(dst, bs, local, n, nbytes, flat);
        }
    }
    free(dst), free(flat), free(remote), free(local), free(rr), free(lr);
    drop_src(&s);
}

static uint64_t rnd(void)
{
    return (uint64_t)rand() << 31 ^ (uint64_t)rand();
}

/* fsum alone: copy or hash a stream of len bytes from src+so to dst+dof in
 * calls of random length; the bytes and XXH3-64 of libxxhash. */
static void fsum_one(const uint8_t *src, uint8_t *dst, uint64_t len, bool copy, int isa)
{
    ecxi_fsum f;
    ecxi_fsum_init(&f, len);
    uint64_t done = 0, calls = 0;
    uint64_t cut = rnd() % 4 == 0 ? 1 + rnd() % 200 : 1 + rnd() % (len + 1);
    while (done < len && calls < 100000) {
        uint64_t k = len - done < cut ? len - done : cut;
        if (copy) ecxi_fsum_copy(&f, dst + done, src + done, k);
        else ecxi_fsum_update(&f, src + done, k);
        done += k, calls++;
        if (rnd() % 3 == 0) cut = 1 + rnd() % (len + 1);
    }
    REQUIRE(done == len);
    uint64_t want = ecxi_checksum(src, len), got = ecxi_fsum_digest(&f);
    if (got != want || (copy && memcmp(dst, src, len) != 0)) {
        fprintf(stderr, "FAIL fsum isa %d %s len %llu src %% 64 = %u dst %% 64 = %u\n", isa,
                copy ? "copy" : "hash", (unsigned long long)len, (unsigned)((uintptr_t)src % 64),
                (unsigned)((uintptr_t)dst % 64));
        failures++;
    }
}

static void fsum_matches_xxh3(void)
{
    const uint64_t big = ECXI_FSUM_NT_MIN + 4096;
    uint8_t *src = malloc(big + 128), *dst = malloc(big + 128);
    REQUIRE(src && dst);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (uint64_t i = 0; i < big + 128; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[i] = (uint8_t)x;
    }
    static const uint64_t edge[] = {0, 1, 16, 17, 128, 129, 239, 240, 241, 255, 256, 1023, 1024,
                                    1025, 1087, 1088, 1089, 16383, 16384, 16385, 65536 + 1000};
    const int nedge = (int)(sizeof edge / sizeof edge[0]);
    int ran = 0;
    srand(11);
    for (int isa = ECXI_FSUM_C; isa <= ECXI_FSUM_AVX512; isa++) {
        if (ecxi_fsum_set_isa(isa) != 0) continue;
        ran++;
        for (int t = 0; t < 600; t++) {
            uint64_t len = t < 2 * nedge ? edge[t % nedge] : 1 + rnd() % (3u << 20);
            size_t so = t % 5 == 0 ? 0 : (size_t)(rnd() % 64), dof = (size_t)(rnd() % 64);
            if (t % 7 == 0) dof = 0; /* aligned: the streaming stores, when large */
            fsum_one(src + so, dst + dof, len, t % 2 == 0 || t < nedge, isa);
        }
        /* Around the non-temporal threshold, aligned and not. */
        static const uint64_t nt[] = {ECXI_FSUM_NT_MIN - 1, ECXI_FSUM_NT_MIN,
                                      ECXI_FSUM_NT_MIN + 65};
        for (int i = 0; i < 3; i++)
            for (size_t dof = 0; dof < 128; dof += 64 + 3) {
                fsum_one(src, dst + dof, nt[i], true, isa);
                fsum_one(src + 5, dst + dof, nt[i], true, isa);
            }
        fsum_one(src + 3, dst, ECXI_FSUM_NT_MIN, false, isa);
    }
    CHECK(ran >= 1);
    CHECK(ecxi_fsum_set_isa(ECXI_FSUM_AVX512 + 1) == -1);
    CHECK(ecxi_fsum_set_isa(ecxi_fsum_best_isa()) == 0);
    free(src), free(dst);
}

/* Truncate the source under a mapping: the copy fails, no signal. */
static void truncated_source_fails(void)
{
    CHECK(ecxi_shm_copy_init() == 0);
    const uint64_t bs = 65536, len = 64 * bs;
    ecxi_shm_src s = make_src(len);
    uint8_t *dst = malloc(len);
    const ecxi_block_run all = {0, 64}, ten = {0, 10};
    uint64_t sum;
    REQUIRE(ecxi_shm_copy_guarded());
    CHECK(ecxi_shm_copy(&s, dst, bs, &all, 1, &all, 1, len, ECXI_SHM_COPY_AUTO, &sum) == 0);
    CHECK(truncate(path, 10 * bs) == 0);
    for (int mi = 0; mi < NMODES; mi++)
        CHECK(ecxi_shm_copy(&s, dst, bs, &all, 1, &all, 1, len, modes[mi], &sum) == ECX_ESYS);
    /* Truncated between two steps of a job: the next step fails. */
    for (int mi = 0; mi < NMODES; mi++) {
        ecxi_shm_job *j;
        uint64_t moved;
        REQUIRE(ecxi_shm_job_new(&s, bs, &all, 1, &all, 1, len, modes[mi], &j) == 0);
        CHECK(ecxi_shm_job_step(j, &s, dst, 4 * bs, &moved, &sum) == 0 && moved == 4 * bs);
        CHECK(ecxi_shm_job_step(j, &s, dst, 20 * bs, &moved, &sum) == ECX_ESYS);
        ecxi_shm_job_free(j);
    }
    /* What is still there still copies. */
    CHECK(ecxi_shm_copy(&s, dst, bs, &ten, 1, &ten, 1, 10 * bs, ECXI_SHM_COPY_AUTO, &sum) == 0);
    REQUIRE(sum == ecxi_checksum(s.map, 10 * bs));
    free(dst);
    drop_src(&s);
}

/* A job whose fault-ahead thread is still running is freed mid-copy (a
 * cancelled READ): nothing waits; the drain before the munmap does. */
static void ahead_freed_mid_copy(void)
{
    const uint64_t bs = 65536, len = MAXLEN;
    ecxi_shm_src s = make_src(len);
    uint8_t *dst = malloc(len);
    const ecxi_block_run all = {0, len / bs};
    uint64_t moved, sum;
    REQUIRE(dst);
    for (int t = 0; t < 20; t++) {
        ecxi_shm_job *j;
        REQUIRE(ecxi_shm_job_new(&s, bs, &all, 1, &all, 1, len, ECXI_SHM_COPY_AHEAD, &j) == 0);
        CHECK(ecxi_shm_job_step(j, &s, dst, 4096u << (t % 8), &moved, &sum) == 0);
        ecxi_shm_job_free(j);
    }
    free(dst);
    drop_src(&s); /* unmapped after every thread is gone */
}

/* In a child: touch a truncated mapping outside any copy. */
static int fault_outside(void)
{
    ecxi_shm_src s = make_src(65536);
    CHECK(truncate(path, 0) == 0);
    unlink(path);
    volatile uint8_t x = s.map[100]; /* SIGBUS */
    (void)x;
    return 0;
}

static void on_bus_exit(int sig)
{
    (void)sig;
    _exit(42);
}

static void foreign_faults_chain(void)
{
    /* No handler before ours: the default action (death by SIGBUS). */
    pid_t pid = fork();
    if (pid == 0) {
        ecxi_shm_copy_init();
        _exit(fault_outside());
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    /* (under ASan its own handler was first: it reports and exits 1) */
    REQUIRE((WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) ||
                (WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 42));
    /* A handler before ours still gets its faults. */
    pid = fork();
    if (pid == 0) {
        signal(SIGBUS, on_bus_exit);
        ecxi_shm_copy_init();
        _exit(fault_outside());
    }
    CHECK(waitpid(pid, &st, 0) == pid);
    REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 42);
}

/* Someone replaces our handler: copies go through pread, still safe. */
static void replaced_handler_uses_pread(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (ecxi_shm_copy_init() != 0) _exit(1);
        signal(SIGBUS, on_bus_exit);
        if (ecxi_shm_copy_guarded()) _exit(2);
        const uint64_t bs = 4096, len = 16 * bs;
        ecxi_shm_src s = make_src(len);
        uint8_t dst[16 * 4096];
        const ecxi_block_run all = {0, 16};
        uint64_t sum;
        if (ecxi_shm_copy(&s, dst, bs, &all, 1, &all, 1, len, ECXI_SHM_COPY_AUTO, &sum) != 0 ||
            sum != ecxi_checksum(s.map, len))
            _exit(3);
        if (truncate(path, bs) != 0) _exit(4);
        int rc = ecxi_shm_copy(&s, dst, bs, &all, 1, &all, 1, len, ECXI_SHM_COPY_AUTO, &sum);
        drop_src(&s);
        _exit(rc == ECX_ESYS ? 0 : 5);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
}

int main(void)
{
    foreign_faults_chain(); /* first: its children install the guard themselves */
    fsum_matches_xxh3();
    for (int isa = ECXI_FSUM_C; isa <= ECXI_FSUM_AVX512; isa++) {
        if (ecxi_fsum_set_isa(isa) != 0) continue;
        sums_match_xxh3();
        truncated_source_fails();
    }
    ahead_freed_mid_copy();
    ecxi_fsum_set_isa(ecxi_fsum_best_isa());
    replaced_handler_uses_pread();
    printf("test_shm_copy: %s\n", failures ? "FAILED" : "all passed");
    return failures != 0;
}
