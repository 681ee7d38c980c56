/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session_id — the consumer's session ids (docs/PROTOCOL.md, "session_id").
 *
 * To vLLM a session_id is an opaque string (its consumer writes
 * str(uuid.uuid4())); it only keys grants and notifications
 * "{session_id}:{mm_hash}". ecx's are UUID4 text of the same form and
 * length whose last group, 48 of the 122 random bits, is a fixed marker:
 * an ecx producer in nixl mode answers a marked session in ecx's own
 * checked form (ticket, token, checksum; shm / tcp) and any other in
 * NIXL's (docs/NIXL.md §8). A vLLM uuid4 carries the marker with chance
 * 2^-48, and then only gets an ack it cannot use (it computes locally).
 * The marker is not a credential: claiming it only gets the stricter form.
 */
#ifndef ECXI_SESSION_ID_H
#define ECXI_SESSION_ID_H

#include <stdbool.h>
#include <stddef.h>

/* The last group of every ecx session id. */
#define ECXI_SESSION_ID_MARK "ec5ec5ec5ec5"
#define ECXI_SESSION_ID_LEN 36

/* A fresh marked id: 36 characters and a NUL. */
void ecxi_session_id_new(char out[ECXI_SESSION_ID_LEN + 1]);

/* True if sid[0..n) is an ecx session id: UUID4 text (lowercase hex,
 * version 4, RFC variant) ending in the marker. */
bool ecxi_session_id_is_ecx(const char *sid, size_t n);

#endif
