/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_wire — libFuzzer target for the wire decoder. Every input is decoded
 * as both XferReq and XferAck; a frame that decodes is re-encoded and must
 * decode again to the same fields (and, if it was already canonical, to the
 * same bytes); a re-encoded ack must also be byte for byte what msgpack-c's
 * packer makes of it (wire_ref.h). ASan/UBSan catch any read outside the
 * frame. */
#include <stdlib.h>
#include <string.h>

#include "wire.h"
#include "wire_ref.h"

static void check_span(ecx_span a, ecx_span b)
{
    if (a.n != b.n || (a.n && memcmp(a.p, b.p, a.n))) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static msgpack_sbuffer buf, ref;
    static int64_t idx[1 << 16], idx2[1 << 16];
    if (!buf.data) msgpack_sbuffer_init(&buf), msgpack_sbuffer_init(&ref);

    ecx_req r, r2;
    /* Each protocol version: decode, encode as that version, decode again. */
    for (int v = 1; v <= ECX_CONNECTOR_VERSION_MAX; v++) {
        if (ecx_wire_decode_req_v(data, size, v, &r)) continue;
        if (ecxi_wire_encode_req(&r, v, &buf)) abort();
        if (ecx_wire_decode_req_v(buf.data, buf.size, v, &r2)) abort();
        check_span(r.mm_hash, r2.mm_hash);
        check_span(r.compatibility_hash, r2.compatibility_hash);
        check_span(r.session_id, r2.session_id);
        if (r.connector_version != r2.connector_version) abort();
    }
    ecx_ack a, a2;
    if (ecx_wire_decode_ack(data, size, &a) == 0) {
        if (a.status < 0 || a.status > ECX_STATUS_MAX) abort();
        if (a.n_indices > size) abort();
        size_t n = ecx_wire_ack_indices(&a, idx, 1 << 16);
        if (n != (a.n_indices < (1 << 16) ? a.n_indices : (1 << 16))) abort();
        if (n == a.n_indices) {
            a.indices = idx;
            if (ecxi_wire_encode_ack(&a, &buf)) abort();
            if (ref_encode_ack(&a, &ref) || ref.size != buf.size ||
                memcmp(ref.data, buf.data, buf.size))
                abort();
            if (ecx_wire_decode_ack(buf.data, buf.size, &a2)) abort();
            check_span(a.mm_hash, a2.mm_hash);
            check_span(a.session_id, a2.session_id);
            check_span(a.agent_metadata, a2.agent_metadata);
            check_span(a.mem_descriptor, a2.mem_descriptor);
            if (a.status != a2.status || a.n_indices != a2.n_indices) abort();
            if (ecx_wire_ack_indices(&a2, idx2, 1 << 16) != n) abort();
            if (n && memcmp(idx, idx2, n * sizeof *idx)) abort();
        }
    }
    return 0;
}
