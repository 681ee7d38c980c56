/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data — the data plane's front: the one small interface the sessions use,
 * whatever moves the bytes. A producer context publishes agent_metadata and,
 * per grant, a mem_descriptor carrying the grant's ticket (token, checksum,
 * size, lease), and asks the producer session before any byte leaves it; a
 * consumer context registers a peer from an ack, posts a READ of the granted
 * blocks into its own, polls it (running / done / failed / corrupt) and
 * releases it. The contract and the formats: docs/PROTOCOL.md §6; the
 * paths (shm, tcp, ucx, nixl, and auto over them; fault in the tests) sit
 * behind the vtable of data_impl.h, registered in paths.c.
 *
 * Bounded slices, no hidden thread: everything advances in
 * ecxi_data_progress() and ecxi_data_poll_notifs(), on the caller's thread,
 * and each call moves bytes in chunks of at most ECXI_DATA_CHUNK, stopping
 * after the chunk that spends its budget (budget_ns; ECXI_DATA_SLICE_NS for
 * poll_notifs; the first chunk always moves). Budget in time, chunks in
 * bytes: a chunk's cost varies several-fold (a warm copy, a first touch,
 * pread, a socket copy), so the chunk bounds the overshoot (15-40 us on
 * this class of machine). ecxi_data_read_post() only validates and queues.
 * A call that stopped with work left says so (*more), and ecxi_data_arm()
 * returns 1 while any READ is unfinished (or, with
 * ecxi_data_opts.background, while shm still pre-faults a producer's
 * mapping): progress again at once, and sleep on ecxi_data_fd() only when
 * arm says 0. Everything from a peer is validated: malformed input is an
 * ECX_EDATA_* code, never a crash.
 */
#ifndef ECXI_DATA_H
#define ECXI_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data_format.h"
#include "ecx.h"
#include "region.h"

typedef struct ecxi_data ecxi_data;
typedef struct ecxi_data_peer ecxi_data_peer;
typedef struct ecxi_data_xfer ecxi_data_xfer;

/* Which path moves the bytes: X(NAME, value, "name"), the one list of
 * them, in the order of ecx.h's ECX_DATA_PATHS, which prints it (the
 * order of the values is older; tests/test_data.c checks that the two
 * agree). nixl (data_nixl.c): NIXL's one-sided data plane, to be a peer
 * of vLLM's own connector; never chosen by auto. */
#define ECXI_DATA_BACKENDS(X)                                                                       \
    X(AUTO, 0, "auto")                                                                             \
    X(SHM, 1, "shm")                                                                               \
    X(TCP, 3, "tcp")                                                                               \
    X(UCX, 2, "ucx")                                                                               \
    X(NIXL, 4, "nixl")
enum ecxi_data_backend {
#define ECXI_DATA_ENUM_(name, v, s) ECX_DATA_##name = v,
    ECXI_DATA_BACKENDS(ECXI_DATA_ENUM_)
#undef ECXI_DATA_ENUM_
};
/* How many: the values are 0 .. ECXI_DATA_BACKEND_COUNT - 1. */
#define ECXI_DATA_COUNT_(name, v, s) +1
enum { ECXI_DATA_BACKEND_COUNT = 0 ECXI_DATA_BACKENDS(ECXI_DATA_COUNT_) };
#undef ECXI_DATA_COUNT_

/* State of a posted READ. CORRUPT: the bytes arrived but their checksum is
 * not the ticket's (the item must not become ready). */
enum ecxi_xfer_state {
    ECXI_XFER_RUNNING = 0,
    ECXI_XFER_DONE = 1,
    ECXI_XFER_FAILED = 2,
    ECXI_XFER_CORRUPT = 3,
};

/* Longest grant key, in bytes ("{session_id}:{mm_hash}"). */
#define ECXI_DATA_NOTIF_MAX 512

typedef struct ecxi_data_opts {
    int backend;           /* enum ecxi_data_backend; 0 = auto */
    const char *bind_host; /* producer: the advertised host; listeners bind
                              to its interface only (NULL: any) */
    bool background;       /* consumer: a thread of the caller's progresses
                              this context whenever arm says 1 (the progress
                              thread), so arm may also say 1 for work that
                              only pays off later: the shm path then faults
                              in the rest of a producer's mapping after the
                              first READ, slice by slice (data_shm.c) */
} ecxi_data_opts;

