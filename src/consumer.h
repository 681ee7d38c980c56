/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer — the consumer sessions (docs/PROTOCOL.md §5): one session per producer
 * address, and one state machine per transfer.
 *
 *   WAITING_ACK --OK ack, valid--> READING --read done, verified--> DONE (entry ready)
 *        |  NACK_NOT_READY: free blocks, RETRY (ask again after a backoff,
 *        |      within the per-item wait) -- no tombstone
 *        |  other NACK, bad ack, ack timeout: tombstone, free blocks
 *   READING --read failed--> tombstone READ_FAILED, free blocks
 *        --bytes do not match the ticket's checksum--> tombstone CORRUPT
 *        --done only after the lease could have expired--> tombstone
 *          LEASE_EXPIRED (the producer may have reused the blocks)
 *        --deadline passed--> QUARANTINED: tombstone now, keep the blocks
 *   QUARANTINED --read ends, or the quarantine limit passes--> SETTLED:
 *        free the blocks (at the limit, the data peer is dropped first so
 *        nothing can still write into them)
 *
 * Timers run before acks in every poll: an ack that arrives after its
 * transfer's deadline is dropped as stale. The lease clock starts when the
 * ack is read: receipt + the ticket's lease - a margin (a tenth of it, at
 * most 1 s) bounds the READ's deadline, and a READ done later than that is
 * not used.
 *
 * A tombstone answers the engine's next fetch of that item with
 * "encode locally" and the reason, and is then gone. Every ack is
 * validated before a READ is posted: the session id must be echoed, the
 * block count must equal the reservation, every index must be in the
 * producer's range (the data plane checks that against its descriptor),
 * and its metadata must register. An OK ack whose agent_metadata differs
 * from the registered one means the producer restarted: the old
 * registration is dropped and the new one made. A registration belongs to
 * the session that first made it: metadata leading to a data plane another
 * open session registered (ecxi_data_peer_overlaps) is another producer's,
 * relayed, and the ack is BAD_ACK (relayed_registrations).
 *
 * A session is a DEALER with heartbeats and a disconnect monitor, and a
 * random UUID4 session_id. When the producer is lost, transfers waiting for
 * an ack become retryable, transfers reading are quarantined (and, since
 * the data peer is dropped with the session, settle at once), and the
 * session is closed: the next contact opens a fresh socket and session id.
 * No reserved block is ever lost: every path frees it, at the latest when
 * the quarantine limit passes.
 *
 * Acks are bounded too: a producer answers each request once, so one that
 * sends more than ECX_CONSUMER_ACK_SLACK acks (or badly framed replies)
 * beyond the requests sent on its session floods (or is broken): its waiting transfers tombstone
 * (BAD_ACK) and the session is closed unread (counted in ack_floods). With
 * the control plane's inflow guard (ctrl.h), that bounds what a producer
 * can make a polling consumer read and hold.
 *
 * Sessions are bounded: a producer that never answers (or is gone without
 * a completed handshake, which the monitor cannot report as lost) must not
 * hold a socket forever. A session is busy while any transfer on it waits
 * for an ack, reads, or is quarantined; one that has not been busy for
 * session_idle_ms is closed (idle close), and at most max_sessions are
 * open. When a new session is needed at the cap, the idle session unused
 * the longest is closed for it (eviction); failing that, the session that
 * has waited the longest for a handshake, once it has waited
 * ECX_CONSUMER_UNREACHED_MS (a producer that is not there: its waiting
 * items fall back with ACK_TIMEOUT now rather than at their deadline).
 * If every session is busy with a producer that answers (or was opened
 * too recently to tell), the item waits for a session, up to
 * ECX_CONSUMER_CAP_WAIT_MS (or its ack timeout, if shorter), then falls
 * back with SEND_FAILED (a cap refusal). So a batch that names more dead
 * producers than the cap holds a live producer's items up by about
 * ECX_CONSUMER_UNREACHED_MS, not by the dead ones' ack timeout. Each is
 * counted.
 */
