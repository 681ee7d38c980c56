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
 * wrapper (auto, nixl, fault) may hand out its inner backend's peers and
 * xfers or its own, as it likes: each object names its real owner.
 */
#ifndef ECXI_DATA_IMPL_H
#define ECXI_DATA_IMPL_H

#include "data.h"
#include "util.h"

enum ecxi_data_role { ECXI_DATA_PRODUCER = 1, ECXI_DATA_CONSUMER = 2 };

/* One call's slice (data.h, "bounded slices"): the front starts it, the
 * backends move bytes in chunks of at most ECXI_DATA_CHUNK, adding each to
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

/* Every slot not marked optional is required: the context slots of every
 * context, the peer slots (peer_drop .. read_release) of every backend
 * whose peers are its own (ecxi_data_ops_check). */
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
     * t->nbytes == nbytes; the runs are already checked (ecxi_data_read_post:
     * none empty, each inside its side's block count, n > 0 blocks on each
     * side), nbytes is in ((n-1) * block_bytes, n * block_bytes] and
     * 0 < key_len <= ECXI_DATA_NOTIF_MAX. Before reporting DONE the
     * backend checks what it wrote against t->checksum (CORRUPT if not),
     * or, for a grant that carries none, sets the xfer head's sum. */
    int (*read_post)(ecxi_data_peer *p, const ecxi_data_ticket *t, const ecxi_block_run *remote,
                     size_t nremote, const ecxi_block_run *local, size_t nlocal, uint64_t nbytes,
                     const char *key, size_t key_len, ecxi_data_xfer **out);
    /* optional, consumer: ecxi_data_decline (arguments checked as read_post's) */
    int (*decline)(ecxi_data_peer *p, const ecxi_data_ticket *t, const char *key, size_t key_len);
    int (*read_poll)(ecxi_data_xfer *x);
    void (*read_release)(ecxi_data_xfer *x);
    /* optional, producer: what an ack carries for one grant (data.h,
     * ecxi_data_grant_ack), for a path with a form of its own (nixl);
     * absent: ecx's form (this context's metadata, t's descriptor) */
    int (*grant_ack)(const ecxi_data *d, bool ecx_peer, const ecxi_data_ticket *t,
                     uint8_t *buf, size_t cap, ecxi_data_ack *out);
    /* optional, consumer: parse and register what an ack brought (data.h,
     * ecxi_data_ack_register), for a path with a form of its own (nixl);
     * absent: ecx's form (ecxi_data_ack_register_ecx) */
    int (*ack_register)(ecxi_data *d, const ecxi_data_ack *a, uint64_t nbytes,
                        ecxi_data_desc *dd, ecxi_data_peer **peer);
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
                                       const uint8_t token[ECXI_DATA_TOKEN_LEN], int flags,
                                       ecxi_data_grant *g)
{
    if (!d->grant_fn || key_len == 0 || key_len > ECXI_DATA_NOTIF_MAX) return ECX_EDATA_GRANT;
    return d->grant_fn(d->grant_arg, key, key_len, token, flags, g);
}

/* Head of every peer: its owner, and what it was registered from. */
struct ecxi_data_peer {
    ecxi_data *owner;
    const char *backend;  /* "shm" / "tcp" / "ucx" / "nixl" */
    uint64_t num_blocks;  /* of the remote region */
    uint64_t nonce;       /* of the producer context */
    uint8_t *meta;        /* the agent_metadata bytes */
    size_t meta_len;
};

/* Head of every xfer. A path whose grants carry no checksum
 * (ecxi_data_desc.unverified) sets sum and has_sum once the READ is DONE:
 * the XXH3-64 of what it wrote (ecxi_data_read_checksum). */
struct ecxi_data_xfer {
    ecxi_data *owner;
    bool has_sum;
    uint64_t sum;
};

/* Finish a registration: rc is the backend's peer_add (or its like);
 * on 0, fill *out's head from desc and the meta bytes (a copy), dropping
 * the peer if that fails (ECX_ENOMEM). Returns the outcome. */
