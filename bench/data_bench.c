/* SPDX-License-Identifier: Apache-2.0 */
/* data_bench — the body of build/bench_data, the internal data-plane
 * benchmark (bench/data_bench.h; `ecx bench data` is its public-API
 * counterpart, tools/cmd_bench_data.c).
 *
 * A producer process (forked) fills a region with a known pattern and
 * serves it (busy polling, as ucx_perftest's server does); this process is
 * the consumer. For each size and path it READs the encoding (stored in one
 * contiguous run, as the cache hands blocks out) repeatedly; each fetch is
 * timed from ecxi_data_read_post() until the READ reports DONE, and every
 * fetch is then checked byte for byte against the pattern (outside the
 * timed window; a mismatch fails the run). Before each fetch, and before
 * each memcpy of the baseline, the destination is overwritten, so every
 * path starts from the same cache state. Figures are medians. The
 * regions live in a fresh directory under $ECX_SHM_DIR (else /dev/shm), as
 * the library's do, so a huge-page tmpfs can be measured.
 *
 * The producer runs two data contexts on its region: auto (shm and tcp)
 * and ucx (which auto no longer publishes). The "tcp" path is ecx's own
 * (data_tcp.c, loopback here); the "ucx" path uses whatever transports
 * UCX picks (on one host, its shared-memory ones); run with UCX_TLS=tcp
 * to measure UCX over TCP.
 *
 * Every fetch is the verified one: the backend checks the bytes it wrote
 * against the grant's XXH3-64 before DONE, so shm_ratio is the verified
 * same-host fetch against a plain memcpy (budget: >= 0.85 at 28.8 MB).
 * When shm is measured, the same loop also times, on the producer's region
 * file (opened here, read-only, by the bench itself), the ways that copy
 * could be done (shm_copy.h), each verified against the checksum:
 *   pread      pread + XXH3 a 512 KiB chunk at a time (ECXI_SHM_COPY_PREAD)
 *   mmap+hash  memcpy from a read-only mapping, then XXH3 of each 256 KiB
 *              chunk while it is in cache
 *   warm       the library's copy (ecxi_shm_copy, guarded one-pass where it
 *              can) from that mapping, which earlier copies faulted in
 *   cold       the same from a fresh mapping, its mmap timed (a consumer's
 *              first read of those pages: page tables built on first touch)
 * and prints their ratios to memcpy on stderr. When tcp is measured, the
 * loop also times raw TCP (tools/bench_util.h): tcp_vs_raw on stdout.
 */
#include "data_bench.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>

