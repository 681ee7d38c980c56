/* SPDX-License-Identifier: Apache-2.0 */
/*
 * producer — the producer session (docs/PROTOCOL.md §4.3–§4.5): answers each XferReq,
 * holds the pins it grants, and lets them go.
 *
 * A request is checked in the order of docs/PROTOCOL.md §4.3: connector_version not ours →
 * NACK_VERSION; compatibility hash differs → NACK_INCOMPAT; empty
 * session_id → NACK_INTERNAL (grants are keyed by session_id:mm_hash, so
 * an empty id would alias two consumers); no entry (an mm_hash longer than
 * ECX_MM_HASH_MAX never has one) → NACK_MISSING; not
 * ready → NACK_NOT_READY; otherwise the entry is pinned and the ack carries
 * all its block indices, the data plane's agent_metadata and
 * mem_descriptor, and the echoed session_id. A NACK carries only mm_hash
 * and status, as the reference's does.
 *
 * Grants are keyed "{session_id}:{mm_hash}", the same string the consumer
 * sends as its completion notification, so a notification releases its
 * grant by exact lookup. Each grant holds one pin under a lease (lease_ms); a
 * lease that expires unpins with a warning.
 *
 * A pin outlives the send that reads its blocks (issue 20). The tcp and ucx
 * paths claim a grant and send straight from the region until they report
 * the send's end; a grant let go before that (lease expired, replaced,
 * evicted, or completed by another path) has its send cut (ecxi_data_cut:
 * the path closes that connection) and waits, off the table and its lease,
 * on a draining list, still pinned, until the path reports the cut send's
 * end; then it is unpinned. So no save can reuse blocks a send still
 * reads, and the lease still bounds how long a consumer holds them (a send
 * is cut, not waited for). A repeated request for a key
 * already granted (the consumer timed out and asked again) releases the old
 * pin before taking the new one.
 *
 * A grant belongs to the connection that asked (issue 9): it records the
 * ZeroMQ routing id, and only that connection may replace it; it carries a
 * random 16-byte token that travels only in the ack to that connection
 * (in the mem_descriptor's ticket, with the item's checksum and size). The
 * data plane serves a grant's bytes only to a request presenting key and
 * token, once (grant_check), and a completion releases the grant only with
 * the right token: knowing a session id (which is never logged at the
 * default level) gains a third party nothing. Frames that do not decode get no reply and
 * are counted. Since the lease is the same for every grant, grants expire
 * in the order they were made: a list in grant order is the expiry queue.
 *
 * Limits, so a hostile peer cannot grow us without bound: a grant key
 * longer than ECX_DATA_NOTIF_MAX, or a grant beyond max_grants, is refused
 * with NACK_INTERNAL. Grant records come from a pool that grows to its peak
 * and is reused; the grant table is hashed with a random SipHash key.
 *
 * Per connection (routing id), so that hitting a bound costs that peer and
 * not everyone (issue 10):
 *  - a connection holding max_conn_grants grants is refused
 *    (NACK_INTERNAL, refused_conn_grants);
 *  - when the shared table (max_grants) is full, a connection holding at
 *    least its fair share, max_grants / (connections holding grants, the
 *    asker included), is refused; one holding less gets its grant, and
 *    the oldest grant of the connection holding the most is released to
 *    make room (evicted_grants; that peer's later read or completion
 *    finds no grant). A full table with an asker below the average
 *    always has a connection above it, so a well-behaved consumer is
 *    served during any flood, however many connections the flood uses;
 *  - a connection's pins may cover at most max_conn_pin_pct of the
 *    region's blocks: a grant that would pass that is refused
 *    (NACK_INTERNAL, refused_conn_pins), unless the connection holds no
 *    pin (one item, however big, can always be served).
 * And for all connections together, so that the encoder's own saves always
 * find room whatever consumers pin (issue 20): the region's pinned blocks
 * may cover at most max_pin_pct of it. A grant that would pin an entry not
 * pinned yet past that is refused with NACK_NOT_READY (refused_pins): the
 * condition is transient (pins drain as sends complete and leases end) and
 * consumers retry NOT_READY with a backoff, where NACK_INTERNAL would send
 * every consumer to encode locally. An entry pinned already costs no room,
 * and when nothing else is pinned one item, however big, is granted.
 * The heaviest connection is found in O(1): connections are listed by
 * their grant count (1..max_conn_grants). Connection records are pooled
 * like grants.
 */
