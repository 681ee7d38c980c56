/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_impl — what the data-plane backends share and nobody else needs:
 * the vtable every backend fills, the common head of contexts / peers /
 * xfers that lets data.c dispatch on any of them, the constructors, and
 * the run coalescing the real backends use. (The parsed forms of
 * agent_metadata and mem_descriptor are data_format.h's.)
 *
 * Dispatch: every ecxi_data, ecxi_data_peer and ecxi_data_xfer starts with
 * the head below; the public calls in data.c follow x->owner->ops. A
 * wrapper (auto, fault) may hand out its inner backend's peers and xfers
 * or its own, as it likes: each object names its real owner.
 */
#ifndef ECX_DATA_IMPL_H
#define ECX_DATA_IMPL_H

#include "data.h"
#include "util.h"

enum ecxi_data_role { ECX_DATA_PRODUCER = 1, ECX_DATA_CONSUMER = 2 };

/* One call's slice (data.h, "bounded slices"): the front starts it, the
 * backends move bytes in chunks of at most ECX_DATA_CHUNK, adding each to
 * it, and ask ecxi_slice_spent() before every chunk but the first. */
typedef struct ecxi_slice {
    int64_t start_ns, budget_ns;
    uint64_t bytes; /* moved so far in this call */
    bool more;      /* stopped with work left */
} ecxi_slice;

void ecxi_slice_start(ecxi_slice *sl, int64_t budget_ns);

/* Called with a chunk about to move: true if this call must stop here
 * (it has moved something and its budget has passed); then sl->more. */
static inline bool ecxi_slice_spent(ecxi_slice *sl)
{
    if (sl->bytes == 0) return false;
    if (sl->budget_ns > 0 && ecxi_now_ns() - sl->start_ns < sl->budget_ns) return false;
    sl->more = true;
    return true;
}

struct ecxi_data_ops {
    const char *name;
    void (*free)(ecxi_data *d);
    /* One slice: see ecxi_slice. */
    int (*progress)(ecxi_data *d, ecxi_slice *sl);
    int (*fd)(ecxi_data *d);
    /* 1 while a queued READ is unfinished or other work waits for no fd. */
    int (*arm)(ecxi_data *d);
    /* producer: progress within sl, then the completions */
    int (*poll_notifs)(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg);
    /* optional: a wrapper passes the grant check on to what it wraps */
    void (*set_grant_fn)(ecxi_data *d, ecxi_data_grant_fn fn, void *arg);
    /* optional, producer: cut a claimed grant's send (data.h, ecxi_data_cut);
     * absent: the path claims nothing */
    int (*cut)(ecxi_data *d, const char *key, size_t key_len, const uint8_t *token);
    /* optional: add the backend's counters to *st (data.h) */
    void (*stats)(const ecxi_data *d, ecxi_data_stats *st);
    /* consumer: meta and desc are already parsed, validated, and agree
     * (same nonce, same block size as the local region). */
    int (*peer_add)(ecxi_data *d, const ecxi_data_meta *m, const ecxi_data_desc *desc,
                    ecxi_data_peer **out);
    void (*peer_drop)(ecxi_data_peer *p);
    /* The ticket comes from a descriptor of this peer's producer, with
     * t->nbytes == nbytes; indices are already checked against both block
     * counts, n > 0, nbytes is in ((n-1) * block_bytes, n * block_bytes]
     * and 0 < key_len <= ECX_DATA_NOTIF_MAX. Before reporting DONE the
     * backend checks what it wrote against t->checksum (CORRUPT if not). */
    int (*read_post)(ecxi_data_peer *p, const ecxi_data_ticket *t, const uint64_t *remote,
                     const uint64_t *local, size_t n, uint64_t nbytes, const char *key,
                     size_t key_len, ecxi_data_xfer **out);
    /* optional, consumer: ecxi_data_decline (arguments checked as read_post's) */
    int (*decline)(ecxi_data_peer *p, const ecxi_data_ticket *t, const char *key, size_t key_len);
    int (*read_poll)(ecxi_data_xfer *x);
    void (*read_release)(ecxi_data_xfer *x);
    /* optional, producer: the one mem_descriptor of every grant, for a
     * path that carries no ticket (nixl); its completions carry no token
     * (data.h, ecxi_data_shared_descriptor) */
    const uint8_t *(*shared_descriptor)(const ecxi_data *d, size_t *len);
    /* optional, consumer: a path whose agent_metadata is not ecx's format
     * (nixl) registers the peer from the raw bytes; desc is its
     * ecxi_data_ack_desc parse */
    int (*peer_add_raw)(ecxi_data *d, const uint8_t *meta, size_t meta_len,
                        const ecxi_data_desc *desc, ecxi_data_peer **out);
    /* optional, consumer: the ack's descriptor, for such a path */
    int (*ack_desc)(const ecxi_data *d, const uint8_t *buf, size_t len, uint64_t nbytes,
                    ecxi_data_desc *dd);
    /* optional: the checksum of what a DONE READ wrote, for a path whose
     * grants carry none */
    bool (*read_checksum)(const ecxi_data_xfer *x, uint64_t *sum);
    /* optional, producer: the context that answers ecx consumers in ecx's
     * own form (nixl: its inner auto context; data.h, ecxi_data_form) */
    const ecxi_data *(*ecx_form)(const ecxi_data *d);
};

/* Head of every context. The front (data.c) fills role, region, the
 * published metadata and the grant check; backends fill ops. */
struct ecxi_data {
    const struct ecxi_data_ops *ops;
    int role;
    ecxi_region *region;
    uint8_t *meta; /* producer: published agent_metadata (malloc'd) */
    size_t meta_len;
    ecxi_data_desc layout; /* producer: every grant's descriptor, less the ticket
                             (its pointers are into the backend) */
    ecxi_data_grant_fn grant_fn; /* producer: the session's grant check */
    void *grant_arg;
    bool more; /* the last slice stopped with work left */
    bool background; /* ecxi_data_opts.background */
    uint64_t slices, slice_bytes, slice_max_bytes, slices_cut, slice_max_ns;
};

/* Ask the producer session whether a grant may be served (a backend's
 * only way to decide what leaves the producer). */
static inline int ecxi_data_grant_check(ecxi_data *d, const char *key, size_t key_len,
                                       const uint8_t token[ECX_DATA_TOKEN_LEN], int flags,
                                       ecxi_data_grant *g)
{
    if (!d->grant_fn || key_len == 0 || key_len > ECX_DATA_NOTIF_MAX) return ECX_EDATA_GRANT;
    return d->grant_fn(d->grant_arg, key, key_len, token, flags, g);
}

/* Head of every peer: its owner, and what it was registered from. */
struct ecxi_data_peer {
    ecxi_data *owner;
    const char *backend;  /* "shm" / "tcp" / "ucx" */
    uint64_t num_blocks;  /* of the remote region */
    uint64_t nonce;       /* of the producer context */
    uint8_t *meta;        /* the agent_metadata bytes */
    size_t meta_len;
};

/* Head of every xfer. */
struct ecxi_data_xfer {
    ecxi_data *owner;
};

/* Fill the peer head (copies the meta bytes); ECX_ENOMEM. */
int ecxi_data_peer_head_init(ecxi_data_peer *p, const ecxi_data_desc *desc, const uint8_t *meta,
                            size_t meta_len);
void ecxi_data_peer_head_fini(ecxi_data_peer *p);

/* Length of the run of consecutive block pairs starting at i: the largest
 * k with remote[i+j] == remote[i]+j and local[i+j] == local[i]+j, j < k. */
static inline size_t ecxi_data_run_len(const uint64_t *remote, const uint64_t *local, size_t i,
                                      size_t n)
{
    size_t k = 1;
    while (i + k < n && remote[i + k] == remote[i] + k && local[i + k] == local[i] + k)
        k++;
    return k;
}

/* The bytes of /proc/sys/kernel/random/boot_id as 16 raw bytes. */
int ecxi_data_boot_id(uint8_t out[16]);

/* Start one real backend (ECX_DATA_SHM / _TCP / _UCX) for role, with the
 * head's role and region filled (data.c); ECX_EINVAL for another value.
 * A producer fills its part of *m and *dd (a consumer may pass NULL). */
int ecxi_data_start(int backend, ecxi_region *region, const ecxi_data_opts *opts, int role,
                    ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out);
/* The "auto" backend over them (data_auto.c): a producer starts shm and
 * tcp (an error only if neither starts), a consumer shm (tcp and UCX on
 * first need). */
int ecxi_data_auto_new(ecxi_region *region, const ecxi_data_opts *opts, int role,
                       ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out);

/* Backend constructors (data_shm.c, data_tcp.c, data_ucx.c). The producer ones fill
 * their part of *m and *dd; pointers they set stay valid until free. */
int ecxi_data_shm_new_producer(ecxi_region *r, ecxi_data_meta *m, ecxi_data_desc *dd, ecxi_data **out);
int ecxi_data_shm_new_consumer(ecxi_region *r, ecxi_data **out);
/* UCX in this process (data_ucx.c): only the UCX process (ucx_proc.h) and
 * tests start one; the library's ucx path is ucx_proc.c's. The producer
 * listens on bind_host's address and port (network order; 0: any free
 * one), and fills m's UCX part. */
int ecxi_data_ucx_new_producer(ecxi_region *r, const char *bind_host, uint16_t port,
                               ecxi_data_meta *m, ecxi_data **out);
int ecxi_data_ucx_new_consumer(ecxi_region *r, ecxi_data **out);
/* The ucx path: UCX in its own process (ucx_proc.c). */
int ecxi_ucx_proc_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data_meta *m,
                               ecxi_data **out);