#ifndef ECX_CONSUMER_H
#define ECX_CONSUMER_H

#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "cache.h"
#include "ctrl.h"
#include "data.h"
#include "util.h"

typedef struct ecxi_consumer ecxi_consumer;

/* Acks a session takes beyond the requests sent on it (duplicates, junk)
 * before its producer counts as flooding. */
#define ECX_CONSUMER_ACK_SLACK 64

/* A session whose handshake has not completed this long after it was
 * opened counts as unreached, and may be closed at the session cap. A
 * handshake takes a few round trips; this also leaves room for one lost
 * TCP SYN (retransmitted after 1 s). */
#define ECX_CONSUMER_UNREACHED_MS 1500

/* How long an item waits for a session at the cap (see above). */
#define ECX_CONSUMER_CAP_WAIT_MS 3000

typedef struct ecxi_consumer_opts {
    void *zctx;               /* ZeroMQ context for the sessions' sockets */
    const char *compat_hash;  /* sent in every XferReq */
    uint64_t block_bytes;     /* of the local region */
    /* <= 0: the ECX_DEFAULT_* of ecx.h */
    int64_t ack_timeout_ms;   /* ECX_DEFAULT_ACK_TIMEOUT_MS */
    int64_t read_timeout_ms;  /* ECX_DEFAULT_READ_TIMEOUT_MS */
    int64_t quarantine_ms;    /* ECX_DEFAULT_QUARANTINE_MS */
    int64_t item_wait_ms;     /* overall NOT_READY wait per item; ECX_DEFAULT_ITEM_WAIT_MS */
    int64_t tombstone_ttl_ms; /* unclaimed tombstones are dropped; ECX_DEFAULT_TOMBSTONE_TTL_MS */
    int64_t session_idle_ms;  /* a session not busy this long is closed;
                                 ECX_DEFAULT_SESSION_IDLE_MS */
    int max_sessions;         /* open sessions at most; ECX_DEFAULT_MAX_SESSIONS */
    int connector_version;    /* ours (0: ECX_CONNECTOR_VERSION): how requests are encoded
                                 and announcements read (announce.h) */
    int elem_size;            /* version 2: bytes per element of the dtype (announce.h) */
    ecxi_ctrl_opts ctrl;
    const ecxi_clock *clock; /* NULL: monotonic */
} ecxi_consumer_opts;

/* Upper bounds (ms) of the fetch-latency histogram; the last is +Inf. */
#define ECX_LATENCY_BUCKETS 14
extern const double ecxi_latency_bounds_ms[ECX_LATENCY_BUCKETS - 1];

typedef struct ecxi_consumer_stats {
    uint64_t requests;                    /* XferReqs sent */
    uint64_t ready;                       /* items fetched */
    uint64_t fallbacks[ECX_REASON_COUNT]; /* items answered "encode locally", by reason */
    uint64_t retries;                     /* NOT_READY (or lost-peer) re-asks */
    uint64_t quarantines;
    uint64_t settled;    /* quarantined transfers whose blocks came back */
    uint64_t bytes;      /* bytes fetched */
    uint64_t stale_acks; /* acks for no waiting transfer, or with another session id */
    uint64_t malformed_acks;
    uint64_t peer_restarts;
    uint64_t relayed_registrations; /* OK acks whose metadata another session registered */
    uint64_t peers_lost;
    uint64_t ack_floods; /* sessions closed: more acks than requests (+ the slack) */
    uint64_t sessions_open;         /* gauge: sessions (sockets) open now */
    uint64_t sessions_idle_closed;  /* closed after session_idle_ms without a busy transfer */
    uint64_t sessions_evicted;      /* idle sessions closed early to make room at the cap */
    uint64_t sessions_unreached;    /* closed at the cap: no handshake in ECX_CONSUMER_UNREACHED_MS */
    uint64_t session_cap_waits;     /* times an item waited for a session at the cap */
    uint64_t session_cap_refusals;  /* items that fell back: no session within the cap wait */
    uint64_t in_flight; /* transfers not yet settled */
    uint64_t waiting_ack, reading, retrying, quarantined, tombstones; /* in_flight by state */
    uint64_t latency_count[ECX_LATENCY_BUCKETS]; /* fetch latency, non-cumulative */
    double latency_sum_ms;
} ecxi_consumer_stats;

