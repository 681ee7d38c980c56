/*
 * ecx.h — the one public header of ecx, peer-to-peer encoder-cache transfer
 * for disaggregated multimodal LLM serving.
 *
 * Conventions (as in libuv / nng): every function returns 0 or a negative
 * ECX_E* code, and ecx_strerror() names the code. Handles are opaque.
 * Bad input from the network or the user is an error code, never an abort.
 *
 * What is here so far: error codes and the compatibility hash. The wire
 * codec lives in src/wire.h (internal); sessions and the engine-facing
 * context arrive with later work.
 */
#ifndef ECX_H
#define ECX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version spoken on the wire (SPEC §7). */
#define ECX_CONNECTOR_VERSION 1

/* Error codes. Keep ecx_strerror() (src/error.c) in step with this list. */
enum ecx_error {
    ECX_OK = 0,
    ECX_EINVAL = -1,        /* invalid argument */
    ECX_ENOMEM = -2,        /* out of memory */
    ECX_ERANGE = -3,        /* value out of range */
    ECX_EUTF8 = -4,         /* string is not valid UTF-8 */
    ECX_ECRYPTO = -5,       /* crypto library failure */
    ECX_ESYS = -6,          /* system call failed (see errno / log) */

    /* Wire decoding: why a frame was refused. */
    ECX_EWIRE_EMPTY = -20,     /* empty frame */
    ECX_EWIRE_TRUNCATED = -21, /* frame ends inside a value */
    ECX_EWIRE_TRAILING = -22,  /* bytes follow the top-level map */
    ECX_EWIRE_NOT_MAP = -23,   /* top level is not a map */
    ECX_EWIRE_TYPE = -24,      /* a field has the wrong msgpack type */
    ECX_EWIRE_UTF8 = -25,      /* a str field is not valid UTF-8 */
    ECX_EWIRE_MISSING = -26,   /* a required field is absent */
    ECX_EWIRE_TAG = -27,       /* "type" tag names another message */
    ECX_EWIRE_STATUS = -28,    /* status not one of 0..5 */
    ECX_EWIRE_INT = -29,       /* int outside the range ecx accepts */
    ECX_EWIRE_INVALID = -30,   /* byte that is not msgpack (0xc1) */
    ECX_EWIRE_TOO_LARGE = -31, /* frame or field larger than allowed */

    /* -40..-59: region and cache (src/region.c, src/cache.c). */

    /* -60..-79: data plane (src/data*.c). */
};

/* Name of an error code ("ECX_EWIRE_TYPE: field has wrong type"). Never NULL. */
const char *ecx_strerror(int err);

/* Status carried by an XferAck (SPEC §3). */
enum ecx_status {
    ECX_STATUS_OK = 0,
    ECX_STATUS_NACK_MISSING = 1,
    ECX_STATUS_NACK_INCOMPAT = 2,
    ECX_STATUS_NACK_VERSION = 3,
    ECX_STATUS_NACK_INTERNAL = 4,
    ECX_STATUS_NACK_NOT_READY = 5,
};
#define ECX_STATUS_MAX ECX_STATUS_NACK_NOT_READY

/* "OK", "NACK_MISSING", ...; "UNKNOWN" for anything else. */
const char *ecx_status_name(int status);

/* Length of a compatibility hash in hex characters (SHA-256), without NUL. */
#define ECX_COMPAT_HASH_HEX 64

/*
 * Peer-compatibility fingerprint, equal to the Python reference's
 * compute_ec_compatibility_hash(): lowercase hex SHA-256 of
 * json.dumps([vllm_version, model, dtype, block_size_bytes],
 * separators=(",", ":")). The strings must be valid UTF-8 (ECX_EUTF8
 * otherwise) and may contain NUL bytes, hence the explicit lengths.
 * out receives ECX_COMPAT_HASH_HEX characters and a terminating NUL.
 */
int ecx_compat_hash(const char *vllm_version, size_t vllm_version_len, const char *model,
                    size_t model_len, const char *dtype, size_t dtype_len,
                    int64_t block_size_bytes, char out[ECX_COMPAT_HASH_HEX + 1]);

#ifdef __cplusplus
}
#endif
#endif /* ECX_H */
