/* SPDX-License-Identifier: Apache-2.0 */
/* shm_hostile — the parts of test_shm_hostile.sh: real and hostile
 * same-host producers, and consumers that report how each READ ended.
 *
 *   shm_hostile produce DIR FILE [truncate]
 *     a real shm producer (16 blocks of 64 KiB in DIR, a known pattern)
 *     with one grant, key "hostile:item" (blocks 0..7, 8 x 64 KiB - 1000
 *     bytes) under a token random per process; FILE gets the ack's parts
 *     (lines: meta HEX, desc HEX, key, region path). Serves for 60 s.
 *     truncate: after the first completion, truncate the region file to
 *     one block.
 *   shm_hostile fake DIR KIND FILE
 *     a hostile producer: its socket answers any hello with a descriptor
 *     of KIND (fifo, devzero, dir, small: a 4 KiB tmpfs file), described
 *     in its metadata (dev/ino of what it passes) with a region path that
 *     is a FIFO nobody writes (a consumer that opened it would hang).
 *     KIND sparse: a 2 GiB memfd with nothing in it, all holes, offered as
 *     a 2 GiB region (it keeps the connection up to 20 s, for the consumer
 *     to fault in what it will of it).
 *   shm_hostile consume DIR FILE [--sock-of FILE2] EXPECT...
 *     a consumer (shm backend) registers FILE's producer (with FILE2's
 *     socket name instead, for --sock-of) and READs its grant once per
 *     EXPECT: done, corrupt, failed (FAILED), refused (FAILED and not one
 *     byte written), or nopath (the peer cannot even be registered); the
 *     word pause instead sleeps 2.5 s without touching the data plane, and
 *     settle progresses until arm says 0 (the context is a background one,
 *     as with the progress thread: the rest of the producer's mapping is
 *     faulted in), failing if it does not within 10 s; warm fails unless
 *     the consumer's RssShmem (/proc/self/status) has grown since the
 *     first word by at least the producer's whole region (16 x 64 KiB: it
 *     was pre-faulted), bounded fails if it has grown by more than 64 MiB.
 *     Exit 0 if every READ ended as expected.
 *   shm_hostile raw FILE
 *     a consumer written from scratch: connects to FILE's producer socket
 *     and says hello with its grant; exit 0 if no descriptor came back
 *     (prints "closed" or "refused"), 1 if one did.
 * Every wait is bounded.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "checksum.h"
#include "data.h"
#include "data_impl.h"
#include "region.h"
#include "util.h"

#define BS 65536u
#define NB 16u
#define ITEM_BLOCKS 8u
#define ITEM_BYTES (ITEM_BLOCKS * BS - 1000u)
#define KEY "hostile:item"
#define SPARSE_BYTES (2ull << 30)

static uint8_t pat(uint64_t off)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (off * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17));
}

static int random_bytes(void *b, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, b, n);
    close(fd);
    return k == (ssize_t)n ? 0 : -1;
}

/* FILE: meta, desc, key, path (written to a temporary name, then renamed). */
static int write_ack(const char *file, const uint8_t *m, size_t ml, const uint8_t *ds,
                     size_t dl, const char *path)
{
    char tmp[4096], mh[2 * ECXI_DATA_META_MAX + 1], dh[2 * ECXI_DATA_DESC_MAX + 1];
    snprintf(tmp, sizeof tmp, "%s.tmp", file);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    ecxi_hex_encode(m, ml, mh);
    ecxi_hex_encode(ds, dl, dh);
    fprintf(f, "%s\n%s\n%s\n%s\n", mh, dh, KEY, path);
    return fclose(f) || rename(tmp, file) ? -1 : 0;
}

typedef struct ack {
    uint8_t m[ECXI_DATA_META_MAX], d[ECXI_DATA_DESC_MAX];
    long ml, dl;
    char path[ECXI_DATA_PATH_MAX + 1];
} ack;

