/* table — intrusive SipHash-keyed hash table; see table.h. */
#include "table.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "ecx.h"

static size_t bucket_of(const ecxi_table *t, const char *key, size_t len)
{
    unsigned char h[crypto_shorthash_BYTES];
    crypto_shorthash(h, (const unsigned char *)key, len, t->sipkey);
    uint64_t v;
    memcpy(&v, h, sizeof v);
    return (size_t)(v & (t->n_buckets - 1));
}

int ecxi_table_init(ecxi_table *t)
{
    if (sodium_init() < 0) return ECX_ECRYPTO;
    memset(t, 0, sizeof *t);
    t->n_buckets = 64;
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    if (!t->buckets) return ECX_ENOMEM;
    randombytes_buf(t->sipkey, sizeof t->sipkey);
    return 0;
}

void ecxi_table_fini(ecxi_table *t)
{
    free(t->buckets);
    t->buckets = NULL;
    t->n_buckets = t->count = 0;
}

ecxi_table_node *ecxi_table_find(const ecxi_table *t, const char *key, size_t len)
{
    for (ecxi_table_node *n = t->buckets[bucket_of(t, key, len)]; n; n = n->next)
        if (n->key_len == len && memcmp(n->key, key, len) == 0) return n;
    return NULL;
}

static void grow(ecxi_table *t)
{
    size_t n = t->n_buckets * 2;
    ecxi_table_node **nb = calloc(n, sizeof *nb);
    if (!nb) return;
    ecxi_table_node **old = t->buckets;
    size_t old_n = t->n_buckets;
    t->buckets = nb, t->n_buckets = n;
    for (size_t i = 0; i < old_n; i++)
        for (ecxi_table_node *e = old[i], *next; e; e = next) {
            next = e->next;
            size_t b = bucket_of(t, e->key, e->key_len);
            e->next = nb[b], nb[b] = e;
        }
    free(old);
}

void ecxi_table_insert(ecxi_table *t, ecxi_table_node *n)
{
    size_t b = bucket_of(t, n->key, n->key_len);
    n->next = t->buckets[b], t->buckets[b] = n;
    if (++t->count > t->n_buckets) grow(t);
}

void ecxi_table_remove(ecxi_table *t, ecxi_table_node *n)
{
    ecxi_table_node **pp = &t->buckets[bucket_of(t, n->key, n->key_len)];
    while (*pp && *pp != n)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = n->next;
        t->count--;
    }
}
