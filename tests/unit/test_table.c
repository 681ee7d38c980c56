/* SPDX-License-Identifier: Apache-2.0 */
/* test_table — the sessions' keyed hash table: find / insert / remove
 * through growth, the hashed calls, and a chain driven past
 * ECXI_TABLE_CHAIN_MAX (keys picked with the table's own secret, as a
 * peer that had learnt it could) making the table draw a new secret. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "table.h"

typedef struct rec {
    ecxi_table_node node;
    char key[32];
} rec;

static rec *mkrec(const char *fmt, int i)
{
    rec *r = calloc(1, sizeof *r);
    assert_non_null(r);
    snprintf(r->key, sizeof r->key, fmt, i);
    r->node.key = r->key;
    r->node.key_len = strlen(r->key);
    return r;
}

static rec *find(const ecxi_table *t, const char *key)
{
    ecxi_table_node *n = ecxi_table_find(t, key, strlen(key));
    return n ? ECXI_CONTAINER_OF(n, rec, node) : NULL;
}

static void test_grow_and_remove(void **state)
{
    (void)state;
    enum { N = 5000 };
    ecxi_table t;
    assert_int_equal(ecxi_table_init(&t), 0);
    rec **r = calloc(N, sizeof *r);
    for (int i = 0; i < N; i++) {
        r[i] = mkrec("key-%d", i);
        if (i % 2)
            ecxi_table_insert(&t, &r[i]->node);
        else
            ecxi_table_insert_hashed(&t, &r[i]->node,
                                     ecxi_table_hash(&t, r[i]->key, r[i]->node.key_len));
    }
    assert_int_equal(t.count, N);
    assert_true(t.n_buckets >= N);
    for (int i = 0; i < N; i++) {
        assert_ptr_equal(find(&t, r[i]->key), r[i]);
        uint64_t h = ecxi_table_hash(&t, r[i]->key, r[i]->node.key_len);
        assert_ptr_equal(ecxi_table_find_hashed(&t, h, r[i]->key, r[i]->node.key_len),
                         &r[i]->node);
    }
    for (int i = 0; i < N; i += 3)
        ecxi_table_remove(&t, &r[i]->node);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(find(&t, r[i]->key), i % 3 ? r[i] : NULL);
    assert_null(find(&t, "key-"));
    assert_null(find(&t, "absent"));
    ecxi_table_fini(&t);
    for (int i = 0; i < N; i++)
        free(r[i]);
    free(r);
}

static void test_long_chain_rekeys(void **state)
{
    (void)state;
    ecxi_table t;
    assert_int_equal(ecxi_table_init(&t), 0);
    size_t mask = t.n_buckets - 1;
    rec *r[ECXI_TABLE_CHAIN_MAX + 1];
    int found = 0;
    /* Keys that all land in bucket 0 under the current secret. */
    for (int i = 0; found <= ECXI_TABLE_CHAIN_MAX; i++) {
        char k[32];
        snprintf(k, sizeof k, "flood-%d", i);
        if ((ecxi_table_hash(&t, k, strlen(k)) & mask) == 0) r[found++] = mkrec("flood-%d", i);
    }
    for (int i = 0; i < found; i++)
        ecxi_table_insert(&t, &r[i]->node);
    assert_int_equal(t.rekeys, 1);
    assert_int_equal(t.n_buckets, mask + 1); /* not grown: rehashed in place */
    size_t longest = 0;
    for (size_t b = 0; b < t.n_buckets; b++) {
        size_t len = 0;
        for (ecxi_table_node *n = t.buckets[b]; n; n = n->next)
            len++;
        if (len > longest) longest = len;
    }
    assert_true(longest < ECXI_TABLE_CHAIN_MAX);
    for (int i = 0; i < found; i++) {
        assert_ptr_equal(find(&t, r[i]->key), r[i]);
        assert_int_equal(r[i]->node.hash, ecxi_table_hash(&t, r[i]->key, r[i]->node.key_len));
    }
    for (int i = 0; i < found; i++) {
        ecxi_table_remove(&t, &r[i]->node);
        assert_null(find(&t, r[i]->key));
        free(r[i]);
    }
    assert_int_equal(t.count, 0);
    ecxi_table_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_and_remove),
        cmocka_unit_test(test_long_chain_rekeys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