int ecxi_data_peer_done(int rc, const ecxi_data_desc *desc, const uint8_t *meta, size_t meta_len,
                        ecxi_data_peer **out);

/* Register what an ack brought in ecx's own form (agent_metadata and a
 * mem_descriptor with a ticket): the default of ack_register, and what a
 * wrapper (nixl) calls for its ecx peers, on its inner context. */
int ecxi_data_ack_register_ecx(ecxi_data *d, const ecxi_data_ack *a, ecxi_data_desc *dd,
                               ecxi_data_peer **peer);

/* Check that ops fills every slot a context needs (peer false) or, peer
 * true, every slot its peers and xfers need (a wrapper such as auto hands
 * out its inner backends' peers, and needs none of those): a programming
 * error, logged with the slot's name, then abort(), in every build. Every
 * context is checked when it is made (data.c, data_fault.c), and every
 * peer's owner when the peer is registered (ecxi_data_peer_done). */
void ecxi_data_ops_check(const struct ecxi_data_ops *ops, bool peer);

/* Walks a READ's two run lists (checked: equal block counts) as pieces
 * that are one run on both sides: ecxi_block_zip_next() gives each in
 * turn, remote's first block, local's, and the count, until it returns
 * false. Start with ecxi_block_zip_start(). */
typedef struct ecxi_block_zip {
    const ecxi_block_run *r;
    size_t nr;
    const ecxi_block_run *l;
    size_t nl;
    size_t ri, li;       /* the runs the next piece starts in */
    uint64_t roff, loff; /* blocks of them already given */
} ecxi_block_zip;

static inline ecxi_block_zip ecxi_block_zip_start(const ecxi_block_run *remote, size_t nremote,
                                                  const ecxi_block_run *local, size_t nlocal)
{
    return (ecxi_block_zip){.r = remote, .nr = nremote, .l = local, .nl = nlocal};
}

static inline bool ecxi_block_zip_next(ecxi_block_zip *z, uint64_t *rfirst, uint64_t *lfirst,
                                       uint64_t *count)
{
    if (z->ri >= z->nr || z->li >= z->nl) return false;
    const ecxi_block_run *r = &z->r[z->ri], *l = &z->l[z->li];
    uint64_t rk = r->count - z->roff, lk = l->count - z->loff, k = rk < lk ? rk : lk;
    *rfirst = r->first + z->roff;
    *lfirst = l->first + z->loff;
    *count = k;
    if ((z->roff += k) == r->count) z->ri++, z->roff = 0;
    if ((z->loff += k) == l->count) z->li++, z->loff = 0;
    return true;
}

/* The bytes of /proc/sys/kernel/random/boot_id as 16 raw bytes. */
int ecxi_data_boot_id(uint8_t out[16]);

/* One data path as the front knows it. The registration table (paths.c)
 * is the one place that names the paths' constructors: it lists every path
 * of ECXI_DATA_BACKENDS (data.h: their names), indexed by its value, with start NULL for one this
 * libecx is built without (ECX_WITH_UCX, ECX_WITH_NIXL). start is called by
 * ecxi_data_start only. */
typedef struct ecxi_data_path {
    int (*start)(ecxi_region *region, const ecxi_data_opts *opts, int role, ecxi_data_meta *m,
                 ecxi_data_desc *dd, ecxi_data **out);
} ecxi_data_path;
extern const ecxi_data_path ecxi_data_paths[ECXI_DATA_BACKEND_COUNT];

/* Start one backend (ECX_DATA_AUTO / _SHM / _TCP / _UCX / _NIXL) for role,
 * with the head's role and region filled (data.c); ECX_EINVAL for another
 * value, ECX_EDATA_NOPATH (logged: "ucx is not built in") for one this
 * libecx is built without. A producer fills its part of *m and *dd (a
 * consumer may pass NULL). */
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
