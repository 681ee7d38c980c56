/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_peer — ecx's NIXL peer (src/data/nixl/nixl_agent.c, Debian's UCX) against a
 * real nixl agent (tests/nixl/nixl_peer.py), for tests/shell/test_nixl_peer.sh.
 *
 *   nixl_peer serve DIR NB BS SECONDS
 *       NB blocks of BS bytes (byte i = (i * 7 + 3) & 255) offered as one
 *       DRAM range: writes DIR/ecx.md (NIXL agent metadata) and DIR/ecx.desc
 *       (vLLM's mem_descriptor), waits for one notification and prints
 *       "notif NAME TEXT".
 *   nixl_peer read DIR NB BS TEXT IDX...
 *       reads DIR/nixl.md and DIR/nixl.desc (a real agent's), READs its
 *       blocks IDX... into local blocks 0.. with the notification TEXT and
 *       checks every byte: prints "read ok NAME N blocks".
 *   nixl_peer mutate DIR NB BS TEXT IDX...
 *       every proper prefix and every one-byte mutation (xor 0xff, 0x01) of
 *       the metadata in DIR/nixl.md (a live real agent's), the UCX worker
 *       address and rkeys included, added through the NIXL agent process
 *       (src/data/nixl/nixl_proc.c): each is refused (ECX_EDATA_META: by NIXL's
 *       format, by UCX, or because UCX 1.13.1 aborted the helper on it,
 *       docs/NIXL.md §6) or is added as a peer, never a crash of this
 *       program. Prints the counts and the helper restarts; then the same
 *       proc READs blocks IDX of the real one and checks every byte.
 *   nixl_peer bound DIR NB BS
 *       the restart bound of the NIXL agent process (run with
 *       ECX_NIXL_AGENT_FAULT=abort-read:1:every): rounds of add + READ of
 *       the agent in DIR, one line each, then "bound: F READs failed, R
 *       refused at once, restarts N".
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nixl_agent.h"
#include "nixl_proc.h"
#include "util.h"

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    struct stat st;
    if (fstat(fileno(f), &st)) exit(2);
    uint8_t *b = malloc((size_t)st.st_size + 1);
    *n = fread(b, 1, (size_t)st.st_size, f);
    fclose(f);
    return b;
}

static void spit(const char *dir, const char *name, const void *b, size_t n)
{
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) || rename(tmp, path)) {
        perror(path);
        exit(2);
    }
}

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)((i * 7 + 3) & 255);
}

