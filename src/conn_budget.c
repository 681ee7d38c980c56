/* SPDX-License-Identifier: Apache-2.0 */
/* conn_budget — the shared admission policy of connection slots; see conn_budget.h. */
#include "conn_budget.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

void ecxi_conn_key(const struct sockaddr *sa, uint8_t key[16])
{
    memset(key, 0, 16);
    if (sa->sa_family == AF_INET) {
        memcpy(key, v4mapped, 12);
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

/* Bytes of the key that make its prefix: /24 of IPv4, /64 of IPv6. */
static size_t prefix_len(const uint8_t k[16])
{
    return memcmp(k, v4mapped, 12) == 0 ? 15 : 8;
}

int ecxi_conn_same_prefix(const uint8_t a[16], const uint8_t b[16])
{
    size_t l = prefix_len(a);
    return l == prefix_len(b) && memcmp(a, b, l) == 0;
}

static int by_key(const void *a, const void *b)
{
    return memcmp(((const ecxi_conn_slot *)a)->key, ((const ecxi_conn_slot *)b)->key, 16);
}

/* The most evictable slot of s[lo..hi) (at most tier max_tier), or hi. */
static size_t best(const ecxi_conn_slot *s, size_t lo, size_t hi, int max_tier)
{
    size_t b = hi;
    for (size_t i = lo; i < hi; i++) {
        if (s[i].tier > max_tier) continue;
        if (b == hi || s[i].tier < s[b].tier ||
            (s[i].tier == s[b].tier && s[i].since < s[b].since))
            b = i;
    }
    return b;
}

/* In sorted s[lo..hi), the heaviest address holding more than `than`
 * connections: its range in *alo, *ahi; false if none does. */
static bool heaviest_addr(const ecxi_conn_slot *s, size_t lo, size_t hi, size_t than,
                          size_t *alo, size_t *ahi)
{
    size_t most = than;
    bool found = false;
    for (size_t i = lo, j; i < hi; i = j) {
        for (j = i + 1; j < hi && !memcmp(s[j].key, s[i].key, 16); j++) {}
        if (j - i > most) most = j - i, *alo = i, *ahi = j, found = true;
    }
    return found;
}

/* Evict the most evictable connection of the heaviest address in sorted
 * s[lo..hi) if that address holds more than `than`. */
static bool evict_from(const ecxi_conn_slot *s, size_t lo, size_t hi, size_t than,
                       size_t *victim)
{
    size_t alo, ahi;
    if (!heaviest_addr(s, lo, hi, than, &alo, &ahi)) return false;
    size_t b = best(s, alo, ahi, ECXI_CONN_KEEP - 1);
    if (b == ahi) return false;
    *victim = s[b].id;
    return true;
}

int ecxi_conn_admit(ecxi_conn_slot *s, size_t n, const uint8_t key[16],
                    const ecxi_conn_caps *caps, size_t *victim)
{
    size_t ca = 0, cp = 0;
    for (size_t i = 0; i < n; i++) {
        ca += !memcmp(s[i].key, key, 16);
        cp += ecxi_conn_same_prefix(s[i].key, key) != 0;
    }
    bool full = n >= caps->total, pfull = cp >= caps->per_prefix, afull = ca >= caps->per_addr;
    if (!full && !pfull && !afull) return ECXI_CONN_ADMIT;
    qsort(s, n, sizeof *s, by_key);
    if (!afull) {
        if (full && !pfull) { /* the heaviest prefix, if heavier than ours, gives one up */
            size_t most = cp, plo = 0, phi = 0;
            for (size_t i = 0, j; i < n; i = j) {
                for (j = i + 1; j < n && ecxi_conn_same_prefix(s[j].key, s[i].key); j++) {}
                if (j - i > most) most = j - i, plo = i, phi = j;
            }
            if (most > cp && evict_from(s, plo, phi, 0, victim)) return ECXI_CONN_EVICT;
        }
        /* Our prefix is (one of) the heaviest: its heaviest address gives one up. */
        size_t plo = 0, phi = 0;
        while (plo < n && !ecxi_conn_same_prefix(s[plo].key, key)) plo++;
        for (phi = plo; phi < n && ecxi_conn_same_prefix(s[phi].key, key); phi++) {}
        if (evict_from(s, plo, phi, ca, victim)) return ECXI_CONN_EVICT;
    }
    /* Nobody holds more than we do: only one of our own idle connections goes. */
    size_t lo = 0, hi;
    while (lo < n && memcmp(s[lo].key, key, 16)) lo++;
    for (hi = lo; hi < n && !memcmp(s[hi].key, key, 16); hi++) {}
    size_t b = best(s, lo, hi, 0);
    if (b < hi) {
        *victim = s[b].id;
        return ECXI_CONN_EVICT;
    }
    return afull ? ECXI_CONN_REFUSE_ADDR : ECXI_CONN_REFUSE_SHARE;
}
