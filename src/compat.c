/* SPDX-License-Identifier: Apache-2.0 */
/*
 * compat — the peer-compatibility hash (docs/PROTOCOL.md §3): SHA-256 over Python's
 * json.dumps([vllm_version, model, dtype, block_size_bytes],
 * separators=(",", ":")) with ensure_ascii=True.
 *
 * The JSON text is streamed straight into libsodium's SHA-256, so nothing is
 * allocated whatever the input size. The escaping is written here because no
 * C JSON library promises Python's exact output: every character outside
 * space..'~' is escaped, the six short escapes \" \\ \n \r \t \b \f are used
 * where Python uses them, others become \u00XX / \uXXXX in lowercase hex,
 * with a UTF-16 surrogate pair above U+FFFF.
 *
 * Also the factors' spellings: the dtype table (every spelling ecx accepts,
 * mapped to str(torch.dtype), which is what vLLM hashes, with its element
 * size) and the protocol version a vLLM version speaks.
 */
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>

#include <stdlib.h>
#include <string.h>

#include "ecx.h"
#include "util.h"

/* Small staging buffer in front of the hash, so it is fed in chunks. */
typedef struct sink {
    crypto_hash_sha256_state st;
    unsigned char buf[256];
    size_t n;
} sink;

static void put(sink *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s->n == sizeof s->buf) {
            crypto_hash_sha256_update(&s->st, s->buf, s->n);
            s->n = 0;
        }
        s->buf[s->n++] = (unsigned char)p[i];
    }
}

static void put_u16_escape(sink *s, uint32_t u)
{
    static const char digits[] = "0123456789abcdef";
    char e[6] = {'\\', 'u', digits[u >> 12 & 15], digits[u >> 8 & 15], digits[u >> 4 & 15],
                 digits[u & 15]};
    put(s, e, 6);
}

static int put_json_string(sink *s, const char *str, size_t len)
{
    const uint8_t *p = (const uint8_t *)str;
    put(s, "\"", 1);
    while (len) {
        uint32_t cp;
        size_t k = ecxi_utf8_next(p, len, &cp);
        if (k == 0) return ECX_EUTF8;
        p += k, len -= k;
        switch (cp) {
        case '"': put(s, "\\\"", 2); continue;
        case '\\': put(s, "\\\\", 2); continue;
        case '\n': put(s, "\\n", 2); continue;
        case '\r': put(s, "\\r", 2); continue;
        case '\t': put(s, "\\t", 2); continue;
        case '\b': put(s, "\\b", 2); continue;
        case '\f': put(s, "\\f", 2); continue;
        }
        if (cp >= 0x20 && cp <= 0x7e) {
            char c = (char)cp;
            put(s, &c, 1);
        } else if (cp < 0x10000) {
            put_u16_escape(s, cp);
        } else {
            cp -= 0x10000;
            put_u16_escape(s, 0xd800 | (cp >> 10));
            put_u16_escape(s, 0xdc00 | (cp & 0x3ff));
        }
    }
    put(s, "\"", 1);
    return 0;
}

int ecx_compat_hash(const char *vllm_version, size_t vllm_version_len, const char *model,
                    size_t model_len, const char *dtype, size_t dtype_len,
                    int64_t block_size_bytes, char out[ECX_COMPAT_HASH_HEX + 1])
{
    if (!out || (!vllm_version && vllm_version_len) || (!model && model_len) ||
        (!dtype && dtype_len))
        return ECX_EINVAL;
    if (sodium_init() < 0) return ECX_ECRYPTO;
    sink s = {.n = 0};
    crypto_hash_sha256_init(&s.st);
    int rc;
    put(&s, "[", 1);
    if ((rc = put_json_string(&s, vllm_version, vllm_version_len))) return rc;
    put(&s, ",", 1);
    if ((rc = put_json_string(&s, model, model_len))) return rc;
    put(&s, ",", 1);
    if ((rc = put_json_string(&s, dtype, dtype_len))) return rc;
    char num[32];
    int k = snprintf(num, sizeof num, ",%" PRId64 "]", block_size_bytes);
    put(&s, num, (size_t)k);
    unsigned char digest[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_update(&s.st, s.buf, s.n);
    crypto_hash_sha256_final(&s.st, digest);
    ecxi_hex_encode(digest, sizeof digest, out);
    return 0;
}

/* str(torch.dtype) for each dtype, its element size, and the other names
 * torch and vLLM's --dtype give it (each also with "torch." in front). */
static const struct {
    const char *name;
    int size;
    const char *aliases[3];
} dtypes[] = {
    {"torch.float64", 8, {"float64", "double"}},
    {"torch.float32", 4, {"float32", "float", "fp32"}},
    {"torch.float16", 2, {"float16", "half", "fp16"}},
    {"torch.bfloat16", 2, {"bfloat16", "bf16"}},
    {"torch.float8_e4m3fn", 1, {"float8_e4m3fn"}},
    {"torch.float8_e5m2", 1, {"float8_e5m2"}},
    {"torch.int64", 8, {"int64", "long"}},
    {"torch.int32", 4, {"int32", "int"}},
    {"torch.int16", 2, {"int16", "short"}},
    {"torch.int8", 1, {"int8"}},
    {"torch.uint8", 1, {"uint8"}},
};
#define N_DTYPES (sizeof dtypes / sizeof *dtypes)

static int dtype_index(const char *d)
{
    if (!d) return -1;
    const char *bare = strncmp(d, "torch.", 6) ? d : d + 6;
    for (size_t i = 0; i < N_DTYPES; i++) {
        if (!strcmp(d, dtypes[i].name)) return (int)i;
        for (size_t a = 0; a < 3 && dtypes[i].aliases[a]; a++)
            if (!strcmp(bare, dtypes[i].aliases[a])) return (int)i;
    }
    return -1;
}

const char *ecx_dtype_name(const char *dtype)
{
    int i = dtype_index(dtype);
    return i < 0 ? NULL : dtypes[i].name;
}

int ecx_dtype_size(const char *dtype)
{
    int i = dtype_index(dtype);
    return i < 0 ? 0 : dtypes[i].size;
}

const char *ecx_dtype_names(void)
{
    return "torch.float64 (float64, double), torch.float32 (float32, float, fp32), "
           "torch.float16 (float16, half, fp16), torch.bfloat16 (bfloat16, bf16), "
           "torch.float8_e4m3fn, torch.float8_e5m2, torch.int64 (long), torch.int32 (int), "
           "torch.int16 (short), torch.int8, torch.uint8";
}

int ecx_protocol_version_of(const char *v)
{
    /* "0.32.0", "0.34.1rc2", "0.35.0.dev3+g1234": MAJOR.MINOR decide. vLLM's
     * ECCPUConnector speaks 1 in 0.30 and 0.31, 2 from 0.32 on (PROTOCOL.md §3.7). */
    if (!v || *v < '0' || *v > '9') return 1;
    char *end;
    long major = strtol(v, &end, 10);
    if (*end != '.' || end[1] < '0' || end[1] > '9') return 1;
    long minor = strtol(end + 1, NULL, 10);
    return major > 0 || minor >= 32 ? 2 : 1;
}
