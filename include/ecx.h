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
    ECX_EREGION_SIZE = -40,     /* region size zero, overflowing, or not whole blocks */
    ECX_EREGION_EXISTS = -41,   /* a region file of that name already exists */
    ECX_EREGION_NOTFOUND = -42, /* no region file of that name */
    ECX_EREGION_NOSPC = -43,    /* shared memory too small to back the region */
    ECX_EREGION_BADFILE = -44,  /* symlink, not a regular file, or not ours */
    ECX_EREGION_BUSY = -45,     /* region file is being reclaimed */
    ECX_ECACHE_FULL = -50,      /* not enough free + evictable blocks */
    ECX_ECACHE_EXISTS = -51,    /* key already has an entry */
    ECX_ECACHE_MISSING = -52,   /* no entry for that key */
    ECX_ECACHE_NOT_READY = -53, /* entry is not ready */
    ECX_ECACHE_STATE = -54,     /* operation not allowed in the entry's state */

    /* -60..-79: data plane (src/data*.c). */
    ECX_EDATA_META = -60,     /* agent_metadata malformed */
    ECX_EDATA_DESC = -61,     /* mem_descriptor malformed */
    ECX_EDATA_VERSION = -62,  /* metadata / descriptor of an unknown format version */
    ECX_EDATA_MISMATCH = -63, /* descriptor of another producer, or block sizes differ */
    ECX_EDATA_INDEX = -64,    /* block index beyond the region */
    ECX_EDATA_COUNT = -65,    /* no blocks, or remote and local counts differ */
    ECX_EDATA_NOPATH = -66,   /* no enabled data path reaches the peer */
    ECX_EDATA_UCX = -67,      /* UCX call failed */
    ECX_EDATA_PEER = -68,     /* peer unreachable or its registration is broken */
    ECX_EDATA_FAULT = -69,    /* failure injected by the fault backend (tests) */
    ECX_EDATA_ROLE = -70,     /* call not valid for a producer / consumer context */
    ECX_EDATA_NOTIF = -71,    /* notification empty or too long */
    ECX_EDATA_GRANT = -72,    /* no live grant with that key and token */
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

/* What a consumer's fetch of one item comes to (SPEC §5). */
enum ecx_fetch_state {
    ECX_FETCH_READY = 0,   /* the bytes are in the local region: load them */
    ECX_FETCH_PENDING = 1, /* in flight: ask again on a later step */
    ECX_FETCH_LOCAL = 2,   /* encode locally; the reason says why */
};

/* Why an item is to be encoded locally. */
enum ecx_reason {
    ECX_REASON_NONE = 0,
    ECX_REASON_NO_PEER,           /* no announcement, or no peer_host in it */
    ECX_REASON_SIZE_MISMATCH,     /* announced size differs from the expected one */
    ECX_REASON_INVALID,           /* unusable mm_hash, size or announcement */
    ECX_REASON_NO_ROOM,           /* no room in the local region */
    ECX_REASON_NACK_MISSING,      /* the producer does not hold it */
    ECX_REASON_NACK_INCOMPAT,     /* compatibility hashes differ */
    ECX_REASON_NACK_VERSION,      /* connector versions differ */
    ECX_REASON_NACK_INTERNAL,     /* producer error */
    ECX_REASON_NOT_READY_TIMEOUT, /* still NOT_READY after the per-item wait */
    ECX_REASON_ACK_TIMEOUT,       /* no ack within the ack timeout */
    ECX_REASON_BAD_ACK,           /* ack unusable: counts, indices or metadata wrong */
    ECX_REASON_READ_FAILED,       /* the data-plane READ failed */
    ECX_REASON_QUARANTINED,       /* the READ overran its deadline */
    ECX_REASON_SEND_FAILED,       /* the request could not be sent */
    ECX_REASON_CORRUPT,           /* the bytes read do not match the producer's checksum */
    ECX_REASON_LEASE_EXPIRED,     /* the READ ended after the producer's pin lease could have */
    ECX_REASON_COUNT
};

/* "NACK_MISSING", "ACK_TIMEOUT", ...; "UNKNOWN" for anything else. */
const char *ecx_reason_name(int reason);

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

/* ======================================================================
 * The engine-facing context (src/connector.c)
 *
 * One context per engine, with a role: producer (serves its encodings),
 * consumer (fetches them), or both sharing one cache. Nothing runs in the
 * background: the engine calls ecx_poll() from its step loop, and every
 * timeout, ack and READ advances there.
 * ====================================================================== */

typedef struct ecx_ctx ecx_ctx;

enum ecx_role { ECX_ROLE_PRODUCER = 1, ECX_ROLE_CONSUMER = 2, ECX_ROLE_BOTH = 3 };

/* Defaults (SPEC §7), used by ecx_config_init(). */
#define ECX_DEFAULT_LISTEN "127.0.0.1:5601"
#define ECX_DEFAULT_REGION_BYTES (1ull << 30)
#define ECX_DEFAULT_BLOCK_BYTES (1ull << 20)
#define ECX_DEFAULT_VLLM_VERSION "0.11.0"
#define ECX_DEFAULT_MODEL "llava-hf/llava-1.5-7b-hf"
#define ECX_DEFAULT_DTYPE "bfloat16"