int ecxi_ucx_proc_new_consumer(ecxi_region *r, ecxi_data **out);
/* The pid of a ucx context's UCX process (0 while none runs, or for
 * another context), for tests and logs. */
int ecxi_ucx_proc_pid(const ecxi_data *d);
int ecxi_data_tcp_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data_meta *m,
                              ecxi_data **out);
int ecxi_data_tcp_new_consumer(ecxi_region *r, ecxi_data **out);
/* data_nixl.c: the producer fills the head's meta (NIXL agent metadata)
 * itself. */
int ecxi_data_nixl_new_producer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data **out);
int ecxi_data_nixl_new_consumer(ecxi_region *r, const ecxi_data_opts *opts, ecxi_data **out);

/* UCX's log lines through ours, UCX kept to errors unless UCX_LOG_LEVEL
 * is set (data_ucx.c); for every UCX context we create, once. */
void ecxi_data_ucx_log_setup(void);

struct sockaddr_storage;
/* The address a producer listens on for opts->bind_host (port 0): NULL,
 * "", "*", "0.0.0.0" and "::" mean any (then *any is set and *publish is
 * the first non-loopback IPv4 interface's address, else 127.0.0.1); else
 * the host resolved, in both. 0 or ECX_EINVAL. */
int ecxi_data_bind_addr(const char *host, struct sockaddr_storage *bind,
                       struct sockaddr_storage *publish, bool *any);

#endif
