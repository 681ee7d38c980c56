/* SPDX-License-Identifier: Apache-2.0 */
/*
 * producer — the producer session: answers each XferReq in the order of
 * docs/PROTOCOL.md §4.3, holds the pins it grants under their lease, and
 * lets them go on a completion with the grant's token, at lease end, or
 * when a bound makes room (§4.4); a grant let go while a path still sends
 * from its blocks waits, still pinned, on a draining list until the path
 * reports the cut send's end. It owns the grant table and the per-
 * connection and region-wide bounds that keep one peer from costing
 * everyone (§4.4, §7).
 *
 * How: grants are keyed "{session_id}:{mm_hash}" in a table hashed with a
 * random SipHash key; since every grant has the same lease, a list in
 * grant order is the expiry queue; connections are listed by their grant
 * count, so the heaviest is found in O(1); grant and connection records
 * come from pools that grow to their peak and are reused.
 */
#ifndef ECXI_PRODUCER_H
#define ECXI_PRODUCER_H

#include <stdint.h>

#include "cache.h"
#include "ctrl.h"
#include "data.h"
#include "util.h"

typedef struct ecxi_producer ecxi_producer;

/* Requests read per poll: one flooding peer cannot starve the engine's
 * loop. */
#define ECXI_PRODUCER_REQUESTS_PER_POLL 4096

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