static ecxi_nixl_agent *agent;
static bool have_notif(void *arg)
{
    (void)arg;
    char name[ECXI_NIXL_NAME_MAX + 1], msg[ECXI_NIXL_MSG_MAX + 1];
    if (!ecxi_nixl_agent_notif_pop(agent, name, msg)) return false;
    printf("notif %s %s\n", name, msg);
    return true;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static int serve(const char *dir, size_t nb, size_t bs, int secs)
{
    uint8_t *buf = aligned_alloc(4096, nb * bs);
    for (size_t i = 0; i < nb * bs; i++)
        buf[i] = pattern(i);
    int rc = ecxi_nixl_agent_new("ecx-producer", buf, nb * bs, false, &agent);
    if (rc) return fprintf(stderr, "agent: %s\n", ecx_strerror(rc)), 1;
    ecxi_nixl_block *blk = calloc(nb, sizeof *blk);
    for (size_t i = 0; i < nb; i++)
        blk[i] = (ecxi_nixl_block){(uintptr_t)buf + i * bs, bs, 0};
    size_t cap = ecxi_nixl_desc_size(nb);
    uint8_t *desc = malloc(cap);
    long dl = ecxi_nixl_desc_encode(blk, nb, desc, cap);
    size_t ml;
    const uint8_t *md = ecxi_nixl_agent_metadata(agent, &ml);
    spit(dir, "ecx.desc", desc, (size_t)dl);
    spit(dir, "ecx.md", md, ml);
    bool ok = ecxi_nixl_agent_wait(agent, have_notif, NULL, secs * 1000);
    /* keep answering a little: the reader's endpoint closes after */
    ecxi_nixl_agent_wait(agent, never, NULL, 300);
    ecxi_nixl_agent_free(agent);
    free(buf), free(blk), free(desc);
    if (!ok) fprintf(stderr, "no notification\n");
    return ok ? 0 : 1;
}

static ecxi_nixl_read *xfer;
static bool read_ended(void *arg)
{
    return (*(int *)arg = ecxi_nixl_read_poll(xfer)) != 0;
}

/* The real agent's files in dir: its metadata and its descriptor list
 * (at most nb blocks), decoded. 0, or 1 with a message. */
static int load_agent(const char *dir, size_t nb, uint8_t **md, size_t *ml, ecxi_nixl_block **blk,
                      size_t *cnt)
{
    char path[4096];
    size_t dl;
    snprintf(path, sizeof path, "%s/nixl.md", dir);
    *md = slurp(path, ml);
    snprintf(path, sizeof path, "%s/nixl.desc", dir);
    uint8_t *desc = slurp(path, &dl);
    int rc = ecxi_nixl_desc_count(desc, dl, nb, cnt);
    *blk = calloc(*cnt ? *cnt : 1, sizeof **blk);
    if (!rc) rc = *blk ? ecxi_nixl_desc_decode(desc, dl, *blk, *cnt, cnt) : ECX_ENOMEM;
    free(desc);
    if (rc) fprintf(stderr, "desc: %s\n", ecx_strerror(rc));
    return rc ? 1 : 0;
}

/* READ blocks idx of the agent whose files are in dir, with our agent. */
static int read_with(const char *dir, size_t nb, size_t bs, const char *text, char **idx, size_t n)
{
    size_t ml, cnt;
    uint8_t *md;
    ecxi_nixl_block *blk;
    if (load_agent(dir, nb, &md, &ml, &blk, &cnt)) return 1;
    int rc;
    uint8_t *buf = aligned_alloc(4096, nb * bs);
    memset(buf, 0, nb * bs);
    ecxi_nixl_remote *r;
    if ((rc = ecxi_nixl_remote_add(agent, md, ml, &r)))
        return fprintf(stderr, "remote: %s\n", ecx_strerror(rc)), 1;
    uint64_t *remote = calloc(n, 8), *len = calloc(n, 8);
    void **local = calloc(n, sizeof *local);
    size_t *which = calloc(n, sizeof *which);
    for (size_t k = 0; k < n; k++) {
        which[k] = strtoul(idx[k], NULL, 10);
        if (which[k] >= cnt || blk[which[k]].len != bs) return fprintf(stderr, "bad index\n"), 1;
        remote[k] = blk[which[k]].addr, len[k] = bs, local[k] = buf + k * bs;
    }
    int64_t t0 = ecxi_now_ns();
    if ((rc = ecxi_nixl_read_post(r, remote, local, len, n, text, strlen(text), &xfer)))
        return fprintf(stderr, "read: %s\n", ecx_strerror(rc)), 1;
    int st = 0;
    ecxi_nixl_agent_wait(agent, read_ended, &st, 30000);
    if (st != 1) return fprintf(stderr, "read ended %d (%s)\n", st, st < 0 ? ecx_strerror(st) : "timeout"), 1;
    for (size_t k = 0; k < n; k++)
        for (size_t j = 0; j < bs; j++)
            if (buf[k * bs + j] != pattern(which[k] * bs + j))
                return fprintf(stderr, "block %zu byte %zu differs\n", which[k], j), 1;
    double ms = (double)(ecxi_now_ns() - t0) / 1e6;
    printf("read ok %s %zu blocks (%zu bytes in %.1f ms, %.0f MB/s)\n", ecxi_nixl_remote_name(r),
           n, n * bs, ms, (double)(n * bs) / 1e3 / ms);
    ecxi_nixl_read_release(xfer);
    ecxi_nixl_remote_drop(r);
    free(md), free(blk), free(buf), free(remote), free(len), free(local), free(which);
    return 0;
}

static int read_blocks(const char *dir, size_t nb, size_t bs, const char *text, char **idx,
                       size_t n)
{
    int rc = ecxi_nixl_agent_new("ecx-consumer", NULL, 0, false, &agent);
    if (rc) return fprintf(stderr, "agent: %s\n", ecx_strerror(rc)), 1;
    rc = read_with(dir, nb, bs, text, idx, n);
    ecxi_nixl_agent_free(agent);
    return rc;
}

/* Is byte p inside one of the opaque UCX blobs (worker address, rkeys)? */
static bool in_ucx_blob(const ecxi_nixl_meta *m, const uint8_t *base, size_t p)
{
    const uint8_t *b = base + p;
    if (b >= m->ucx_addr && b < m->ucx_addr + m->ucx_addr_len) return true;
    for (size_t i = 0; i < m->nregs; i++)
        if (b >= m->regs[i].rkey && b < m->regs[i].rkey + m->regs[i].rkey_len) return true;
    return false;
}

/* Wait (bounded) for x to end, progressing the proc. */
static int proc_wait(ecxi_nixl_proc *p, ecxi_nixl_proc_read *x)
{
    int64_t end = ecxi_now_ms(NULL) + 30000;
    while (ecxi_nixl_proc_read_poll(x) == 0 && ecxi_now_ms(NULL) < end) {
        struct pollfd q = {.fd = ecxi_nixl_proc_fd(p), .events = POLLIN};
        (void)poll(&q, 1, 10);
        ecxi_nixl_proc_progress(p);
    }
    return ecxi_nixl_proc_read_poll(x);
}

/* The mutants go through the NIXL agent process (src/data/nixl/nixl_proc.c), as the
 * nixl data path's do: a mutant on which UCX 1.13.1 aborts ends a helper,
 * not this program; a new one starts, and the bytes are remembered. */
static int mutate(const char *dir, size_t nb, size_t bs, const char *text, char **idx, size_t nidx)
{
    size_t n, cnt;
    uint8_t *md;
    ecxi_nixl_block *blk;
    if (load_agent(dir, nb, &md, &n, &blk, &cnt)) return 1;
    uint8_t *m = malloc(n);
    ecxi_nixl_meta real;
    if (ecxi_nixl_meta_decode(md, n, &real)) return fprintf(stderr, "not metadata\n"), 1;
    int rc = 0;
    int fd = memfd_create("nixl-peer-region", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)(nb * bs))) return perror("memfd"), 1;
    uint8_t *buf = mmap(NULL, nb * bs, PROT_READ, MAP_SHARED, fd, 0);
    ecxi_nixl_proc *p;
    if (buf == MAP_FAILED || (rc = ecxi_nixl_proc_new(fd, nb * bs, false, &p)))
        return fprintf(stderr, "proc: %s\n", ecx_strerror(rc)), 1;
    for (int k = 0; k < 2; k++) {
        uint64_t h;
        int64_t t0 = ecxi_now_ns();
        if ((rc = ecxi_nixl_proc_remote_add(p, md, n, &h)))
            return fprintf(stderr, "real metadata: %s\n", ecx_strerror(rc)), 1;
        printf("real metadata added in %.2f ms (in the NIXL agent process)\n",
               (double)(ecxi_now_ns() - t0) / 1e6);
        ecxi_nixl_proc_remote_drop(p, h);
    }
    if (!getenv("ECX_LOG")) ecx_set_log_level(ECX_LOG_ERROR);
    size_t refused = 0, other = 0, added = 0, blob_refused = 0, blob_added = 0;
    int64_t t0 = ecxi_now_ns();
    for (size_t q = 0; q <= 3 * n; q++) {
        size_t len = n;
        memcpy(m, md, n);
        bool blob = false;
        if (q < n) {
            len = q; /* a prefix */
        } else {
            size_t at = (q - n) / 2;
            if (at >= n) break;
            blob = in_ucx_blob(&real, md, at);
            m[at] ^= (q - n) % 2 ? 0x01 : 0xff;
        }
        uint64_t h;
        rc = ecxi_nixl_proc_remote_add(p, m, len, &h);
        if (rc == ECX_EDATA_META) refused++, blob_refused += blob;
        else if (rc) other++;
        else added++, blob_added += blob, ecxi_nixl_proc_remote_drop(p, h);
        ecxi_nixl_proc_progress(p);
    }
    printf("mutations of %zu bytes (%.1f s): %zu refused, %zu other errors, %zu accepted as a "
           "peer; inside the UCX address / rkeys: %zu refused, %zu accepted; NIXL agent "
           "processes restarted: %llu; no crash\n",
           n, (double)(ecxi_now_ns() - t0) / 1e9, refused, other, added, blob_refused, blob_added,
           (unsigned long long)ecxi_nixl_proc_restarts(p));
    ecx_set_log_level(ECX_LOG_WARN);
    /* and the real agent is still read, through the same proc */
    uint64_t h, *remote = calloc(nidx, 8), *loff = calloc(nidx, 8), *len = calloc(nidx, 8);
    size_t *which = calloc(nidx, sizeof *which);
    rc = refused > n && blob_refused > 0 ? ecxi_nixl_proc_remote_add(p, md, n, &h) : ECX_EINVAL;
    if (rc) return fprintf(stderr, "after the mutants: %s\n", ecx_strerror(rc)), 1;
    for (size_t k = 0; k < nidx; k++) {
        which[k] = strtoul(idx[k], NULL, 10);
        if (which[k] >= cnt || blk[which[k]].len != bs) return fprintf(stderr, "bad index\n"), 1;
        remote[k] = blk[which[k]].addr, loff[k] = k * bs, len[k] = bs;
    }
    ecxi_nixl_proc_read *x;
    if ((rc = ecxi_nixl_proc_read_post(p, h, remote, loff, len, nidx, text, strlen(text), &x)))
        return fprintf(stderr, "read: %s\n", ecx_strerror(rc)), 1;
    int st = proc_wait(p, x);
    if (st != 1) return fprintf(stderr, "read ended %d\n", st), 1;
    for (size_t k = 0; k < nidx; k++)
        for (size_t j = 0; j < bs; j++)
            if (buf[k * bs + j] != pattern(which[k] * bs + j))
                return fprintf(stderr, "block %zu byte %zu differs\n", which[k], j), 1;
    printf("read ok %zu blocks through the NIXL agent process %s\n", nidx, ecxi_nixl_proc_name(p));
    ecxi_nixl_proc_read_release(p, x);
    ecxi_nixl_proc_remote_drop(p, h);
    ecxi_nixl_proc_free(p);
    munmap(buf, nb * bs);
    close(fd);
    free(md), free(m), free(blk), free(remote), free(loff), free(len), free(which);
    return 0;
}