typedef struct ecx_config {
    int role;                  /* enum ecx_role */
    const char *listen;        /* producer: "HOST:PORT" to bind (port 0: any free one) */
    const char *advertise_host; /* producer: peer_host announced; NULL: the listen host,
                                   or 127.0.0.1 when that is a wildcard */
    uint64_t region_bytes;     /* rounded down to whole blocks */
    uint64_t block_bytes;
    const char *vllm_version;  /* compatibility factors: peers must agree */
    const char *model;
    const char *dtype;
    const char *data;          /* data path: "auto" (shm + tcp), "shm", "tcp" or "ucx" */
    const char *instance;      /* region instance name; NULL: unique per process start */
    int rank;
    int64_t ack_timeout_ms;    /* consumer: 2000 */
    int64_t read_timeout_ms;   /* consumer: 20000 */
    int64_t quarantine_ms;     /* consumer: 60000 */
    int64_t item_wait_ms;      /* consumer: overall NOT_READY wait, 60000 */
    int64_t lease_ms;          /* producer: pin lease, 30000 */
    uint32_t max_conn_grants;  /* producer: active grants per consumer connection, 1024 */
    uint32_t max_conn_pin_pct; /* producer: % of the region one connection's pins may
                                  cover, 50 (1..100; see src/producer.h) */

    /* Authenticated, encrypted control plane (ZeroMQ CURVE), opt-in; all
     * NULL: plaintext, as the Python reference speaks. Keys are Z85 text
     * (40 characters, as zmq_curve_keypair makes). Copied by ecx_new. */
    const char *curve_secret_key;   /* producer: its secret key, which turns CURVE on for the
                                       listener; consumer: its own secret key (NULL: a fresh
                                       keypair per connection) */
    const char *curve_server_key;   /* consumer: the producers' public key, which turns CURVE
                                       on for every connection (one key for the whole fleet) */
    const char *const *curve_allow; /* producer: client public keys let in; n_curve_allow 0:
                                       any client that knows the producer's public key */
    size_t n_curve_allow;
} ecx_config;

void ecx_config_init(ecx_config *cfg);

/* Create a context: region, cache, data plane, and the role's sessions.
 * A producer is listening when this returns. */
int ecx_new(const ecx_config *cfg, ecx_ctx **out);
/* Release every grant and reservation, close every socket, remove the
 * region file. NULL is a no-op. */
void ecx_free(ecx_ctx *ctx);

/* Advance everything; wait up to timeout_ms (0: don't wait, -1: until
 * something happens) if nothing was ready. Returns events handled, or a
 * negative error. */
int ecx_poll(ecx_ctx *ctx, int timeout_ms);

/* The producer's bound port (useful with port 0). */
int ecx_listen_port(const ecx_ctx *ctx);

/* A place to write or read an encoding's bytes: one run of blocks. */
typedef struct ecx_segment {
    uint8_t *ptr;
    size_t len;
} ecx_segment;

/* Producer: reserve room for mm_hash's size_bytes (the entry starts not
 * ready) and get where to write it, as *n_segs segments in order (at most
 * cap; ECX_ERANGE if cap is too small, with *n_segs saying how many are
 * needed and nothing reserved). ECX_ECACHE_FULL if there is no room even
 * after evicting, ECX_ECACHE_EXISTS if it is already held. */
int ecx_save_begin(ecx_ctx *ctx, const char *mm_hash, uint64_t size_bytes, ecx_segment *segs,
                   size_t cap, size_t *n_segs);
/* The bytes are written: the entry becomes ready (and servable). */
int ecx_save_commit(ecx_ctx *ctx, const char *mm_hash);
/* Give up a save that was begun (not yet committed). */
int ecx_save_abort(ecx_ctx *ctx, const char *mm_hash);
/* begin + copy + commit in one call. */
int ecx_save(ecx_ctx *ctx, const char *mm_hash, const void *bytes, uint64_t size_bytes);

/* Producer: the announcement of mm_hash for the orchestrator, as JSON:
 * {"peer_host":..,"peer_port":..,"size_bytes":..,"metadata":{}} if held
 * (ready or not), else {"metadata":{}}. Returns the length written (NUL
 * excluded), or ECX_ERANGE if cap is too small. */
int ecx_announce(ecx_ctx *ctx, const char *mm_hash, char *buf, size_t cap);

/* Consumer: ask for mm_hash given its announcement (JSON text as above, or
 * NULL). expected_size is what the engine expects (0: accept the
 * announced size). Returns enum ecx_fetch_state; for ECX_FETCH_LOCAL,
 * *reason (enum ecx_reason) says why. Call again on a later step while it
 * is pending. */
int ecx_fetch(ecx_ctx *ctx, const char *mm_hash, const char *announcement,
              uint64_t expected_size, int *reason);

/* Consumer: pin a ready item and get its bytes as segments (as in
 * ecx_save_begin) and its size. The bytes stay put until ecx_release(). */
int ecx_load(ecx_ctx *ctx, const char *mm_hash, ecx_segment *segs, size_t cap, size_t *n_segs,
             uint64_t *size_bytes);
int ecx_release(ecx_ctx *ctx, const char *mm_hash);
/* load + copy into dst (cap bytes) + release; returns the size. */
int64_t ecx_read(ecx_ctx *ctx, const char *mm_hash, void *dst, uint64_t cap);

/* Metrics of this context in Prometheus text format. Returns the length
 * written (NUL excluded), or ECX_ERANGE if cap is too small. */
int ecx_metrics(ecx_ctx *ctx, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* ECX_H */