/* Parse a name of ECXI_DATA_BACKENDS into enum ecxi_data_backend;
 * ECX_EINVAL else. The name of a value ("unknown" for none). A path this
 * libecx is built without parses: starting it says it is not built in. */
int ecxi_data_backend_parse(const char *s, int *out);
const char *ecxi_data_backend_name(int backend);
/* True if this libecx is built with that path (ucx: ECX_WITH_UCX, nixl: ECX_WITH_NIXL). */
bool ecxi_data_backend_built(int backend);

/* ---- producer ---------------------------------------------------------- */

/* A producer context serving `region` (which must outlive it). opts may be
 * NULL (auto: publish both paths; if one cannot start it is left out with a
 * warning, and only if none starts is it an error). */
int ecxi_data_new_producer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out);

/* The parts of an ack in this context's own form (the sessions use
 * ecxi_data_grant_ack, which picks the form): its agent_metadata, valid
 * until ecxi_data_free(), and one grant's mem_descriptor, the layout plus
 * the ticket, into buf (its length, or ECX_ERANGE if cap is too small:
 * ECXI_DATA_DESC_MAX always suffices). */
const uint8_t *ecxi_data_agent_metadata(const ecxi_data *d, size_t *len);
long ecxi_data_grant_descriptor(const ecxi_data *d, const ecxi_data_ticket *t, uint8_t *buf,
                               size_t cap);

/* What an OK ack carries for the data plane: its agent_metadata and its
 * mem_descriptor. */
typedef struct ecxi_data_ack {
    const uint8_t *meta;
    size_t meta_len;
    const uint8_t *desc;
    size_t desc_len;
    /* ecxi_data_grant_ack: the grant goes out *tokenless*: its descriptor
     * carries no token and no checksum (nixl: vLLM's list of the region's
     * blocks, the same for every grant), its completions come with a NULL
     * token, and whoever can send one releases the grant it names. */
    bool tokenless;
} ecxi_data_ack;

/* What an OK ack carries for one grant, into *out: the metadata and a
 * descriptor (the layout plus the ticket t, written into buf; or a
 * tokenless path's own, then out->tokenless). ecx_peer: the consumer is
 * ecx (its session id is marked, session_id.h); a nixl producer answers
 * it in the form of the ecx paths it also runs (auto: shm and tcp), with
 * tickets, tokens and checksums, and anyone else in NIXL's. Every other
 * context answers in its own form. The grant check and completions of
 * both forms come through d. out's pointers stay valid until
 * ecxi_data_free() (the metadata) or until buf is reused. ECX_ERANGE if
 * cap is too small (ECXI_DATA_DESC_MAX always suffices), ECX_EINVAL. */
int ecxi_data_grant_ack(const ecxi_data *d, bool ecx_peer, const ecxi_data_ticket *t,
                        uint8_t *buf, size_t cap, ecxi_data_ack *out);

/* A grant as a producer backend needs it to serve the bytes. */
typedef struct ecxi_data_grant {
    const uint64_t *blocks; /* producer block indices, in item order */
    size_t n;
    uint64_t nbytes; /* the bytes run through blocks in order */
} ecxi_data_grant;

/* Flag for the grant check: mark the grant served (a second claim fails).
 * A claim is also a promise (issue 20): the claiming path reads the
 * grant's blocks from then until it reports the send's end through
 * poll_notifs (once, with the claim's key and token), and it can cut that
 * send on request (ecxi_data_cut). The session keeps the blocks pinned
 * until then, whatever the lease says. */
#define ECXI_DATA_GRANT_CLAIM 1
/* The grant check's "asked, answer later" (positive: not an error). */
#define ECXI_DATA_GRANT_ASKED 1

/* The producer session's answer to "may this leave?": 0 and *g if key
 * ("{session_id}:{mm_hash}") names a live grant with exactly this token
 * (and, with ECXI_DATA_GRANT_CLAIM, not claimed before: it is now);
 * ECX_EDATA_GRANT otherwise. In the UCX process (ucx_proc.h), whose
 * session is its parent's, the check may also say ECXI_DATA_GRANT_ASKED:
 * the question went to the parent, ask again once its answer is in. g->blocks stays valid until the grant is
 * released. Backends call it only from progress / poll_notifs. */
typedef int (*ecxi_data_grant_fn)(void *arg, const char *key, size_t key_len,
                                 const uint8_t token[ECXI_DATA_TOKEN_LEN], int flags,
                                 ecxi_data_grant *g);