static int read_ack(const char *file, ack *a)
{
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = -1;
    if ((n = getline(&line, &cap, f)) < 2 || n > 2 * ECXI_DATA_META_MAX + 1) goto out;
    if ((a->ml = ecxi_hex_decode(line, (size_t)n - 1, a->m)) < 0) goto out;
    if ((n = getline(&line, &cap, f)) < 2 || n > 2 * ECXI_DATA_DESC_MAX + 1) goto out;
    if ((a->dl = ecxi_hex_decode(line, (size_t)n - 1, a->d)) < 0) goto out;
    if (getline(&line, &cap, f) < 0) goto out; /* the key: always KEY */
    if ((n = getline(&line, &cap, f)) < 2 || n > ECXI_DATA_PATH_MAX) goto out;
    memcpy(a->path, line, (size_t)n - 1);
    a->path[n - 1] = 0;
    rc = 0;
out:
    free(line);
    fclose(f);
    return rc;
}

/* ---- a real producer ----------------------------------------------------- */

typedef struct grant_state {
    uint8_t token[ECXI_DATA_TOKEN_LEN];
    uint64_t blocks[ITEM_BLOCKS];
    int completions;
} grant_state;

static int grant_check(void *arg, const char *key, size_t key_len,
                       const uint8_t token[ECXI_DATA_TOKEN_LEN], int flags, ecxi_data_grant *g)
{
    (void)flags;
    grant_state *s = arg;
    if (key_len != strlen(KEY) || memcmp(key, KEY, key_len) != 0 ||
        memcmp(token, s->token, ECXI_DATA_TOKEN_LEN) != 0)
        return ECX_EDATA_GRANT;
    g->blocks = s->blocks;
    g->n = ITEM_BLOCKS;
    g->nbytes = ITEM_BYTES;
    return 0;
}

static void on_done(void *arg, const char *key, size_t key_len, const uint8_t *token, int status)
{
    grant_state *s = arg;
    if (status == 0 && grant_check(s, key, key_len, token, 0, &(ecxi_data_grant){0}) == 0)
        s->completions++;
}

static int produce(const char *dir, const char *file, bool truncate_after)
{
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    ecxi_region *r;
    ecxi_data *d;
    if (ecxi_region_instance_id(id) || ecxi_region_create_in(dir, id, 0, NB * BS, BS, &r)) return 1;
    uint8_t *b = ecxi_region_base(r);
    for (uint64_t i = 0; i < ecxi_region_size(r); i++)
        b[i] = pat(i);
    ecxi_data_opts o = {.backend = ECX_DATA_SHM};
    if (ecxi_data_new_producer(r, &o, &d)) return 1;
    static grant_state gs;
    for (unsigned i = 0; i < ITEM_BLOCKS; i++)
        gs.blocks[i] = i;
    if (random_bytes(gs.token, sizeof gs.token)) return 1;
    ecxi_data_set_grant_fn(d, grant_check, &gs);
    ecxi_data_ticket t = {.checksum = ecxi_checksum_blocks(b, BS, gs.blocks, ITEM_BLOCKS, ITEM_BYTES),
                         .nbytes = ITEM_BYTES,
                         .lease_ms = 30000};
    memcpy(t.token, gs.token, sizeof t.token);
    uint8_t ds[ECXI_DATA_DESC_MAX];
    size_t ml;
    const uint8_t *m = ecxi_data_agent_metadata(d, &ml);
    long dl = ecxi_data_grant_descriptor(d, &t, ds, sizeof ds);
    if (dl < 0 || write_ack(file, m, ml, ds, (size_t)dl, ecxi_region_path(r))) return 1;
    bool truncated = false;
    for (int64_t end = ecxi_now_ms(NULL) + 60000; ecxi_now_ms(NULL) < end;) {
        ecxi_data_poll_notifs(d, on_done, &gs);
        if (truncate_after && !truncated && gs.completions > 0) {
            truncated = truncate(ecxi_region_path(r), BS) == 0;
            fprintf(stderr, "producer: region truncated to one block: %s\n",
                    truncated ? "yes" : strerror(errno));
        }
        struct pollfd p = {.fd = ecxi_data_fd(d), .events = POLLIN};
        if (ecxi_data_arm(d) == 0) (void)poll(&p, 1, 50);
    }
    ecxi_data_free(d);
    ecxi_region_free(r);
    return 0;
}

