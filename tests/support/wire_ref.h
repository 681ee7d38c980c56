/* SPDX-License-Identifier: Apache-2.0 */
/* wire_ref — the XferAck encoded with msgpack-c's packer, the way wire.c
 * encoded it before the ack was written by hand: the reference that
 * test_wire and fuzz_wire hold the hand-written encoder to, byte for byte.
 * (Fields are assumed valid: callers encode with ecxi_wire_encode_ack
 * first, which checks them.) */
#ifndef ECXI_WIRE_REF_H
#define ECXI_WIRE_REF_H

#include <msgpack.h>
#include <string.h>

#include "ecx.h"

static int ref_key(msgpack_packer *pk, const char *key)
{
    size_t n = strlen(key);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, key, n);
}

/* 0, or -1 if the packer failed. buf is cleared first. */
static int ref_encode_ack(const ecx_ack *a, msgpack_sbuffer *buf)
{
    msgpack_sbuffer_clear(buf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
    bool has_sid = a->session_id.n > 0, has_idx = a->n_indices > 0;
    bool has_meta = a->agent_metadata.n > 0, has_desc = a->mem_descriptor.n > 0;
    int fail = msgpack_pack_map(&pk, 3 + has_sid + has_idx + has_meta + has_desc) ||
               ref_key(&pk, "type") || ref_key(&pk, "ack") || ref_key(&pk, "mm_hash") ||
               msgpack_pack_str(&pk, a->mm_hash.n) ||
               msgpack_pack_str_body(&pk, a->mm_hash.p, a->mm_hash.n) || ref_key(&pk, "status") ||
               msgpack_pack_int(&pk, a->status);
    if (!fail && has_sid)
        fail = ref_key(&pk, "session_id") || msgpack_pack_str(&pk, a->session_id.n) ||
               msgpack_pack_str_body(&pk, a->session_id.p, a->session_id.n);
    if (!fail && has_idx) {
        fail = ref_key(&pk, "src_block_indices") || msgpack_pack_array(&pk, a->n_indices);
        for (size_t i = 0; !fail && i < a->n_indices; i++)
            fail = msgpack_pack_int64(&pk, a->indices[i]);
    }
    if (!fail && has_meta)
        fail = ref_key(&pk, "agent_metadata") || msgpack_pack_bin(&pk, a->agent_metadata.n) ||
               msgpack_pack_bin_body(&pk, a->agent_metadata.p, a->agent_metadata.n);
    if (!fail && has_desc)
        fail = ref_key(&pk, "mem_descriptor") || msgpack_pack_bin(&pk, a->mem_descriptor.n) ||
               msgpack_pack_bin_body(&pk, a->mem_descriptor.p, a->mem_descriptor.n);
    return fail ? -1 : 0;
}

#endif
