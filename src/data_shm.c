/*
 * data_shm — the same-host data path: the consumer maps the producer's
 * region file read-only and copies runs of blocks with memcpy, then sends
 * the completion notification as one datagram to the producer's socket.
 *
 * Why not UCX for this: on a region we map ourselves UCX's shared-memory
 * transports reach CMA (process_vm_readv) at best, which pins pages and
 * copies through the kernel per call; a plain memcpy from a read-only
 * mapping of the same tmpfs pages is the memory-speed ceiling itself
 * (figures in BENCHMARKS.md).
 *
 * Notification channel: a SOCK_DGRAM unix socket in the abstract
 * namespace, bound by the producer, named in agent_metadata. Datagrams
 * keep message boundaries, need no accept() or connection bookkeeping, no
 * thread on either side, and leave no file behind when a process dies.
 * Abstract names are per network namespace: a consumer in another
 * namespace cannot connect, so the auto backend falls back to UCX for it,
 * which is the right answer anyway. A full receive queue (EAGAIN) keeps the
 * notification queued on the consumer and retried in progress for up to
 * ECX_SHM_NOTIF_RETRY_MS; a producer that has gone (ECONNREFUSED) loses it,
 * and its pin lease expires as it would have anyway.
 *
 * A READ is done when ecx_data_read_post() returns: the copy is
 * synchronous (tens of milliseconds at most for the largest encodings).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "checksum.h"
#include "data_impl.h"
#include "util.h"

#define ECX_SHM_NOTIF_RETRY_MS 30000
#define ECX_SHM_RECV_BATCH 4096

typedef struct shm_peer shm_peer;

typedef struct shm_xfer {
    ecx_data_xfer head;
    struct shm_xfer *next; /* free list or pending list */
    shm_peer *peer;        /* while a notification is pending */
    int state;
    bool released, pending;
    int64_t give_up_ms;
    size_t notif_len; /* token + key */
    char notif[ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX];
} shm_xfer;

struct shm_peer {
    ecx_data_peer head;
    ecx_region *remote; /* the producer's file, read-only */
    const uint8_t *base;
    int sock; /* connected to the producer's notification socket */
};

typedef struct shm_data {
    ecx_data base;
    uint8_t boot_id[16];
    int sock; /* producer: bound socket; consumer: -1 */
    char sock_name[ECX_DATA_SOCK_MAX + 1];
    shm_xfer *free_xfers;
    shm_xfer *pending; /* consumer: notifications waiting for room */
} shm_data;

static const struct ecx_data_ops shm_ops;

static socklen_t abstract_addr(struct sockaddr_un *sa, const char *name, size_t len)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    sa->sun_path[0] = 0;
    memcpy(sa->sun_path + 1, name, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

static shm_data *shm_alloc(void)
{
    shm_data *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base.ops = &shm_ops;
    s->sock = -1;
    return s;
}

int ecx_data_shm_new_producer(ecx_region *r, ecx_data_meta *m, ecx_data_desc *dd, ecx_data **out)
{
    (void)dd;
    const char *path = ecx_region_path(r);
    struct stat st;
    if (!path || path[0] != '/' || strlen(path) > ECX_DATA_PATH_MAX) return ECX_EINVAL;
    if (stat(path, &st) != 0) {
        ecx_log(ECX_LOG_WARN, "data shm: stat %s: %s", path, strerror(errno));
        return ECX_ESYS;
    }
    shm_data *s = shm_alloc();
    if (!s) return ECX_ENOMEM;
    int rc = ecx_data_boot_id(s->boot_id);
    if (rc) goto fail;
    snprintf(s->sock_name, sizeof s->sock_name, "ecx-ntf-%08x-%016llx", (unsigned)getpid(),
             (unsigned long long)m->nonce);
    s->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->sock < 0) goto sysfail;
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, s->sock_name, strlen(s->sock_name));
    if (bind(s->sock, (struct sockaddr *)&sa, sl) != 0) goto sysfail;
    m->has_shm = true;
    memcpy(m->boot_id, s->boot_id, 16);
    m->dev = (uint64_t)st.st_dev;
    m->ino = (uint64_t)st.st_ino;
    m->path = path;
    m->path_len = strlen(path);
    m->sock = s->sock_name;
    m->sock_len = strlen(s->sock_name);
    *out = &s->base;
    return 0;
