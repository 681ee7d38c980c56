/* SPDX-License-Identifier: Apache-2.0 */
/*
 * announce — the announcement of one item (SPEC §4.2, §5): what the
 * orchestrator carries from a producer to a consumer, in the reference's
 * JSON ({"peer_host":..,"peer_port":..,"size_bytes":..,"metadata":{}} for
 * a held item, {"metadata":{}} for one not held) or as ecx.h's
 * ecx_announcement.
 *
 * Both directions live here so that the one format has one writer and one
 * reader, and every check a consumer makes before it asks a producer sits
 * in one function: whether there is a peer at all (NO_PEER), whether the
 * announcement is usable (INVALID), and whether its size is the one the
 * engine expects (SIZE_MISMATCH). Protocol version 2 (vLLM >= 0.32) adds
 * the item's "shape" [rows, width] and announces size_bytes in whole blocks
 * of one row each (docs/PROTOCOL.md, "Versions"). The consumer session calls it only for
 * an item it has never heard of; the connector only passes text or struct
 * through.
 */
#ifndef ECXI_ANNOUNCE_H
#define ECXI_ANNOUNCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

/* Longest peer_host, in bytes (a DNS name's limit). */
#define ECXI_HOST_MAX 255

/* True if h is a host name or address that may be announced and asked:
 * 1..ECXI_HOST_MAX bytes of letters, digits, '.', '-', ':' and '_' (so it
 * is also safe in JSON as is). */
bool ecxi_announce_host_ok(const char *h);

/* Version 2's sizing: a block is one row of width = block_bytes / elem_size
 * elements of elem_size bytes (vLLM: block_size_bytes = hidden x element size). */
typedef struct ecxi_announce_rows {
    uint64_t block_bytes;
    int elem_size;
} ecxi_announce_rows;

/* The reference's JSON for a (NULL: the item is not held) into buf, with
 * snprintf's contract: *len gets the full length (NUL excluded) always;
 * if that does not fit cap bytes with the NUL, nothing is written and the
 * result is ECX_ERANGE. ECX_EINVAL (and *len 0) if len is NULL, or
 * a's host is not ecxi_announce_host_ok() or its port not 1..65535.
 * rows non-NULL (version 2): "shape": [size_bytes / block_bytes, width]
 * after size_bytes (a->size_bytes must be whole blocks, else ECX_EINVAL). */
int ecxi_announce_json(char *buf, size_t cap, size_t *len, const ecx_announcement *a,
                       const ecxi_announce_rows *rows);
/* The same with the item's own shape (version 2, rows non-NULL): "shape":
 * [shape_rows, shape_width] instead of the derived one, when both are non-zero
 * (0, 0: derived). ECX_EINVAL if the whole blocks that rows x width x elem_size
 * bytes take are not a->size_bytes (or the product overflows): an announcement
 * a version-2 consumer would refuse is never written. */
int ecxi_announce_json_shape(char *buf, size_t cap, size_t *len, const ecx_announcement *a,
                             const ecxi_announce_rows *rows, uint64_t shape_rows,
                             uint64_t shape_width);

/* Version 2: the bytes of the whole blocks that rows x width elements take
 * (vLLM's scheduler: _num_blocks x block_size_bytes) into *out; false if a
 * product overflows. */
bool ecxi_announce_shape_bytes(const ecxi_announce_rows *r, uint64_t rows, uint64_t width,
                               uint64_t *out);

/* An announcement checked and copied: where a consumer asks, and the size. */
typedef struct ecxi_announce_peer {
    char host[ECXI_HOST_MAX + 1];
    int port;
    uint64_t size_bytes;
} ecxi_announce_peer;

/*
 * Check the announcement of an item, given as the reference's JSON (json)
 * or as the struct (from): at most one of them; both NULL means not
 * announced. expected_size is what the engine expects (0: any); max_bytes
 * the largest item the consumer can take at all (0: no limit). Returns
 * ECX_REASON_NONE with *out filled when the consumer may ask, else the
 * reason (enum ecx_reason) to encode locally, checked in this order:
 *   NO_PEER        not announced, {"metadata":{}}, text that is not a JSON
 *                  object, or no peer_host (absent, not a string, empty);
 *   INVALID        peer_host not ecxi_announce_host_ok(), peer_port not an
 *                  integer in 1..65535, size_bytes not an integer > 0 (or
 *                  json and from both given);
 *   SIZE_MISMATCH  size_bytes differs from a non-zero expected_size
 *                  (out->size_bytes is the announced size, for the log);
 *   INVALID        size_bytes above max_bytes.
 * rows non-NULL (version 2), after the first INVALID checks, as vLLM 0.34's
 * scheduler (_admit_item) checks them:
 *   INVALID        json without a "shape" of two integers >= 0 (vLLM: the
 *                  announced size was unusable);
 *   SIZE_MISMATCH  size_bytes is not the whole blocks that shape's
 *                  rows x width x elem_size bytes take (from: size_bytes not
 *                  whole blocks; the struct has no shape).
 */
int ecxi_announce_parse(const char *json, const ecx_announcement *from, uint64_t expected_size,
                        uint64_t max_bytes, const ecxi_announce_rows *rows,
                        ecxi_announce_peer *out);

#endif
