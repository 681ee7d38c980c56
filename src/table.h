/* SPDX-License-Identifier: Apache-2.0 */
/*
 * table — an intrusive hash table keyed by byte strings, for the sessions'
 * own indexes (the producer's grants and connections, the consumer's
 * transfers and peers, the context's open saves).
 *
 * Records embed an ecxi_table_node whose key points into the record itself,
 * so the table allocates only its bucket array, which doubles when the
 * table holds more nodes than buckets and is never shrunk: no allocation
 * per insert in steady state. A node keeps its key's hash, so removing it,
 * growing and a lookup's compares never hash again.
 *
 * Keys come from the network, so a peer must not be able to aim many keys
 * at one chain (hash flooding). The hash is XXH3-64 under a secret of
 * XXH3_SECRET_SIZE_MIN+ random bytes drawn per table (libsodium's
 * randombytes), not SipHash: XXH3 is not a PRF, but with a random secret
 * its output for a chosen key is not predictable from outside (the secret
 * is never revealed: bucket order is never sent anywhere, and the only
 * signal is timing), and it costs a tenth of SipHash-2-4 for the 40-110
 * byte keys hashed per request. Defence in depth: a chain that grows past
 * ECXI_TABLE_CHAIN_MAX on insert makes the table draw a new secret and
 * rehash every node (at most once per `count` inserts, so O(1) amortised),
 * which undoes whatever a peer may have learnt about the old secret. A
 * lookup therefore costs at most ECXI_TABLE_CHAIN_MAX compares of nodes
 * whose 64-bit hash matches, unless collisions survive a fresh secret.
 */
#ifndef ECXI_TABLE_H
#define ECXI_TABLE_H

#include <stddef.h>
#include <stdint.h>

/* Random secret bytes per table (>= XXH3_SECRET_SIZE_MIN, 136). */
#define ECXI_TABLE_SECRET_BYTES 192
/* A longer chain on insert triggers a new secret (see above). */
#define ECXI_TABLE_CHAIN_MAX 12

typedef struct ecxi_table_node {
    struct ecxi_table_node *next;
    const char *key; /* points into the record; set before insert */
    size_t key_len;
    uint64_t hash; /* set by insert */
} ecxi_table_node;

typedef struct ecxi_table {
    ecxi_table_node **buckets;
    size_t n_buckets; /* power of two */
    size_t count;
    size_t since_rekey; /* inserts since the secret was last drawn */
    uint64_t rekeys;
    unsigned char secret[ECXI_TABLE_SECRET_BYTES];
} ecxi_table;

/* 0, ECX_ENOMEM or ECX_ECRYPTO. */
int ecxi_table_init(ecxi_table *t);
void ecxi_table_fini(ecxi_table *t); /* frees the buckets, not the records */

/* The key's hash under this table's secret, for the *_hashed calls: a
 * caller that looks a key up and may then insert it hashes it once. Valid
 * until the next insert (which may draw a new secret). */
uint64_t ecxi_table_hash(const ecxi_table *t, const char *key, size_t len);

ecxi_table_node *ecxi_table_find(const ecxi_table *t, const char *key, size_t len);
ecxi_table_node *ecxi_table_find_hashed(const ecxi_table *t, uint64_t h, const char *key,
                                        size_t len);
/* The key must not be in the table already. Never fails: if growing the
 * buckets fails, chains just get longer. */
void ecxi_table_insert(ecxi_table *t, ecxi_table_node *n);
/* The same with h = ecxi_table_hash(t, n->key, n->key_len). */
void ecxi_table_insert_hashed(ecxi_table *t, ecxi_table_node *n, uint64_t h);
void ecxi_table_remove(ecxi_table *t, ecxi_table_node *n);

/* The record that holds node n as member `field`. */
#define ECXI_CONTAINER_OF(n, type, field) ((type *)((char *)(n)-offsetof(type, field)))

#endif