#include "bench_util.h"
#include "data.h"
#include "grant_stub.h"
#include "region.h"
#include "shm_copy.h"
#include "util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill_pattern(uint8_t *b, uint64_t n)
{
    uint64_t *w = (uint64_t *)b;
    for (uint64_t i = 0; i < n / 8; i++)
        w[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
    for (uint64_t i = n / 8 * 8; i < n; i++)
        b[i] = (uint8_t)i;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int write_all(int fd, const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *b, size_t n)
{
    uint8_t *p = b;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static void count_notif(void *arg, const char *key, size_t len, const uint8_t *token, int status)
{
    (void)key, (void)len, (void)token, (void)status;
    (*(long *)arg)++;
}

/* The producer: serve until the parent closes the pipe (or 10 minutes).
 * Two contexts (auto: shm + tcp; ucx, where built in); for each, it sends
 * the parent its metadata and layout: u32 lengths[4], then the four blobs
 * (ucx's empty where it is not built in). */
static int producer_main(const char *dir, uint64_t bytes, uint64_t bs, int out_fd, int stop_fd)
{
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    ecxi_region *r;
    ecxi_data *d[2] = {NULL, NULL};
    int n = ecxi_data_backend_built(ECX_DATA_UCX) ? 2 : 1;
    static const ecxi_data_opts opts[2] = {{.backend = ECX_DATA_AUTO},
                                          {.backend = ECX_DATA_UCX}};
    static stub_grants grants;
    const uint8_t *m[2];
    size_t ml[2];
    uint8_t ds[2][ECXI_DATA_DESC_MAX];
    uint32_t lens[4] = {0, 0, 0, 0};
    if (ecxi_region_instance_id(id) || ecxi_region_create_in(dir, id, 0, bytes, bs, &r)) return 1;
    fill_pattern(ecxi_region_base(r), ecxi_region_size(r));
    for (int k = 0; k < n; k++) {
        if (ecxi_data_new_producer(r, &opts[k], &d[k])) return 1;
        ecxi_data_set_grant_fn(d[k], stub_grant_check, &grants);
        m[k] = ecxi_data_agent_metadata(d[k], &ml[k]);
        long dl = stub_layout(d[k], ds[k], sizeof ds[k]);
        if (dl < 0) return 1;
        lens[2 * k] = (uint32_t)ml[k], lens[2 * k + 1] = (uint32_t)dl;
    }
    if (write_all(out_fd, lens, sizeof lens))
        return 1;
    for (int k = 0; k < n; k++)
        if (write_all(out_fd, m[k], ml[k]) || write_all(out_fd, ds[k], lens[2 * k + 1])) return 1;
    long notifs = 0;
    double end = now_s() + 600;
    for (unsigned i = 0; now_s() < end; i++) {
        ecxi_data_poll_notifs(d[0], count_notif, &notifs);
        if (d[1]) ecxi_data_poll_notifs(d[1], count_notif, &notifs);
        if (i % 256 == 0) {
            struct pollfd p = {.fd = stop_fd, .events = POLLIN};
            if (poll(&p, 1, 0) > 0) break;
        }
    }
    ecxi_data_free(d[0]);
    ecxi_data_free(d[1]);
    ecxi_region_free(r);
    return 0;
}

typedef struct bench {
    ecxi_region *cr;
    uint8_t *expect, *src, *dst; /* pattern; memcpy baseline buffers */
    uint64_t bs;
    int iters, warmup;
    ecxi_shm_src var;    /* the producer's region, for the copy variants */
    double *tv[4];      /* their times: pread, mmap+hash, guarded, guarded cold */
} bench;

typedef struct path {
    int backend;
    const uint8_t *layout; /* its producer context's descriptor, for each grant's */
    size_t layout_len;
    ecxi_data *d;
    ecxi_data_peer *p;
    double *t;
} path;

static int path_open(path *ph, int backend, bench *b, const uint8_t *m, size_t ml,
                     const uint8_t *ds, size_t dl)
{
    ecxi_data_opts o = {.backend = backend};
    ph->backend = backend;
    ph->layout = ds, ph->layout_len = dl;
    ph->t = malloc((size_t)b->iters * sizeof *ph->t);
    if (!ph->t) return -1;
    ecxi_data_desc layout;
    int rc = ecxi_data_new_consumer(b->cr, &o, &ph->d);
    if (rc || (rc = ecxi_data_desc_decode(ds, dl, &layout)) ||
        (rc = ecxi_data_peer_add(ph->d, m, ml, &layout, &ph->p))) {
        fprintf(stderr, "bench: %s path: %s\n", ecxi_data_backend_name(backend), ecx_strerror(rc));
        return -1;
    }
    return 0;
}

static void path_close(path *ph)
{
    if (ph->p) ecxi_data_peer_drop(ph->p);
    if (ph->d) ecxi_data_free(ph->d);
    free(ph->t);
    memset(ph, 0, sizeof *ph);
}

/* One timed READ of `size` bytes (the producer's blocks from..  into our
 * blocks 0..), verified afterwards; seconds, or < 0 on failure. */
static double path_fetch_at(path *ph, bench *b, uint64_t size, uint64_t from)
{
    uint64_t n = (size + b->bs - 1) / b->bs;
    const uint8_t *expect = b->expect + from * b->bs;
    const ecxi_block_run remote = {from, n}, local = {0, n};
    uint8_t *dst = ecxi_region_base(b->cr);
    memset(dst, 0x5a, size);
    ecxi_data_xfer *x;
    char key[ECXI_DATA_NOTIF_MAX];
    uint8_t desc[ECXI_DATA_DESC_MAX];
    int kl = stub_key(key, sizeof key, size, &remote, 1);
    long dl = stub_desc(ph->layout, ph->layout_len, size, ecxi_checksum(expect, size), desc,
                        sizeof desc);
    ecxi_data_desc dd;
    if (kl < 0 || dl < 0 || ecxi_data_desc_decode(desc, (size_t)dl, &dd)) {
        fprintf(stderr, "bench: %llu blocks do not fit one grant key\n", (unsigned long long)n);
        return -1;
    }
    double t0 = now_s();
    int rc = ecxi_data_read_post(ph->p, &dd, &remote, 1, &local, 1, size, key, (size_t)kl, &x);
    if (rc) {
        fprintf(stderr, "bench: post: %s\n", ecx_strerror(rc));
        return -1;
    }
    int st;
    double limit = t0 + 30;
    while ((st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING && now_s() < limit)
        ecxi_data_progress(ph->d, ECXI_DATA_SLICE_NS, NULL);
    double t1 = now_s();
    ecxi_data_read_release(x);
    if (st != ECXI_XFER_DONE || memcmp(dst, expect, size) != 0) {
        fprintf(stderr, "bench: %s fetch %s\n", ecxi_data_backend_name(ph->backend),
                st == ECXI_XFER_DONE ? "delivered wrong bytes" : "did not finish");
        return -1;
    }
    return t1 - t0;
}

static double path_fetch(path *ph, bench *b, uint64_t size)
{
    return path_fetch_at(ph, b, size, 0);
}

/* Cold fetches over shm, each on a fresh consumer context (a first fetch:
 * none of the producer's pages is in our page tables yet): the first
 * fetch; then, on the same context, a fetch of other blocks never read,
 * straight away (still cold) or after idle progress calls (the shm path
 * pre-faults a ready peer's mapping a chunk per idle call); then the first
 * blocks again (warm). Printed on stderr against the memcpy median. */
static int cold_fetches(bench *b, uint64_t size, const uint8_t *m,
                        size_t ml, const uint8_t *ds, size_t dl, double memcpy_s)
{
    uint64_t n = (size + b->bs - 1) / b->bs;
    enum { REPS = 5 };
    double t[2][3], v[2][3][REPS], idle_v[REPS];
    double idle_ms = 0;
    uint64_t idle_calls = 0;
    for (int k = 0; k < 2 * REPS; k++) {
        int idle = k % 2, r = k / 2;
        path ph;
        memset(&ph, 0, sizeof ph);
        int saved = b->iters;
        b->iters = 1;
        int rc = path_open(&ph, ECX_DATA_SHM, b, m, ml, ds, dl);
        b->iters = saved;
        if (rc) {
            path_close(&ph);
            return -1;
        }
        t[idle][0] = path_fetch_at(&ph, b, size, 0);
        if (idle) {
            /* Enough idle calls for the whole mapping, a chunk each. */
            uint64_t calls = ecxi_region_size(b->cr) / ECXI_DATA_CHUNK + 16;
            double t0 = now_s();
            for (uint64_t i = 0; i < calls; i++)
                ecxi_data_progress(ph.d, ECXI_DATA_SLICE_NS, NULL);
            idle_v[r] = (now_s() - t0) * 1e3;
            idle_calls = calls;
        }
        t[idle][1] = path_fetch_at(&ph, b, size, n);
        t[idle][2] = path_fetch_at(&ph, b, size, 0);
        for (int j = 0; j < 3; j++)
            v[idle][j][r] = t[idle][j];
        ecxi_data_stats st;
        memset(&st, 0, sizeof st);
        ecxi_data_get_stats(ph.d, &st);
        path_close(&ph);
        if (t[idle][0] < 0 || t[idle][1] < 0 || t[idle][2] < 0) return -1;
        if (idle && r == REPS - 1)
            fprintf(stderr,
                    "bench: size %llu: shm slices: %llu calls moved bytes, at most %llu bytes "
                    "and %.0f us in one call\n",
                    (unsigned long long)size, (unsigned long long)st.slices,
                    (unsigned long long)st.slice_max_bytes, (double)st.slice_max_ns / 1e3);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            t[i][j] = median(v[i][j], REPS);
    double firsts[2 * REPS]; /* both halves start with a first fetch */
    for (int r = 0; r < REPS; r++)
        firsts[r] = v[0][0][r], firsts[REPS + r] = v[1][0][r];
    t[1][0] = median(firsts, 2 * REPS);
    idle_ms = median(idle_v, REPS);
    fprintf(stderr,
            "bench: size %llu: shm cold (medians, %d fresh contexts each): first fetch %.3f ms (%.2fx memcpy %.3f ms); other "
            "blocks at once %.3f ms (%.2fx); other blocks after %llu idle calls (%.1f ms, "
            "pre-fault) %.3f ms (%.2fx); warm %.3f ms (%.2fx)\n",
            (unsigned long long)size, (int)REPS, t[1][0] * 1e3, t[1][0] / memcpy_s, memcpy_s * 1e3,
            t[0][1] * 1e3, t[0][1] / memcpy_s, (unsigned long long)idle_calls, idle_ms,
            t[1][1] * 1e3, t[1][1] / memcpy_s, t[1][2] * 1e3, t[1][2] / memcpy_s);
    printf("size=%llu cold_ratio=%.3f cold_other_ratio=%.3f prefaulted_ratio=%.3f "
           "warm_ratio=%.3f\n",
           (unsigned long long)size, t[1][0] / memcpy_s, t[0][1] / memcpy_s,
           t[1][1] / memcpy_s, t[1][2] / memcpy_s);
    return 0;
}

/* Open the producer's region (named in its metadata) read-only and map it,
 * for the copy variants; 0, or -1 if unavailable (variants not measured). */
static int variants_open(bench *b, const uint8_t *m, size_t ml)
{
    ecxi_data_meta meta;
    char path[ECXI_DATA_PATH_MAX + 1];
    if (ecxi_data_meta_decode(m, ml, &meta) || !meta.has_shm) return -1;
    memcpy(path, meta.path, meta.path_len);
    path[meta.path_len] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    uint64_t len = ecxi_region_size(b->cr);
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return -1;
    }
    b->var = (ecxi_shm_src){.fd = fd, .map = map, .map_len = len};
    return 0;
}

static void variants_close(bench *b)
{
    if (b->var.map) munmap((void *)b->var.map, b->var.map_len);
    if (b->var.map) close(b->var.fd);
    memset(&b->var, 0, sizeof b->var);
}

/* One timed copy variant of `size` bytes into the consumer region, checked
 * against the checksum; seconds, or < 0. 0 pread, 1 mmap+hash, 2 the
 * library's copy (guarded one-pass where it can) from the bench's mapping,
 * which every earlier copy has faulted in (warm), 3 the same from a fresh
 * mapping, mmap included (cold: what a consumer's first read of those
 * pages pays; the munmap after it is not timed). */
static double variant_once(bench *b, int v, uint64_t size, uint64_t want)
{
    uint64_t n = (size + b->bs - 1) / b->bs, sum = 0;
    const ecxi_block_run all = {0, n};
    uint8_t *dst = ecxi_region_base(b->cr);
    memset(dst, 0x5a, size);
    double t0 = now_s();
    if (v == 0 || v == 2) {
        if (ecxi_shm_copy(&b->var, dst, b->bs, &all, 1, &all, 1, size,
                          v == 0 ? ECXI_SHM_COPY_PREAD : ECXI_SHM_COPY_AUTO, &sum))
            return -1;
    } else if (v == 3) {
        void *map = mmap(NULL, b->var.map_len, PROT_READ, MAP_SHARED, b->var.fd, 0);
        if (map == MAP_FAILED) return -1;
        ecxi_shm_src fresh = {.fd = b->var.fd, .map = map, .map_len = b->var.map_len};
        int rc = ecxi_shm_copy(&fresh, dst, b->bs, &all, 1, &all, 1, size, ECXI_SHM_COPY_AUTO,
                               &sum);
        double t1 = now_s();
        munmap(map, b->var.map_len);
        if (rc) return -1;
        t0 += now_s() - t1; /* the munmap is not the copy's */
    } else {
        const size_t chunk = 256u << 10;
        ecxi_sum st;
        ecxi_sum_reset(&st);
        for (uint64_t off = 0; off < size; off += chunk) {
            size_t k = size - off < chunk ? (size_t)(size - off) : chunk;
            memcpy(dst + off, b->var.map + off, k);
            ecxi_sum_update(&st, dst + off, k);
        }
        sum = ecxi_sum_digest(&st);
    }
    double t1 = now_s();
    if (sum != want) {
        fprintf(stderr, "bench: copy variant %d: checksum mismatch\n", v);
        return -1;
    }
    return t1 - t0;
}

/* One timed memcpy of `size` bytes; seconds, or < 0 if it delivered wrong
 * bytes. */
static double memcpy_once(bench *b, uint64_t size)
{
    memset(b->dst, 0x5a, size);
    double t0 = now_s();
    memcpy(b->dst, b->src, size);
    __asm__ __volatile__("" ::"r"(b->dst) : "memory");
    double t1 = now_s();
    /* Checked against the pattern, as the fetches are, so the source is
     * no hotter in cache than the producer's region is for them. */
    if (memcmp(b->dst, b->expect, size) != 0) {
        fprintf(stderr, "bench: memcpy baseline delivered wrong bytes\n");
        return -1;
    }
    return t1 - t0;
}

void ecxi_data_bench_opts_init(ecxi_data_bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->iters = 30;
    o->warmup = 3;
    o->block_bytes = 1 << 20;
    o->shm = o->tcp = true;
    o->ucx = ecxi_data_backend_built(ECX_DATA_UCX); /* all: every path built in */
}

/* Remove the bench's directory and the files left in it (region files and
 * their lock files: no subdirectories). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                (void)unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    if (rmdir(dir) != 0) fprintf(stderr, "bench: could not remove %s: %s\n", dir, strerror(errno));
}

int ecxi_data_bench_run(const ecxi_data_bench_opts *o)
{
    uint64_t sizes[ECX_DATA_BENCH_MAX_SIZES];
    int nsizes = o->nsizes;
    if (nsizes < 0 || nsizes > ECX_DATA_BENCH_MAX_SIZES || o->iters < 1 || o->iters > 100000 ||
        o->warmup < 0 || o->warmup > 100000 || o->block_bytes == 0 || (!o->shm && !o->tcp && !o->ucx)) {
        fprintf(stderr, "bench: invalid options\n");
        return -1;
    }
    memcpy(sizes, o->sizes, sizeof sizes);
    if (nsizes == 0) sizes[nsizes++] = 4700000, sizes[nsizes++] = 28800000;
    bench b = {.bs = o->block_bytes, .iters = o->iters, .warmup = o->warmup};
    uint64_t max = 0;
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] == 0) {
            fprintf(stderr, "bench: a size must be at least 1 byte\n");
            return -1;
        }
        if (sizes[i] > max) max = sizes[i];
    }
    uint64_t region = ((max + b.bs - 1) / b.bs) * b.bs;
    if (o->cold) region *= 2; /* other blocks for the cold fetches */

    /* Where the library puts regions ($ECX_SHM_DIR, else /dev/shm). */
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/ecx-bench-data-XXXXXX", ecxi_region_default_dir()) >=
        (int)sizeof dir) {
        fprintf(stderr, "bench: ECX_SHM_DIR is too long\n");
        return -1;
    }
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench: cannot make %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int to_parent[2], stop[2];
    if (pipe(to_parent)) {
        perror("bench: pipe");
        rmdir(dir);
        return -1;
    }
    if (pipe(stop)) {
        perror("bench: pipe");
        close(to_parent[0]), close(to_parent[1]);
        rmdir(dir);
        return -1;
    }
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(to_parent[0]), close(stop[1]);
        _exit(producer_main(dir, region, b.bs, to_parent[1], stop[0]));
    }
    close(to_parent[1]), close(stop[0]);
    int ret = -1;
    uint32_t lens[4];
    uint8_t *m = NULL, *ds = NULL, *um = NULL, *uds = NULL;
    double *tm = NULL, *tr = NULL; /* memcpy's times; raw TCP's */
    bench_raw_tcp raw = {.fd = -1, .pid = -1};
    path paths[3];
    memset(paths, 0, sizeof paths);
    int np = 0;
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    if (pid < 0 || read_all(to_parent[0], lens, sizeof lens) || lens[0] > 65536 ||
        lens[1] > 65536 || lens[2] > 65536 || lens[3] > 65536 ||
        !(m = malloc(lens[0] ? lens[0] : 1)) || !(ds = malloc(lens[1] ? lens[1] : 1)) ||
        !(um = malloc(lens[2] ? lens[2] : 1)) || !(uds = malloc(lens[3] ? lens[3] : 1)) ||
        read_all(to_parent[0], m, lens[0]) || read_all(to_parent[0], ds, lens[1]) ||
        read_all(to_parent[0], um, lens[2]) || read_all(to_parent[0], uds, lens[3])) {
        fprintf(stderr, "bench: producer did not start\n");
        goto done;
    }
    if (ecxi_region_instance_id(id) || ecxi_region_create_in(dir, id, 1, region, b.bs, &b.cr)) {
        fprintf(stderr, "bench: cannot create the consumer region\n");
        goto done;
    }
    b.expect = malloc(region);
    b.src = malloc(region);
    b.dst = malloc(region);
    tm = malloc((size_t)b.iters * sizeof *tm);
    if (!b.expect || !b.src || !b.dst || !tm) {
        fprintf(stderr, "bench: out of memory\n");
        goto done;
    }
    fill_pattern(b.expect, region);
    memcpy(b.src, b.expect, region);
    memset(b.dst, 0, region);
    if (o->shm && path_open(&paths[np++], ECX_DATA_SHM, &b, m, lens[0], ds, lens[1])) goto done;
    if (o->shm && variants_open(&b, m, lens[0]) == 0) {
        bool ok = true;
        for (int v = 0; v < 4; v++)
            ok = (b.tv[v] = malloc((size_t)b.iters * sizeof *b.tv[v])) && ok;
        if (!ok) variants_close(&b);
    }
    if (o->tcp && path_open(&paths[np++], ECX_DATA_TCP, &b, m, lens[0], ds, lens[1])) goto done;
    if (o->ucx && path_open(&paths[np++], ECX_DATA_UCX, &b, um, lens[2], uds, lens[3])) goto done;
    if (o->tcp && (bench_raw_tcp_open(&raw, b.expect, region) != 0 ||
                   !(tr = malloc((size_t)b.iters * sizeof *tr)))) {
        fprintf(stderr, "bench: raw TCP baseline: cannot set up: %s\n", strerror(errno));
        goto done;
    }
    for (int s = 0; s < nsizes; s++) {
        uint64_t size = sizes[s];
        uint64_t want = ecxi_checksum(b.expect, size);
        /* Interleaved: memcpy, then each path, per iteration, so all see
         * the same machine (this one is shared and noisy). */
        for (int it = 0; it < b.warmup + b.iters; it++) {
            double t = memcpy_once(&b, size);
            if (t < 0) goto done;
            if (it >= b.warmup) tm[it - b.warmup] = t;
            for (int k = 0; k < np; k++) {
                if ((t = path_fetch(&paths[k], &b, size)) < 0) goto done;
                if (it >= b.warmup) paths[k].t[it - b.warmup] = t;
            }
            if (tr) {
                if ((t = bench_raw_tcp_once(&raw, ecxi_region_base(b.cr), b.expect, size)) < 0)
                    goto done;
                if (it >= b.warmup) tr[it - b.warmup] = t;
            }
            for (int v = 0; b.var.map && v < 4; v++) {
                if ((t = variant_once(&b, v, size, want)) < 0) goto done;
                if (it >= b.warmup) b.tv[v][it - b.warmup] = t;
            }
        }
        double g[4] = {0, 0, 0, 0}, lat[4] = {0, 0, 0, 0}; /* memcpy, shm, ucx, tcp */
        lat[0] = median(tm, b.iters);
        g[0] = (double)size / lat[0] / 1e9;
        for (int k = 0; k < np; k++) {
            int j = paths[k].backend == ECX_DATA_SHM ? 1 : paths[k].backend == ECX_DATA_UCX ? 2 : 3;
            lat[j] = median(paths[k].t, b.iters);
            g[j] = (double)size / lat[j] / 1e9;
        }
        fprintf(stderr,
                "bench: size %llu: median memcpy %.3f ms, shm fetch %.3f ms, tcp fetch %.3f ms, "
                "ucx fetch %.3f ms (UCX_TLS=%s, %d iterations)\n",
                (unsigned long long)size, lat[0] * 1e3, lat[1] * 1e3, lat[3] * 1e3, lat[2] * 1e3,
                getenv("UCX_TLS") ? getenv("UCX_TLS") : "UCX's choice", b.iters);
        if (b.var.map) {
            double lp = median(b.tv[0], b.iters), lm = median(b.tv[1], b.iters);
            fprintf(stderr,
                    "bench: size %llu: verified copies / memcpy: shm fetch (%s) %.3f, "
                    "pread+hash %.3f, mmap memcpy+hash %.3f (medians, same run)\n",
                    (unsigned long long)size,
                    ecxi_shm_copy_guarded() ? "guarded one-pass copy+hash" : "pread+hash",
                    lat[1] > 0 ? lat[0] / lat[1] : 0.0, lat[0] / lp, lat[0] / lm);
            double lw = median(b.tv[2], b.iters), lc = median(b.tv[3], b.iters);
            fprintf(stderr,
                    "bench: size %llu: copy time / memcpy time: pread+hash %.2f (a pread reads "
                    "the page cache: nothing of the consumer's to warm), mapping warm %.2f, "
                    "fresh mapping (cold) %.2f\n",
                    (unsigned long long)size, lp / lat[0], lw / lat[0], lc / lat[0]);
        }
        if (o->cold && o->shm &&
            cold_fetches(&b, size, m, lens[0], ds, lens[1], lat[0]) != 0) {
            fprintf(stderr, "bench: cold fetches failed\n");
            goto done;
        }
        double rawt = tr ? median(tr, b.iters) : 0;
        printf("size=%llu shm_gbps=%.3f ucx_gbps=%.3f memcpy_gbps=%.3f shm_ratio=%.3f "
               "ucx_ratio=%.3f tcp_gbps=%.3f tcp_ratio=%.3f rawtcp_gbps=%.3f tcp_vs_raw=%.3f\n",
               (unsigned long long)size, g[1], g[2], g[0], g[1] / g[0], g[2] / g[0], g[3],
               g[3] / g[0], rawt > 0 ? (double)size / rawt / 1e9 : 0.0,
               rawt > 0 && lat[3] > 0 ? rawt / lat[3] : 0.0);
        fflush(stdout);
    }
    ret = 0;
done:
    for (int k = 0; k < np; k++)
        path_close(&paths[k]);
    variants_close(&b);
    for (int v = 0; v < 4; v++)
        free(b.tv[v]);
    free(tm), free(tr);
    bench_raw_tcp_close(&raw);
    close(to_parent[0]);
    close(stop[1]); /* tells the producer to stop */
    if (pid > 0) {
        int st;
        waitpid(pid, &st, 0);
    }
    ecxi_region_free(b.cr);
    free(b.expect), free(b.src), free(b.dst), free(m), free(ds), free(um), free(uds);
    remove_dir(dir);
    return ret;
}