#ifndef ECX_PRODUCER_H
#define ECX_PRODUCER_H

#include <stdint.h>

#include "cache.h"
#include "ctrl.h"
#include "data.h"
#include "util.h"

typedef struct ecxi_producer ecxi_producer;

/* Requests read per poll: one flooding peer cannot starve the engine's
 * loop. */
#define ECX_PRODUCER_REQUESTS_PER_POLL 4096

typedef struct ecxi_producer_opts {
    const char *compat_hash; /* ours: requests with another one get NACK_INCOMPAT */
    /* 0: the ECX_DEFAULT_* of ecx.h */
    int64_t lease_ms;          /* ECX_DEFAULT_LEASE_MS */
    uint32_t max_grants;       /* ECX_DEFAULT_MAX_GRANTS */
    uint32_t max_conn_grants;  /* per connection (at most max_grants);
                                  ECX_DEFAULT_MAX_CONN_GRANTS */
    uint32_t max_conn_pin_pct; /* % of the region one connection's pins may cover (1..100);
                                  ECX_DEFAULT_MAX_CONN_PIN_PCT */
    uint32_t max_pin_pct;      /* % of the region pins may cover, all connections together
                                  (1..100); ECX_DEFAULT_MAX_PIN_PCT */
    uint64_t block_bytes;      /* for bytes_served */
    const ecxi_clock *clock;   /* NULL: monotonic */
    int connector_version;     /* ours (0: ECX_CONNECTOR_VERSION): requests are decoded as
                                  this version decodes them, and another is NACK_VERSION */
} ecxi_producer_opts;

typedef struct ecxi_producer_stats {
    uint64_t requests;                  /* frames received */
    uint64_t malformed;                 /* frames that did not decode (dropped) */
    uint64_t grants;                    /* OK acks */
    uint64_t nacks[ECX_STATUS_MAX + 1]; /* by status; nacks[0] unused */
    uint64_t regrants;                  /* repeated requests that replaced a grant */
    uint64_t active_grants;
    uint64_t expired_leases;
    uint64_t completions;      /* notifications that released a grant */
    uint64_t unknown_notifs;   /* notifications matching no grant */
    uint64_t forged_notifs;    /* notifications for a grant with a wrong token */
    uint64_t foreign_requests; /* requests for a grant another connection holds */
    uint64_t refused_reads;    /* data-plane requests with no live grant / wrong token / replay */
    uint64_t send_failed;      /* grants whose bytes could not be sent */
    uint64_t bytes_served;     /* bytes of completed grants */
    uint64_t reply_failed;   /* acks that could not be sent */
    uint64_t refused_conn_grants; /* refused: at its cap, or at its share of a full table */
    uint64_t refused_conn_pins;   /* refused: its pins would pass its share of the region */
    uint64_t refused_pins;        /* refused (NOT_READY): pins in all would pass max_pin_pct */
    uint64_t evicted_grants;      /* taken from the heaviest connection: a full table */
    uint64_t nixl_grants;         /* OK acks in NIXL's form (nixl mode, a non-ecx session) */
    uint64_t cut_sends;       /* grants let go while their send ran: the send was cut */
    uint64_t draining_grants; /* of those, the ones whose send has not reported its end yet
                                 (their blocks stay pinned) */
} ecxi_producer_stats;

/* None of cache, data, srv is owned; all must outlive the producer. */
int ecxi_producer_new(ecxi_cache *cache, ecxi_data *data, ecxi_ctrl_server *srv,
                     const ecxi_producer_opts *opts, ecxi_producer **out);
/* Release every grant (unpinning) and free. NULL is a no-op. */
void ecxi_producer_free(ecxi_producer *p);

/* Drain requests and reply, drain notifications, sweep expired leases.
 * Never blocks. Returns the number of events handled. */
int ecxi_producer_poll(ecxi_producer *p);

ecxi_producer_stats ecxi_producer_get_stats(const ecxi_producer *p);

/* Milliseconds until the oldest lease expires (0 if due, -1 if no grant). */
int64_t ecxi_producer_next_timeout(const ecxi_producer *p);

#endif
