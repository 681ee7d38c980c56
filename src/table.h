/*
 * table — an intrusive hash table keyed by byte strings, for the sessions'
 * own indexes (the producer's grants, the consumer's transfers and peers).
 *
 * Records embed an ecxi_table_node whose key points into the record itself,
 * so the table allocates only its bucket array, which doubles when the
 * table holds more nodes than buckets and is never shrunk: no allocation
 * per insert in steady state. Keys come from the network, so buckets are
 * chosen by SipHash (libsodium's crypto_shorthash) under a random key, and
 * a peer cannot aim collisions at one chain.
 */
#ifndef ECX_TABLE_H
#define ECX_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ecxi_table_node {
    struct ecxi_table_node *next;
    const char *key; /* points into the record; set before insert */
    size_t key_len;
} ecxi_table_node;

typedef struct ecxi_table {
    ecxi_table_node **buckets;
    size_t n_buckets; /* power of two */
    size_t count;
    unsigned char sipkey[16];
} ecxi_table;

/* 0, ECX_ENOMEM or ECX_ECRYPTO. */
int ecxi_table_init(ecxi_table *t);
void ecxi_table_fini(ecxi_table *t); /* frees the buckets, not the records */

ecxi_table_node *ecxi_table_find(const ecxi_table *t, const char *key, size_t len);
/* The key must not be in the table already. Never fails: if growing the
 * buckets fails, chains just get longer. */
void ecxi_table_insert(ecxi_table *t, ecxi_table_node *n);
void ecxi_table_remove(ecxi_table *t, ecxi_table_node *n);

/* The record that holds node n as member `field`. */
#define ECX_CONTAINER_OF(n, type, field) ((type *)((char *)(n)-offsetof(type, field)))

#endif