/* ---- a hostile producer -------------------------------------------------- */

static int open_kind(const char *dir, const char *kind)
{
    char p[4096];
    if (strcmp(kind, "fifo") == 0) {
        snprintf(p, sizeof p, "%s/passed.fifo", dir);
        if (mkfifo(p, 0600) != 0) return -1;
        return open(p, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    }
    if (strcmp(kind, "devzero") == 0) return open("/dev/zero", O_RDONLY | O_CLOEXEC);
    if (strcmp(kind, "dir") == 0) return open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (strcmp(kind, "small") == 0) {
        snprintf(p, sizeof p, "%s/small.mmap", dir);
        int fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, 4096) != 0) return -1;
        return fd;
    }
    if (strcmp(kind, "sparse") == 0) { /* nothing in it: no page is allocated */
        int fd = memfd_create("ecx-sparse", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)SPARSE_BYTES) != 0) return -1;
        return fd;
    }
    return -1;
}

static int fake(const char *dir, const char *kind, const char *file)
{
    int pass = open_kind(dir, kind);
    struct stat st;
    if (pass < 0 || fstat(pass, &st) != 0) {
        fprintf(stderr, "fake: cannot make a %s: %s\n", kind, strerror(errno));
        return 1;
    }
    char trap[4096], name[64];
    snprintf(trap, sizeof trap, "%s/trap-%s.fifo", dir, kind); /* nobody ever writes it */
    if (mkfifo(trap, 0600) != 0) return 1;
    snprintf(name, sizeof name, "ecx-hostile-%d", (int)getpid());
    int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, name, strlen(name));
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sl) != 0 || listen(ls, 8) != 0) return 1;
    ecxi_data_meta m = {.has_shm = true,
                       .dev = (uint64_t)st.st_dev,
                       .ino = (uint64_t)st.st_ino,
                       .path = trap,
                       .path_len = strlen(trap),
                       .sock = name,
                       .sock_len = strlen(name)};
    bool sparse = strcmp(kind, "sparse") == 0;
    ecxi_data_desc dd = {.block_bytes = BS,
                        .num_blocks = sparse ? SPARSE_BYTES / BS : NB,
                        .has_ticket = true};
    if (random_bytes(&m.nonce, sizeof m.nonce) || ecxi_data_boot_id(m.boot_id) ||
        random_bytes(dd.ticket.token, sizeof dd.ticket.token))
        return 1;
    dd.nonce = m.nonce;
    dd.ticket.nbytes = ITEM_BYTES;
    dd.ticket.lease_ms = 30000;
    uint8_t mb[ECXI_DATA_META_MAX], db[ECXI_DATA_DESC_MAX];
    long ml = ecxi_data_meta_encode(&m, mb, sizeof mb), dl = ecxi_data_desc_encode(&dd, db, sizeof db);
    if (ml < 0 || dl < 0 || write_ack(file, mb, (size_t)ml, db, (size_t)dl, trap)) return 1;
    for (int64_t end = ecxi_now_ms(NULL) + 60000; ecxi_now_ms(NULL) < end;) {
        struct pollfd p = {.fd = ls, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        uint8_t b[1024];
        struct pollfd pc = {.fd = c, .events = POLLIN};
        if (poll(&pc, 1, 2000) > 0 && recv(c, b, sizeof b, 0) > 0) {
            uint8_t reply[2] = {1, 'F'};
            struct iovec iov = {.iov_base = reply, .iov_len = 2};
            union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
            } u;
            memset(&u, 0, sizeof u);
            struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                                .msg_controllen = sizeof u.buf};
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &pass, sizeof(int));
            if (sendmsg(c, &mh, MSG_NOSIGNAL) == 2) fprintf(stderr, "fake: passed a %s\n", kind);
            /* until the consumer hangs up (a sparse one reads its done messages) */
            for (int64_t by = ecxi_now_ms(NULL) + (sparse ? 20000 : 2000);
                 poll(&pc, 1, 200) >= 0 && ecxi_now_ms(NULL) < by;)
                if ((pc.revents & POLLIN) && (!sparse || recv(c, b, sizeof b, 0) <= 0)) break;
        }
        close(c);
    }
    return 0;
}

