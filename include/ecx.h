/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx.h — the one public header of libecx: peer-to-peer encoder-cache
 * transfer for disaggregated multimodal LLM serving.
 *
 * An encoder (the producer) keeps vision-encoder outputs in a shared-memory
 * block region; a prefill/decode engine (the consumer) asks for one by its
 * mm_hash and reads its blocks over the data plane, or is told to encode
 * locally. docs/PROTOCOL.md describes the protocol; docs/API.md walks
 * through this header with examples.
 *
 * Conventions (as in libuv and nng):
 *   - Every int-returning call returns 0 (or a count / state) on success
 *     and a negative ECX_E* code on failure; ecx_errname() and
 *     ecx_strerror() name the code. Bad input from the network or from the
 *     caller is an error code, never an abort.
 *   - Handles are opaque. Only what this header declares is exported.
 *   - Strings are NUL-terminated UTF-8 unless a length is given.
 *   - Memory the library hands out (segment lists, strings) is owned by the
 *     library and stays valid for as long as each call's comment says.
 *
 * Threading (the rule for every call on a context):
 *   - Every call on an ecx_ctx may be made from any thread. Calls on one
 *     context are serialised by the context's lock, held only for
 *     bookkeeping: ecx_poll() with a timeout waits *without* holding it, so
 *     other threads may fetch, load or save while one thread waits in
 *     ecx_poll(), and work proportional to an item (ecx_save()'s copy, a
 *     commit's checksum) runs outside it. The calls an engine makes every
 *     step or item never wait for it: ecx_fetch() / ecx_fetch_from(),
 *     ecx_load(), ecx_release(), ecx_read(), and ecx_poll() with the
 *     progress thread (each takes only a lock of its own, held for a
 *     lookup). A fetch of a new item sends its request in the call when
 *     the context's lock is free, else the request goes out at the next
 *     step (the progress thread's, or the next ecx_poll()); a request that
 *     fails then (no room, no session) is answered LOCAL by a later fetch.
 *   - ecx_free() must be the last call on a context: no other thread may be
 *     inside, or later enter, a call on it.
 *   - Segments returned by ecx_save_begin() / ecx_load() may be read and
 *     written from any thread until the call that ends them (commit/abort,
 *     release).
 *   - The process-wide calls (ecx_version, ecx_errname, ecx_strerror,
 *     ecx_status_name, ecx_reason_name, ecx_compat_hash, the wire codec,
 *     ecx_set_logger, ecx_set_log_level, ecx_reap_regions) are safe from
 *     any thread at any time.
 *   - With progress_thread = 1 (the default), each context runs one thread
 *     of its own that advances everything (acks, READs, grants, timers) as
 *     soon as it can, in bounded slices under the context's lock, letting
 *     the caller's calls in between slices and yielding its core between
 *     two slices. Transfers then finish whatever the engine's step rate,
 *     and no call waits on the lock for more than one slice. ecx_poll() has nothing to drive: it reports the events
 *     the thread handled (waiting up to timeout_ms for some), ecx_fd()
 *     becomes readable when the thread handled events, and
 *     ecx_next_timeout() is ECX_NO_TIMEOUT. The thread touches the context's sockets,
 *     region and cache only while holding the lock; it never calls the
 *     logger with the lock of another context held, and stops in ecx_free().
 *     On the same-host path it also maps in the rest of a producer's region
 *     after the first fetch from it (in slices, behind any READ), so that
 *     later fetches of blocks never read before run at memory speed: once
 *     per producer, about 85 ms of its time per GiB on 4 KiB pages, at
 *     most the first 8 GiB of a region.
 *   - With progress_thread = 0, nothing runs in the background: work
 *     advances inside the calls, chiefly ecx_poll(), which steps for at
 *     most about 0.5 ms per call; a large READ then needs many polls.
 *   - Whatever progress_thread says, while any consumer session exists the
 *     process runs one watchdog thread (shared by all contexts) that checks
 *     every 20 ms how much each
 *     producer connection has queued inside ZeroMQ, and shuts down one that
 *     floods; it logs nothing and makes no ZeroMQ call. Each context's
 *     ZeroMQ context runs ZeroMQ's two threads (one I/O thread, a reaper).
 *   - Each context faults its region's memory in on one more thread of its
 *     own, 2 MiB at a time, from ecx_new() until it is all in or ecx_free()
 *     (ECX_PREFAULT=0 in the environment: no such thread; a save then backs
 *     its own blocks as it always does first). It pauses while a fetch
 *     copies into the region. Its signals are blocked.
 *   - A producer with events_endpoint set runs one more thread, which
 *     publishes the events (docs/EVENTS.md).
 *   - No UCX runs in this process: the ucx and nixl data paths run it in
 *     helper processes (ecx-ucx-agent, ecx-nixl-agent) that the context
 *     starts, talks to over a socket from its own calls / thread, restarts
 *     if they die, and ends in ecx_free(); the library installs no signal
 *     handler for them.
 *
 * ABI: ecx_config carries its own size (set by ecx_config_init), so fields
 * appended in later versions do not break programs built against this
 * one. The shared library's SONAME is libecx.so.ECX_ABI_VERSION.
 */
#ifndef ECX_H
#define ECX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ECX_BUILDING_LIBRARY) && defined(__GNUC__)
#define ECX_API __attribute__((visibility("default")))
#else
#define ECX_API
#endif

/* ======================================================================
 * Versions
 * ====================================================================== */

#define ECX_VERSION_MAJOR 0
#define ECX_VERSION_MINOR 3
#define ECX_VERSION_PATCH 0
#define ECX_VERSION_STRING "0.3.0"
/* Bumped on every incompatible ABI change; the SONAME's number. */
#define ECX_ABI_VERSION 2

/* Protocol versions (docs/PROTOCOL.md, "Versions"): 1 is the reference's
 * ECCPUConnector before vLLM 0.32, 2 that of vLLM >= 0.32 (the same
 * messages; the announcement carries the item's shape and whole blocks).
 * ECX_CONNECTOR_VERSION is the version of the wire functions without _v
 * and of ecx_req_init; a context's version is the one its vllm_version
 * speaks (2 with the defaults) unless connector_version says. */
#define ECX_CONNECTOR_VERSION 1
#define ECX_CONNECTOR_VERSION_MAX 2

/* The library's version as "MAJOR.MINOR.PATCH" (that of the library loaded
 * at run time, which may be newer than the header a program was built
 * with). Never NULL. */
ECX_API const char *ecx_version(void);

/* ======================================================================
 * Errors, statuses, reasons: each list is written once, here, and the
 * enum and the name tables are generated from it.
 * ====================================================================== */

/* X(NAME, code, "message") */
#define ECX_ERRORS(X)                                                                              \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ERANGE, -3, "value out of range, or buffer too small")                                       \
    X(EUTF8, -4, "string is not valid UTF-8")                                                      \
    X(ECRYPTO, -5, "crypto library failure")                                                       \
    X(ESYS, -6, "system call failed")                                                              \
    X(EROLE, -7, "call not valid for this context's role")                                         \
    /* Wire decoding: why a frame was refused. */                                                  \
    X(EWIRE_EMPTY, -20, "empty frame")                                                             \
    X(EWIRE_TRUNCATED, -21, "frame truncated inside a value")                                      \
    X(EWIRE_TRAILING, -22, "trailing bytes after the message")                                     \
    X(EWIRE_NOT_MAP, -23, "message is not a msgpack map")                                          \
    X(EWIRE_TYPE, -24, "field or key has the wrong msgpack type")                                  \
    X(EWIRE_UTF8, -25, "str field is not valid UTF-8")                                             \
    X(EWIRE_MISSING, -26, "required field missing")                                                \
    X(EWIRE_TAG, -27, "type tag names another message")                                            \
    X(EWIRE_STATUS, -28, "status is not a known XferStatus")                                       \
    X(EWIRE_INT, -29, "integer out of the accepted range")                                         \
    X(EWIRE_INVALID, -30, "byte 0xc1 is not msgpack")                                              \
    X(EWIRE_TOO_LARGE, -31, "frame or field too large")                                            \
    /* Region and cache. */                                                                        \
    X(EREGION_SIZE, -40, "region size is zero, too large, or not whole blocks")                    \
    X(EREGION_EXISTS, -41, "region file already exists")                                           \
    X(EREGION_NOTFOUND, -42, "region file not found")                                              \
    X(EREGION_NOSPC, -43, "shared memory too small for the region")                                \
    X(EREGION_BADFILE, -44, "region file is a symlink, not regular, or not ours")                  \
    X(EREGION_BUSY, -45, "region file is being reclaimed")                                         \
    X(ECACHE_FULL, -50, "cache full: not enough free or evictable blocks")                         \
    X(ECACHE_EXISTS, -51, "cache entry already exists")                                            \
    X(ECACHE_MISSING, -52, "no cache entry for that key")                                          \
    X(ECACHE_NOT_READY, -53, "cache entry is not ready")                                           \
    X(ECACHE_STATE, -54, "operation not allowed in the cache entry's state")                       \
    /* Data plane. */                                                                              \
    X(EDATA_META, -60, "agent_metadata malformed")                                                 \
    X(EDATA_DESC, -61, "mem_descriptor malformed")                                                 \
    X(EDATA_VERSION, -62, "data-plane format version not supported")                              \
    X(EDATA_MISMATCH, -63, "descriptor does not match the producer or block sizes differ")        \
    X(EDATA_INDEX, -64, "block index out of range")                                                \
    X(EDATA_COUNT, -65, "block count is zero or differs between the sides")                        \
    X(EDATA_NOPATH, -66, "no data path reaches the peer, or that path is not built in")           \
    X(EDATA_UCX, -67, "UCX call failed")                                                           \
    X(EDATA_PEER, -68, "data-plane peer unreachable or broken")                                    \
    X(EDATA_FAULT, -69, "injected data-plane fault")                                               \
    X(EDATA_NOTIF, -71, "notification empty or too long")                                          \
    X(EDATA_GRANT, -72, "no live grant with that key and token")

enum ecx_error {
#define ECX_ERROR_ENUM_(name, code, msg) ECX_##name = code,
    ECX_ERRORS(ECX_ERROR_ENUM_)
#undef ECX_ERROR_ENUM_
};

/* "ECX_ECACHE_FULL"; "ECX_EUNKNOWN" for a code not in the list. Never NULL. */
ECX_API const char *ecx_errname(int err);
/* "cache full: not enough free or evictable blocks"; "unknown error" for a
 * code not in the list. Never NULL. */
ECX_API const char *ecx_strerror(int err);

/* Status carried by an XferAck: X(NAME, value). */
#define ECX_STATUSES(X)                                                                            \
    X(OK, 0)                                                                                       \
    X(NACK_MISSING, 1)                                                                             \
    X(NACK_INCOMPAT, 2)                                                                            \
    X(NACK_VERSION, 3)                                                                             \
    X(NACK_INTERNAL, 4)                                                                            \
    X(NACK_NOT_READY, 5)

enum ecx_status {
#define ECX_STATUS_ENUM_(name, v) ECX_STATUS_##name = v,
    ECX_STATUSES(ECX_STATUS_ENUM_)
#undef ECX_STATUS_ENUM_
};
#define ECX_STATUS_MAX ECX_STATUS_NACK_NOT_READY

/* "OK", "NACK_MISSING", ...; "UNKNOWN" for anything else. */
ECX_API const char *ecx_status_name(int status);

/* What a consumer's fetch of one item comes to. */
enum ecx_fetch_state {
    ECX_FETCH_READY = 0,   /* the bytes are in the local region: load them */
    ECX_FETCH_PENDING = 1, /* in flight: ask again on a later step */
    ECX_FETCH_LOCAL = 2,   /* encode locally; the reason says why */
};

/* Why an item is to be encoded locally: X(NAME, "meaning"), numbered from 0
 * in this order. */
#define ECX_REASONS(X)                                                                             \
    X(NONE, "not a fallback")                                                                      \
    X(NO_PEER, "no announcement, or no peer_host in it")                                           \
    X(SIZE_MISMATCH, "announced size differs from the expected one")                               \
    X(INVALID, "unusable mm_hash, size or announcement")                                           \
    X(NO_ROOM, "no room in the local region")                                                      \
    X(NACK_MISSING, "the producer does not hold it")                                               \
    X(NACK_INCOMPAT, "compatibility hashes differ")                                                \
    X(NACK_VERSION, "connector versions differ")                                                   \
    X(NACK_INTERNAL, "producer error")                                                             \
    X(NOT_READY_TIMEOUT, "still NOT_READY after the per-item wait")                                \
    X(ACK_TIMEOUT, "no ack within the ack timeout")                                                \
    X(BAD_ACK, "ack unusable: counts, indices or metadata wrong")                                  \
    X(READ_FAILED, "the data-plane READ failed")                                                   \
    X(QUARANTINED, "the READ overran its deadline")                                                \
    X(SEND_FAILED, "the request could not be sent")                                                \
    X(CORRUPT, "the bytes read do not match the producer's checksum")                              \
    X(LEASE_EXPIRED, "the READ ended after the producer's pin lease could have")                  \
    X(REFUSED, "the producer's address refused the connection: nothing listening there")         \
    X(NOT_ZMQ, "the producer's address is not a ZeroMQ peer: it sent no ZeroMQ greeting")       \
    X(HANDSHAKE, "the producer's address hung up in the ZeroMQ handshake: CURVE keys or modes "    \
                 "differ, it is at its connection cap, or it is not a ZeroMQ peer")

enum ecx_reason {
#define ECX_REASON_ENUM_(name, meaning) ECX_REASON_##name,
    ECX_REASONS(ECX_REASON_ENUM_)
#undef ECX_REASON_ENUM_
    ECX_REASON_COUNT
};

/* "NACK_MISSING", "ACK_TIMEOUT", ...; "UNKNOWN" for anything else. */
ECX_API const char *ecx_reason_name(int reason);

/* ======================================================================
 * Logging (process-wide)
 * ====================================================================== */

enum ecx_log_level { ECX_LOG_ERROR = 0, ECX_LOG_WARN = 1, ECX_LOG_INFO = 2, ECX_LOG_DEBUG = 3 };

/* Receives one log line (no trailing newline; at most 1023 bytes) at a
 * level. Calls are serialised by the library (fn need not be thread-safe)
 * and may come from any thread inside an ecx call or from the library's
 * own threads (ecx.h's list above). fn must not call into ecx (a context, or ecx_set_logger). */
typedef void (*ecx_log_fn)(void *arg, int level, const char *line);

/* Route every log line to fn (NULL: back to stderr, "ecx LEVEL: line"). */
ECX_API void ecx_set_logger(ecx_log_fn fn, void *arg);
/* Lines above level are dropped before they are formatted. The default is
 * ECX_LOG_WARN, or what the ECX_LOG environment variable names (error,
 * warn, info, debug) when the first line is logged. */
ECX_API void ecx_set_log_level(int level);

/* ======================================================================
 * Compatibility hash
 * ====================================================================== */

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
ECX_API int ecx_compat_hash(const char *vllm_version, size_t vllm_version_len, const char *model,
                            size_t model_len, const char *dtype, size_t dtype_len,
                            int64_t block_size_bytes, char out[ECX_COMPAT_HASH_HEX + 1]);

/*
 * The dtype factor as vLLM hashes it, str(model_config.dtype): "torch.bfloat16" for
 * "bfloat16", "bf16" and "torch.bfloat16" alike ("half" / "fp16" -> "torch.float16",
 * "float" / "fp32" -> "torch.float32", ...). NULL if ecx does not know the dtype; then
 * ecx_dtype_names() lists the accepted spellings. A context hashes this spelling
 * (ecx_compat_hash itself hashes the bytes it is given, as the reference does).
 */
ECX_API const char *ecx_dtype_name(const char *dtype);
/* Bytes per element of such a dtype; 0 if ecx does not know it. */
ECX_API int ecx_dtype_size(const char *dtype);
/* The dtypes ecx knows, "torch.float64, torch.float32, ..." (static text). */
ECX_API const char *ecx_dtype_names(void);
/*
 * The protocol version a vLLM version speaks: 2 from 0.32 on, else 1 (also for a
 * version string that is not MAJOR.MINOR...). ecx_config.connector_version 0 means this.
 */
ECX_API int ecx_protocol_version_of(const char *vllm_version);

/* ======================================================================
 * The engine-facing context
 * ====================================================================== */

typedef struct ecx_ctx ecx_ctx;

enum ecx_role { ECX_ROLE_PRODUCER = 1, ECX_ROLE_CONSUMER = 2, ECX_ROLE_BOTH = 3 };

/* Longest mm_hash, in bytes, anywhere in ecx: saved, announced, requested,
 * answered, fetched. 255 so that every mm_hash made of file-name-safe
 * characters is also a file name (NAME_MAX). Longer ones are ECX_EINVAL
 * from the API, NACK_MISSING from a producer, INVALID at a consumer. An
 * mm_hash is a str on the wire: one that is not UTF-8 is ECX_EUTF8. */
#define ECX_MM_HASH_MAX 255

/* Defaults: the one home of every default ecx_config_init() sets and the
 * library's internals fall back on. */
#define ECX_DEFAULT_LISTEN "127.0.0.1:5601"
#define ECX_DEFAULT_REGION_BYTES (1ull << 30)
/* One row of the default model's encoder output: llava-1.5-7b's hidden size,
 * 4096 elements of bfloat16, as vLLM's ECCPUConnector sizes its blocks
 * (version 2 stores and announces whole rows: an item is whole blocks). */
#define ECX_DEFAULT_BLOCK_BYTES 8192ull
/* The newest vLLM release ecx is tested against, which speaks protocol
 * version 2 (ecx_protocol_version_of derives it), and dtype as vLLM hashes
 * it. Facing another vLLM, set vllm_version (and block_bytes, model, dtype)
 * to that engine's. */
#define ECX_DEFAULT_VLLM_VERSION "0.34.0"
#define ECX_DEFAULT_MODEL "llava-hf/llava-1.5-7b-hf"
#define ECX_DEFAULT_DTYPE "torch.bfloat16"
#define ECX_DEFAULT_DATA "auto"
/* Every ecx_config.data value, the one list messages and help print (the
 * library's own list, src/data.h, is checked against it by a test). */
#define ECX_DATA_PATHS "auto, shm, tcp, ucx, nixl"
#define ECX_DEFAULT_ACK_TIMEOUT_MS 2000
#define ECX_DEFAULT_READ_TIMEOUT_MS 20000
#define ECX_DEFAULT_QUARANTINE_MS 60000
#define ECX_DEFAULT_ITEM_WAIT_MS 60000
#define ECX_DEFAULT_TOMBSTONE_TTL_MS 600000
#define ECX_DEFAULT_SESSION_IDLE_MS 30000
#define ECX_DEFAULT_MAX_SESSIONS 256
#define ECX_DEFAULT_LEASE_MS 30000
#define ECX_DEFAULT_MAX_GRANTS 65536
#define ECX_DEFAULT_MAX_CONN_GRANTS 1024
#define ECX_DEFAULT_MAX_CONN_PIN_PCT 50
#define ECX_DEFAULT_MAX_PIN_PCT 75
/* 0: the protocol version vllm_version speaks (ecx_protocol_version_of). */
#define ECX_DEFAULT_CONNECTOR_VERSION 0
/* How long a version-2 peer (vLLM >= 0.32) waits for an ack by default
 * (its consumer_ack_timeout_s = the 30 s pin lease). ecx_config_init keeps
 * ECX_DEFAULT_ACK_TIMEOUT_MS whatever the version; `ecx get
 * --connector-version 2` uses this one. */
#define ECX_DEFAULT_ACK_TIMEOUT_V2_MS 30000

typedef struct ecx_config {
    /* sizeof(ecx_config) as the caller was compiled: set by ecx_config_init.
     * A library newer than the caller gives fields past it their defaults;
     * an older one accepts a larger size only if every byte it does not
     * know is zero. Always start from ecx_config_init(). */
    size_t size;
    int role;                   /* enum ecx_role; default consumer */
    const char *listen;         /* producer: "HOST:PORT" to bind (port 0: any free one) */
    const char *advertise_host; /* producer: peer_host announced; NULL: the listen host
                                   (a wildcard listen host needs one: ECX_EINVAL) */
    uint64_t region_bytes;      /* rounded down to whole blocks */
    uint64_t block_bytes;
    const char *vllm_version;   /* compatibility factors: peers must agree */
    const char *model;
    const char *dtype;          /* any spelling ecx_dtype_name() knows; hashed as vLLM does */
    const char *data;           /* data path: "auto" (shm + tcp), "shm", "tcp", "ucx" or
                                   "nixl" (NIXL, to be a peer of vLLM's own connector;
                                   one-sided, trusted networks only; with ecx peers it
                                   is auto; docs/NIXL.md) */
    int progress_thread;        /* 1 (default): a library thread moves transfers on (see
                                   Threading); 0: only the calls do, chiefly ecx_poll() */
    const char *instance;       /* region instance name; NULL: unique per process start */
    int rank;

    /* Consumer timing (milliseconds; defaults ECX_DEFAULT_*). */
    int64_t ack_timeout_ms;     /* request sent -> ack */
    int64_t read_timeout_ms;    /* READ posted -> done */
    int64_t quarantine_ms;      /* an overrun READ's blocks are held this long at most */
    int64_t item_wait_ms;       /* overall wait per item over NOT_READY retries (and, in
                                   version 2, ack-timeout retries) */
    int64_t tombstone_ttl_ms;   /* an unclaimed fallback answer is dropped after this */
    int64_t session_idle_ms;    /* a producer session not busy this long is closed */
    uint32_t max_sessions;      /* producer sessions (sockets) open at most */

    /* Producer limits (defaults ECX_DEFAULT_*). */
    int64_t lease_ms;           /* a granted item stays pinned this long at most */
    uint32_t max_grants;        /* active grants in all */
    uint32_t max_conn_grants;   /* active grants per consumer connection */
    uint32_t max_conn_pin_pct;  /* % of the region one connection's pins may cover (1..100) */
    uint32_t max_connections;   /* control-plane connections; 0: the soft fd limit less a
                                   reserve (64, and 512 for the data plane) */

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

    /* Protocol version, 1 or 2 (vLLM >= 0.32); 0 (the default) derives it from
     * vllm_version (ecx_protocol_version_of), and 1 with a vllm_version of 0.32 or later
     * is refused (ECX_EINVAL: no such vLLM). Both ends of a transfer must use the same one: requests do not carry it (see
     * docs/PROTOCOL.md). Version 2 announces an item's shape [rows, block_bytes /
     * element size of dtype] (or the one ecx_save_shape recorded for it) with
     * size_bytes in whole blocks, so it needs a dtype whose element size ecx
     * knows (torch's names, with or without "torch.") and items of whole blocks
     * (ecx_save* of another size: ECX_EINVAL); its consumers check the shape
     * against size_bytes (INVALID, SIZE_MISMATCH). */
    int connector_version;

    /* Producer: % of the region's blocks that pins may cover, all consumers together
     * (1..100; default ECX_DEFAULT_MAX_PIN_PCT), so that the encoder's own saves
     * always find room: a request whose pin would pass it gets NACK_NOT_READY (the
     * consumer retries as the pins drain), unless nothing else is pinned. */
    uint32_t max_pin_pct;

    /* Producer: encoder-cache events for routers (docs/EVENTS.md), off by default
     * (NULL). "HOST:PORT" (PORT 1..65534) of a ZeroMQ PUB socket on which every item
     * that becomes ready, every eviction and every start / stop is published in vLLM's
     * KV-events framing, with a replay socket on PORT + 1. The context then runs one
     * more thread, which publishes without ever blocking the calls. CURVE applies to
     * both sockets as to the control plane (curve_secret_key, curve_allow). */
    const char *events_endpoint;
    const char *events_topic; /* first frame of every event message; NULL: "" */
} ecx_config;

/* Every field to its default, and size to sizeof(ecx_config). */
ECX_API void ecx_config_init(ecx_config *cfg);

/* Create a context: region, cache, data plane, and the role's sessions. A
 * producer is listening when this returns. Every string is copied. Errors:
 * ECX_EINVAL (a field out of range, or cfg not made by ecx_config_init;
 * the log says which), region errors, ECX_ESYS. */
ECX_API int ecx_new(const ecx_config *cfg, ecx_ctx **out);
/* Release every grant and reservation, close every socket, remove the
 * region file. NULL is a no-op. See the threading rule above. */
ECX_API void ecx_free(ecx_ctx *ctx);

/* ---------- driving it: the engine's step, or a foreign event loop ---------- */

/* Advance everything: acks, READs, grants, timers. Waits up to timeout_ms
 * (0: don't wait; -1: until something happens) if nothing was ready, and
 * does not hold the context's lock while it waits. Returns the number of
 * events handled, or a negative error. With the progress thread, the
 * thread advances everything and this returns the events it handled since
 * the last call. Never takes more than about a millisecond with timeout 0. */
ECX_API int ecx_poll(ecx_ctx *ctx, int timeout_ms);

/* For an engine with its own event loop: a file descriptor that becomes
 * readable when ecx_poll() may have work (level triggered; never read from
 * it or close it); with the progress thread, when it handled events. Right before each wait, call ecx_next_timeout(): it
 * also finds work already queued, which the descriptor does not signal.
 * Then wait for the descriptor for at most that long, and call
 * ecx_poll(ctx, 0). Valid until ecx_free(). */
ECX_API int ecx_fd(ecx_ctx *ctx);
/* Milliseconds until ecx_poll() must run even if ecx_fd() stays quiet: 0
 * if it has work now, ECX_NO_TIMEOUT if nothing is pending (always, with
 * the progress thread), a negative error (ECX_EINVAL: ctx NULL). */
ECX_API int ecx_next_timeout(ecx_ctx *ctx);
/* ecx_next_timeout()'s "nothing pending": INT_MAX, which no error and no
 * timer has (wait as long as you like; poll(2)'s -1 is the same). */
#define ECX_NO_TIMEOUT 0x7fffffff

/* The producer's bound port (useful with port 0); ECX_EROLE for a
 * consumer-only context. */
ECX_API int ecx_listen_port(const ecx_ctx *ctx);

/* Where the context's shared-memory region lives, so an engine can
 * register it once (cudaHostRegister, ibv_reg_mr) and copy in batches.
 * Every segment the API hands out lies inside [base, base + size_bytes). */
typedef struct ecx_region_layout {
    uint8_t *base;        /* valid until ecx_free() */
    uint64_t size_bytes;  /* num_blocks * block_bytes */
    uint64_t block_bytes;
    uint64_t num_blocks;
    const char *path;     /* the region file; valid until ecx_free() */
} ecx_region_layout;

ECX_API int ecx_region_info(const ecx_ctx *ctx, ecx_region_layout *out);

/* Remove the region files of this user in dir (NULL: $ECX_SHM_DIR, else
 * /dev/shm) whose owning process is gone. Returns how many were removed,
 * or a negative error if dir cannot be read. ecx_new does this too. */
ECX_API int ecx_reap_regions(const char *dir);

/* ---------- items ---------- */

/* A place to write or read an item's bytes: one run of blocks. An item's
 * segments, in order, hold its bytes; only the last may be shorter than a
 * whole number of blocks. */
typedef struct ecx_segment {
    uint8_t *ptr;
    size_t len;
} ecx_segment;

/* Producer: reserve room for mm_hash's size_bytes (the entry starts not
 * ready) and get where to write it: *segs points to *n_segs segments owned
 * by the library, valid until ecx_save_commit() or ecx_save_abort().
 * ECX_ECACHE_FULL if there is no room even after evicting,
 * ECX_ECACHE_EXISTS if it is already held, ECX_EINVAL with connector_version 2
 * if size_bytes is not whole blocks (version 2 announces whole rows),
 * ECX_EREGION_NOSPC if the region's directory has no room left for the
 * blocks (it filled up after ecx_new(), which takes the region's memory
 * afterwards: docs/API.md §2). */
ECX_API int ecx_save_begin(ecx_ctx *ctx, const char *mm_hash, uint64_t size_bytes,
                           const ecx_segment **segs, size_t *n_segs);
/* The bytes are written: the entry becomes ready (and servable). The
 * item's checksum is computed here, without the context's lock (other
 * calls and the progress thread go on meanwhile); a second commit or an
 * abort of the same item during it gets ECX_ECACHE_STATE. */
ECX_API int ecx_save_commit(ecx_ctx *ctx, const char *mm_hash);
/* Give up a save that was begun (not yet committed). */
ECX_API int ecx_save_abort(ecx_ctx *ctx, const char *mm_hash);
/* begin + copy + commit in one call; the copy and the checksum run without
 * the context's lock, as with the three calls. */
ECX_API int ecx_save(ecx_ctx *ctx, const char *mm_hash, const void *bytes, uint64_t size_bytes);

/* Where a held item can be fetched from: what the orchestrator passes from
 * producer to consumer. From ecx_announce_info(), peer_host is owned by the
 * producer's context (valid until ecx_free()); given to ecx_fetch_from(),
 * it is the caller's and is read during the call only. */
typedef struct ecx_announcement {
    const char *peer_host;
    int peer_port;
    uint64_t size_bytes;
} ecx_announcement;

/* Producer: the announcement of mm_hash (held, ready or not), or
 * ECX_ECACHE_MISSING. */
ECX_API int ecx_announce_info(ecx_ctx *ctx, const char *mm_hash, ecx_announcement *out);
/* The same as the reference's JSON: {"peer_host":..,"peer_port":..,
 * "size_bytes":..,"metadata":{}} if held, else {"metadata":{}}. Returns 0
 * with the text in buf, or ECX_ERANGE if it does not fit cap bytes with its
 * NUL (nothing written); either way *len gets its length, NUL excluded. */
ECX_API int ecx_announce(ecx_ctx *ctx, const char *mm_hash, char *buf, size_t cap, size_t *len);

/* Producer, connector_version 2: record the true shape [rows, width] of a held
 * item (a saved one, between ecx_save_begin() and ecx_save_commit() or after
 * the commit), which ecx_announce() then writes as its "shape" instead of
 * [size_bytes / block_bytes, block_bytes / element size]: for an item whose rows
 * are not one block each, e.g. encoder outputs wider than the language model's
 * hidden size (several layers packed on the last dimension). rows x width
 * elements of dtype must take exactly the item's size_bytes in whole blocks
 * (as a version-2 consumer checks); the bytes past rows x width x element size
 * are padding. Call it before announcing the item; a later call replaces the
 * shape, and a new save of the key starts without one. ECX_EINVAL (with a log
 * line saying the numbers): rows or width 0, the product overflows, the blocks
 * differ, or connector_version 1 (which announces no shape);
 * ECX_ECACHE_MISSING if the item is not held. */
ECX_API int ecx_save_shape(ecx_ctx *ctx, const char *mm_hash, uint64_t rows, uint64_t width);

/* Consumer: ask for mm_hash given its announcement as JSON text (NULL or
 * {"metadata":{}}: not announced). expected_size is what the engine
 * expects (0: accept the announced size). Returns enum ecx_fetch_state;
 * for ECX_FETCH_LOCAL, *reason (enum ecx_reason) says why. Call again on a
 * later step while it is pending: an item already known is answered
 * without looking at the announcement. */
ECX_API int ecx_fetch(ecx_ctx *ctx, const char *mm_hash, const char *announcement,
                      uint64_t expected_size, int *reason);
/* The same without JSON: from (NULL: not announced). */
ECX_API int ecx_fetch_from(ecx_ctx *ctx, const char *mm_hash, const ecx_announcement *from,
                           uint64_t expected_size, int *reason);

/* Pin a ready item and get its bytes: *segs points to *n_segs segments
 * owned by the library; *size_bytes gets the item's size. Loads nest: each
 * needs its own ecx_release(), every load of an item returns the same list,
 * and it stays valid until the item's last outstanding release. */
ECX_API int ecx_load(ecx_ctx *ctx, const char *mm_hash, const ecx_segment **segs, size_t *n_segs,
                     uint64_t *size_bytes);
ECX_API int ecx_release(ecx_ctx *ctx, const char *mm_hash);
/* load + copy into dst (cap bytes) + release; returns the size, or
 * ECX_ERANGE (nothing copied) if cap is smaller. */
ECX_API int64_t ecx_read(ecx_ctx *ctx, const char *mm_hash, void *dst, uint64_t cap);

/* Remove a ready item from this context's region now, freeing its blocks
 * (as the cache's own eviction does when it needs room; a producer's event
 * subscribers get "EncoderCacheRemoved", reason "evicted"). For an engine
 * that knows it will not need the item again: a consumer's next fetch of it
 * asks a producer again; a producer answers later requests for it
 * NACK_MISSING. 0, or ECX_ECACHE_MISSING (not held), ECX_ECACHE_NOT_READY
 * (still being saved or fetched), ECX_ECACHE_STATE (loaded and not yet
 * released, or granted to a consumer that is reading it: try again later).
 * Takes the context's lock. Since 0.3.0. */
ECX_API int ecx_evict(ecx_ctx *ctx, const char *mm_hash);

/* Metrics of this context in Prometheus text format. Returns 0 with the
 * text in buf, or ECX_ERANGE if it does not fit cap bytes with its NUL (buf
 * then holds an empty string); either way *len gets its length, NUL
 * excluded. The text can grow between two calls: allow some slack. */
ECX_API int ecx_metrics(ecx_ctx *ctx, char *buf, size_t cap, size_t *len);

/* ======================================================================
 * The wire codec: XferReq / XferAck of protocol versions 1 and 2, byte-identical
 * to the Python reference's msgspec encoding (docs/PROTOCOL.md). For tools
 * and tests that speak the control plane themselves.
 * ====================================================================== */

/* A view of bytes: into a decoded frame, or the caller's memory to encode. */
typedef struct ecx_span {
    const char *p;
    size_t n;
} ecx_span;

typedef struct ecx_req {
    ecx_span mm_hash;            /* required */
    ecx_span compatibility_hash; /* required */
    ecx_span session_id;         /* default "" */
    int64_t connector_version;   /* default ECX_CONNECTOR_VERSION */
} ecx_req;

typedef struct ecx_ack {
    ecx_span mm_hash;    /* required */
    int status;          /* required, enum ecx_status */
    ecx_span session_id; /* default "" */
    size_t n_indices;    /* length of src_block_indices, default 0 */
    /* Encoding: the n_indices values. Decoding: NULL; read them with
     * ecx_wire_ack_indices(). */
    const int64_t *indices;
    ecx_span indices_raw;    /* decoding only: the validated array body */
    ecx_span agent_metadata; /* default b"" */
    ecx_span mem_descriptor; /* default b"" */
} ecx_ack;

/* Initialise with the defaults (empty strings, version 1, no indices). */
ECX_API void ecx_req_init(ecx_req *r);
ECX_API void ecx_ack_init(ecx_ack *a);

/* Encode into buf (cap bytes). For a valid message *len gets the frame's
 * length, and if that exceeds cap the call returns ECX_ERANGE (buf's
 * contents then unspecified).
 * Refuses str fields that are not UTF-8 (ECX_EUTF8), a status outside
 * 0..5 (ECX_EINVAL), and fields over 4 GiB (ECX_EWIRE_TOO_LARGE). */
ECX_API int ecx_wire_encode_req(const ecx_req *r, void *buf, size_t cap, size_t *len);
ECX_API int ecx_wire_encode_ack(const ecx_ack *a, void *buf, size_t cap, size_t *len);

/* Decode one frame. On success the spans in *r / *a point into frame, which
 * must outlive them. On failure returns an ECX_EWIRE_* code. */
ECX_API int ecx_wire_decode_req(const void *frame, size_t len, ecx_req *r);
ECX_API int ecx_wire_decode_ack(const void *frame, size_t len, ecx_ack *a);

/* XferReq as a peer of protocol version `version` (1..ECX_CONNECTOR_VERSION_MAX)
 * encodes and decodes it: connector_version is left out when it equals
 * `version`, and an absent one decodes as `version` (msgspec's omit_defaults
 * with the default of that version). ecx_req_init sets version 1: set
 * r->connector_version to encode another. The functions above are these with
 * version 1. XferAck is the same in every version. ECX_EINVAL: version out of range. */
ECX_API int ecx_wire_encode_req_v(const ecx_req *r, int version, void *buf, size_t cap,
                                  size_t *len);
ECX_API int ecx_wire_decode_req_v(const void *frame, size_t len, int version, ecx_req *r);

/* Copy a decoded ack's block indices into out (at most cap of them).
 * Returns the number copied. */
ECX_API size_t ecx_wire_ack_indices(const ecx_ack *a, int64_t *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* ECX_H */
