/* SPDX-License-Identifier: Apache-2.0 */
/* test_compat — the compatibility hash against the Python-made vectors, and
 * a property test of 10,000 random rows checked against /usr/bin/python3
 * (json.dumps + hashlib) in the same run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ecx.h"
#include "util.h"
#include "vectors.h"

static void test_vectors(void **state)
{
    (void)state;
    json_t *rows = load_vectors("compat_hash.json");
    assert_true(json_array_size(rows) >= 10);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r)
    {
        json_t *v = json_object_get(r, "vllm_version"), *m = json_object_get(r, "model"),
               *d = json_object_get(r, "dtype");
        char out[ECX_COMPAT_HASH_HEX + 1];
        int rc = ecx_compat_hash(json_string_value(v), json_string_length(v),
                                 json_string_value(m), json_string_length(m),
                                 json_string_value(d), json_string_length(d),
                                 json_integer_value(json_object_get(r, "block_size_bytes")), out);
        assert_int_equal(rc, 0);
        assert_string_equal(out, json_string_value(json_object_get(r, "sha256")));
    }
    json_decref(rows);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    char out[ECX_COMPAT_HASH_HEX + 1];
    const char *bad[] = {"\xed\xa0\x80", "\xc0\xaf", "\xe2\x82", "\xf4\x90\x80\x80", "\xff", "\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ecx_compat_hash("v", 1, bad[i], strlen(bad[i]), "d", 1, 1, out), ECX_EUTF8);
    assert_int_equal(ecx_compat_hash(NULL, 3, "m", 1, "d", 1, 1, out), ECX_EINVAL);
}

/* One random code point, weighted toward the characters JSON escapes. */
static uint32_t random_cp(void)
{
    switch (rand() % 8) {
    case 0: return (uint32_t)(rand() % 0x20);             /* C0 controls */
    case 1: { static const char s[] = "\"\\/\x7f '"; return (uint8_t)s[rand() % 6]; }
    case 2: return (uint32_t)(0x20 + rand() % 0x5f);      /* printable ASCII */
    case 3: return (uint32_t)(0x80 + rand() % 0x780);     /* 2-byte */
    case 4: {                                              /* 3-byte, no surrogates */
        uint32_t c;
        do c = (uint32_t)(0x800 + rand() % 0xf800); while (c >= 0xd800 && c <= 0xdfff);
        return c;
    }
    case 5: return (uint32_t)(0x10000 + rand() % 0x100000); /* all astral planes */
    case 6: { static const uint32_t s[] = {0x2028, 0x2029, 0xfeff, 0xfffe, 0xffff, 0x10ffff, 0x85, 0xa0};
              return s[rand() % 8]; }
    default: return (uint32_t)(0x1f600 + rand() % 0x50);  /* emoji */
    }
}

static size_t put_utf8(uint32_t c, char *o)
{
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xc0 | c >> 6), o[1] = (char)(0x80 | (c & 0x3f)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xe0 | c >> 12), o[1] = (char)(0x80 | ((c >> 6) & 0x3f)),
               o[2] = (char)(0x80 | (c & 0x3f)), 3;
    return o[0] = (char)(0xf0 | c >> 18), o[1] = (char)(0x80 | ((c >> 12) & 0x3f)),
           o[2] = (char)(0x80 | ((c >> 6) & 0x3f)), o[3] = (char)(0x80 | (c & 0x3f)), 4;
}

static size_t random_str(char *buf)
{
    size_t n = 0, cps = (size_t)(rand() % 24);
    for (size_t i = 0; i < cps; i++) n += put_utf8(random_cp(), buf + n);
    return n;
}

static int64_t random_int(void)
{
    int64_t big = (int64_t)(((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 2) ^ (uint64_t)rand());
    switch (rand() % 4) {
    case 0: return rand() % 100000;
    case 1: return big;
    case 2: return big == INT64_MIN ? big : -big;
    default: return rand() % 2 ? INT64_MAX : INT64_MIN;
    }
}

#define ROWS 10000

static const char PY[] =
    "import sys, json, hashlib\n"
    "for line in open(sys.argv[1]):\n"
    "    v, m, d, n = line.rstrip('\\n').split('\\t')\n"
    "    f = [bytes.fromhex(x).decode('utf-8') for x in (v, m, d)] + [int(n)]\n"
    "    print(hashlib.sha256(json.dumps(f, separators=(',', ':')).encode('utf-8')).hexdigest())\n";

static void test_property_against_python(void **state)
{
    (void)state;
    char in_path[] = "/tmp/ecx_compat_in_XXXXXX";
    int fd = mkstemp(in_path);
    assert_true(fd >= 0);
    FILE *in = fdopen(fd, "w");
    static char ours[ROWS][ECX_COMPAT_HASH_HEX + 1];
    srand(4242);
    for (int i = 0; i < ROWS; i++) {
        char s[3][24 * 4 + 1], hx[3][24 * 8 + 1];
        size_t n[3];
        for (int k = 0; k < 3; k++) {
            n[k] = random_str(s[k]);
            ecxi_hex_encode(s[k], n[k], hx[k]);
        }
        int64_t bs = random_int();
        assert_int_equal(ecx_compat_hash(s[0], n[0], s[1], n[1], s[2], n[2], bs, ours[i]), 0);
        fprintf(in, "%s\t%s\t%s\t%lld\n", hx[0], hx[1], hx[2], (long long)bs);
    }
    fclose(in);

    char py_path[] = "/tmp/ecx_compat_py_XXXXXX";
    fd = mkstemp(py_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, PY, strlen(PY)), (ssize_t)strlen(PY));
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s", py_path, in_path);
    FILE *py = popen(cmd, "r");
    assert_non_null(py);
    char line[128];
    int rows = 0, mismatches = 0;
    while (fgets(line, sizeof line, py) && rows < ROWS) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, ours[rows]) && mismatches++ < 5)
            print_error("row %d: python %s, ecx %s\n", rows, line, ours[rows]);
        rows++;
    }
    assert_int_equal(pclose(py), 0);
    unlink(in_path);
    unlink(py_path);
    assert_int_equal(rows, ROWS);
    assert_int_equal(mismatches, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_property_against_python),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