/* Install the grant check (without one, nothing is ever served). */
void ecxi_data_set_grant_fn(ecxi_data *d, ecxi_data_grant_fn fn, void *arg);

/* The session lets a claimed grant go (its lease expired, it was replaced
 * or evicted, or a completion came) while the path may still be sending
 * it: if a send of the grant (key, token) runs on this context, cut it
 * (close its connection, or fail its endpoint) and return 1: its end, a
 * negative status, comes through poll_notifs once the path can no longer
 * read the grant's blocks, and only then may they be unpinned. 0 if no
 * send of it runs here (none began, or it has ended: nothing reads the
 * blocks). A path whose sends read no block after they report their end
 * and that claims nothing (shm, nixl's one-sided READs) returns 0. */
int ecxi_data_cut(ecxi_data *d, const char *key, size_t key_len,
                  const uint8_t token[ECXI_DATA_TOKEN_LEN]);

/* Called once per completion: key is NUL-terminated (key_len excludes it);
 * status 0: the grant's transfer is complete (the consumer said so, or the
 * producer's own send finished), or the consumer declined it; negative:
 * the producer's send failed. The token is the one the completion
 * presented: the session must check it; NULL from a tokenless path
 * (ecxi_data_ack.tokenless). Inside the UCX process only, data_ucx.c
 * reports a decline as ECXI_DATA_DECLINED, which that process tells its
 * parent apart from a send's end (ucx_proc.h); the parent hands it on as 0. */
#define ECXI_DATA_DECLINED 1
typedef void (*ecxi_data_notif_cb)(void *arg, const char *key, size_t key_len,
                                  const uint8_t token[ECXI_DATA_TOKEN_LEN], int status);

/* Progress (one slice of ECXI_DATA_SLICE_NS), then hand every completion
 * since the last call to cb. Returns how many were delivered, or a
 * negative error. ecxi_data_arm() says whether work was left. */
int ecxi_data_poll_notifs(ecxi_data *d, ecxi_data_notif_cb cb, void *arg);

/* ---- consumer ---------------------------------------------------------- */

/* A consumer context reading into `region` (which must outlive it). */
int ecxi_data_new_consumer(ecxi_region *region, const ecxi_data_opts *opts, ecxi_data **out);

/* Register what an OK ack brought: parse its mem_descriptor into *dd
 * the way this context's path reads it (once: the READ takes the parsed
 * form), and, if *peer is NULL, register the producer there (into
 * *peer); a *peer already set is kept (the caller checked that it was
 * registered from this metadata: ecxi_data_peer_same). ecx's form is
 * ecxi_data_desc_decode's descriptor, which must carry a ticket, and
 * ecxi_data_peer_add's registration. A nixl context registers ecx's own
 * metadata (the "ECX" magic) that way, through its auto paths, and
 * anything else as NIXL's: the descriptor is then vLLM's list, which must
 * be uniform (base + i * our block size, dev 0: what vLLM's
 * build_block_descs writes), and is described as a grant of nbytes with
 * no checksum (dd->unverified: ecxi_data_read_checksum) and
 * ECXI_NIXL_LEASE_MS. Errors: ECX_EDATA_DESC, ECX_EDATA_MISMATCH,
 * ECX_EDATA_VERSION (the descriptor), and ecxi_data_peer_add's. */
int ecxi_data_ack_register(ecxi_data *d, const ecxi_data_ack *a, uint64_t nbytes,
                           ecxi_data_desc *dd, ecxi_data_peer **peer);
/* A NIXL ack names no lease: the consumer assumes this one (vLLM's pins
 * outlive it). */
#define ECXI_NIXL_LEASE_MS 30000

/* Register a producer from its agent_metadata bytes and a descriptor of
 * it in ecx's form, already parsed (ecxi_data_desc_decode): what
 * ecxi_data_ack_register does for ecx's form. Errors: ECX_EDATA_META
 * (metadata malformed), ECX_EDATA_DESC (desc NULL, or NIXL's), ECX_EDATA_VERSION,
 * ECX_EDATA_MISMATCH (descriptor of another producer, or block sizes
 * differ), ECX_EDATA_NOPATH (no enabled backend reaches it),
 * ECX_EDATA_UCX. */
