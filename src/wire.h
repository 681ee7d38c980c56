/*
 * wire — the XferReq / XferAck codec of protocol version 1 (SPEC §3).
 *
 * Encoding must be byte-identical to msgspec's for a tagged struct with
 * omit_defaults=True: a map whose first entry is "type", then the fields in
 * declaration order, defaults left out, shortest msgpack forms. We encode
 * with msgpack-c's packer, which picks exactly those forms.
 *
 * Decoding follows msgspec.msgpack.Decoder(XferReq / XferAck), strictly, and
 * is written here rather than on msgpack-c's unpacker: that unpacker
 * allocates claimed_count * sizeof(msgpack_object) before it has seen the
 * elements (a 5-byte frame claiming 2^32 elements asks for ~96 GB), has no
 * hook to cap it, and does not validate UTF-8. This decoder never
 * allocates: strings and bytes are views into the frame, the index list is
 * validated in place and copied out on demand by ecx_wire_ack_indices(),
 * and every length is checked against the bytes that remain.
 *
 * One deliberate narrowing: msgspec accepts ints up to 2^64-1; ecx refuses
 * values above 2^63-1 (ECX_EWIRE_INT). No block index or version that large
 * means anything.
 */
#ifndef ECX_WIRE_H
#define ECX_WIRE_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

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
    ecx_span mm_hash;   /* required */
    int status;         /* required, enum ecx_status */
    ecx_span session_id; /* default "" */
    size_t n_indices;   /* length of src_block_indices, default 0 */
    /* Encoding: the n_indices values. Decoding: NULL; read them with
     * ecx_wire_ack_indices(). */
    const int64_t *indices;
    ecx_span indices_raw;       /* decoding only: the validated array body */
    ecx_span agent_metadata;    /* default b"" */
    ecx_span mem_descriptor;    /* default b"" */
} ecx_ack;

/* Initialise with the defaults (empty strings, version 1, no indices). */
void ecx_req_init(ecx_req *r);
void ecx_ack_init(ecx_ack *a);

/*
 * Encode into buf (cleared first; reuse one buffer to avoid allocation in
 * steady state). Refuses str fields that are not UTF-8 (ECX_EUTF8), a status
 * outside 0..5 (ECX_EINVAL), and fields over 4 GiB (ECX_EWIRE_TOO_LARGE).
 */
int ecxi_wire_encode_req(const ecx_req *r, msgpack_sbuffer *buf);
int ecxi_wire_encode_ack(const ecx_ack *a, msgpack_sbuffer *buf);

/* Decode one frame. On success the spans in *r / *a point into frame, which
 * must outlive them. On failure returns an ECX_EWIRE_* code. */
int ecx_wire_decode_req(const void *frame, size_t len, ecx_req *r);
int ecx_wire_decode_ack(const void *frame, size_t len, ecx_ack *a);

/* Copy a decoded ack's block indices into out (at most cap of them).
 * Returns the number copied. */
size_t ecx_wire_ack_indices(const ecx_ack *a, int64_t *out, size_t cap);

#endif
