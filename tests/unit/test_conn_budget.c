/* SPDX-License-Identifier: Apache-2.0 */
/* test_conn_budget — the shared connection admission policy (conn_budget.h):
 * keys and prefixes, admission below the caps, eviction from the heaviest
 * prefix and address, own-idle replacement, refusal, and tiers. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "conn_budget.h"

static void key4(const char *a, uint8_t k[16])
{
    struct sockaddr_in s = {.sin_family = AF_INET};
    assert_int_equal(inet_pton(AF_INET, a, &s.sin_addr), 1);
    ecxi_conn_key((struct sockaddr *)&s, k);
}

static void key6(const char *a, uint8_t k[16])
{
    struct sockaddr_in6 s = {.sin6_family = AF_INET6};
    assert_int_equal(inet_pton(AF_INET6, a, &s.sin6_addr), 1);
    ecxi_conn_key((struct sockaddr *)&s, k);
}

static size_t add(ecxi_conn_slot *s, size_t n, const char *a, int tier, int64_t since)
{
    key4(a, s[n].key);
    s[n].tier = tier;
    s[n].since = since;
    s[n].id = n;
    return n + 1;
}

static void test_keys(void **state)
{
    (void)state;
    uint8_t a[16], b[16], c[16], m[16];
    key4("10.1.2.3", a);
    key4("10.1.2.200", b);
    key4("10.1.3.3", c);
    key6("::ffff:10.1.2.9", m);
    assert_true(ecxi_conn_same_prefix(a, b));
    assert_false(ecxi_conn_same_prefix(a, c));
    assert_true(ecxi_conn_same_prefix(a, m)); /* v4-mapped counts as IPv4 */
    key6("2001:db8:1:2::1", a);
    key6("2001:db8:1:2:ffff::7", b);
    key6("2001:db8:1:3::1", c);
    assert_true(ecxi_conn_same_prefix(a, b));
    assert_false(ecxi_conn_same_prefix(a, c));
    assert_false(ecxi_conn_same_prefix(a, m));
}

static void test_policy(void **state)
{
    (void)state;
    ecxi_conn_slot s[16];
    ecxi_conn_caps caps = {8, 6, 3};
    uint8_t k[16];
    size_t v = 99, n = 0;
    n = add(s, n, "10.0.0.1", 1, 5);
    key4("10.0.0.1", k);
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_ADMIT);
    /* The address cap: only an idle one of its own goes, else refused. */
    n = add(s, n, "10.0.0.1", 1, 3);
    n = add(s, n, "10.0.0.1", 2, 1);
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_REFUSE_ADDR);
    s[0].tier = 0;
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_EVICT);
    assert_int_equal(v, 0);
    /* The prefix cap (6 in 10.0.0/24): the heaviest address loses its most
     * evictable (lowest tier, then smallest since) to a lighter newcomer. */
    n = 0;
    n = add(s, n, "10.0.0.1", 1, 9);
    n = add(s, n, "10.0.0.1", 2, 1);
    n = add(s, n, "10.0.0.1", 1, 4);
    n = add(s, n, "10.0.0.2", 0, 1);
    n = add(s, n, "10.0.0.2", 0, 2);
    n = add(s, n, "10.0.0.3", 0, 0);
    key4("10.0.0.4", k);
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_EVICT);
    assert_int_equal(s[0].id, 0); /* reordered, but ids stay */
    assert_true(v == 2);          /* 10.0.0.1's tier-1, since 4 */
    /* A newcomer as heavy as the heaviest, none of its own idle: refused. */
    n = 0;
    n = add(s, n, "10.0.0.1", 1, 1);
    n = add(s, n, "10.0.0.1", 1, 1);
    n = add(s, n, "10.0.0.2", 1, 1);
    n = add(s, n, "10.0.0.2", 1, 1);
    n = add(s, n, "10.0.0.3", 1, 1);
    n = add(s, n, "10.0.0.3", 1, 1);
    key4("10.0.0.3", k);
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_REFUSE_SHARE);
    /* The total cap: the heaviest prefix gives one up to another prefix. */
    n = 0;
    for (int i = 0; i < 5; i++)
        n = add(s, n, "10.0.1.7", 0, 10 + i);
    n = add(s, n, "10.0.2.7", 0, 0);
    n = add(s, n, "10.0.3.7", 0, 0);
    n = add(s, n, "10.0.4.7", 0, 0);
    key4("10.0.9.9", k);
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_EVICT);
    assert_int_equal(v, 0); /* 10.0.1.7's oldest idle, not the lighter ones' older */
    /* Never evicted: ECXI_CONN_KEEP. */
    for (size_t i = 0; i < n; i++)
        s[i].tier = ECXI_CONN_KEEP;
    assert_int_equal(ecxi_conn_admit(s, n, k, &caps, &v), ECXI_CONN_REFUSE_SHARE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