sysfail:
    ecx_log(ECX_LOG_WARN, "data shm: notification socket: %s", strerror(errno));
    rc = ECX_ESYS;
fail:
    if (s->sock >= 0) close(s->sock);
    free(s);
    return rc;
}

int ecx_data_shm_new_consumer(ecx_region *r, ecx_data **out)
{
    (void)r;
    shm_data *s = shm_alloc();
    if (!s) return ECX_ENOMEM;
    int rc = ecx_data_boot_id(s->boot_id);
    if (rc) {
        free(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}

static void xfer_put(shm_data *s, shm_xfer *x)
{
    x->next = s->free_xfers;
    s->free_xfers = x;
}

static void shm_free(ecx_data *d)
{
    shm_data *s = (shm_data *)d;
    /* Pending notifications belong to peers, which the caller has dropped. */
    for (shm_xfer *x = s->pending, *n; x; x = n) {
        n = x->next;
        if (x->released)
            free(x);
        else
            x->pending = false;
    }
    for (shm_xfer *x = s->free_xfers, *n; x; x = n) {
        n = x->next;
        free(x);
    }
    if (s->sock >= 0) close(s->sock);
    free(s);
}

/* Try to send one notification; 0 sent or given up, 1 still no room. */
static int notif_send(shm_peer *p, const char *msg, size_t len)
{
    ssize_t n = send(p->sock, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == (ssize_t)len) return 0;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) return 1;
    ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: notification not delivered: %s",
                        n < 0 ? strerror(errno) : "short send");
    return 0;
}

static int shm_progress(ecx_data *d)
{
    shm_data *s = (shm_data *)d;
    int done = 0;
    int64_t now = s->pending ? ecx_now_ms(NULL) : 0;
    for (shm_xfer **pp = &s->pending; *pp;) {
        shm_xfer *x = *pp;
        int rc = notif_send(x->peer, x->notif, x->notif_len);
        if (rc == 1 && now < x->give_up_ms) {
            pp = &x->next;
            continue;
        }
        if (rc == 1)
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: producer never drained its "
                                              "notification queue; notification dropped");
        *pp = x->next;
        x->pending = false;
        x->peer = NULL;
        if (x->released) xfer_put(s, x);
        done++;
    }
    return done;
}

static int shm_fd(ecx_data *d)
{
    return ((shm_data *)d)->sock;
}

static int shm_arm(ecx_data *d)
{
    (void)d;
    return 0;
}

static int shm_poll_notifs(ecx_data *d, ecx_data_notif_cb cb, void *arg)
{
    shm_data *s = (shm_data *)d;
    char buf[ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX + 1];
    int count = 0;
    for (int i = 0; i < ECX_SHM_RECV_BATCH; i++) {
        ssize_t n = recv(s->sock, buf, sizeof buf - 1, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            ecx_log(ECX_LOG_WARN, "data shm: recv: %s", strerror(errno));
            return ECX_ESYS;
        }
        if (n <= ECX_DATA_TOKEN_LEN || n > ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX) {
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data shm: dropped a notification of %zd bytes", n);
            continue;
        }
        buf[n] = 0;
        cb(arg, buf + ECX_DATA_TOKEN_LEN, (size_t)n - ECX_DATA_TOKEN_LEN, (const uint8_t *)buf, 0);
        count++;
    }
    return count;
}

static bool same_file(const char *path, uint64_t dev, uint64_t ino)
{
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

static int shm_peer_add(ecx_data *d, const ecx_data_meta *m, const ecx_data_desc *desc,
                        ecx_data_peer **out)
{
    shm_data *s = (shm_data *)d;
    if (!m->has_shm || memcmp(m->boot_id, s->boot_id, 16) != 0) return ECX_EDATA_NOPATH;
    char path[ECX_DATA_PATH_MAX + 1];
    memcpy(path, m->path, m->path_len);
    path[m->path_len] = 0;
    /* Same file as the producer's: checked before and after mapping it, so
     * a file of the same name in another mount namespace is never read. */
    if (!same_file(path, m->dev, m->ino)) return ECX_EDATA_NOPATH;
    shm_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    p->sock = -1;
    int rc = ecx_region_open_readonly(path, desc->block_bytes, &p->remote);
    if (rc) {
        ecx_log(ECX_LOG_DEBUG, "data shm: cannot map %s: %s", path, ecx_strerror(rc));
        rc = ECX_EDATA_NOPATH;
        goto fail;
    }
    if (!same_file(path, m->dev, m->ino)) {
        rc = ECX_EDATA_NOPATH;
        goto fail;
    }
    if (ecx_region_num_blocks(p->remote) < desc->num_blocks) {
        rc = ECX_EDATA_MISMATCH; /* the descriptor claims more than the file holds */
        goto fail;
    }
    p->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p->sock < 0) {
        rc = ECX_ESYS;
        goto fail;
    }
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, m->sock, m->sock_len);
    if (connect(p->sock, (struct sockaddr *)&sa, sl) != 0) {
        ecx_log(ECX_LOG_DEBUG, "data shm: notification socket unreachable: %s", strerror(errno));
        rc = ECX_EDATA_NOPATH;
        goto fail;
    }
    p->base = ecx_region_base(p->remote);
    p->head.owner = d;
    p->head.backend = "shm";
    *out = &p->head;
    return 0;