int ecxi_data_peer_add(ecxi_data *d, const uint8_t *meta, size_t meta_len,
                       const ecxi_data_desc *desc, ecxi_data_peer **out);

/* For a READ whose grant carried no checksum (dd->unverified): the
 * XXH3-64 of what it wrote, once DONE. False otherwise. */
bool ecxi_data_read_checksum(const ecxi_data_xfer *x, uint64_t *sum);

/* True if the peer was registered from exactly this agent_metadata (an
 * ack whose metadata differs means the producer restarted: drop and add
 * again). */
bool ecxi_data_peer_same(const ecxi_data_peer *p, const uint8_t *meta, size_t meta_len);

/* True if this agent_metadata leads to a data plane the peer was
 * registered for: the same bytes, or (ecx's form) any endpoint in common,
 * whichever path each would take: the producer context's nonce, the shm
 * socket name or region file (boot id, device, inode), the tcp address and
 * port, the UCX worker address. Two producers never share one, so metadata that does is the
 * peer's producer's, relayed (or copied) by another: a consumer uses a
 * registration only for the control-plane peer that first sent it
 * (consumer.c). Metadata that does not parse overlaps nothing here (it is
 * refused when registered). */
bool ecxi_data_peer_overlaps(const ecxi_data_peer *p, const uint8_t *meta, size_t meta_len);

/* Name of the path the peer uses ("shm" / "tcp" / "ucx" / "nixl"). */
const char *ecxi_data_peer_backend(const ecxi_data_peer *p);

/* Drop a registration. READs still running on it are failed (their xfers
 * stay valid until released). NULL is a no-op. */
void ecxi_data_peer_drop(ecxi_data_peer *p);

/* A run of blocks: first, first + 1, ..., first + count - 1. Blocks go
 * to the data plane as runs, in order (the cache's, and the ack's indices
 * made runs once, by ecxi_block_runs_of); each path cuts them into its
 * own pieces, never back into indices. */
typedef struct ecxi_block_run {
    uint64_t first, count;
} ecxi_block_run;

/* The runs of blocks[0..n), in order, consecutive blocks merged, into
 * out (room for n; n runs at most). Returns how many. */
size_t ecxi_block_runs_of(const uint64_t *blocks, size_t n, ecxi_block_run *out);

/* Post a READ of the grant in desc (this ack's mem_descriptor, parsed by
 * ecxi_data_desc_decode, which checked its own bounds): the peer's blocks
 * remote[0..nremote) into our blocks local[0..nlocal), block for block in
 * run order (n blocks on each side). key is the grant's key
 * "{session_id}:{mm_hash}" (1..ECXI_DATA_NOTIF_MAX bytes). nbytes is the
 * encoding's size, as announced (0: the ticket's): the bytes run through
 * the blocks in order, so only the first nbytes - (n-1) * block_bytes
 * bytes of the last block move. Errors: ECX_EDATA_DESC (desc NULL or
 * without a ticket), ECX_EDATA_MISMATCH (descriptor of another producer,
 * or its size differs from nbytes), ECX_EDATA_COUNT (no blocks, the two
 * sides' block counts differ, or nbytes not in ((n-1) * block_bytes,
 * n * block_bytes]), ECX_EDATA_INDEX (an empty run, or a block beyond
 * its side's block count), ECX_EDATA_NOTIF (key empty or too long),
 * ECX_EDATA_PEER (peer broken), ECX_ENOMEM, ECX_EDATA_UCX. */
int ecxi_data_read_post(ecxi_data_peer *p, const ecxi_data_desc *desc,
                        const ecxi_block_run *remote, size_t nremote, const ecxi_block_run *local,
                        size_t nlocal, uint64_t nbytes, const char *key, size_t key_len,
                        ecxi_data_xfer **out);

/* Tell the producer that the grant desc's ticket and key name (its ack
 * was read, its bytes will not be: the ack did not fit the item asked
 * for) is done with, so that it releases the grant now rather than at the
 * lease's end: on shm the consumer's 'D' (the one it sends after every
 * READ), on tcp a 'C' request (data_tcp.c), on ucx a decline request
 * (data_ucx.c, through the UCX process). Nothing is read or written;
 * the message goes out from this call or the progress calls after it,
 * best effort (a failure leaves the grant to its lease). 0 if said or
 * queued; ECX_EDATA_NOPATH on a path that cannot say it (nixl: the lease
 * releases the grant); ECX_EDATA_DESC, ECX_EDATA_MISMATCH,
 * ECX_EDATA_NOTIF as read_post; ECX_ENOMEM, ECX_EDATA_PEER. */