int ecxi_consumer_new(ecxi_cache *cache, ecxi_data *data, const ecxi_consumer_opts *opts,
                     ecxi_consumer **out);
/* Close every session and free every reserved block. NULL is a no-op. */
void ecxi_consumer_free(ecxi_consumer *c);

/*
 * The engine's question about mm_hash (1..ECX_MM_HASH_MAX bytes, else
 * INVALID): one lookup answers an item already known (in flight, a
 * tombstone, or in the local cache); only a new item's announcement is
 * looked at, checked by ecxi_announce_parse() (announce.h: NO_PEER,
 * INVALID, SIZE_MISMATCH), and then asked for. The announcement is the
 * reference's JSON text (json) or the struct (from), never both (both
 * given: ECX_EINVAL); both NULL: not announced. expected_size is what the
 * engine expects (0: any). Returns enum ecx_fetch_state; for
 * ECX_FETCH_LOCAL, *reason says why (and is counted). Asking again about a
 * pending item is cheap and is how the engine learns it finished.
 *
 * ecxi_consumer_answer is the one call here that may be made without the
 * lock that serialises every other (the connector's context lock, which
 * the poll's caller holds): it takes only the front's own lock, held for a
 * lookup, and the cache's. A new item is queued (*queued set) and answered
 * PENDING; its request goes out at the next ecxi_consumer_admit(), which
 * every ecxi_consumer_poll() begins with, and a request that fails then
 * (no room, no session) is the answer to a later call. queued NULL: a
 * new item is answered PENDING and not queued.
 *
 * ecxi_consumer_fetch is answer + admit + answer, under the lock: the
 * request is sent in the call, and one that fails at once is answered
 * LOCAL in it.
 */
int ecxi_consumer_answer(ecxi_consumer *c, const char *mm_hash, size_t hash_len, const char *json,
                         const ecx_announcement *from, uint64_t expected_size, int *reason,
                         bool *queued);
void ecxi_consumer_admit(ecxi_consumer *c);
int ecxi_consumer_fetch(ecxi_consumer *c, const char *mm_hash, size_t hash_len, const char *json,
                        const ecx_announcement *from, uint64_t expected_size, int *reason);

/* Receive acks, advance READs and timers. Never blocks; returns the number
 * of events handled. */
int ecxi_consumer_poll(ecxi_consumer *c);

/* Fill items with the sessions' sockets and their inflow guards' monitor
 * sockets (for a wait); returns how many there are (may exceed cap: then
 * only cap were written). */
size_t ecxi_consumer_pollitems(ecxi_consumer *c, zmq_pollitem_t *items, size_t cap);

/* Milliseconds until the next timer is due (0 if one is due, -1 if none);
 * the sessions' idle deadlines and inflow-guard checks count as timers. */
int64_t ecxi_consumer_next_timeout(ecxi_consumer *c);

ecxi_consumer_stats ecxi_consumer_get_stats(const ecxi_consumer *c);

/* XferReqs sent so far (cheap: the connector compares it around a fetch to
 * learn whether a socket was written). */
uint64_t ecxi_consumer_requests(const ecxi_consumer *c);

/* Changes whenever a session (socket) opens or closes: a waiter watching
 * the sessions' descriptors must then re-register them all, since a new
 * socket may have been given a closed one's descriptor number. */
uint64_t ecxi_consumer_sessions_gen(const ecxi_consumer *c);

#endif