/* ---- consumers ------------------------------------------------------------ */

/* This process's RssShmem (shared memory mapped and resident), KiB; -1 if unknown. */
static long rss_shmem_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssShmem: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static int consume(const char *dir, const char *file, const char *sock_of, char **expect,
                   int nexpect)
{
    ack a, other;
    if (read_ack(file, &a) || (sock_of && read_ack(sock_of, &other))) {
        fprintf(stderr, "consumer: cannot read the ack\n");
        return 2;
    }
    if (sock_of) { /* the same producer's ack, naming another's socket */
        ecxi_data_meta m, mo;
        if (ecxi_data_meta_decode(a.m, (size_t)a.ml, &m) ||
            ecxi_data_meta_decode(other.m, (size_t)other.ml, &mo))
            return 2;
        m.sock = mo.sock;
        m.sock_len = mo.sock_len;
        uint8_t mb[ECXI_DATA_META_MAX];
        long ml = ecxi_data_meta_encode(&m, mb, sizeof mb);
        if (ml < 0) return 2;
        memcpy(a.m, mb, (size_t)ml);
        a.ml = ml;
    }
    char id[ECXI_REGION_INSTANCE_ID_LEN + 1];
    ecxi_region *r;
    ecxi_data *d;
    ecxi_data_opts o = {.backend = ECX_DATA_SHM, .background = true};
    if (ecxi_region_instance_id(id) || ecxi_region_create_in(dir, id, 1, NB * BS, BS, &r) ||
        ecxi_data_new_consumer(r, &o, &d)) {
        fprintf(stderr, "consumer: cannot start\n");
        return 2;
    }
    uint8_t *dst = ecxi_region_base(r);
    uint64_t remote[ITEM_BLOCKS], local[ITEM_BLOCKS];
    for (unsigned i = 0; i < ITEM_BLOCKS; i++)
        remote[i] = i, local[i] = NB - 1 - i; /* scattered, reversed */
    ecxi_block_run rr[ITEM_BLOCKS], lr[ITEM_BLOCKS];
    size_t nr = ecxi_block_runs_of(remote, ITEM_BLOCKS, rr),
           nl = ecxi_block_runs_of(local, ITEM_BLOCKS, lr);
    ecxi_data_peer *p = NULL;
    ecxi_data_desc dd;
    int prc = ecxi_data_desc_decode(a.d, (size_t)a.dl, &dd);
    if (!prc) prc = ecxi_data_peer_add(d, a.m, (size_t)a.ml, &dd, &p);
    int bad = 0;
    long rss0 = rss_shmem_kib();
    for (int e = 0; e < nexpect; e++) {
        if (strcmp(expect[e], "warm") == 0 || strcmp(expect[e], "bounded") == 0) {
            long grown = rss_shmem_kib() - rss0;
            bool warm = strcmp(expect[e], "warm") == 0;
            bool ok = rss0 >= 0 && (warm ? grown >= (long)(NB * BS / 1024) : grown <= 64 << 10);
            printf("%s: RssShmem grew by %ld KiB: %s\n", expect[e], grown, ok ? "yes" : "NO");
            if (!ok) bad++;
            continue;
        }
        if (strcmp(expect[e], "pause") == 0) {
            usleep(2500 * 1000);
            continue;
        }
        if (strcmp(expect[e], "settle") == 0) {
            for (int64_t end = ecxi_now_ms(NULL) + 10000;
                 ecxi_data_arm(d) == 1 && ecxi_now_ms(NULL) < end;)
                ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
            bool settled = ecxi_data_arm(d) == 0;
            printf("settle: %s\n", settled ? "nothing left to do" : "still armed");
            if (!settled) bad++;
            continue;
        }
        const char *got;
        bool untouched = true, exact = true;
        if (prc) {
            got = prc == ECX_EDATA_NOPATH ? "nopath" : ecx_strerror(prc);
        } else {
            memset(dst, 0x5a, ecxi_region_size(r));
            ecxi_data_xfer *x;
            int rc = ecxi_data_read_post(p, &dd, rr, nr, lr, nl, ITEM_BYTES, KEY, strlen(KEY),
                                         &x);
            int st = rc ? ECXI_XFER_FAILED : ECXI_XFER_RUNNING;
            for (int64_t end = ecxi_now_ms(NULL) + 10000;
                 !rc && (st = ecxi_data_read_poll(x)) == ECXI_XFER_RUNNING &&
                 ecxi_now_ms(NULL) < end;) {
                ecxi_data_progress(d, ECXI_DATA_SLICE_NS, NULL);
                struct pollfd pf = {.fd = ecxi_data_fd(d), .events = POLLIN};
                if (ecxi_data_arm(d) == 0) (void)poll(&pf, 1, 50);
            }
            if (!rc) ecxi_data_read_release(x);
            for (uint64_t i = 0; i < ecxi_region_size(r); i++)
                if (dst[i] != 0x5a) untouched = false;
            for (uint64_t i = 0; i < ITEM_BYTES; i++)
                if (dst[local[i / BS] * BS + i % BS] != pat(i)) exact = false;
            got = st == ECXI_XFER_DONE      ? "done"
                  : st == ECXI_XFER_CORRUPT ? "corrupt"
                  : st == ECXI_XFER_RUNNING ? "still running"
                  : untouched              ? "refused"
                                           : "failed";
            if (st == ECXI_XFER_DONE && !exact) got = "done with wrong bytes";
        }
        bool match = strcmp(got, expect[e]) == 0 ||
                     (strcmp(expect[e], "failed") == 0 && strcmp(got, "refused") == 0);
        printf("read %d: %s (expected %s)\n", e + 1, got, expect[e]);
        if (!match) bad++;
    }
    ecxi_data_peer_drop(p);
    ecxi_data_free(d);
    ecxi_region_free(r);
    return bad ? 1 : 0;
}