int ecxi_data_decline(ecxi_data_peer *p, const ecxi_data_desc *desc, const char *key,
                      size_t key_len);

/* enum ecxi_xfer_state. Cheap; call ecxi_data_progress() to move things on
 * (a READ is never DONE when read_post returns: its bytes move in the
 * progress calls after it). */
int ecxi_data_read_poll(ecxi_data_xfer *x);

/* Give the xfer back. A READ still running is cancelled; its memory may be
 * written until the backend confirms (at the latest when its peer is
 * dropped). shm and tcp stop writing at once (a copy stops between two
 * chunks; tcp drains the rest of the reply into scratch). NULL is a no-op. */
void ecxi_data_read_release(ecxi_data_xfer *x);

/* ---- both -------------------------------------------------------------- */

/* Bytes moved between two looks at the budget (a multiple of 64: the
 * one-pass copy+hash then never splits a stripe), and the budget the
 * library's own calls give one slice (poll_notifs, the sessions' poll):
 * measured on the 2-core AMD EPYC VM this was written on, a 256 KiB chunk
 * costs 15-20 us warm, 35-40 us on a first touch of the producer's pages;
 * a 150 us budget keeps one call under about 200 us. */
#define ECXI_DATA_CHUNK (256u << 10)
#define ECXI_DATA_SLICE_NS 150000

/* Advance everything by one bounded slice (see the top of this file):
 * move bytes in chunks until budget_ns (<= 0: one chunk) has passed.
 * Returns how many events it handled (>= 0: READs ended, completions
 * collected, connections served) or a negative error; *more (may be NULL)
 * is set when work is left that another call would advance now (call
 * again rather than sleep). Never blocks. */
int ecxi_data_progress(ecxi_data *d, int64_t budget_ns, bool *more);

/* True when the last progress call stopped at its budget with bytes left
 * to move: a READ's next slice is due at once. */
bool ecxi_data_moving(const ecxi_data *d);

/* A descriptor that becomes readable when progress may have work, or -1
 * if the context has none (then poll it on a timer). */
int ecxi_data_fd(ecxi_data *d);

/* Prepare to sleep on ecxi_data_fd(): 0 = safe to sleep, 1 = work is
 * already pending (progress again first: a READ queued or half copied,
 * a slice that stopped at its budget), negative = error. */
int ecxi_data_arm(ecxi_data *d);

/* What peers made a producer's data plane refuse or cut off, per path
 * (indexed by enum ecxi_data_backend; [ECX_DATA_AUTO] is unused). The grant
 * refusals themselves are the producer session's (refused_reads). */
typedef struct ecxi_data_counts {
    uint64_t conns_refused;    /* connections refused at a bound, or of another uid */
    uint64_t conns_evicted;    /* connections closed to make room for a newcomer */
    uint64_t conns_dropped;    /* connections closed for garbage, silence or a stalled send */
    uint64_t requests_dropped; /* malformed requests, or past a queue bound */
} ecxi_data_counts;
typedef struct ecxi_data_stats {
    ecxi_data_counts path[ECXI_DATA_BACKEND_COUNT];
    /* Slices (ecxi_data_progress / poll_notifs calls that moved bytes). */
    uint64_t slices;
    uint64_t slice_bytes;     /* bytes they moved (ucx: bytes verified) */
    uint64_t slice_max_bytes; /* the most one call moved */
    uint64_t slices_cut;      /* calls that stopped at their budget, work left */
    uint64_t slice_max_ns;    /* the longest call (informational, not a bound) */
    uint64_t nixl_agent_restarts; /* NIXL agent processes started again (nixl_proc.h) */
    uint64_t ucx_agent_restarts;  /* UCX processes started again (ucx_proc.h) */
} ecxi_data_stats;

/* Add the context's counters (every path it runs) to *st (the slice
 * maxima: the larger of *st's and the context's). */
void ecxi_data_get_stats(const ecxi_data *d, ecxi_data_stats *st);

/* Backend actually in use: "auto", "shm", "tcp", "ucx", "nixl", "fault". */
const char *ecxi_data_name(const ecxi_data *d);

void ecxi_data_free(ecxi_data *d);

#endif