fail:
    if (p->sock >= 0) close(p->sock);
    ecx_region_free(p->remote);
    free(p);
    return rc;
}

static void shm_peer_drop(ecx_data_peer *hp)
{
    shm_peer *p = (shm_peer *)hp;
    shm_data *s = (shm_data *)hp->owner;
    for (shm_xfer **pp = &s->pending; *pp;) {
        shm_xfer *x = *pp;
        if (x->peer != p) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        x->pending = false;
        x->peer = NULL;
        if (x->released) xfer_put(s, x);
    }
    close(p->sock);
    ecx_region_free(p->remote);
    free(p);
}

static int shm_read_post(ecx_data_peer *hp, const ecx_data_ticket *t, const uint64_t *remote,
                         const uint64_t *local, size_t n, uint64_t nbytes, const char *key,
                         size_t key_len, ecx_data_xfer **out)
{
    shm_peer *p = (shm_peer *)hp;
    shm_data *s = (shm_data *)hp->owner;
    shm_xfer *x = s->free_xfers;
    if (x)
        s->free_xfers = x->next;
    else if (!(x = malloc(sizeof *x)))
        return ECX_ENOMEM;
    memset(x, 0, offsetof(shm_xfer, notif));
    x->head.owner = hp->owner;

    const uint64_t bs = ecx_region_block_bytes(s->base.region);
    uint8_t *lbase = ecx_region_base(s->base.region);
    ecx_sum sum;
    ecx_sum_reset(&sum);
    for (size_t i = 0; i < n;) {
        size_t k = ecx_data_run_len(remote, local, i, n);
        uint64_t len = k * bs < nbytes ? k * bs : nbytes;
        memcpy(lbase + local[i] * bs, p->base + remote[i] * bs, len);
        ecx_sum_update(&sum, lbase + local[i] * bs, len);
        nbytes -= len;
        i += k;
    }
    x->state = ecx_sum_digest(&sum) == t->checksum ? ECX_XFER_DONE : ECX_XFER_CORRUPT;
    char notif[ECX_DATA_TOKEN_LEN + ECX_DATA_NOTIF_MAX];
    size_t notif_len = ECX_DATA_TOKEN_LEN + key_len;
    memcpy(notif, t->token, ECX_DATA_TOKEN_LEN);
    memcpy(notif + ECX_DATA_TOKEN_LEN, key, key_len);
    if (notif_send(p, notif, notif_len) == 1) {
        memcpy(x->notif, notif, notif_len);
        x->notif_len = notif_len;
        x->peer = p;
        x->pending = true;
        x->give_up_ms = ecx_now_ms(NULL) + ECX_SHM_NOTIF_RETRY_MS;
        x->next = s->pending;
        s->pending = x;
    }
    *out = &x->head;
    return 0;
}

static int shm_read_poll(ecx_data_xfer *hx)
{
    return ((shm_xfer *)hx)->state;
}

static void shm_read_release(ecx_data_xfer *hx)
{
    shm_xfer *x = (shm_xfer *)hx;
    x->released = true;
    if (!x->pending) xfer_put((shm_data *)hx->owner, x);
}

static const struct ecx_data_ops shm_ops = {
    .name = "shm",
    .free = shm_free,
    .progress = shm_progress,
    .fd = shm_fd,
    .arm = shm_arm,
    .poll_notifs = shm_poll_notifs,
    .peer_add = shm_peer_add,
    .peer_drop = shm_peer_drop,
    .read_post = shm_read_post,
    .read_poll = shm_read_poll,
    .read_release = shm_read_release,
};