static int raw(const char *file)
{
    ack a;
    ecxi_data_meta m;
    ecxi_data_desc dd;
    if (read_ack(file, &a) || ecxi_data_meta_decode(a.m, (size_t)a.ml, &m) || !m.has_shm ||
        ecxi_data_desc_decode(a.d, (size_t)a.dl, &dd) || !dd.has_ticket)
        return 2;
    const ecxi_data_ticket t = dd.ticket;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, m.sock, m.sock_len);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + m.sock_len);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sl) != 0) {
        printf("cannot connect: %s\n", strerror(errno));
        return 2;
    }
    uint8_t hello[2 + ECXI_DATA_TOKEN_LEN + sizeof KEY] = {1, 'H'};
    memcpy(hello + 2, t.token, ECXI_DATA_TOKEN_LEN);
    memcpy(hello + 2 + ECXI_DATA_TOKEN_LEN, KEY, strlen(KEY));
    (void)send(s, hello, sizeof hello - 1, MSG_NOSIGNAL);
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, 3000) <= 0) {
        printf("no answer\n");
        return 1;
    }
    uint8_t b[8];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = b, .iov_len = sizeof b};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(s, &mh, 0);
    if (n > 0 && mh.msg_controllen > 0) {
        printf("got a descriptor\n");
        return 1;
    }
    printf("%s\n", n > 0 ? "refused" : "closed");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "produce") == 0)
        return produce(argv[2], argv[3], argc > 4 && strcmp(argv[4], "truncate") == 0);
    if (argc == 5 && strcmp(argv[1], "fake") == 0) return fake(argv[2], argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[1], "consume") == 0) {
        const char *sock_of = NULL;
        int i = 4;
        if (argc >= 7 && strcmp(argv[4], "--sock-of") == 0) sock_of = argv[5], i = 6;
        return consume(argv[2], argv[3], sock_of, argv + i, argc - i);
    }
    if (argc == 3 && strcmp(argv[1], "raw") == 0) return raw(argv[2]);
    fprintf(stderr, "usage: see the comment at the top of tests/support/shm_hostile.c\n");
    return 2;
}
