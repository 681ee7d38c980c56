/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer — the consumer sessions: one session (a DEALER with a fresh
 * session id) per producer address, and one state machine per transfer,
 * from the request to a ready entry or to "encode locally" with a reason.
 * It owns ack validation, the timers (they run before acks in every poll,
 * so a late ack is stale), the tombstones that carry a reason to the
 * engine's next fetch, and the bounds on sessions and on what a producer
 * can make us read. No reserved block is ever lost: every path frees it,
 * at the latest when the quarantine limit passes. The rules:
 * docs/PROTOCOL.md §5 (fetch §5.1, the machine §5.2, acks §5.3, sessions
 * and their bounds §5.4).
 *
 *   WAITING_ACK --OK ack, valid--> READING --done, verified--> DONE (ready)
 *        |  NACK_NOT_READY: free blocks, RETRY after a backoff (no tombstone)
 *        |  other NACK, bad ack, ack timeout: tombstone, free blocks
 *   READING --failed--> READ_FAILED | --checksum differs--> CORRUPT
 *        --done after the lease could have ended--> LEASE_EXPIRED
 *        --deadline passed--> QUARANTINED: tombstone now, keep the blocks
 *   QUARANTINED --read ends, or the quarantine limit--> SETTLED: free them
 */
#ifndef ECXI_CONSUMER_H
#define ECXI_CONSUMER_H

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
#define ECXI_CONSUMER_ACK_SLACK 64

/* A session whose handshake has not completed this long after it was
 * opened counts as unreached, and may be closed at the session cap. A
 * handshake takes a few round trips; this also leaves room for one lost
 * TCP SYN (retransmitted after 1 s). */
#define ECXI_CONSUMER_UNREACHED_MS 1500

/* How long an item waits for a session at the cap (see above), and how
 * soon it asks again meanwhile. */
#define ECXI_CONSUMER_CAP_WAIT_MS 3000
#define ECXI_CONSUMER_CAP_RETRY_MS 50

/* An item asked for again (NOT_READY, or an ack timeout on protocol 2)
 * waits this long first, doubling per try up to the maximum. */
#define ECXI_CONSUMER_BACKOFF_MIN_MS 20
#define ECXI_CONSUMER_BACKOFF_MAX_MS 500

/* A READ's bytes must be in this far before the producer's lease ends
 * (counted from our receipt of the ack): a tenth of the lease, at most
 * the maximum. */
#define ECXI_CONSUMER_LEASE_MARGIN_MAX_MS 1000

/* Acks read from one session per poll: one flooding producer cannot
 * starve the engine's loop. */
#define ECXI_CONSUMER_ACKS_PER_POLL 4096

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
#define ECXI_LATENCY_BUCKETS 14
extern const double ecxi_latency_bounds_ms[ECXI_LATENCY_BUCKETS - 1];

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
    uint64_t sessions_unreached;    /* closed at the cap: no handshake in ECXI_CONSUMER_UNREACHED_MS */
    uint64_t session_cap_waits;     /* times an item waited for a session at the cap */
    uint64_t session_cap_refusals;  /* items that fell back: no session within the cap wait */
    uint64_t in_flight; /* transfers not yet settled */
    uint64_t waiting_ack, reading, retrying, quarantined, tombstones; /* in_flight by state */
    uint64_t latency_count[ECXI_LATENCY_BUCKETS]; /* fetch latency, non-cumulative */
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
