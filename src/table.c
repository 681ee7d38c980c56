/* SPDX-License-Identifier: Apache-2.0 */
/* table — intrusive hash table under a keyed XXH3; see table.h. */
#include "table.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>
/* Inlined (all static), so the hash of a short key is a few dozen
 * instructions with no call through the PLT. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ecx.h"

_Static_assert(ECXI_TABLE_SECRET_BYTES >= XXH3_SECRET_SIZE_MIN, "XXH3 needs a longer secret");

uint64_t ecxi_table_hash(const ecxi_table *t, const char *key, size_t len)
{
    return XXH3_64bits_withSecret(key, len, t->secret, sizeof t->secret);
}

static size_t bucket_of(const ecxi_table *t, uint64_t h)
{
    return (size_t)(h & (t->n_buckets - 1));
}

int ecxi_table_init(ecxi_table *t)
{
    if (sodium_init() < 0) return ECX_ECRYPTO;
    memset(t, 0, sizeof *t);
    t->n_buckets = 64;
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    if (!t->buckets) return ECX_ENOMEM;
    randombytes_buf(t->secret, sizeof t->secret);
    return 0;
}

void ecxi_table_fini(ecxi_table *t)
{
    free(t->buckets);
    t->buckets = NULL;
    t->n_buckets = t->count = 0;
}

ecxi_table_node *ecxi_table_find_hashed(const ecxi_table *t, uint64_t h, const char *key,
                                        size_t len)
{
    for (ecxi_table_node *n = t->buckets[bucket_of(t, h)]; n; n = n->next)
        if (n->hash == h && n->key_len == len && memcmp(n->key, key, len) == 0) return n;
    return NULL;
}

ecxi_table_node *ecxi_table_find(const ecxi_table *t, const char *key, size_t len)
{
    return ecxi_table_find_hashed(t, ecxi_table_hash(t, key, len), key, len);
}

/* Move every node into a bucket array of n, under secret (NULL: the
 * current one, whose hashes the nodes keep); if the array cannot be
 * allocated, nothing changes. */
static void rebuild(ecxi_table *t, size_t n, const unsigned char *secret)
{
    ecxi_table_node **nb = calloc(n, sizeof *nb);
    if (!nb) return;
    ecxi_table_node **old = t->buckets;
    size_t old_n = t->n_buckets;
    t->buckets = nb, t->n_buckets = n;
    if (secret) memcpy(t->secret, secret, sizeof t->secret);
    for (size_t i = 0; i < old_n; i++)
        for (ecxi_table_node *e = old[i], *next; e; e = next) {
            next = e->next;
            if (secret) e->hash = ecxi_table_hash(t, e->key, e->key_len);
            size_t b = bucket_of(t, e->hash);
            e->next = nb[b], nb[b] = e;
        }
    free(old);
}

void ecxi_table_insert_hashed(ecxi_table *t, ecxi_table_node *n, uint64_t h)
{
    size_t b = bucket_of(t, h), chain = 0;
    for (ecxi_table_node *e = t->buckets[b]; e; e = e->next)
        chain++;
    n->hash = h;
    n->next = t->buckets[b], t->buckets[b] = n;
    t->since_rekey++;
    if (++t->count > t->n_buckets) {
        rebuild(t, t->n_buckets * 2, NULL);
    } else if (chain >= ECXI_TABLE_CHAIN_MAX && t->since_rekey >= t->count) {
        /* A chain this long is no accident at load <= 1: new secret. */
        unsigned char secret[sizeof t->secret];
        randombytes_buf(secret, sizeof secret);
        t->since_rekey = 0;
        t->rekeys++;
        rebuild(t, t->n_buckets, secret);
        sodium_memzero(secret, sizeof secret);
    }
}

void ecxi_table_insert(ecxi_table *t, ecxi_table_node *n)
{
    ecxi_table_insert_hashed(t, n, ecxi_table_hash(t, n->key, n->key_len));
}

void ecxi_table_remove(ecxi_table *t, ecxi_table_node *n)
{
    ecxi_table_node **pp = &t->buckets[bucket_of(t, n->hash)];
    while (*pp && *pp != n)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = n->next;
        t->count--;
    }
}