/* The restart bound: with a helper that aborts on every READ
 * (ECX_NIXL_AGENT_FAULT=abort-read:1:every), rounds of add + READ of the
 * real agent in DIR: the first ECXI_NIXL_PROC_RESTARTS rounds fail their
 * READ (each kills a helper), later ones fail at once (ECX_EDATA_PEER). */
static int bound(const char *dir, size_t nb, size_t bs)
{
    size_t n, cnt;
    uint8_t *md;
    ecxi_nixl_block *blk;
    if (load_agent(dir, nb, &md, &n, &blk, &cnt)) return 1;
    int rc = 0;
    int fd = memfd_create("nixl-peer-region", MFD_CLOEXEC);
    ecxi_nixl_proc *p;
    if (fd < 0 || ftruncate(fd, (off_t)(nb * bs)) ||
        (rc = ecxi_nixl_proc_new(fd, nb * bs, false, &p)))
        return fprintf(stderr, "proc: %s\n", ecx_strerror(rc)), 1;
    int failed = 0, fast = 0;
    for (int i = 0; i < ECXI_NIXL_PROC_RESTARTS + 3; i++) {
        uint64_t h, off = 0, len = bs;
        ecxi_nixl_proc_read *x;
        int64_t t0 = ecxi_now_ns();
        rc = ecxi_nixl_proc_remote_add(p, md, n, &h);
        if (!rc) rc = ecxi_nixl_proc_read_post(p, h, &blk[0].addr, &off, &len, 1, "bound", 5, &x);
        if (!rc) {
            rc = proc_wait(p, x);
            ecxi_nixl_proc_read_release(p, x);
            failed += rc < 0;
        } else {
            fast += rc == ECX_EDATA_PEER;
        }
        printf("round %d: %s (%.1f ms)\n", i, rc == 1 ? "READ done" : ecx_strerror(rc),
               (double)(ecxi_now_ns() - t0) / 1e6);
    }
    printf("bound: %d READs failed, %d refused at once, restarts %llu\n", failed, fast,
           (unsigned long long)ecxi_nixl_proc_restarts(p));
    ecxi_nixl_proc_free(p);
    close(fd);
    free(md), free(blk);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "serve"))
        return serve(argv[2], strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10), atoi(argv[5]));
    if (argc >= 7 && !strcmp(argv[1], "read"))
        return read_blocks(argv[2], strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10), argv[5],
                           argv + 6, (size_t)argc - 6);
    if (argc == 5 && !strcmp(argv[1], "bound"))
        return bound(argv[2], strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10));
    if (argc >= 7 && !strcmp(argv[1], "mutate"))
        return mutate(argv[2], strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10), argv[5],
                      argv + 6, (size_t)argc - 6);
    fprintf(stderr, "usage: see tests/support/nixl_peer.c\n");
    return 2;
}
