/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conn_budget — who gets a connection slot when a listener is at one of its
 * bounds (issue 20): the data plane's tcp listener and the control plane's
 * ROUTER share this policy.
 *
 * A listener holds at most `total` connections, `per_prefix` from one
 * network prefix (/24 for IPv4, /64 for IPv6; an IPv4-mapped IPv6 address
 * counts as IPv4) and `per_addr` from one address. A cap alone lets a set
 * of addresses hold every slot and lock everyone else out, so a newcomer
 * that finds a cap full takes a slot from the heaviest holder instead, as
 * the producer's grant table does:
 *   - at the total cap: if the heaviest prefix holds more connections than
 *     the newcomer's prefix, it loses one (from its heaviest address);
 *     otherwise the newcomer's prefix is (one of) the heaviest and the rule
 *     below applies inside it;
 *   - at the prefix cap (or the total cap in the heaviest prefix): if the
 *     heaviest address of the prefix holds more than the newcomer's
 *     address, it loses one;
 *   - otherwise (and at the address cap) the newcomer may only replace one
 *     of its own address's idle connections (tier 0), else it is refused.
 * The connection lost is the holder's most evictable one: the lowest tier
 * (the caller's: idle before busy), then the smallest `since` (the one idle
 * longest, or the slowest). So a newcomer whose address (and prefix)
 * holds fewer connections than the heaviest always gets in, and whoever
 * holds the most loses first: however many addresses hold idle or dripping
 * connections, a consumer with one connection is not locked out.
 */
#ifndef ECXI_CONN_BUDGET_H
#define ECXI_CONN_BUDGET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* One connection a listener holds, as the policy sees it. */
typedef struct ecxi_conn_slot {
    uint8_t key[16]; /* its peer address (ecxi_conn_key) */
    int tier;        /* how evictable: 0 idle, higher busier; ECXI_CONN_KEEP: never */
    int64_t since;   /* within a tier, the smallest is evicted first */
    size_t id;       /* the caller's: handed back as the victim */
} ecxi_conn_slot;

#define ECXI_CONN_KEEP 1000

typedef struct ecxi_conn_caps {
    size_t total, per_prefix, per_addr;
} ecxi_conn_caps;

/* What to do with a newcomer. */
enum {
    ECXI_CONN_ADMIT = 0,    /* below every cap */
    ECXI_CONN_EVICT,        /* admit it and close *victim */
    ECXI_CONN_REFUSE_ADDR,  /* its address holds per_addr, none of them idle */
    ECXI_CONN_REFUSE_SHARE, /* a cap is full and nobody holds more than it */
};

/* The 16-byte key of a socket address: IPv6 as is, IPv4 (and IPv4-mapped)
 * as ::ffff:a.b.c.d; anything else all zero. */
void ecxi_conn_key(const struct sockaddr *sa, uint8_t key[16]);

/* True if two keys share a prefix (/24 IPv4, /64 IPv6). */
int ecxi_conn_same_prefix(const uint8_t a[16], const uint8_t b[16]);

/* Decide for a newcomer with `key` against the n connections in s (which
 * this may reorder). On ECXI_CONN_EVICT, *victim is the id of the slot to
 * close. */
int ecxi_conn_admit(ecxi_conn_slot *s, size_t n, const uint8_t key[16],
                    const ecxi_conn_caps *caps, size_t *victim);

#endif
