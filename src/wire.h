/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire — the XferReq / XferAck codec of protocol versions 1 and 2 (docs/PROTOCOL.md §3,
 * "Versions": only XferReq's connector_version default differs).
 *
 * Encoding must be byte-identical to msgspec's for a tagged struct with
 * omit_defaults=True: a map whose first entry is "type", then the fields in
 * declaration order, defaults left out, shortest msgpack forms. Requests
 * are encoded with msgpack-c's packer, which picks exactly those forms;
 * acks (one per request a producer serves) by hand in the same forms,
 * sized first and written in one pass.
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
#ifndef ECXI_WIRE_H
#define ECXI_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

/* ecx_span, ecx_req, ecx_ack, their init, decode and the caller-buffer
 * encoders are public (ecx.h); the msgpack_sbuffer encoders the sessions
 * use to reuse one growing buffer are internal. */

/*
 * Encode into buf (cleared first; reuse one buffer to avoid allocation in
 * steady state). Refuses str fields that are not UTF-8 (ECX_EUTF8), a status
 * outside 0..5 (ECX_EINVAL), and fields over 4 GiB (ECX_EWIRE_TOO_LARGE). A request
 * is encoded as a peer of protocol version `version` does (ecx_wire_encode_req_v).
 */
int ecxi_wire_encode_req(const ecx_req *r, int version, msgpack_sbuffer *buf);
int ecxi_wire_encode_ack(const ecx_ack *a, msgpack_sbuffer *buf);
/* The same, for a producer's ack whose a->mm_hash and a->session_id are
 * spans of a request that ecx_wire_decode_req* accepted (strs_decoded):
 * their UTF-8, checked by that decoder, is not checked again; every other
 * check runs. The same bytes. */
int ecxi_wire_encode_ack_of(const ecx_ack *a, bool strs_decoded, msgpack_sbuffer *buf);

#endif
